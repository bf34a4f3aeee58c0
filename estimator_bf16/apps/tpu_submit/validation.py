"""Checks that run before any gcloud call.

Every check raises `UsageError` with a message that names the flag and says
what to do; the program turns it into exit code 2. Nothing here touches the
network or the file system, so a rejected command never costs a TPU.
"""

import re

from estimator_bf16.platform import tpu as tpu_facts

# A Cloud TPU core count is given in TensorCores; every host of the v2, v3,
# v4 and v5p generations holds one board's 8, so more means a pod slice.
CORES_PER_HOST = tpu_facts.TPU_CORES_PER_BOARD
TPU_VM_GENERATIONS = ('v2', 'v3', 'v4', 'v5p')
VERTEX_ACCELERATORS = ('TPU_V2', 'TPU_V3')

_ACCELERATOR_RE = re.compile(r'^(v\d+p?)-(\d+)$')
_RUNTIME_RE = re.compile(
    r'^tpu-vm-tf-(\d+)\.(\d+)\.(\d+)(-pod)?(-se|-pjrt)?$')
# Compute Engine resource names (TPU VMs): RFC 1035 labels.
_TPU_NAME_RE = re.compile(r'^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$')
# The display name also names the generated YAML file and the staging folder,
# so it is kept to characters that are safe in both.
_DISPLAY_NAME_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$')
_AIP_JOB_NAME_RE = re.compile(r'^[A-Za-z][A-Za-z0-9_]{0,127}$')
_REGION_RE = re.compile(r'^[a-z]+-[a-z]+\d+$')
_ZONE_RE = re.compile(r'^([a-z]+-[a-z]+\d+)-[a-z]$')
_BUCKET_RE = re.compile(r'^gs://[a-z0-9][a-z0-9._-]{1,220}[a-z0-9](/.*)?$')
_JOB_ID_RE = re.compile(
    r'^(?:projects/[^/]+/locations/([a-z0-9-]+)/customJobs/)?(\d+)$')
_DURATION_RE = re.compile(r'(\d+)([smhd])')
_DURATION_UNITS = {'s': 1, 'm': 60, 'h': 3600, 'd': 86400}

# Flags the submission script sets on the trainer itself. Passing them again
# after `--` would leave two values for one flag on the TPU host.
_OWNED_TRAINER_FLAGS = {
    'model_dir': 'pass --model-dir=gs://... to tpu_submit instead',
    'data_dir': 'pass --data-dir=gs://... to tpu_submit instead',
    'use_tpu': 'tpu_submit always adds --use_tpu --tpu=local; drop it',
    'nouse_tpu': 'a TPU job always runs with --use_tpu; drop it',
    'tpu': 'tpu_submit always adds --use_tpu --tpu=local; drop it',
}


class UsageError(Exception):
  """A command line that must not reach gcloud; reported with exit code 2."""


def accelerator_cores(accelerator_type):
  """Validates a TPU VM accelerator type and returns its TensorCore count.

  Args:
    accelerator_type: e.g. 'v3-8' or 'v3-32'.

  Returns:
    The number of TensorCores, e.g. 8 for 'v3-8'.

  Raises:
    UsageError: for any other spelling (including Vertex's 'TPU_V3').
  """
  match = _ACCELERATOR_RE.match(accelerator_type or '')
  if not match or match.group(1) not in TPU_VM_GENERATIONS:
    hint = ''
    if accelerator_type in VERTEX_ACCELERATORS:
      hint = (' (%s is the Vertex AI spelling; a TPU VM wants e.g. v%s-8)'
              % (accelerator_type, accelerator_type[-1]))
    generations = ', '.join(g[1:] for g in TPU_VM_GENERATIONS)
    raise UsageError(
        '--accelerator-type=%s is not a TPU VM type%s; use vN-CORES with N in '
        '%s, e.g. v2-8, v3-8, v3-32 or v4-8.'
        % (accelerator_type, hint, generations))
  cores = int(match.group(2))
  if cores < CORES_PER_HOST or cores % CORES_PER_HOST:
    raise UsageError(
        '--accelerator-type=%s: the core count must be a multiple of %d '
        '(one host), e.g. %s-8 or %s-32.'
        % (accelerator_type, CORES_PER_HOST, match.group(1), match.group(1)))
  return cores


def is_pod_slice(accelerator_type):
  """True when the slice spans more than one host."""
  return accelerator_cores(accelerator_type) > CORES_PER_HOST


def check_vertex_accelerator(accelerator_type):
  """Vertex AI names TPUs TPU_V2 / TPU_V3 and always gives a host's 8 cores."""
  if accelerator_type not in VERTEX_ACCELERATORS:
    raise UsageError(
        '--accelerator-type=%s is not a Vertex AI TPU type; use one of %s '
        '(8 cores each). Pod slices such as v3-32 need the tpu-vm path.'
        % (accelerator_type, ', '.join(VERTEX_ACCELERATORS)))


def check_runtime_version(version, accelerator_type):
  """Accepts only TPU VM TensorFlow runtimes that still ship tf.estimator.

  Args:
    version: e.g. 'tpu-vm-tf-2.15.0-se' or 'tpu-vm-tf-2.15.0-pod-pjrt'.
    accelerator_type: already validated TPU VM accelerator type.

  Raises:
    UsageError: unknown spelling, a TensorFlow without tf.estimator, or a
      `-pod` runtime that does not match the slice.
  """
  match = _RUNTIME_RE.match(version or '')
  if not match:
    raise UsageError(
        '--version=%s is not a TPU VM TensorFlow runtime; use '
        'tpu-vm-tf-2.15.x[-pod][-se|-pjrt], e.g. tpu-vm-tf-2.15.0-se.'
        % version)
  major, minor = int(match.group(1)), int(match.group(2))
  if (major, minor) >= (2, 16):
    raise UsageError(
        '--version=%s: tf.estimator (and so TPUEstimator) was removed in '
        'TensorFlow 2.16; use a tpu-vm-tf-2.15.x runtime, e.g. '
        'tpu-vm-tf-2.15.0-se.' % version)
  if (major, minor) < (2, 15):
    raise UsageError(
        '--version=%s: estimator_bf16 needs TensorFlow 2.15 (see setup.py); '
        'use a tpu-vm-tf-2.15.x runtime, e.g. tpu-vm-tf-2.15.0-se.' % version)
  pod_runtime = bool(match.group(4))
  if is_pod_slice(accelerator_type) and not pod_runtime:
    raise UsageError(
        '--version=%s on %s: a multi-host slice needs the -pod runtime, e.g. '
        'tpu-vm-tf-%s.%s.%s-pod%s.' % ((version, accelerator_type)
                                       + match.group(1, 2, 3)
                                       + (match.group(5) or '',)))
  if pod_runtime and not is_pod_slice(accelerator_type):
    raise UsageError(
        '--version=%s on %s: a single-host TPU takes the runtime without '
        '-pod, e.g. %s.' % (version, accelerator_type,
                            version.replace('-pod', '')))


def check_gcs_path(flag, value):
  """TPUs read and write only Cloud Storage; a local path fails on the host."""
  value = value or ''
  if value.startswith('gs://') and not _BUCKET_RE.match(value):
    raise UsageError(
        '%s=%s: "%s" is not a valid bucket name (3-222 lowercase letters, '
        'digits, "-", "_" or ".", starting and ending with a letter or digit).'
        % (flag, value, value[len('gs://'):].split('/', 1)[0]))
  if not _BUCKET_RE.match(value):
    raise UsageError(
        '%s=%s must be a gs:// path: the TPU host cannot read or write your '
        'local disk. Create a bucket with `gcloud storage buckets create '
        'gs://NAME` and pass %s=gs://NAME/...' % (flag, value, flag))


def check_tpu_name(name):
  if not _TPU_NAME_RE.match(name or ''):
    raise UsageError(
        '--name=%s: a TPU name is 1-63 lowercase letters, digits or hyphens, '
        'starting with a letter and not ending with a hyphen, e.g. bf16-v3.'
        % name)


def check_display_name(name):
  if not _DISPLAY_NAME_RE.match(name or ''):
    raise UsageError(
        '--display-name=%s: use 1-128 letters, digits, ".", "_" or "-", '
        'starting with a letter or digit, e.g. resnet-bf16-v3.' % name)


def check_aip_job_name(name):
  if not _AIP_JOB_NAME_RE.match(name or ''):
    raise UsageError(
        '--job-name=%s: AI Platform job names are letters, digits and "_", '
        'starting with a letter.' % name)


def check_region(region):
  if not _REGION_RE.match(region or ''):
    raise UsageError(
        '--region=%s is not a region; use e.g. us-central1 or europe-west4.'
        % region)


def check_zone(zone, region=None):
  """Validates a zone and, when a region is given too, that it lies in it."""
  match = _ZONE_RE.match(zone or '')
  if not match:
    raise UsageError(
        '--zone=%s is not a zone; use e.g. us-central1-b or europe-west4-a.'
        % zone)
  if region is not None and match.group(1) != region:
    raise UsageError(
        '--zone=%s is not inside --region=%s; pick a zone of %s (e.g. %s-a) '
        'or drop --region.' % (zone, region, region, region))


def check_job_id(job_id, region):
  """Accepts a numeric Vertex job ID or its full resource name."""
  match = _JOB_ID_RE.match(job_id or '')
  if not match:
    raise UsageError(
        'JOB_ID=%s: pass the numeric job ID printed by `vertex submit` (or '
        'projects/P/locations/R/customJobs/ID).' % job_id)
  if match.group(1) and match.group(1) != region:
    raise UsageError(
        'JOB_ID=%s lives in %s but --region=%s; pass --region=%s.'
        % (job_id, match.group(1), region, match.group(1)))


def timeout_seconds(text):
  """Parses '2h', '90m', '1h30m' or '3600s' into seconds.

  Raises:
    UsageError: on any other spelling or a zero timeout.
  """
  text = text or ''
  parts = _DURATION_RE.findall(text)
  if not parts or ''.join(n + u for n, u in parts) != text:
    raise UsageError(
        '--timeout=%s: use a duration such as 2h, 90m, 1h30m or 3600s.' % text)
  seconds = sum(int(n) * _DURATION_UNITS[u] for n, u in parts)
  if seconds <= 0:
    raise UsageError('--timeout=%s must be longer than zero.' % text)
  return seconds


def flag_part(trainer_args):
  """The trainer's flags: absl reads what follows its own `--` as positional."""
  if '--' in trainer_args:
    return trainer_args[:trainer_args.index('--')]
  return trainer_args


def _trainer_flag(trainer_args, name):
  """The value of --NAME=V or --NAME V among the trainer flags, else None."""
  trainer_args = flag_part(trainer_args)
  for i, arg in enumerate(trainer_args):
    if arg.startswith('--%s=' % name):
      return arg.split('=', 1)[1]
    if arg == '--' + name and i + 1 < len(trainer_args):
      return trainer_args[i + 1]
  return None


def check_trainer_args(trainer_args):
  """Checks the arguments after `--` before a TPU is paid for.

  estimator_bf16.apps.train_cli cannot start without --model, and the flags the script sets
  itself must not be given twice.

  Raises:
    UsageError: no --model (nor --flagfile), or a flag the script owns.
  """
  if (_trainer_flag(trainer_args, 'model') is None
      and _trainer_flag(trainer_args, 'flagfile') is None):
    raise UsageError(
        'no --model among the trainer arguments: estimator_bf16.apps.train_cli needs one after '
        '`--`, e.g. `-- --model=mnist_mlp --precision=bfloat16`.')
  for arg in flag_part(trainer_args):
    name = arg[2:].split('=', 1)[0] if arg.startswith('--') else None
    if name in _OWNED_TRAINER_FLAGS:
      raise UsageError('trainer argument %s after --: %s.'
                       % (arg, _OWNED_TRAINER_FLAGS[name]))


def check_num_shards(trainer_args, accelerator_type):
  """TPUEstimator runs one shard per core: 8 per host on TPU v2 and v3.

  estimator_bf16.apps.train_cli defaults --num_shards to 8 (one v2-8 or v3-8 host), which is
  why a v2 -> v3 move needs no change while a pod slice needs the total.
  v4 and v5p are left alone: their chips may show as one device per chip.

  Raises:
    UsageError: a --num_shards that differs from the slice's core count, or
      a v2/v3 pod slice without one.
  """
  cores = accelerator_cores(accelerator_type)
  if accelerator_type.split('-')[0] not in ('v2', 'v3'):
    return
  value = _trainer_flag(trainer_args, 'num_shards')
  if value is None and cores > CORES_PER_HOST:
    raise UsageError(
        '%s has %d cores but estimator_bf16.apps.train_cli defaults to 8 shards (one host); '
        'add --num_shards=%d after --.' % (accelerator_type, cores, cores))
  if value is not None and value != str(cores):
    raise UsageError(
        '--num_shards=%s after -- does not match the %d cores of %s: '
        'TPUEstimator runs one shard per core, 8 per host on TPU v2 and v3 '
        'alike; pass --num_shards=%d or drop it.'
        % (value, cores, accelerator_type, cores))


def check_worker(worker, accelerator_type):
  """TPUEstimator on a pod slice needs its input pipeline on every host."""
  if is_pod_slice(accelerator_type) and worker != 'all':
    raise UsageError(
        '--worker=%s on %s: a pod slice runs the trainer on every host; use '
        '--worker=all (the default).' % (worker, accelerator_type))
