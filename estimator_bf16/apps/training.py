"""The train / evaluate / export loop behind the training CLI.

`run(TrainOptions(...))` is what `python -m estimator_bf16.apps.train_cli`
calls, and what tests and the demo call without flags. The options, their
defaults and checks live in `train_options`; `TrainOptions`, `OptionError`
and `prepare` are named here too, so one import serves a program. Besides
the loop, this module holds `ThroughputHook` (steady-state examples/sec)
and the translation of TensorFlow errors into messages naming the flag,
file or step to fix.
"""

import dataclasses
import os
import time

from absl import logging
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import preflight
from estimator_bf16.apps import progress
from estimator_bf16.apps import registry
from estimator_bf16.apps import train_options
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.distribute import cluster as cluster_lib
from estimator_bf16.distribute import strategies
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.models import records
from estimator_bf16.safety import activation_stats
from estimator_bf16.safety import checkpoint_match
from estimator_bf16.safety import checkpoint_repair
from estimator_bf16.safety import guards
from estimator_bf16.safety import preemption

OptionError = train_options.OptionError
TrainOptions = train_options.TrainOptions
prepare = train_options.prepare

# Data sets generated in the graph: nothing on disk can be bad.
_GENERATED = ('synthetic',)
# What stops a run with a message rather than a traceback (the CLI prints it
# and exits with status 1).
FAILURES = (records.InputError, guards.NumericGuardError,
            checkpoint_repair.CheckpointError, compat_distribute.WorkerFailure)
# How long the evaluator task waits for the chief's next checkpoint.
_EVALUATOR_WAIT_SECS = 600


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


def _result(options, **values):
  """`run`'s result dict: nothing trained or evaluated yet, then `values`."""
  result = {
      'options': dataclasses.asdict(options),
      'train_seconds': 0.0,
      'examples_per_sec': None,
      'window_rates': [],
      'eval': None,
      'export_dir': None,
      'preempted': False,
      'stopped_by': None,
      'global_step': None,
      'activation_stats': None,
      'skipped_files': None,
  }
  result.update(values)
  return result


def _check_before_training(options, model, replicas=1):
  """Fails on an unwritable model_dir or unreadable data, writing nothing."""
  try:
    preflight.check_model_dir(options.model_dir)
  except preflight.ModelDirError as e:
    raise OptionError('--model_dir', str(e)) from e
  if options.dataset in _GENERATED:
    return
  shards = (tpu_facts.tpu_replicas(options.num_shards) if options.use_tpu
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
    checkpoint_repair.CheckpointError: model_dir holds only unreadable
      checkpoints, or the checkpoint of a different model.
    compat_distribute.WorkerFailure: another task of a multi-worker run
      failed or stopped answering (named in the message).
  """
  options = prepare(options)
  replicas, task = train_options.replicas(options)
  model = registry.build(options)
  if task is not None and task.task_type == cluster_lib.EVALUATOR:
    return _evaluate_checkpoints(options, model)
  chief = task is None or task.is_chief
  strategy = _strategy(options)
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
  estimator = _make_estimator(options, model, strategy, steps_per_run)
  result = _train(estimator, options, model, strategy, steps_per_run, hooks)
  if result['preempted']:
    logging.warning('Stopped by %s at global step %d; the checkpoint is '
                    'written. Run the same command again to resume.',
                    result['stopped_by'], result['global_step'])
    return result
  if not chief:
    # The chief evaluates and exports; it may still be writing the final
    # checkpoint, so the global step read after training can lag behind.
    return result
  if result['global_step'] < options.train_steps:
    # Only an input that ends can stop training early without an error.
    raise records.InputError(
        'The training data ran out at global step %d, before '
        '--train_steps=%d.' % (result['global_step'], options.train_steps))
  _evaluate_and_export(estimator, options, model, result)
  return result


def _strategy(options):
  """The `tf.distribute` strategy of `--distribute`, or None."""
  if not options.distribute:
    return None
  return strategies.make_strategy(
      options.distribute, cpu_devices=options.cpu_devices,
      timeout_seconds=options.worker_timeout_secs)


def _make_estimator(options, model, strategy, steps_per_run):
  """The wrapped TPUEstimator of a training run (chief or worker)."""
  return eb.make_tpu_estimator(
      model.model_fn, model_dir=options.model_dir,
      precision=options.precision, use_tpu=options.use_tpu, tpu=options.tpu,
      train_batch_size=options.train_batch_size,
      eval_batch_size=options.eval_batch_size,
      predict_batch_size=options.eval_batch_size, distribute=strategy,
      options=eb.WrapOptions(gradient_accumulation_steps=options.accumulate,
                             recompute=options.recompute),
      estimator_options=eb.EstimatorOptions(
          iterations_per_loop=steps_per_run, num_shards=options.num_shards,
          tpu_zone=options.tpu_zone, gcp_project=options.gcp_project,
          save_checkpoints_steps=options.save_checkpoints_steps,
          keep_checkpoint_max=options.keep_checkpoint_max,
          log_step_count_steps=options.log_every_steps,
          tf_random_seed=options.seed,
          numeric_guard=options.numeric_guard))


def _train(estimator, options, model, strategy, steps_per_run, hooks):
  """Trains to --train_steps or a stop signal.

  Returns:
    `run`'s result dict, before evaluation and export.
  """
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
  return _result(
      options, train_seconds=time.perf_counter() - start,
      examples_per_sec=throughput.examples_per_sec,
      window_rates=throughput.window_rates,
      preempted=stopper.requested, stopped_by=stopper.signal_name,
      global_step=int(estimator.get_variable_value('global_step')),
      activation_stats=stats.report if stats else None)


def _evaluate_and_export(estimator, options, model, result):
  """Evaluates the last checkpoint and exports it, filling in `result`."""
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
      model.model_fn, model_dir=options.model_dir,
      precision=options.precision, train_batch_size=options.train_batch_size,
      eval_batch_size=options.eval_batch_size,
      options=eb.WrapOptions(audit='off'),
      estimator_options=eb.EstimatorOptions(
          log_step_count_steps=options.log_every_steps,
          tf_random_seed=options.seed))
  result = _result(options, evaluated_steps=[])
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
