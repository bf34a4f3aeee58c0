"""What every path shares: the gcloud invocation and the trainer command."""

import dataclasses
import os
import shutil
from typing import Optional

from estimator_bf16.apps.tpu_submit import command_runner as runner_lib
from estimator_bf16.apps.tpu_submit import validation

TRAINER_MODULE = 'estimator_bf16.apps.train_cli'


@dataclasses.dataclass
class Gcloud:
  """Builds gcloud argv lists with the common flags appended.

  Attributes:
    executable: --gcloud, else $GCLOUD, else `gcloud` from PATH.
    project: --project, passed on to every call when given.
    quiet: --quiet, turns off gcloud's prompts.
  """
  executable: str
  project: Optional[str] = None
  quiet: bool = False

  def argv(self, *words, quiet=None, user_args=None):
    """gcloud WORDS... [--project=P] [--quiet] [-- USER_ARGS...].

    Args:
      *words: the command and its own flags.
      quiet: overrides --quiet for this call when not None.
      user_args: arguments gcloud forwards to the trainer; they go after a
        `--`, behind the common flags, so gcloud does not read them.

    Returns:
      The argv list.
    """
    command = [self.executable, *words]
    if self.project:
      command.append('--project=' + self.project)
    if self.quiet if quiet is None else quiet:
      command.append('--quiet')
    if user_args is not None:
      command += ['--', *user_args]
    return command


def make_gcloud(args):
  """Resolves the gcloud executable; only a real run needs it to exist."""
  executable = args.gcloud or os.environ.get('GCLOUD') or 'gcloud'
  if not args.dry_run and shutil.which(executable) is None:
    raise validation.UsageError(
        '--gcloud=%s: no such executable. Install the Google Cloud CLI, set '
        '$GCLOUD, or pass --gcloud=PATH (or use --dry-run to only print the '
        'commands).' % executable)
  return Gcloud(executable, args.project, args.quiet)


def trainer_args(model_dir, data_dir, user_args):
  """Arguments of `python -m estimator_bf16.apps.train_cli` on a TPU host.

  The script owns --model_dir, --data_dir, --use_tpu and --tpu (each value is
  traceable to one submit flag); the user's arguments after `--` follow
  verbatim. `--tpu=local` is the TPU attached to the host the trainer runs on.
  """
  args = ['--model_dir=' + model_dir]
  if data_dir:
    args.append('--data_dir=' + data_dir)
  return args + ['--use_tpu', '--tpu=local'] + list(user_args)


def v3_note(generation):
  """The v2 -> v3 answer users ask for, printed whenever a v3 is chosen."""
  if generation == 'v3':
    runner_lib.note(
        'TPU v3 keeps the 8 cores per host of TPU v2 (16 GiB of HBM per core '
        'instead of 8 GiB). Moving from v2 needs no code change: '
        'TPUEstimator still runs 8 shards per host; only the accelerator type '
        '(and a zone that offers it) changes, and the per-core batch can '
        'about double.')


def run_all(runner, commands):
  """Runs commands in order, stopping at the first failure."""
  for command in commands:
    code = runner.run(command)
    if code:
      return code
  return 0


def make_runner(args, root):
  return runner_lib.Runner(dry_run=args.dry_run, cwd=root)

