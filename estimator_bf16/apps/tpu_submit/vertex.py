"""The Vertex AI path: a custom job on a TPU VM host, managed by Vertex.

`submit` uploads the package to the staging bucket and creates the job from a
generated --config YAML; `status`, `logs`, `cancel` and `list` wrap the
matching `gcloud ai custom-jobs` commands.
"""

import os

import yaml

from estimator_bf16.apps.tpu_submit import common
from estimator_bf16.apps.tpu_submit import packaging
from estimator_bf16.apps.tpu_submit import validation

# Vertex AI's prebuilt TensorFlow 2.15 training image for TPUs (Python 3.10),
# mirrored in three multi-regions; the closest one is picked from --region.
EXECUTOR_IMAGE = '%s-docker.pkg.dev/vertex-ai/training/tf-tpu.2-15.cp310:latest'
# Vertex gives a TPU worker one host, whose 8 cores TPUEstimator shards over.
ACCELERATOR_COUNT = validation.CORES_PER_HOST


def executor_image(region):
  for prefix in ('europe', 'asia'):
    if region.startswith(prefix):
      return EXECUTOR_IMAGE % prefix
  return EXECUTOR_IMAGE % 'us'


def staged_uri(staging_bucket, display_name, file_name):
  # One folder per display name, so a new upload never changes the package of
  # a job that is still queued.
  return '%s/tpu_submit/%s/%s' % (staging_bucket.rstrip('/'), display_name,
                                  file_name)


def job_spec(args, package_uri):
  """The CustomJobSpec passed to `gcloud ai custom-jobs create --config`.

  Args:
    args: parsed `vertex submit` flags.
    package_uri: gs:// URI of the uploaded sdist, or None with
      --container-image (the image then holds the trainer).

  Returns:
    A dict ready for `yaml.safe_dump`.
  """
  trainer_args = common.trainer_args(args.model_dir, args.data_dir,
                                     args.trainer_args)
  pool = {
      'machineSpec': {
          'machineType': 'cloud-tpu',
          'acceleratorType': args.accelerator_type,
          'acceleratorCount': ACCELERATOR_COUNT,
      },
      'replicaCount': 1,
  }
  if args.container_image:
    pool['containerSpec'] = {
        'imageUri': args.container_image,
        'command': ['python3', '-m', common.TRAINER_MODULE],
        'args': trainer_args,
    }
  else:
    pool['pythonPackageSpec'] = {
        'executorImageUri': (args.executor_image
                             or executor_image(args.region)),
        'packageUris': [package_uri],
        'pythonModule': common.TRAINER_MODULE,
        'args': trainer_args,
    }
  spec = {'workerPoolSpecs': [pool]}
  scheduling = {}
  if args.timeout:
    scheduling['timeout'] = '%ds' % validation.timeout_seconds(args.timeout)
  if args.spot:
    scheduling['strategy'] = 'SPOT'
  if scheduling:
    spec['scheduling'] = scheduling
  return spec


def _check_submit(args):
  validation.check_region(args.region)
  validation.check_display_name(args.display_name)
  validation.check_vertex_accelerator(args.accelerator_type)
  validation.check_gcs_path('--model-dir', args.model_dir)
  if args.data_dir is not None:
    validation.check_gcs_path('--data-dir', args.data_dir)
  if args.staging_bucket is not None:
    validation.check_gcs_path('--staging-bucket', args.staging_bucket)
  elif not args.container_image:
    raise validation.UsageError(
        '--staging-bucket is required: the trainer package is uploaded there '
        'for Vertex AI to install (or pass --container-image=URI of an image '
        'that already holds it).')
  if args.container_image and (args.package or args.executor_image):
    raise validation.UsageError(
        '--container-image replaces the package: drop --package and '
        '--executor-image.')
  if args.timeout:
    validation.timeout_seconds(args.timeout)
  validation.check_trainer_args(args.trainer_args)
  # A Vertex TPU worker is one 8-core host: TPU_V3 behaves like a v3-8.
  validation.check_num_shards(args.trainer_args,
                              'v%s-8' % args.accelerator_type[-1])


def submit(args, root):
  """`vertex submit`: build, upload, write the YAML, create the job."""
  _check_submit(args)
  out_dir = packaging.work_dir(args.work_dir)
  package = None
  if not args.container_image:
    package = packaging.plan(args.package, out_dir, root)
  gcloud = common.make_gcloud(args)
  runner = common.make_runner(args, root)
  common.v3_note('v' + args.accelerator_type[-1])
  package_uri = None
  if package is not None:
    package_uri = staged_uri(args.staging_bucket, args.display_name,
                             package.file_name)
    code = packaging.build(package, runner) or runner.run(
        gcloud.argv('storage', 'cp', package.local_path, package_uri))
    if code:
      return code
  config_path = os.path.join(out_dir, args.display_name + '.yaml')
  config = yaml.safe_dump(job_spec(args, package_uri), sort_keys=False)
  create_argv = gcloud.argv('ai', 'custom-jobs', 'create',
                            '--region=' + args.region,
                            '--display-name=' + args.display_name,
                            '--config=' + config_path)
  if args.dry_run:
    # Commands first, then the file they read, so stdout lists the commands
    # one per line before the YAML.
    code = runner.run(create_argv)
    runner.write_file(config_path, config)
    return code
  runner.write_file(config_path, config)
  return runner.run(create_argv)


def _job_command(verb):
  """`vertex status|logs|cancel JOB_ID`: one gcloud call on a job."""
  def handler(args, root):
    validation.check_region(args.region)
    validation.check_job_id(args.job_id, args.region)
    gcloud = common.make_gcloud(args)
    return common.make_runner(args, root).run(gcloud.argv(
        'ai', 'custom-jobs', verb, args.job_id, '--region=' + args.region))
  return handler


status = _job_command('describe')
logs = _job_command('stream-logs')
cancel = _job_command('cancel')


def list_jobs(args, root):
  """`vertex list`: the custom jobs of a region."""
  validation.check_region(args.region)
  gcloud = common.make_gcloud(args)
  return common.make_runner(args, root).run(
      gcloud.argv('ai', 'custom-jobs', 'list', '--region=' + args.region))
