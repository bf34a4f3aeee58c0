"""A user's own TPUEstimator program, run on a TPU VM by `estimator_bf16 run`.

`tpu-vm run|up --program=PATH/main.py [--precision=...] [--accumulate=K]
[--recompute] -- PROGRAM ARGS` copies the program's folder (its sibling modules come along, as `python
main.py` needs them) to the home directory of every TPU host, next to the
trainer package, and runs there

    python3 -m estimator_bf16 run --precision=bfloat16 [--accumulate=K]
        [--recompute] FOLDER/main.py ARGS

with ARGS verbatim (the levers `check --fit --device=tpu-...` chose go
before the program). The program's flags are its own: nothing is added to
them, so the checks here only refuse what cannot work on a TPU host.
"""

import dataclasses
import os

from estimator_bf16.apps.tpu_submit import command_runner as runner_lib
from estimator_bf16.apps.tpu_submit import validation
from estimator_bf16.platform.tpu import MiB
from estimator_bf16.precision import policy

# The folder travels with every run; data belongs in Cloud Storage.
MAX_FOLDER_BYTES = 50 * MiB
_NO_TPU_ARGS = ('--use_tpu=false', '--use_tpu=False', '--use_tpu=0',
                '--nouse_tpu')


@dataclasses.dataclass(frozen=True)
class Program:
  """Where the program is here and where it lands on the TPU host.

  Attributes:
    local_dir: absolute path of the program's folder, copied as a whole.
    remote_path: the program's path on the host, relative to the home
      directory (`FOLDER/main.py`).
    precision: the `Precision` for `estimator_bf16 run`.
    accumulate: K, micro-batches per update (1: none).
    recompute: recompute activations in backprop.
  """
  local_dir: str
  remote_path: str
  precision: policy.Precision
  accumulate: int = 1
  recompute: bool = False


def _folder_bytes(folder, limit):
  """Bytes in `folder`, counting stops once past `limit`."""
  total = 0
  for parent, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(parent, name)
      if not os.path.islink(path):
        total += os.path.getsize(path)
      if total > limit:
        return total
  return total


def _check_program_args(program_args):
  """Refuses program arguments that cannot work on a TPU host."""
  flags = validation.flag_part(program_args)
  for arg in flags:
    if arg in _NO_TPU_ARGS:
      raise validation.UsageError(
          'program argument %s after --: the job runs on a TPU VM to use its '
          'TPU; drop it (run the program locally with `python -m '
          'estimator_bf16 run` instead).' % arg)
    name, _, value = arg.partition('=')
    if name.startswith('--') and name.endswith('dir') and value and not (
        value.startswith('gs://')):
      raise validation.UsageError(
          'program argument %s after --: the TPU host cannot read or write '
          'your local disk; pass a gs:// path.' % arg)
  if not any(arg.startswith('--tpu=') or arg == '--tpu' for arg in flags):
    runner_lib.note(
        'the program gets no --tpu: if it builds its TPUClusterResolver from '
        'such a flag, add --tpu=local after -- (the TPU of the host it runs '
        'on).')


def plan(args):
  """Validates `--program` and its arguments; returns a `Program` or None.

  Args:
    args: parsed `tpu-vm run|up` flags (`program`, `precision`, `model_dir`,
      `data_dir`, `trainer_args`).

  Returns:
    A `Program`, or None when no --program was given.

  Raises:
    validation.UsageError: anything that would fail on the TPU host.
  """
  accumulate = getattr(args, 'accumulate', None)
  recompute = getattr(args, 'recompute', None)
  if args.program is None:
    for flag, value in (('--precision', args.precision),
                        ('--accumulate', accumulate),
                        ('--recompute', recompute)):
      if value is not None:
        raise validation.UsageError(
            '%s goes with --program; for estimator_bf16.apps.train_cli pass '
            'its own flags after --.' % flag)
    return None
  try:
    precision = policy.parse_precision(
        args.precision or policy.DEFAULT_PRECISION)
  except ValueError as e:
    raise validation.UsageError('--%s' % e)
  if accumulate is not None and accumulate < 1:
    raise validation.UsageError('--accumulate=%d: K is the number of '
                                'micro-batches per update, an integer >= 1.'
                                % accumulate)
  for flag, value in (('--model-dir', args.model_dir),
                      ('--data-dir', args.data_dir)):
    if value is not None:
      raise validation.UsageError(
          '%s is a flag of estimator_bf16.apps.train_cli; with --program the program takes '
          'its own flags after --, e.g. -- --model_dir=gs://bucket/model.'
          % flag)
  path = args.program
  if not path.endswith('.py'):
    raise validation.UsageError('--program=%s: give the Python program '
                                '(a .py file).' % path)
  if not os.path.isfile(path):
    raise validation.UsageError('--program=%s: no such file.' % path)
  folder = os.path.dirname(os.path.abspath(path))
  if folder == os.path.dirname(folder):
    raise validation.UsageError(
        '--program=%s lives in the root directory; put it in a folder of '
        'its own (the whole folder is copied).' % path)
  if _folder_bytes(folder, MAX_FOLDER_BYTES) > MAX_FOLDER_BYTES:
    raise validation.UsageError(
        '--program=%s: its folder %s holds more than %d MiB, and the whole '
        'folder is copied to the TPU host. Keep data in Cloud Storage and the '
        'program in a folder with its own modules only.' % (
            path, folder, MAX_FOLDER_BYTES // MiB))
  _check_program_args(args.trainer_args)
  return Program(folder, '%s/%s' % (os.path.basename(folder),
                                    os.path.basename(path)), precision,
                 accumulate or 1, bool(recompute))


def scp_argv(gcloud, args, program):
  """Copies the program's folder into the home directory of every worker."""
  return gcloud.argv('compute', 'tpus', 'tpu-vm', 'scp', '--recurse',
                     program.local_dir, '%s:' % args.name,
                     '--zone=' + args.zone, '--worker=' + args.worker)


def run_words(program, program_args):
  """The command that runs the program on the host (a list of words)."""
  levers = []
  if program.accumulate > 1:
    levers.append('--accumulate=%d' % program.accumulate)
  if program.recompute:
    levers.append('--recompute')
  return ['python3', '-m', 'estimator_bf16', 'run',
          '--precision=' + program.precision, *levers, program.remote_path,
          *program_args]
