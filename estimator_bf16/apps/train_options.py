"""The options of one training run, their defaults and their checks.

`TrainOptions` mirrors the flags of `python -m estimator_bf16.apps.train_cli`
one to one, so tests and programs build a run by keyword without flags.
Unset (None) fields take the defaults of the model and data set
(`registry.defaults`); `prepare` fills them in and checks every option
before any graph is built, raising an `OptionError` that names the flag at
fault.
"""

import dataclasses
from typing import Optional

import tensorflow as tf

from estimator_bf16.apps import registry
from estimator_bf16.distribute import cluster as cluster_lib
from estimator_bf16.distribute import strategies
from estimator_bf16.estimator import options as options_lib
from estimator_bf16.levers import accumulation
from estimator_bf16.models import bert
from estimator_bf16.models import resnet
from estimator_bf16.optimizers import registry as optimizers
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.precision import policy

_MAX_SEQ_LENGTH = 512  # BERT's position table


class OptionError(ValueError):
  """A bad option; `flag` is the CLI flag to fix, e.g. '--data_dir'."""

  def __init__(self, flag, message):
    super().__init__('%s: %s' % (flag, message))
    self.flag = flag


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  """One training run; each field is the CLI flag of the same name.

  None means "the model's default" (`registry.DEFAULTS`), except for
  `data_dir` (None: the built-in data), `eval_steps` (None: the whole eval
  split when its size is known) and the TPU fields.
  """
  # The run: which model, where its files go, in which precision.
  model: str
  model_dir: str
  precision: str = 'float32'  # a `Precision` once `prepare`d
  # Data, steps and checkpoints.
  data_dir: Optional[str] = None
  dataset: Optional[str] = None  # None: the real set if data_dir, else built-in
  train_steps: Optional[int] = None
  eval_steps: Optional[int] = None
  train_batch_size: Optional[int] = None  # global: all cores together
  eval_batch_size: Optional[int] = None
  save_checkpoints_steps: Optional[int] = None
  keep_checkpoint_max: int = options_lib.ESTIMATOR_DEFAULTS.keep_checkpoint_max
  # TPU.
  use_tpu: bool = False
  tpu: Optional[str] = None
  tpu_zone: Optional[str] = None
  gcp_project: Optional[str] = None
  iterations_per_loop: int = (
      options_lib.ESTIMATOR_DEFAULTS.iterations_per_loop)
  num_shards: Optional[int] = None  # None: 8 on a TPU
  # Optimizer.
  optimizer: Optional[str] = None
  learning_rate: Optional[float] = None
  weight_decay: Optional[float] = None
  warmup_steps: Optional[int] = None
  # Model size.
  resnet_depth: Optional[int] = None
  image_size: Optional[int] = None
  num_classes: Optional[int] = None
  bert_preset: Optional[str] = None
  seq_length: Optional[int] = None
  vocab_size: Optional[int] = None
  # Seed, logging and export.
  seed: int = 0
  log_every_steps: int = 100
  export: bool = True
  # Safety.
  numeric_guard: bool = True  # stop on a NaN/Inf loss or gradient
  skip_corrupt_records: bool = False  # skip and count damaged TFRecords
  activation_stats_steps: int = 0  # 0: off; N: bfloat16 ranges every N
  # Distribution on CPUs and GPUs.
  distribute: Optional[str] = None  # None, 'mirrored' or 'multi_worker'
  cpu_devices: Optional[int] = None  # mirrored on N logical CPU devices
  worker_timeout_secs: float = strategies.DEFAULT_TIMEOUT_SECONDS
  # Memory levers.
  # micro-batches per update (gradient accumulation)
  accumulate: int = options_lib.WRAP_DEFAULTS.gradient_accumulation_steps
  recompute: bool = options_lib.WRAP_DEFAULTS.recompute  # in backprop


def _check(condition, flag, message, *args):
  if not condition:
    raise OptionError(flag, message % args)


def _positive(options, *names):
  for name in names:
    value = getattr(options, name)
    _check(value is None or (isinstance(value, int) and value > 0),
           '--' + name, 'must be a positive integer, got %r.', value)


def _resolve(options):
  """Fills unset fields from the data set's, then the model's defaults."""
  if options.dataset is None:
    datasets = registry.DATASETS[options.model]
    options = dataclasses.replace(
        options, dataset=datasets[1] if options.data_dir else datasets[0])
  defaults = registry.defaults(options.model, options.dataset)
  options = dataclasses.replace(options, **{
      name: value for name, value in defaults.items()
      if getattr(options, name) is None})
  if options.warmup_steps is None and options.train_steps:
    options = dataclasses.replace(options, warmup_steps=(
        registry.default_warmup_steps(options.model, options.train_steps)))
  return options


def _check_scalars(options):
  """Checks the options that stand alone, after defaults are filled in."""
  _check(options.optimizer in optimizers.OPTIMIZERS, '--optimizer',
         'must be one of %s, got %r.', ', '.join(optimizers.OPTIMIZERS),
         options.optimizer)
  _positive(options, 'train_steps', 'eval_steps', 'train_batch_size',
            'eval_batch_size', 'save_checkpoints_steps', 'keep_checkpoint_max',
            'iterations_per_loop', 'num_shards', 'log_every_steps')
  _check(options.activation_stats_steps >= 0, '--activation_stats_steps',
         'must be >= 0, got %r.', options.activation_stats_steps)
  _check(options.learning_rate > 0, '--learning_rate', 'must be > 0, got %r.',
         options.learning_rate)
  _check(options.weight_decay >= 0, '--weight_decay', 'must be >= 0, got %r.',
         options.weight_decay)
  _check(options.warmup_steps >= 0, '--warmup_steps', 'must be >= 0, got %r.',
         options.warmup_steps)
  _check(not options.use_tpu or options.tpu, '--tpu', '--use_tpu needs the '
         "TPU's name or address (or 'local' on a TPU VM).")


def _check_data(options):
  datasets = registry.DATASETS[options.model]
  _check(options.dataset in datasets, '--dataset',
         '--model=%s reads one of %s, got %r.', options.model,
         ', '.join(datasets), options.dataset)
  builtin = options.dataset == datasets[0]
  if builtin:
    _check(not options.data_dir, '--data_dir',
           '--dataset=%s is built in and reads no --data_dir; drop one.',
           options.dataset)
    # The generated digits sit in a local cache that TPU hosts cannot read.
    _check(not (options.use_tpu and options.dataset == 'digits' and
                options.tpu != 'local'), '--data_dir',
           'a Cloud TPU reads data from gs://: write the digits with '
           '`python -m estimator_bf16.apps.digits_cli --out_dir=gs://...` '
           'and pass that directory.')
    return
  _check(options.data_dir, '--data_dir', '--dataset=%s is a real data set '
         'and needs --data_dir (the directory holding its TFRecords).',
         options.dataset)
  for pattern in registry.data_files(options.dataset, options.data_dir):
    _check(tf.io.gfile.glob(pattern), '--data_dir', 'no files match %s.',
           pattern)


def _check_model_sizes(options):
  _check(options.num_classes >= 2, '--num_classes', 'must be >= 2, got %r.',
         options.num_classes)
  if options.model == 'resnet':
    _check(options.resnet_depth in resnet.DEPTHS, '--resnet_depth',
           'must be one of %s, got %r.', resnet.DEPTHS, options.resnet_depth)
    _check(options.image_size >= 32, '--image_size',
           'ResNet needs images of at least 32x32, got %r.',
           options.image_size)
  elif options.model == 'bert':
    _check(options.bert_preset in bert.PRESETS, '--bert_preset',
           'must be one of %s, got %r.', ', '.join(bert.PRESETS),
           options.bert_preset)
    # The synthetic task (estimator_bf16/models/bert_input.py) needs 8
    # tokens per sequence and ids for [PAD], [CLS], [SEP], one marker per
    # class and 8 fillers.
    shortest = 8 if options.dataset == 'synthetic' else 2
    _check(shortest <= options.seq_length <= _MAX_SEQ_LENGTH, '--seq_length',
           'must be in %d..%d, got %r.', shortest, _MAX_SEQ_LENGTH,
           options.seq_length)
    smallest = options.num_classes + 11 if options.dataset == 'synthetic' else 2
    _check(options.vocab_size >= smallest, '--vocab_size',
           'must be >= %d here, got %r.', smallest, options.vocab_size)
  elif options.dataset == 'digits':
    _check(options.image_size == 28, '--image_size',
           'the built-in digits are 28x28, got %r.', options.image_size)


def _check_shards(options):
  shards = options.num_shards or (
      tpu_facts.TPU_CORES_PER_BOARD if options.use_tpu else None)
  if not shards:
    return
  for name in ('train_batch_size', 'eval_batch_size'):
    batch = getattr(options, name)
    error = tpu_facts.tpu_batch_error(batch, shards)
    _check(error is None, '--' + name, '%d %s', batch, error)


def replicas(options, environ=None):
  """Replicas in sync under --distribute (1 without), checking TF_CONFIG.

  Args:
    options: a `TrainOptions`.
    environ: the environment holding TF_CONFIG; None: `os.environ`.

  Returns:
    (replicas, task): replicas is an int; task is the `cluster.Cluster` of
    a multi-worker run, else None.

  Raises:
    OptionError: a bad --distribute, --cpu_devices, --worker_timeout_secs
      or TF_CONFIG.
  """
  _check(options.distribute in (None,) + strategies.KINDS, '--distribute',
         'must be one of %s, got %r.', ', '.join(strategies.KINDS),
         options.distribute)
  if options.distribute is None:
    _check(options.cpu_devices is None, '--cpu_devices',
           'needs --distribute=mirrored.')
    return 1, None
  _check(not options.use_tpu, '--distribute', 'is for CPUs and GPUs; on a '
         'TPU, --use_tpu already trains data parallel on --num_shards cores.')
  gpus = len(tf.config.list_physical_devices('GPU'))
  if options.distribute == 'mirrored':
    return options.cpu_devices or gpus or 1, None
  _check(options.cpu_devices is None, '--cpu_devices', 'needs '
         '--distribute=mirrored; multi_worker runs one replica per process '
         'on a CPU.')
  _check(options.worker_timeout_secs > 0, '--worker_timeout_secs',
         'must be > 0, got %r.', options.worker_timeout_secs)
  try:
    task = cluster_lib.read_tf_config(environ)
  except cluster_lib.ClusterError as e:
    raise OptionError('--distribute=multi_worker', str(e)) from e
  return task.num_workers * (gpus or 1), task


def _check_replicas(options):
  count, _ = replicas(options)
  if count == 1:
    return
  # Evaluation is data parallel only on the devices of one process.
  names = ('train_batch_size',) + (
      ('eval_batch_size',) if options.distribute == 'mirrored' else ())
  for name in names:
    batch = getattr(options, name)
    _check(batch % count == 0, '--' + name, '%d is not divisible by the '
           '%d replicas of --distribute=%s: every replica gets the same '
           'share.', batch, count, options.distribute)


def _check_levers(options):
  _positive(options, 'accumulate')
  if options.accumulate == 1:
    return
  _check(not options.use_tpu, '--accumulate', 'needs --use_tpu=false: on a '
         'TPU the host cannot run micro-steps inside the training loop.')
  count, _ = replicas(options)
  try:
    accumulation.micro_batch_size(options.train_batch_size,
                                  options.accumulate, count,
                                  'replicas of --distribute')
  except ValueError as e:
    raise OptionError('--accumulate', str(e)) from e


def _check_eval_steps(options):
  if options.eval_steps is not None:
    return options
  examples = registry.eval_examples(options.dataset)
  if examples is None:
    # Unknown size: the Estimator reads to the end, which TPUs cannot do.
    _check(not options.use_tpu, '--eval_steps',
           'must be set for --dataset=%s on a TPU.', options.dataset)
    return options
  steps = examples // options.eval_batch_size
  _check(steps > 0, '--eval_batch_size', '%d exceeds the %d eval examples.',
         options.eval_batch_size, examples)
  return dataclasses.replace(options, eval_steps=steps)


def prepare(options):
  """Returns `options` with defaults filled in, after checking them all.

  Args:
    options: a `TrainOptions`.

  Returns:
    A `TrainOptions` with no unset model defaults, its precision a
    `Precision`.

  Raises:
    OptionError: naming the flag of the first bad option.
  """
  _check(options.model in registry.MODELS, '--model', 'must be one of %s, '
         'got %r.', ', '.join(registry.MODELS), options.model)
  try:
    # Parsed once: training, the estimator and the input_fns get the value.
    options = dataclasses.replace(
        options, precision=policy.parse_precision(options.precision))
  except ValueError as e:
    raise OptionError('--precision', str(e)) from e
  _check(options.model_dir, '--model_dir', 'is required (checkpoints, '
         'summaries and the export go there).')
  options = _resolve(options)
  _check_scalars(options)
  _check_data(options)
  _check_model_sizes(options)
  _check_shards(options)
  _positive(options, 'cpu_devices')
  _check_replicas(options)
  _check_levers(options)
  return _check_eval_steps(options)
