"""Legacy AI Platform Training: printed for reference, never run.

Old TPUEstimator tutorials submit with `gcloud ai-platform jobs submit
training --scale-tier BASIC_TPU`. The service was shut down in January 2025,
so the command is only shown (under --dry-run) next to the paths that work.
"""

from estimator_bf16.apps.tpu_submit import command_runner as runner_lib
from estimator_bf16.apps.tpu_submit import common
from estimator_bf16.apps.tpu_submit import packaging
from estimator_bf16.apps.tpu_submit import validation

SHUTDOWN = (
    'AI Platform Training was shut down in January 2025, so `ai-platform '
    'submit` only prints the legacy command (with --dry-run). Run the same '
    'trainer with `tpu-vm up` (a Cloud TPU VM) or `vertex submit` (a Vertex '
    'AI custom job).')


def submit(args, root):
  """`ai-platform submit --dry-run`: the legacy command, for comparison."""
  # The shutdown comes first, before any flag is checked: whoever follows an
  # old tutorial must learn that the service is gone, not that a flag is
  # missing.
  if not args.dry_run:
    raise validation.UsageError(SHUTDOWN)
  runner_lib.note(SHUTDOWN)
  missing = [flag for flag, value in (
      ('--job-name', args.job_name), ('--region', args.region),
      ('--staging-bucket', args.staging_bucket),
      ('--model-dir', args.model_dir)) if value is None]
  if missing:
    raise validation.UsageError('the following arguments are required: %s'
                                % ', '.join(missing))
  validation.check_aip_job_name(args.job_name)
  validation.check_region(args.region)
  validation.check_gcs_path('--staging-bucket', args.staging_bucket)
  validation.check_gcs_path('--model-dir', args.model_dir)
  if args.data_dir is not None:
    validation.check_gcs_path('--data-dir', args.data_dir)
  validation.check_trainer_args(args.trainer_args)
  package = packaging.plan(args.package, packaging.work_dir(args.work_dir),
                           root)
  gcloud = common.make_gcloud(args)
  runner = common.make_runner(args, root)
  package_uri = '%s/tpu_submit/%s/%s' % (args.staging_bucket.rstrip('/'),
                                         args.job_name, package.file_name)
  # AI Platform's TPU tier gave the trainer a TPU by name through its cluster
  # spec, so only --use_tpu is passed (no --tpu=local).
  trainer_args = ['--model_dir=' + args.model_dir]
  if args.data_dir:
    trainer_args.append('--data_dir=' + args.data_dir)
  trainer_args += ['--use_tpu', *args.trainer_args]
  submit_argv = gcloud.argv(
      'ai-platform', 'jobs', 'submit', 'training', args.job_name,
      '--region=' + args.region, '--scale-tier=BASIC_TPU',
      '--runtime-version=' + args.runtime_version,
      '--python-version=' + args.python_version,
      '--module-name=' + common.TRAINER_MODULE, '--packages=' + package_uri,
      '--staging-bucket=' + args.staging_bucket,
      '--job-dir=' + args.model_dir, user_args=trainer_args)
  return common.run_all(runner, [
      *([package.build_argv] if package.build_argv else []),
      gcloud.argv('storage', 'cp', package.local_path, package_uri),
      submit_argv])
