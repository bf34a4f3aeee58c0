"""Command-line flags of tpu_submit, defined in functions (not at import).

Each subcommand gets exactly the flags it reads, so `--help` on it is the
full story and argparse rejects what does not belong there.
"""

import argparse

from estimator_bf16.apps.tpu_submit import ai_platform
from estimator_bf16.apps.tpu_submit import tpu_vm
from estimator_bf16.apps.tpu_submit import vertex
from estimator_bf16.precision import policy

_EPILOG = ('Trainer arguments go after `--` and reach `python -m '
           'estimator_bf16.apps.train_cli` (or, with --program, your program) on the TPU host '
           'verbatim, e.g. -- --model=mnist_mlp --precision=bfloat16')


def _add_common(parser):
  group = parser.add_argument_group('common flags')
  group.add_argument('--dry-run', action='store_true',
                     help='print every command and the generated YAML; run '
                     'nothing')
  group.add_argument('--gcloud', help='gcloud executable (default: $GCLOUD, '
                     'else gcloud on PATH)')
  group.add_argument('--project', help='Google Cloud project for every call')
  group.add_argument('--quiet', action='store_true',
                     help='pass --quiet to gcloud (no prompts)')


def _add_tpu_location(parser):
  parser.add_argument('--name', required=True, help='TPU VM name, e.g. bf16-v3')
  parser.add_argument('--zone', required=True, help='e.g. us-central1-b')
  parser.add_argument('--region', help='optional; checks that --zone is in it')


def _add_tpu_hardware(parser, with_runtime):
  parser.add_argument('--accelerator-type', required=True,
                      help='v2-8, v3-8, v4-8, or a pod slice such as v3-32')
  if not with_runtime:
    return
  parser.add_argument('--version', required=True,
                      help='TPU VM runtime with tf.estimator: '
                      'tpu-vm-tf-2.15.x[-pod][-se|-pjrt], e.g. '
                      'tpu-vm-tf-2.15.0-se (-pod for pod slices)')
  capacity = parser.add_mutually_exclusive_group()
  capacity.add_argument('--spot', action='store_true',
                        help='Spot capacity: cheaper, can be reclaimed')
  capacity.add_argument('--preemptible', action='store_true',
                        help='preemptible capacity (older spelling of Spot)')


def _add_package(parser):
  parser.add_argument('--package', help='prebuilt trainer sdist or wheel '
                      '(default: build one from setup.py)')
  parser.add_argument('--work-dir', help='where the sdist and YAML are '
                      'written (default: build/tpu_submit in the repository)')


def _add_trainer_dirs(parser, required=True):
  # Not required by argparse where the handler must speak first (a program
  # of one's own, a shut-down service); the handler then checks it.
  parser.add_argument('--model-dir', required=required,
                      help='gs:// checkpoint and summary directory')
  parser.add_argument('--data-dir', help='gs:// input data directory')


def _add_tpu_run(parser):
  _add_trainer_dirs(parser, required=False)
  parser.add_argument('--worker', default='all',
                      help='TPU workers to run on (default: all; pod slices '
                      'require all)')
  _add_package(parser)
  program = parser.add_argument_group(
      'your own program', 'Run an unmodified TPUEstimator program instead of '
      'estimator_bf16.apps.train_cli: its folder is copied to the TPU host and run there with '
      '`python -m estimator_bf16 run`; the arguments after `--` are the '
      "program's own (give it --tpu=local and gs:// paths).")
  program.add_argument('--program', metavar='PROGRAM.py',
                       help='the program to run in bfloat16 (instead of '
                       'estimator_bf16.apps.train_cli; then --model-dir is not used)')
  program.add_argument(
      '--precision', metavar='{%s}' % ','.join(policy.PRECISIONS),
      help='%s (default); float32 runs the program unchanged; only with '
      '--program' % policy.DEFAULT_PRECISION)
  program.add_argument('--accumulate', type=int, metavar='K',
                       help='gradient accumulation inside the TPU loop: each '
                       "update is K micro-batches of the program's "
                       'train_batch_size / K (what `estimator_bf16 check '
                       '--fit --device=tpu-...` chose); only with --program')
  program.add_argument('--recompute', action='store_true', default=None,
                       help='recompute activations in backprop; only with '
                       '--program')


def _subparsers(parser, dest):
  return parser.add_subparsers(dest=dest, required=True)


def _path(paths, name, help_text):
  """A `tpu_submit NAME` parser; returns the subparsers of its actions."""
  parser = paths.add_parser(name, help=help_text, description=help_text,
                            allow_abbrev=False)
  return _subparsers(parser, 'action')


def _leaf(subparsers, name, handler, help_text, takes_trainer_args=False):
  parser = subparsers.add_parser(
      name, help=help_text, description=help_text, allow_abbrev=False,
      epilog=_EPILOG if takes_trainer_args else None)
  parser.set_defaults(handler=handler, takes_trainer_args=takes_trainer_args)
  return parser


def _add_tpu_vm(paths):
  actions = _path(paths, 'tpu-vm', 'Cloud TPU VM (TPUEstimator on TF 2.15 '
                  'runtimes)')
  create = _leaf(actions, 'create', tpu_vm.create, 'create a TPU VM')
  _add_tpu_location(create)
  _add_tpu_hardware(create, with_runtime=True)
  run = _leaf(actions, 'run', tpu_vm.run, 'copy the trainer package to an '
              'existing TPU VM and train', takes_trainer_args=True)
  _add_tpu_location(run)
  _add_tpu_hardware(run, with_runtime=False)
  _add_tpu_run(run)
  delete = _leaf(actions, 'delete', tpu_vm.delete, 'delete a TPU VM')
  _add_tpu_location(delete)
  up = _leaf(actions, 'up', tpu_vm.up, 'create, run, then delete (even if the '
             'run fails)', takes_trainer_args=True)
  _add_tpu_location(up)
  _add_tpu_hardware(up, with_runtime=True)
  _add_tpu_run(up)
  up.add_argument('--keep', action='store_true',
                  help='do not delete the TPU VM afterwards')
  for leaf in (create, run, delete, up):
    _add_common(leaf)


def _add_vertex(paths):
  actions = _path(paths, 'vertex', 'Vertex AI custom job on a TPU')
  submit = _leaf(actions, 'submit', vertex.submit, 'upload the trainer and '
                 'create a custom job', takes_trainer_args=True)
  submit.add_argument('--region', required=True, help='e.g. us-central1')
  submit.add_argument('--display-name', required=True, help='job name')
  submit.add_argument('--accelerator-type', required=True,
                      help='TPU_V2 or TPU_V3 (8 cores)')
  submit.add_argument('--staging-bucket', help='gs:// bucket for the package')
  _add_trainer_dirs(submit)
  submit.add_argument('--timeout', help='e.g. 2h, 90m, 1h30m')
  submit.add_argument('--spot', action='store_true',
                      help='SPOT scheduling strategy')
  submit.add_argument('--executor-image', help='prebuilt training image '
                      '(default: Vertex AI tf-tpu.2-15 for the region)')
  submit.add_argument('--container-image', help='custom image that already '
                      'holds the trainer (no package upload)')
  _add_package(submit)
  leaves = [submit]
  for name, handler, help_text in (
      ('status', vertex.status, 'describe a job'),
      ('logs', vertex.logs, 'stream the logs of a job'),
      ('cancel', vertex.cancel, 'cancel a job')):
    leaf = _leaf(actions, name, handler, help_text)
    leaf.add_argument('job_id', metavar='JOB_ID',
                      help='numeric job ID (or its full resource name)')
    leaf.add_argument('--region', required=True)
    leaves.append(leaf)
  list_leaf = _leaf(actions, 'list', vertex.list_jobs, 'list custom jobs')
  list_leaf.add_argument('--region', required=True)
  leaves.append(list_leaf)
  for leaf in leaves:
    _add_common(leaf)


def _add_ai_platform(paths):
  actions = _path(paths, 'ai-platform', 'legacy AI Platform Training (shut '
                  'down; --dry-run only)')
  submit = _leaf(actions, 'submit', ai_platform.submit, 'print the legacy '
                 'BASIC_TPU submission (needs --dry-run)',
                 takes_trainer_args=True)
  # Required, but checked by the handler: a user of the shut-down service
  # hears that first, not that a flag is missing.
  submit.add_argument('--job-name')
  submit.add_argument('--region')
  submit.add_argument('--staging-bucket')
  _add_trainer_dirs(submit, required=False)
  submit.add_argument('--runtime-version', default='2.11',
                      help='AI Platform runtime (2.11 was the last)')
  submit.add_argument('--python-version', default='3.7')
  _add_package(submit)
  _add_common(submit)


def build_parser():
  """The full `tpu_submit PATH ACTION [flags] [-- trainer args]` parser."""
  # allow_abbrev=False: a trainer flag put before `--` (say --model=mnist)
  # must be refused, not read as an abbreviation of --model-dir.
  parser = argparse.ArgumentParser(
      prog='tpu_submit', allow_abbrev=False,
      description='Run estimator_bf16 training on a Cloud TPU with gcloud: '
      'a TPU VM (tpu-vm) or a Vertex AI custom job (vertex).',
      epilog=_EPILOG)
  paths = _subparsers(parser, 'path')
  _add_tpu_vm(paths)
  _add_vertex(paths)
  _add_ai_platform(paths)
  return parser
