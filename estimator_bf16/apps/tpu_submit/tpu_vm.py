"""The Cloud TPU VM path: create, run, delete, and up (all three).

A TPU VM is the current home of TPUEstimator: the TensorFlow 2.15 runtime
images still ship tf.estimator, and the trainer talks to the TPU of its own
host (`--tpu=local`).
"""

import shlex

from estimator_bf16.apps.tpu_submit import command_runner as runner_lib
from estimator_bf16.apps.tpu_submit import common
from estimator_bf16.apps.tpu_submit import packaging
from estimator_bf16.apps.tpu_submit import program as program_lib
from estimator_bf16.apps.tpu_submit import validation

# Installed next to the package with --no-deps, because letting pip resolve
# setup.py's `tensorflow` requirement could swap the runtime's TPU build of
# TensorFlow for the generic wheel. absl-py, six and numpy come with the image;
# tf-slim is the one missing dependency, at the version requirements.txt pins.
EXTRA_REQUIREMENTS = ('tf-slim==1.1.0',)


def create_argv(gcloud, args):
  argv = ['compute', 'tpus', 'tpu-vm', 'create', args.name,
          '--zone=' + args.zone, '--accelerator-type=' + args.accelerator_type,
          '--version=' + args.version]
  if args.spot:
    argv.append('--spot')
  if args.preemptible:
    argv.append('--preemptible')
  return gcloud.argv(*argv)


def delete_argv(gcloud, args, quiet=None):
  return gcloud.argv('compute', 'tpus', 'tpu-vm', 'delete', args.name,
                     '--zone=' + args.zone, quiet=quiet)


def scp_argv(gcloud, args, package):
  # The archive lands in the home directory of every worker.
  return gcloud.argv('compute', 'tpus', 'tpu-vm', 'scp', package.local_path,
                     '%s:%s' % (args.name, package.file_name),
                     '--zone=' + args.zone, '--worker=' + args.worker)


def remote_command(args, package, program=None):
  """The shell line run on each TPU host: install the package, then train.

  With a `program.Program`, the training command is the user's program
  under `estimator_bf16 run` instead of estimator_bf16.apps.train_cli.

  This is the one shell string in the script, and it runs remotely: every
  word is quoted, so the user's arguments reach the trainer verbatim.
  """
  # --force-reinstall: the version in setup.py stays the same between runs,
  # and pip would otherwise keep the code of the first one.
  install = ['python3', '-m', 'pip', 'install', '--quiet', '--user',
             '--no-deps', '--force-reinstall', package.file_name,
             *EXTRA_REQUIREMENTS]
  # `python3`: the Ubuntu images of TPU VMs have no `python` alias.
  if program is not None:
    train = program_lib.run_words(program, args.trainer_args)
  else:
    train = ['python3', '-m', common.TRAINER_MODULE,
             *common.trainer_args(args.model_dir, args.data_dir,
                                  args.trainer_args)]
  return shlex.join(install) + ' && ' + shlex.join(train)


def ssh_argv(gcloud, args, package, program=None):
  return gcloud.argv('compute', 'tpus', 'tpu-vm', 'ssh', args.name,
                     '--zone=' + args.zone, '--worker=' + args.worker,
                     '--command=' + remote_command(args, package, program))


def _check_location(args):
  validation.check_tpu_name(args.name)
  if args.region is not None:
    validation.check_region(args.region)
  validation.check_zone(args.zone, args.region)


def _check_hardware(args):
  validation.accelerator_cores(args.accelerator_type)
  validation.check_runtime_version(args.version, args.accelerator_type)


def _check_trainer(args):
  """Validates what runs on the hosts; returns the `program.Program` or None."""
  validation.accelerator_cores(args.accelerator_type)
  validation.check_worker(args.worker, args.accelerator_type)
  program = program_lib.plan(args)
  if program is not None:
    return program
  if args.model_dir is None:
    raise validation.UsageError(
        'the following arguments are required: --model-dir (or run a program '
        'of your own with --program=PROGRAM.py)')
  validation.check_gcs_path('--model-dir', args.model_dir)
  if args.data_dir is not None:
    validation.check_gcs_path('--data-dir', args.data_dir)
  validation.check_trainer_args(args.trainer_args)
  validation.check_num_shards(args.trainer_args, args.accelerator_type)
  return None


def _hardware_notes(accelerator_type):
  common.v3_note(accelerator_type.split('-')[0])
  cores = validation.accelerator_cores(accelerator_type)
  if cores > validation.CORES_PER_HOST:
    runner_lib.note(
        '%s is a pod slice of %d hosts: the package is copied to and the '
        'trainer started on every host (--worker=all).'
        % (accelerator_type, cores // validation.CORES_PER_HOST))


def _prepare(args, root):
  """Shared set-up of run and up, after validation: package, gcloud, runner."""
  package = packaging.plan(args.package, packaging.work_dir(args.work_dir),
                           root)
  gcloud = common.make_gcloud(args)
  _hardware_notes(args.accelerator_type)
  return package, gcloud, common.make_runner(args, root)


def _launch(gcloud, runner, args, package, program):
  copies = [scp_argv(gcloud, args, package)]
  if program is not None:
    copies.append(program_lib.scp_argv(gcloud, args, program))
  return common.run_all(runner, copies + [ssh_argv(gcloud, args, package,
                                                   program)])


def create(args, root):
  """`tpu-vm create`: one TPU VM, ready for `run`."""
  _check_location(args)
  _check_hardware(args)
  gcloud = common.make_gcloud(args)
  _hardware_notes(args.accelerator_type)
  return common.make_runner(args, root).run(create_argv(gcloud, args))


def run(args, root):
  """`tpu-vm run`: build and copy the package, then train on every worker."""
  _check_location(args)
  program = _check_trainer(args)
  package, gcloud, runner = _prepare(args, root)
  code = packaging.build(package, runner)
  return code or _launch(gcloud, runner, args, package, program)


def delete(args, root):
  """`tpu-vm delete`: gcloud asks for confirmation unless --quiet."""
  _check_location(args)
  gcloud = common.make_gcloud(args)
  return common.make_runner(args, root).run(delete_argv(gcloud, args))


def up(args, root):
  """`tpu-vm up`: create -> run -> delete, the delete even if run fails.

  Returns:
    The exit code of the first failing step among build, create and run;
    else the delete's.
  """
  _check_location(args)
  _check_hardware(args)
  program = _check_trainer(args)
  package, gcloud, runner = _prepare(args, root)
  # Build before creating: a broken package must not cost TPU time.
  code = packaging.build(package, runner)
  if code:
    return code
  code = runner.run(create_argv(gcloud, args))
  if code:
    # No delete: a failed create can mean the name belongs to a TPU that
    # someone else is using.
    runner_lib.note('create failed, so nothing was deleted. If the TPU exists '
                    'anyway, remove it with: '
                    + shlex.join(delete_argv(gcloud, args)))
    return code
  run_code = 1
  delete_code = 0
  try:
    run_code = _launch(gcloud, runner, args, package, program)
  finally:
    if args.keep:
      runner_lib.note('--keep: the TPU keeps running (and billing). Delete it '
                      'with: ' + shlex.join(delete_argv(gcloud, args)))
    else:
      # --quiet: nobody may be at the terminal to answer the prompt, and the
      # TPU must not outlive the job.
      delete_code = runner.run(delete_argv(gcloud, args, quiet=True))
  return run_code or delete_code
