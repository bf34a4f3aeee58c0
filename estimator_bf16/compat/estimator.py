"""An Estimator for TensorFlow 2.16+, built on what tf.compat.v1 still ships.

Each call builds a fresh `tf.Graph`, calls input_fn and model_fn in it and
runs it with `MonitoredTrainingSession` / `MonitoredSession`, so a legacy
model_fn sees what it saw under tf.estimator: graph mode, a global step, a
default graph to add summaries and collections to. Checkpoints are written
by `tf.compat.v1.train.Saver` under tf.estimator's names (`model.ckpt-N`,
`checkpoint`, `graph.pbtxt`), summaries by the v1 summary hooks, exports by
the v1 SavedModel builder, so TensorFlow 2.15's Estimator can read what this
one writes and the other way round.

This module holds the `Estimator` class: its arguments, how it builds a
mode's graph (the part `TPUEstimator` adapts) and its public methods. What
runs the graphs lives next to it: `training_loop`, `evaluation`,
`prediction`, `saved_model` and `checkpoints`.

With `RunConfig(train_distribute=STRATEGY)` training runs data parallel
(`estimator_bf16.compat.distribute`): model_fn once per replica, input_fn
once per worker with `params['batch_size']` per replica, the gradients
all-reduced, checkpoints and summaries written by the chief only.
`eval_distribute` does the same for evaluation on local devices. Predict
and export run on one device.
"""

import copy
import os
import tempfile

from absl import logging
import tensorflow as tf

from estimator_bf16.compat import checkpoints
from estimator_bf16.compat import config as config_lib
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import evaluation
from estimator_bf16.compat import inputs
from estimator_bf16.compat import prediction
from estimator_bf16.compat import saved_model
from estimator_bf16.compat import training_loop
from estimator_bf16.compat import calling

ModeKeys = spec_lib.ModeKeys


def _default_session_config():
  # Ops without a kernel on the chosen device fall back to the CPU, as under
  # tf.estimator's defaults.
  return tf.compat.v1.ConfigProto(allow_soft_placement=True)


def _check_train_steps(steps, max_steps):
  """Raises ValueError unless at most one of them is set, and positive."""
  if steps is not None and max_steps is not None:
    raise ValueError('Give steps or max_steps, not both.')
  for name, value in (('steps', steps), ('max_steps', max_steps)):
    if value is not None and value <= 0:
      raise ValueError('%s must be positive, got %r.' % (name, value))


def as_estimator_spec(spec):
  """Returns `spec` as this module's EstimatorSpec (duck typed on fields).

  tf.estimator's own EstimatorSpec (TF 2.15) is accepted too, so a model_fn
  that imported tensorflow_estimator directly still runs here.

  Raises:
    TypeError: model_fn returned something else (a TPUEstimatorSpec to a
      plain Estimator included: use TPUEstimator for those).
  """
  if isinstance(spec, spec_lib.EstimatorSpec):
    return spec
  if getattr(spec, '_fields', None) == spec_lib.EstimatorSpec._fields:
    return spec_lib.EstimatorSpec(**spec._asdict())
  raise TypeError('model_fn must return an EstimatorSpec, got %s. A '
                  'TPUEstimatorSpec needs TPUEstimator.' % type(spec).__name__)


class Estimator(object):
  """Trains, evaluates, predicts with and exports a legacy model_fn.

  Args:
    model_fn: `(features, labels, mode, params, config)` or any subset with
      `features`, returning an `EstimatorSpec`.
    model_dir: checkpoints, summaries and eval results go here; defaults to
      `config.model_dir`, else a new temporary directory.
    config: a `RunConfig`.
    params: dict of hyperparameters, passed (as a copy) to model_fn and
      input_fn when they take `params`.
    warm_start_from: a checkpoint file or directory whose variables
      initialize the model when `model_dir` has no checkpoint yet.
  """

  def __init__(self, model_fn, model_dir=None, config=None, params=None,
               warm_start_from=None):
    # As tf.estimator does: a model_fn it cannot call fails here.
    calling.model_fn_arg_names(model_fn)
    config = config or config_lib.RunConfig()
    if not isinstance(config, config_lib.RunConfig):
      raise TypeError('config must be an estimator_bf16.compat RunConfig (the'
                      ' class tf.estimator.RunConfig resolves to after '
                      'install()), got %r.' % type(config).__name__)
    if model_dir and config.model_dir and (
        os.fspath(model_dir) != config.model_dir):
      raise ValueError('model_dir %r differs from config.model_dir %r.' %
                       (model_dir, config.model_dir))
    model_dir = os.fspath(model_dir) if model_dir else config.model_dir
    if not model_dir:
      model_dir = tempfile.mkdtemp()
      logging.warning('No model_dir given; using the temporary %s.',
                      model_dir)
    self._model_fn = model_fn
    self._model_dir = model_dir
    self._config = config.replace(model_dir=model_dir)
    self._params = copy.deepcopy(params or {})
    self._warm_start_from = warm_start_from

  @property
  def model_fn(self):
    return self._model_fn

  @property
  def model_dir(self):
    return self._model_dir

  @property
  def config(self):
    return copy.deepcopy(self._config)

  @property
  def params(self):
    return copy.deepcopy(self._params)

  # --- Hooks for TPUEstimator: what params input_fn / model_fn get, and how
  # a model_fn's result becomes an EstimatorSpec.

  def _input_fn_params(self, mode):
    del mode
    return self.params

  def _model_fn_params(self, mode, export):
    del mode, export
    return self.params

  def _to_estimator_spec(self, spec, mode, keep_host_call=True):
    del mode, keep_host_call
    return as_estimator_spec(spec)

  def _replica_params(self, params, mode, strategy):
    """params of one replica; a plain Estimator's are the user's own."""
    del mode, strategy
    return params

  # --- Graph building.

  def _new_graph(self, strategy=None):
    graph = tf.Graph()
    with graph.as_default():
      if self._config.tf_random_seed is not None:
        tf.compat.v1.set_random_seed(self._config.tf_random_seed)
      if strategy is None:
        tf.compat.v1.train.get_or_create_global_step()
      else:
        # A mirrored global step, which the optimizer increments once per
        # step (not once per replica).
        with strategy.scope():
          tf.compat.v1.train.get_or_create_global_step()
    return graph

  def _build_for(self, input_fn, mode, strategy):
    """Builds a TRAIN or EVAL graph, replicated under `strategy` if any."""
    if strategy is None:
      return self._build(input_fn, mode)
    return self._build_replicated(input_fn, mode, strategy)

  def _build(self, input_fn, mode):
    """Builds input and model in the default graph; returns (spec, hooks)."""
    features, labels, hooks = inputs.call_input_fn(
        input_fn, self._input_fn_params(mode), mode, self._config)
    if mode == ModeKeys.PREDICT:
      labels = None
    spec = self._call_model_fn(features, labels, mode)
    return spec, hooks

  def _call_model_fn(self, features, labels, mode, export=False,
                     params=None, keep_host_call=True):
    if params is None:
      params = self._model_fn_params(mode, export)
    spec = calling.call_model_fn(self._model_fn, features, labels, mode,
                                 params, self._config)
    return self._to_estimator_spec(spec, mode, keep_host_call=keep_host_call)

  def _build_replicated(self, input_fn, mode, strategy):
    """Builds input and one model per replica; returns (spec, hooks).

    The returned EstimatorSpec stands for all local replicas
    (`distribute.merge_replica_specs`).
    """
    replicas = compat_distribute.num_local_replicas(strategy)
    input_params = self._replica_params(self._input_fn_params(mode), mode,
                                        strategy)
    model_params = self._replica_params(
        self._model_fn_params(mode, export=False), mode, strategy)
    features, labels, hooks = inputs.call_input_fn(
        input_fn, input_params, mode, self._config,
        input_context=compat_distribute.input_context(strategy),
        replicas=replicas,
        device=compat_distribute.host_device(strategy))
    chief = compat_distribute.is_chief(strategy)

    def build_replica(index):
      # The wrapped model_fn runs here, in the replica's thread: precision
      # rules that are per thread apply to this replica's graph.
      spec = self._call_model_fn(
          features[index], labels[index], mode, params=dict(model_params),
          keep_host_call=(index == 0 and chief))
      metrics = None
      if mode == ModeKeys.EVAL:
        # Each replica's metrics, its mean loss included, are created in
        # its own context so that they aggregate over the replicas.
        metrics = evaluation.metrics_with_loss(spec)
      return spec, metrics

    with strategy.scope():
      built = compat_distribute.call_for_each_replica(strategy, build_replica)
    spec = compat_distribute.merge_replica_specs(
        [spec for spec, _ in built], [metrics for _, metrics in built], mode)
    return spec, hooks

  def _session_config(self, strategy=None):
    config = self._config.session_config or _default_session_config()
    if strategy is not None:
      config = compat_distribute.session_config(strategy, config)
    return config

  # --- Checkpoints.

  def latest_checkpoint(self):
    """Path prefix of the newest checkpoint in model_dir, or None."""
    return tf.train.latest_checkpoint(self._model_dir)

  def get_variable_names(self):
    """Names of the variables in the newest checkpoint."""
    return [name for name, _ in tf.train.list_variables(self._model_dir)]

  def get_variable_value(self, name):
    """Value (numpy array) of variable `name` in the newest checkpoint."""
    return tf.train.load_checkpoint(self._model_dir).get_tensor(name)

  # --- train.

  def train(self, input_fn, hooks=None, steps=None, max_steps=None,
            saving_listeners=None):
    """Trains from the newest checkpoint in model_dir (or from scratch).

    Args:
      input_fn: returns a Dataset (or tensors) of `(features, labels)`.
      hooks: extra `SessionRunHook`s.
      steps: train this many more steps (None: until input_fn runs out).
      max_steps: stop at this global step; if the checkpoint is already
        there, return without training. At most one of steps / max_steps.
      saving_listeners: `CheckpointSaverListener`s around each save.

    Returns:
      self, as tf.estimator does, so calls can be chained.

    Raises:
      compat_distribute.WorkerFailure: under a multi-worker strategy,
        another task failed or stopped answering (the message names it).
    """
    _check_train_steps(steps, max_steps)
    if max_steps is not None and (
        checkpoints.checkpoint_step(self._model_dir) >= max_steps):
      logging.info('Skipping training: the checkpoint in %s is already at '
                   'step >= max_steps=%d.', self._model_dir, max_steps)
      return self
    strategy = self._config.train_distribute
    chief = strategy is None or compat_distribute.is_chief(strategy)
    with training_loop.scratch_dir(strategy, chief) as scratch:
      with self._new_graph(strategy).as_default():
        spec, input_hooks = self._build_for(input_fn, ModeKeys.TRAIN,
                                            strategy)
        checkpoints.warm_start(self._warm_start_from)
        tf.compat.v1.summary.scalar('loss', spec.loss)
        scaffold = spec.scaffold or tf.compat.v1.train.Scaffold()
        checkpoints.add_saver(scaffold, self._config)
        loss = training_loop.run(
            spec, scaffold, input_hooks, hooks, steps, max_steps,
            saving_listeners, self._config, strategy, chief, scratch,
            self._session_config(strategy))
    # tf.estimator's line, word for word and on its logger (which
    # `tf.compat.v1.logging.set_verbosity` controls); people and scripts
    # read it.
    tf.compat.v1.logging.info('Loss for final step: %s.', loss)
    return self

  # --- evaluate.

  def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None,
               name=None):
    """Evaluates the newest (or the given) checkpoint.

    Args:
      input_fn: returns a Dataset (or tensors) of `(features, labels)`.
      steps: batches to evaluate; None runs until input_fn runs out.
      hooks: extra `SessionRunHook`s.
      checkpoint_path: a checkpoint to evaluate instead of the newest.
      name: results and summaries go to `model_dir/eval_<name>` (else
        `model_dir/eval`).

    Returns:
      dict {metric name: numpy value} with `'loss'` (mean over batches, if
      model_fn gave no metric of that name) and `'global_step'` (int64).
    """
    if steps is not None and steps <= 0:
      raise ValueError('steps must be positive, got %r.' % steps)
    checkpoint_path = checkpoint_path or self.latest_checkpoint()
    if checkpoint_path is None:
      logging.warning('No checkpoint in %s: evaluating the initial values.',
                      self._model_dir)
    strategy = self._config.eval_distribute
    with self._new_graph(strategy).as_default():
      spec, input_hooks = self._build_for(input_fn, ModeKeys.EVAL, strategy)
      results = evaluation.run_evaluation(
          spec, input_hooks, hooks, steps, checkpoint_path,
          self._session_config(strategy))
    evaluation.write_summary(results, self._model_dir, name)
    return results

  # --- predict.

  def predict(self, input_fn, predict_keys=None, hooks=None,
              checkpoint_path=None, yield_single_examples=True):
    """Yields predictions of the newest (or the given) checkpoint.

    Args:
      input_fn: returns a Dataset (or tensors) of features (labels, if any,
        are ignored). Runs until it is exhausted.
      predict_keys: a key or list of keys of a dict of predictions to keep.
      hooks: extra `SessionRunHook`s.
      checkpoint_path: a checkpoint to use instead of the newest.
      yield_single_examples: True yields one example at a time (each value
        without its batch dimension); False yields whole batches.

    Yields:
      dicts of numpy arrays (or arrays, if predictions is one tensor).
    """
    checkpoint_path = checkpoint_path or self.latest_checkpoint()
    if checkpoint_path is None:
      logging.warning('No checkpoint in %s: predicting with the initial '
                      'values.', self._model_dir)
    with self._new_graph().as_default():
      spec, input_hooks = self._build(input_fn, ModeKeys.PREDICT)
      yield from prediction.run_predictions(
          spec, input_hooks, hooks, predict_keys, checkpoint_path,
          self._session_config(), yield_single_examples)

  # --- export.

  def export_saved_model(self, export_dir_base, serving_input_receiver_fn,
                         assets_extra=None, as_text=False,
                         checkpoint_path=None,
                         experimental_mode=ModeKeys.PREDICT):
    """Writes a SavedModel (tag 'serve') under `export_dir_base/<timestamp>`.

    Args:
      export_dir_base: parent directory of the timestamped export.
      serving_input_receiver_fn: returns a `ServingInputReceiver` (or
        `TensorServingInputReceiver`) of placeholders.
      assets_extra: {path inside assets.extra: source file} to copy along.
      as_text: write saved_model.pbtxt instead of saved_model.pb.
      checkpoint_path: the checkpoint to export (default: the newest).
      experimental_mode: only PREDICT is supported.

    Returns:
      bytes, the export directory (tf.estimator returns bytes too).

    Raises:
      ValueError: there is no checkpoint, or no signature could be built.
    """
    if experimental_mode != ModeKeys.PREDICT:
      raise NotImplementedError('Only PREDICT graphs are exported by the TF '
                                '2.16+ backend.')
    checkpoint_path = checkpoint_path or self.latest_checkpoint()
    if checkpoint_path is None:
      raise ValueError("Couldn't find a trained model in %s: train first." %
                       self._model_dir)
    with self._new_graph().as_default():
      receiver = serving_input_receiver_fn()
      if not hasattr(receiver, 'receiver_tensors'):
        raise TypeError('serving_input_receiver_fn must return a '
                        'ServingInputReceiver, got %r.' % (receiver,))
      spec = self._call_model_fn(receiver.features, None, ModeKeys.PREDICT,
                                 export=True)
      export_dir = saved_model.write_saved_model(
          spec, receiver, checkpoint_path, export_dir_base, assets_extra,
          as_text, self._session_config())
    return export_dir.encode('utf-8')

  # The TF 1.x spelling, still used by older programs.
  export_savedmodel = export_saved_model
