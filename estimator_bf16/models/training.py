"""The train / evaluate / export loop behind `python -m estimator_bf16.models.train_cli`.

`TrainOptions` mirrors the CLI flags one to one, so tests and the demo call
`run(TrainOptions(...))` without flags. Unset (None) fields take the model's
defaults from `registry.DEFAULTS`; `prepare` fills them in and checks every
option before any graph is built, naming the flag at fault.
"""

import dataclasses
import os
import time
from typing import Optional

from absl import logging
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16 import accumulation
from estimator_bf16 import activation_stats
from estimator_bf16 import checkpoint_match
from estimator_bf16 import checkpoint_repair
from estimator_bf16 import cluster
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16 import estimator as eb_estimator
from estimator_bf16 import guards
from estimator_bf16.models import bert
from estimator_bf16.models import preflight
from estimator_bf16.models import records
from estimator_bf16.models import registry
from estimator_bf16.models import resnet
from estimator_bf16 import optimizers
from estimator_bf16 import preemption
from estimator_bf16 import progress
from estimator_bf16 import strategies

_MAX_SEQ_LENGTH = 512  # BERT's position table
# Data sets generated in the graph: nothing on disk can be bad.
_GENERATED = ('synthetic',)
# What stops a run with a message rather than a traceback (the CLI prints it
# and exits with status 1).
FAILURES = (records.InputError, guards.NumericGuardError,
            checkpoint_repair.CheckpointError, compat_distribute.WorkerFailure)
# How long the evaluator task waits for the chief's next checkpoint.
_EVALUATOR_WAIT_SECS = 600


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
  model: str
  model_dir: str
  precision: str = 'float32'
  data_dir: Optional[str] = None
  dataset: Optional[str] = None  # None: the real set if data_dir, else built-in
  train_steps: Optional[int] = None
  eval_steps: Optional[int] = None
  train_batch_size: Optional[int] = None  # global: all cores together
  eval_batch_size: Optional[int] = None
  save_checkpoints_steps: Optional[int] = None
  keep_checkpoint_max: int = 5
  use_tpu: bool = False
  tpu: Optional[str] = None
  tpu_zone: Optional[str] = None
  gcp_project: Optional[str] = None
  iterations_per_loop: int = 100
  num_shards: Optional[int] = None  # None: 8 on a TPU
  optimizer: Optional[str] = None
  learning_rate: Optional[float] = None
  weight_decay: Optional[float] = None
  warmup_steps: Optional[int] = None
  resnet_depth: Optional[int] = None
  image_size: Optional[int] = None
  num_classes: Optional[int] = None
  bert_preset: Optional[str] = None
  seq_length: Optional[int] = None
  vocab_size: Optional[int] = None
  seed: int = 0
  log_every_steps: int = 100
  export: bool = True
  numeric_guard: bool = True  # stop on a NaN/Inf loss or gradient
  skip_corrupt_records: bool = False  # skip and count damaged TFRecords
  activation_stats_steps: int = 0  # 0: off; N: bfloat16 ranges every N
  distribute: Optional[str] = None  # None, 'mirrored' or 'multi_worker'
  cpu_devices: Optional[int] = None  # mirrored on N logical CPU devices
  worker_timeout_secs: float = strategies.DEFAULT_TIMEOUT_SECONDS
  accumulate: int = 1  # micro-batches per update (gradient accumulation)
  recompute: bool = False  # recompute activations in backprop


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
  defaults = dict(registry.DEFAULTS[options.model])
  defaults.update(registry.DATASET_DEFAULTS.get(options.dataset, {}))
  options = dataclasses.replace(options, **{
      name: value for name, value in defaults.items()
      if getattr(options, name) is None})
  if options.warmup_steps is None and options.train_steps:
    options = dataclasses.replace(options, warmup_steps=(
        registry.default_warmup_steps(options.model, options.train_steps)))
  return options


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
           '`python -m estimator_bf16.models.digits_cli --out_dir=gs://...` and pass that '
           'directory.')
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
    # The synthetic task (estimator_bf16/models/bert_input.py) needs 8 tokens per sequence
    # and ids for [PAD], [CLS], [SEP], one marker per class and 8 fillers.
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
      eb_estimator.TPU_CORES_PER_BOARD if options.use_tpu else None)
  if not shards:
    return
  for name in ('train_batch_size', 'eval_batch_size'):
    batch = getattr(options, name)
    error = eb_estimator.tpu_batch_error(batch, shards)
    _check(error is None, '--' + name, '%d %s', batch, error)


def _replicas(options, environ=None):
  """Replicas in sync under --distribute (1 without), checking TF_CONFIG.

  Returns:
    (replicas, task): task is the `cluster.Cluster` of a multi-worker run,
    else None.
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
    task = cluster.read_tf_config(environ)
  except cluster.ClusterError as e:
    raise OptionError('--distribute=multi_worker', str(e)) from e
  return task.num_workers * (gpus or 1), task


def _check_replicas(options):
  replicas, _ = _replicas(options)
  if replicas == 1:
    return
  # Evaluation is data parallel only on the devices of one process.
  names = ('train_batch_size',) + (
      ('eval_batch_size',) if options.distribute == 'mirrored' else ())
  for name in names:
    batch = getattr(options, name)
    _check(batch % replicas == 0, '--' + name, '%d is not divisible by the '
           '%d replicas of --distribute=%s: every replica gets the same '
           'share.', batch, replicas, options.distribute)


def _check_levers(options):
  _positive(options, 'accumulate')
  if options.accumulate == 1:
    return
  _check(not options.use_tpu, '--accumulate', 'needs --use_tpu=false: on a '
         'TPU the host cannot run micro-steps inside the training loop.')
  replicas, _ = _replicas(options)
  try:
    accumulation.micro_batch_size(options.train_batch_size,
                                  options.accumulate, replicas,
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
    A `TrainOptions` with no unset model defaults.

  Raises:
    OptionError: naming the flag of the first bad option.
  """
  _check(options.model in registry.MODELS, '--model', 'must be one of %s, '
         'got %r.', ', '.join(registry.MODELS), options.model)
  _check(options.precision in eb.PRECISIONS, '--precision', 'must be one of '
         '%s, got %r.', ', '.join(eb.PRECISIONS), options.precision)
  _check(options.model_dir, '--model_dir', 'is required (checkpoints, '
         'summaries and the export go there).')
  options = _resolve(options)
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
  _check_data(options)
  _check_model_sizes(options)
  _check_shards(options)
  _positive(options, 'cpu_devices')
  _check_replicas(options)
  _check_levers(options)
  return _check_eval_steps(options)


class ThroughputHook(tf.compat.v1.train.SessionRunHook):
  """Measures the steady-state examples/sec (progress.ProgressHook shows it).

  It fetches the global step with each `run` call, so it counts correctly on
  a TPU too, where one call runs `iterations_per_loop` steps.

  Attributes:
    examples_per_sec: float, over the calls after the first `warmup_calls`
      (graph optimisation and memory tracing happen there); None until
      measured.
    window_rates: examples/sec of each run of `window_steps` steps after
      the warm-up, in order: the spread of the rate (a single figure on a
      shared machine can be off by a third).
  """

  def __init__(self, batch_size, warmup_calls=5, window_steps=25):
    self._batch_size = batch_size
    self._warmup_calls = warmup_calls
    self._window_steps = window_steps
    self.examples_per_sec = None
    self.window_rates = []

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    self._calls = 0
    self._start = None  # (step, time) once warmed up

  def before_run(self, run_context):
    # Read alongside the train op: it may see the step before or after the
    # increment, but consistently, so differences between calls are exact.
    return tf.compat.v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    now = time.perf_counter()
    step = int(run_values.results)
    self._calls += 1
    if self._calls == self._warmup_calls:
      self._start = self._window = (step, now)
    elif self._start and step > self._start[0]:
      self.examples_per_sec = (self._batch_size * (step - self._start[0]) /
                               (now - self._start[1]))
      if step - self._window[0] >= self._window_steps:
        self.window_rates.append(self._batch_size * (step - self._window[0]) /
                                 (now - self._window[1]))
        self._window = (step, now)


def _as_python(metrics):
  return {key: value.item() if hasattr(value, 'item') else value
          for key, value in metrics.items()}


def _check_before_training(options, model, replicas=1):
  """Fails on an unwritable model_dir or unreadable data, writing nothing."""
  try:
    preflight.check_model_dir(options.model_dir)
  except preflight.ModelDirError as e:
    raise OptionError('--model_dir', str(e)) from e
  if options.dataset in _GENERATED:
    return
  shards = (eb_estimator.tpu_replicas(options.num_shards) if options.use_tpu
            else replicas)

  def params(batch):
    return {'batch_size': batch // shards, 'precision': options.precision}

  preflight.check_input([
      ('training', model.train_input_fn, params(options.train_batch_size)),
      ('eval', model.eval_input_fn, params(options.eval_batch_size))])


def _advised(numeric):
  """A `NumericGuardError` that also says what to try from the command line."""
  return guards.NumericGuardError(
      '%s Rerun to resume from the last checkpoint with a lower '
      '--learning_rate, or compare with --precision=float32; '
      '--activation_stats_steps=N reports bfloat16 activation ranges.' %
      numeric, numeric.step, numeric.tensors)


def _explained(error, context, step=None):
  """The guard or input error behind a TensorFlow error, or None."""
  numeric = guards.translate_error(error)
  if numeric is not None:
    return _advised(numeric)
  return records.translate_error(error, context, step)


def run(options, hooks=()):
  """Trains, evaluates and exports one model.

  Training resumes from the last readable checkpoint in model_dir. On
  SIGTERM or Ctrl-C (SIGINT) it stops after the current step, the
  Estimator writes a final checkpoint, and `run` returns at once with
  'preempted' set (no eval, no export): run it again to go on.

  With `options.distribute` training is data parallel (docs/distribute.md).
  In a multi-worker run (TF_CONFIG) the chief checks model_dir, writes the
  checkpoints, evaluates and exports; a worker trains only ('eval' None);
  the evaluator task evaluates each new checkpoint instead of training.

  Args:
    options: a `TrainOptions` (checked by `prepare` first).
    hooks: extra training `SessionRunHook`s, e.g. a `PeakMemoryHook`.

  Returns:
    dict with 'options' (the resolved options as a dict), 'train_seconds',
    'examples_per_sec' (steady state; None if training was already done),
    'window_rates' (examples/sec of each 25-step window after the warm-up),
    'eval' (the Estimator's eval results, Python numbers), 'export_dir'
    (str, or None without `options.export`), 'preempted' (bool),
    'stopped_by' (the signal's name, e.g. 'SIGINT', or None),
    'global_step' (after training), 'activation_stats' (the report of
    `ActivationStatsHook`, or None when off) and 'skipped_files' (with
    --skip_corrupt_records: {path: (bytes read, size, times)} of the
    damaged files skipped; else None).

  Raises:
    OptionError: for bad options or an unwritable --model_dir, before any
      graph is built.
    records.InputError: unusable data, naming the file (and the step when
      found during training).
    guards.NumericGuardError: a NaN/Inf loss or gradient, naming the step
      and the tensors; that step's update was not applied.
    checkpoint_repair.CheckpointError: model_dir holds only unreadable checkpoints,
      or the checkpoint of a different model.
    compat_distribute.WorkerFailure: another task of a multi-worker run
      failed or stopped answering (named in the message).
  """
  options = prepare(options)
  replicas, task = _replicas(options)
  model = registry.build(options)
  if task is not None and task.task_type == cluster.EVALUATOR:
    return _evaluate_checkpoints(options, model)
  chief = task is None or task.is_chief
  strategy = None
  if options.distribute:
    strategy = strategies.make_strategy(
        options.distribute, cpu_devices=options.cpu_devices,
        timeout_seconds=options.worker_timeout_secs)
  if chief:
    # model_dir belongs to the chief: the others only read its checkpoints.
    _check_before_training(options, model, replicas)
    checkpoint_repair.ensure_restorable(options.model_dir)
  logging.info('Training %s in %s on %s (%s): %s', options.model,
               options.precision, options.dataset,
               '%d replicas, task %s' % (replicas, task.name if task else
                                         'chief:0'), model.config)
  # On a CPU each session.run is one step; TPUEstimator would still divide
  # its logging interval by iterations_per_loop and log (and write
  # examples/sec summaries) every step.
  steps_per_run = options.iterations_per_loop if options.use_tpu else 1
  estimator = eb.make_tpu_estimator(
      model.model_fn, model_dir=options.model_dir,
      numeric_guard=options.numeric_guard,
      precision=options.precision, use_tpu=options.use_tpu, tpu=options.tpu,
      tpu_zone=options.tpu_zone, gcp_project=options.gcp_project,
      train_batch_size=options.train_batch_size,
      eval_batch_size=options.eval_batch_size,
      predict_batch_size=options.eval_batch_size,
      iterations_per_loop=steps_per_run,
      num_shards=options.num_shards,
      save_checkpoints_steps=options.save_checkpoints_steps,
      keep_checkpoint_max=options.keep_checkpoint_max,
      log_step_count_steps=options.log_every_steps,
      tf_random_seed=options.seed, distribute=strategy,
      gradient_accumulation_steps=options.accumulate,
      recompute=options.recompute)
  throughput = ThroughputHook(options.train_batch_size)
  stopper = preemption.stop_on_signals(steps_per_run)
  shown = progress.ProgressHook(options.train_steps, options.train_batch_size,
                                options.log_every_steps, steps_per_run)
  # The match check goes first: its `begin` fails before other hooks write.
  train_hooks = [checkpoint_match.CheckpointMatchHook(options.model_dir),
                 throughput, shown, stopper.hook]
  stats = None
  if options.activation_stats_steps:
    stats = activation_stats.ActivationStatsHook(
        options.activation_stats_steps, output_path=os.path.join(
            options.model_dir, 'activation_stats.json'))
    train_hooks.append(stats)
  start = time.perf_counter()
  with stopper:
    try:
      estimator.train(model.train_input_fn, max_steps=options.train_steps,
                      hooks=train_hooks + list(hooks))
    except guards.NumericGuardError as e:  # from make_tpu_estimator's guard
      raise _advised(e) from e
    except tf.errors.OpError as e:
      explained = (strategy and compat_distribute.explain(e, strategy)) or (
          _explained(e, 'the training data', stopper.step))
      if explained is None:
        raise
      raise explained from e
  train_seconds = time.perf_counter() - start
  global_step = int(estimator.get_variable_value('global_step'))
  result = {
      'options': dataclasses.asdict(options),
      'train_seconds': train_seconds,
      'examples_per_sec': throughput.examples_per_sec,
      'window_rates': throughput.window_rates,
      'eval': None,
      'export_dir': None,
      'preempted': stopper.requested,
      'stopped_by': stopper.signal_name,
      'global_step': global_step,
      'activation_stats': stats.report if stats else None,
      'skipped_files': None,
  }
  if stopper.requested:
    logging.warning('Stopped by %s at global step %d; the checkpoint is '
                    'written. Run the same command again to resume.',
                    stopper.signal_name, global_step)
    return result
  if not chief:
    # The chief evaluates and exports; it may still be writing the final
    # checkpoint, so global_step above can lag behind.
    return result
  if global_step < options.train_steps:
    # Only an input that ends can stop training early without an error.
    raise records.InputError(
        'The training data ran out at global step %d, before '
        '--train_steps=%d.' % (global_step, options.train_steps))
  try:
    # The match check again: training skips (and checks nothing) when
    # model_dir already holds a checkpoint at or past --train_steps.
    metrics = estimator.evaluate(
        model.eval_input_fn, steps=options.eval_steps,
        hooks=[checkpoint_match.CheckpointMatchHook(options.model_dir)])
  except tf.errors.OpError as e:
    explained = records.translate_error(e, 'the eval data')
    if explained is None:
      raise
    raise explained from e
  logging.info('Eval after %d steps: %s', metrics['global_step'], metrics)
  result['eval'] = _as_python(metrics)
  if model.skipped is not None:
    result['skipped_files'] = dict(model.skipped.files)
    if model.skipped.files:
      logging.warning('--skip_corrupt_records: %s', model.skipped.summary())
  if options.export:
    export_dir = estimator.export_saved_model(
        os.path.join(options.model_dir, 'export'), model.serving_input_fn)
    result['export_dir'] = (export_dir.decode()
                            if isinstance(export_dir, bytes) else export_dir)
  return result


def _evaluate_checkpoints(options, model):
  """The evaluator task: evaluates each new checkpoint until the last one.

  Returns:
    `run`'s result dict, with 'eval' holding the metrics of the checkpoint
    at --train_steps and 'evaluated_steps' the global steps evaluated.

  Raises:
    compat_distribute.WorkerFailure: no checkpoint at --train_steps
      arrived within `_EVALUATOR_WAIT_SECS` of the previous one.
  """
  estimator = eb.make_tpu_estimator(
      model.model_fn, model_dir=options.model_dir, audit='off',
      precision=options.precision, train_batch_size=options.train_batch_size,
      eval_batch_size=options.eval_batch_size,
      log_step_count_steps=options.log_every_steps,
      tf_random_seed=options.seed)
  result = {'options': dataclasses.asdict(options), 'train_seconds': 0.0,
            'examples_per_sec': None, 'window_rates': [], 'eval': None,
            'export_dir': None,
            'preempted': False, 'stopped_by': None, 'global_step': None,
            'activation_stats': None, 'skipped_files': None,
            'evaluated_steps': []}
  for path in tf.train.checkpoints_iterator(
      options.model_dir, min_interval_secs=1,
      timeout=_EVALUATOR_WAIT_SECS):
    metrics = _as_python(estimator.evaluate(
        model.eval_input_fn, steps=options.eval_steps, checkpoint_path=path,
        name='evaluator'))
    logging.info('Evaluator: %s -> %s', path, metrics)
    result['evaluated_steps'].append(metrics['global_step'])
    result['eval'], result['global_step'] = metrics, metrics['global_step']
    if metrics['global_step'] >= options.train_steps:
      return result
  raise compat_distribute.WorkerFailure(
      'Task evaluator:0 stopped: no checkpoint at --train_steps=%d arrived '
      'in %s within %d s of the previous one; did the chief stop?' % (
          options.train_steps, options.model_dir, _EVALUATOR_WAIT_SECS))
