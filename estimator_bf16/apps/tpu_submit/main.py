"""From laptop to Cloud TPU in one command: the `tpu-submit` program.

  tpu-submit tpu-vm {create,run,delete,up} --name=NAME \
      --zone=ZONE --accelerator-type=v3-8 --version=tpu-vm-tf-2.15.0-se \
      --model-dir=gs://... [--data-dir=gs://...] [--spot] [--keep] \
      [common flags] -- TRAINER ARGS
  tpu-submit tpu-vm {run,up} ... --program=DIR/main.py \
      [--precision=bfloat16|float32] -- PROGRAM ARGS
  tpu-submit vertex submit --region=R --display-name=N \
      --accelerator-type=TPU_V3 --staging-bucket=gs://... --model-dir=gs://... \
      [--timeout=2h] [--spot] [common flags] -- TRAINER ARGS
  tpu-submit vertex {status,logs,cancel} JOB_ID --region=R
  tpu-submit ai-platform submit ... --dry-run
  common flags: --dry-run --gcloud=PATH --project=P --quiet

`tpu-submit` is the console script; `python -m estimator_bf16.apps.tpu_submit` is
the same program. Everything after `--` goes verbatim to
`python -m estimator_bf16.apps.train_cli` on the TPU host, or with
--program to the user's own program, which runs there unmodified under
`python -m estimator_bf16 run`. Exit codes: 2 for a rejected command line (no
gcloud call is made), otherwise the exit code of the first failing command.
"""

import sys

from estimator_bf16.apps.tpu_submit import arguments
from estimator_bf16.apps.tpu_submit import packaging
from estimator_bf16.apps.tpu_submit import validation


def _error(message):
  print('tpu_submit: error: ' + message, file=sys.stderr)
  return 2


def main(argv=None):
  """Parses, validates, then runs (or prints) the gcloud commands.

  Args:
    argv: arguments without the program name; defaults to sys.argv[1:].

  Returns:
    The process exit code.
  """
  argv = sys.argv[1:] if argv is None else list(argv)
  # Split at the first `--` ourselves: what follows belongs to the trainer,
  # even if it looks like one of our flags.
  head, trainer_args = argv, []
  if '--' in argv:
    split = argv.index('--')
    head, trainer_args = argv[:split], argv[split + 1:]
  try:
    args, unknown = arguments.build_parser().parse_known_args(head)
  except SystemExit as e:  # argparse has printed usage (or --help).
    return e.code if isinstance(e.code, int) else 2
  if unknown:
    return _error(
        'unrecognized arguments: %s. Trainer arguments go after `--`, e.g. '
        '`... -- %s`.' % (' '.join(unknown), ' '.join(unknown)))
  if trainer_args and not args.takes_trainer_args:
    return _error('`%s %s` takes no trainer arguments after --; got %s.'
                  % (args.path, args.action, ' '.join(trainer_args)))
  args.trainer_args = trainer_args
  try:
    return args.handler(args, packaging.repo_root())
  except validation.UsageError as e:
    return _error(str(e))
  except KeyboardInterrupt:
    return 130

