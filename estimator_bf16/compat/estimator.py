"""An Estimator for TensorFlow 2.16+, built on what tf.compat.v1 still ships.

Each call builds a fresh `tf.Graph`, calls input_fn and model_fn in it and
runs it with `MonitoredTrainingSession` / `MonitoredSession`, so a legacy
model_fn sees what it saw under tf.estimator: graph mode, a global step, a
default graph to add summaries and collections to. Checkpoints are written
by `tf.compat.v1.train.Saver` under tf.estimator's names (`model.ckpt-N`,
`checkpoint`, `graph.pbtxt`), summaries by the v1 summary hooks, exports by
the v1 SavedModel builder, so TensorFlow 2.15's Estimator can read what this
one writes and the other way round.

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
import time

from absl import logging
import numpy as np
import tensorflow as tf

from estimator_bf16.compat import config as config_lib
from estimator_bf16.compat import distribute
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import export as export_lib
from estimator_bf16.compat import inputs
from estimator_bf16.compat import step_deadline

ModeKeys = spec_lib.ModeKeys
# What tf.distribute's own sessions use when asked to save by time.
_MULTI_WORKER_SAVE_STEPS = 1000


def _default_session_config():
  # Ops without a kernel on the chosen device fall back to the CPU, as under
  # tf.estimator's defaults.
  return tf.compat.v1.ConfigProto(allow_soft_placement=True)


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
    inputs.arg_names(model_fn, 'model_fn')
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
    spec = inputs.call_model_fn(self._model_fn, features, labels, mode,
                                params, self._config)
    return self._to_estimator_spec(spec, mode, keep_host_call=keep_host_call)

  def _build_replicated(self, input_fn, mode, strategy):
    """Builds input and one model per replica; returns (spec, hooks).

    The returned EstimatorSpec stands for all local replicas: the mean of
    their losses, their train ops grouped, each eval metric's value (the
    metrics aggregate over the replicas themselves) with every replica's
    update; hooks, scaffold and predictions are the first replica's.
    """
    replicas = distribute.num_local_replicas(strategy)
    input_params = self._replica_params(self._input_fn_params(mode), mode,
                                        strategy)
    model_params = self._replica_params(
        self._model_fn_params(mode, export=False), mode, strategy)
    features, labels, hooks = inputs.call_input_fn(
        input_fn, input_params, mode, self._config,
        input_context=distribute.input_context(strategy), replicas=replicas,
        device=distribute.host_device(strategy))
    chief = distribute.is_chief(strategy)

    def build_replica(index):
      # The wrapped model_fn runs here, in the replica's thread: precision
      # rules that are per thread apply to this replica's graph.
      spec = self._call_model_fn(
          features[index], labels[index], mode, params=dict(model_params),
          keep_host_call=(index == 0 and chief))
      metrics = None
      if mode == ModeKeys.EVAL:
        metrics = dict(spec.eval_metric_ops)
        if 'loss' not in metrics:
          metrics['loss'] = tf.compat.v1.metrics.mean(spec.loss)
      return spec, metrics

    with strategy.scope():
      built = distribute.call_for_each_replica(strategy, build_replica)
    specs = [spec for spec, _ in built]
    first = specs[0]
    loss = tf.add_n([spec.loss for spec in specs]) / float(len(specs))
    eval_metric_ops = None
    if mode == ModeKeys.EVAL:
      eval_metric_ops = {
          key: (value, tf.group(*[m[key][1] for _, m in built]))
          for key, (value, _) in built[0][1].items()}
    train_op = None
    if mode == ModeKeys.TRAIN:
      train_op = tf.group(*[spec.train_op for spec in specs])
    spec = spec_lib.EstimatorSpec(
        mode=mode, loss=loss, train_op=train_op,
        eval_metric_ops=eval_metric_ops, scaffold=first.scaffold,
        training_hooks=first.training_hooks,
        training_chief_hooks=first.training_chief_hooks,
        evaluation_hooks=first.evaluation_hooks)
    return spec, hooks

  def _session_config(self, strategy=None):
    config = self._config.session_config or _default_session_config()
    if strategy is not None:
      config = distribute.session_config(strategy, config)
    return config

  def latest_checkpoint(self):
    """Path prefix of the newest checkpoint in model_dir, or None."""
    return tf.train.latest_checkpoint(self._model_dir)

  def get_variable_names(self):
    """Names of the variables in the newest checkpoint."""
    return [name for name, _ in tf.train.list_variables(self._model_dir)]

  def get_variable_value(self, name):
    """Value (numpy array) of variable `name` in the newest checkpoint."""
    return tf.train.load_checkpoint(self._model_dir).get_tensor(name)

  def _checkpoint_step(self):
    path = self.latest_checkpoint()
    if path is None:
      return 0
    return int(tf.train.load_checkpoint(path).get_tensor(
        tf.compat.v1.GraphKeys.GLOBAL_STEP))

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
      distribute.WorkerFailure: under a multi-worker strategy, another task
        failed or stopped answering (the message names it).
    """
    if steps is not None and max_steps is not None:
      raise ValueError('Give steps or max_steps, not both.')
    for name, value in (('steps', steps), ('max_steps', max_steps)):
      if value is not None and value <= 0:
        raise ValueError('%s must be positive, got %r.' % (name, value))
    if max_steps is not None and self._checkpoint_step() >= max_steps:
      logging.info('Skipping training: the checkpoint in %s is already at '
                   'step >= max_steps=%d.', self._model_dir, max_steps)
      return self
    strategy = self._config.train_distribute
    chief = strategy is None or distribute.is_chief(strategy)
    scratch = None
    if not chief:
      # Every task of a multi-worker job must run the same session calls
      # (collective ops are matched call by call), so the other workers
      # run the chief's checkpoint and summary hooks too, writing into a
      # throw-away directory: tf.distribute's own recipe.
      scratch = tempfile.mkdtemp(prefix='estimator_bf16_%s_' % (
          distribute.task_name(strategy).replace(':', '')))
    try:
      return self._train(input_fn, hooks, steps, max_steps,
                         saving_listeners, strategy, chief, scratch)
    finally:
      if scratch:
        tf.io.gfile.rmtree(scratch)

  def _train(self, input_fn, hooks, steps, max_steps, saving_listeners,
             strategy, chief, scratch):
    """train() in the graph of one task; `scratch` is set off the chief."""
    with self._new_graph(strategy).as_default():
      global_step = tf.compat.v1.train.get_global_step()
      if strategy is None:
        spec, input_hooks = self._build(input_fn, ModeKeys.TRAIN)
      else:
        spec, input_hooks = self._build_replicated(input_fn, ModeKeys.TRAIN,
                                                   strategy)
      self._warm_start()
      tf.compat.v1.summary.scalar('loss', spec.loss)
      scaffold = spec.scaffold or tf.compat.v1.train.Scaffold()
      self._add_saver(scaffold)
      config = self._config
      every = config.log_step_count_steps
      all_hooks = [tf.compat.v1.train.NanTensorHook(spec.loss)]
      if steps is not None or max_steps is not None:
        # Without either, training runs until input_fn's data run out.
        all_hooks.append(tf.compat.v1.train.StopAtStepHook(
            num_steps=steps, last_step=max_steps))
      all_hooks += input_hooks + list(spec.training_hooks) + list(hooks or [])
      deadline = step_deadline.hook_for(strategy)
      if deadline:
        # First: its step ends (after_run) before the other hooks' after_run,
        # checkpoint saves included, run.
        all_hooks.insert(0, deadline)
      if every:
        all_hooks.append(tf.compat.v1.train.LoggingTensorHook(
            {'loss': spec.loss, 'step': global_step}, every_n_iter=every))
      chief_hooks = list(spec.training_chief_hooks) if chief else []
      save_steps = config.save_checkpoints_steps
      save_secs = config.save_checkpoints_secs
      if save_secs and strategy is not None and (
          distribute.is_multi_worker(strategy)):
        # Timers fire at different steps in different tasks; the saves
        # must happen at the same step everywhere.
        logging.warning('save_checkpoints_secs=%s: a multi-worker job saves '
                        'by steps; saving every %d steps instead.',
                        save_secs, _MULTI_WORKER_SAVE_STEPS)
        save_steps, save_secs = _MULTI_WORKER_SAVE_STEPS, None
      if save_steps or save_secs:
        chief_hooks.append(tf.compat.v1.train.CheckpointSaverHook(
            scratch or self._model_dir, save_secs=save_secs,
            save_steps=save_steps, scaffold=scaffold,
            listeners=saving_listeners if chief else None,
            save_graph_def=config.checkpoint_save_graph_def))
      elif saving_listeners:
        raise ValueError('saving_listeners need checkpoints: set '
                         'save_checkpoints_steps or save_checkpoints_secs.')
      session_config = self._session_config(strategy)
      target = ''
      if strategy is not None:
        target = distribute.session_target(strategy, session_config)
      # Every worker restores the newest checkpoint of model_dir (the
      # chief's) or, on a fresh start, initializes: a multi-worker strategy
      # broadcasts the chief's initial values. So each opens its session
      # as a "chief" of its own variables.
      if strategy is not None and distribute.is_multi_worker(strategy):
        session = _multi_worker_session(
            target, self._model_dir, scratch or self._model_dir, scaffold,
            all_hooks + chief_hooks, session_config, every,
            config.save_summary_steps)
      else:
        session = tf.compat.v1.train.MonitoredTrainingSession(
            master=target, is_chief=True,
            checkpoint_dir=self._model_dir, scaffold=scaffold,
            hooks=all_hooks, chief_only_hooks=chief_hooks,
            save_checkpoint_secs=None, save_checkpoint_steps=None,
            save_summaries_steps=config.save_summary_steps or None,
            save_summaries_secs=None, config=session_config,
            log_step_count_steps=every or None,
            max_wait_secs=config.session_creation_timeout_secs)
      try:
        with session:
          try:
            while not session.should_stop():
              session.run([spec.train_op, spec.loss])
          except BaseException:
            # Before the session closes: a failed step's error, not the
            # backstop, is what the task reports.
            if deadline:
              deadline.stop()
            raise
      except tf.errors.OpError as e:
        failure = strategy and distribute.explain(e, strategy)
        if failure:
          raise failure from e
        raise
      finally:
        # After a clean close: the final checkpoint save was watched too.
        if deadline:
          deadline.stop()
    return self

  def _add_saver(self, scaffold):
    """A Saver with keep_checkpoint_max, unless model_fn brought its own."""
    if scaffold.saver or tf.compat.v1.get_collection(
        tf.compat.v1.GraphKeys.SAVERS):
      return
    config = self._config
    tf.compat.v1.add_to_collection(
        tf.compat.v1.GraphKeys.SAVERS,
        tf.compat.v1.train.Saver(
            sharded=True, max_to_keep=config.keep_checkpoint_max,
            keep_checkpoint_every_n_hours=(
                config.keep_checkpoint_every_n_hours),
            defer_build=True, save_relative_paths=True))

  def _warm_start(self):
    source = self._warm_start_from
    if source is None:
      return
    path = getattr(source, 'ckpt_to_initialize_from', source)
    variables = getattr(source, 'vars_to_warm_start', '.*')
    renames = getattr(source, 'var_name_to_prev_var_name', None)
    tf.compat.v1.train.warm_start(os.fspath(path), vars_to_warm_start=variables,
                                  var_name_to_prev_var_name=renames)

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
      global_step = tf.compat.v1.train.get_global_step()
      if strategy is None:
        spec, input_hooks = self._build(input_fn, ModeKeys.EVAL)
      else:
        spec, input_hooks = self._build_replicated(input_fn, ModeKeys.EVAL,
                                                   strategy)
      metrics = dict(spec.eval_metric_ops)
      if 'loss' not in metrics:
        metrics['loss'] = tf.compat.v1.metrics.mean(spec.loss)
      values = {key: value for key, (value, _) in metrics.items()}
      values[tf.compat.v1.GraphKeys.GLOBAL_STEP] = global_step
      updates = [update for _, update in metrics.values()]
      final = tf.compat.v1.train.FinalOpsHook(values)
      creator = tf.compat.v1.train.ChiefSessionCreator(
          scaffold=spec.scaffold or tf.compat.v1.train.Scaffold(),
          checkpoint_filename_with_path=checkpoint_path,
          config=self._session_config(strategy))
      all_hooks = (input_hooks + list(spec.evaluation_hooks) +
                   list(hooks or []) + [final])
      with tf.compat.v1.train.MonitoredSession(creator, all_hooks) as session:
        done = 0
        while not session.should_stop():
          session.run(updates)
          done += 1
          if steps is not None and done >= steps:
            break
    results = final.final_ops_values
    self._write_eval_summary(results, name)
    logging.info('Evaluation at step %d: %s', results['global_step'],
                 ', '.join('%s = %s' % item for item in sorted(
                     results.items())))
    return results

  def _write_eval_summary(self, results, name):
    directory = os.path.join(self._model_dir,
                             'eval' if not name else 'eval_' + name)
    summary = tf.compat.v1.Summary()
    for key, value in sorted(results.items()):
      if key == tf.compat.v1.GraphKeys.GLOBAL_STEP:
        continue
      if np.ndim(value) == 0 and np.issubdtype(np.asarray(value).dtype,
                                               np.number):
        summary.value.add(tag=key, simple_value=float(value))
    # v1 FileWriters refuse to open under eager execution (TF's default
    # outside our graphs); an empty graph is all one needs.
    with tf.Graph().as_default():
      writer = tf.compat.v1.summary.FileWriter(directory)
      writer.add_summary(summary, int(results['global_step']))
      writer.close()

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
      predictions = _select(spec.predictions, predict_keys)
      creator = tf.compat.v1.train.ChiefSessionCreator(
          scaffold=spec.scaffold or tf.compat.v1.train.Scaffold(),
          checkpoint_filename_with_path=checkpoint_path,
          config=self._session_config())
      all_hooks = input_hooks + list(spec.prediction_hooks) + list(hooks or [])
      with tf.compat.v1.train.MonitoredSession(creator, all_hooks) as session:
        while not session.should_stop():
          batch = session.run(predictions)
          if not yield_single_examples:
            yield batch
            continue
          for example in _unbatch(batch):
            yield example

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
      outputs = export_lib.export_outputs_for(spec.export_outputs,
                                              spec.predictions)
      signatures = export_lib.signature_defs(receiver, outputs)
      scaffold = spec.scaffold or tf.compat.v1.train.Scaffold()
      saver = scaffold.saver or tf.compat.v1.train.Saver(sharded=True)
      local_init = scaffold.local_init_op or tf.group(
          tf.compat.v1.local_variables_initializer(),
          tf.compat.v1.tables_initializer())
      export_dir = _timestamped_dir(os.fspath(export_dir_base))
      temp_dir = export_dir + '.tmp'
      with tf.compat.v1.Session(config=self._session_config()) as session:
        saver.restore(session, checkpoint_path)
        builder = tf.compat.v1.saved_model.Builder(temp_dir)
        builder.add_meta_graph_and_variables(
            session, [tf.compat.v1.saved_model.tag_constants.SERVING],
            signature_def_map=signatures,
            assets_collection=tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
            main_op=local_init, strip_default_attrs=True, saver=saver)
        builder.save(as_text)
    for target, source in (assets_extra or {}).items():
      destination = os.path.join(temp_dir, 'assets.extra', target)
      tf.io.gfile.makedirs(os.path.dirname(destination))
      tf.io.gfile.copy(source, destination, overwrite=True)
    tf.io.gfile.rename(temp_dir, export_dir)
    logging.info('SavedModel written to %s', export_dir)
    return export_dir.encode('utf-8')

  # The TF 1.x spelling, still used by older programs.
  export_savedmodel = export_saved_model


def _multi_worker_session(target, model_dir, summary_dir, scaffold, hooks,
                          config, log_every, summary_every):
  """The training session of one task of a multi-worker job.

  Not MonitoredTrainingSession: it treats a lost peer (UnavailableError) as
  a preemption and recreates the session forever, while a job whose task
  died must stop (and be restarted as a whole). Every task restores the
  newest checkpoint of `model_dir` (the chief's), or initializes, in which
  case the strategy broadcasts the chief's initial values.

  Args:
    target: this task's gRPC server target.
    model_dir: where the chief's checkpoints are.
    summary_dir: model_dir on the chief, a scratch directory elsewhere.
    scaffold, hooks, config: as for a MonitoredSession.
    log_every, summary_every: steps between step-rate logs / summaries
      (None or 0: none).
  """
  hooks = list(hooks)
  if log_every:
    hooks.append(tf.compat.v1.train.StepCounterHook(
        output_dir=summary_dir, every_n_steps=log_every))
  if summary_every:
    hooks.append(tf.compat.v1.train.SummarySaverHook(
        scaffold=scaffold, save_steps=summary_every, output_dir=summary_dir))
  return tf.compat.v1.train.SingularMonitoredSession(
      hooks=hooks, scaffold=scaffold, master=target, config=config,
      checkpoint_dir=model_dir)


def _timestamped_dir(base):
  """base/<seconds since epoch>, one second later if that one exists."""
  tf.io.gfile.makedirs(base)
  stamp = int(time.time())
  while (tf.io.gfile.exists(os.path.join(base, str(stamp))) or
         tf.io.gfile.exists(os.path.join(base, str(stamp) + '.tmp'))):
    stamp += 1
  return os.path.join(base, str(stamp))


def _select(predictions, keys):
  if keys is None:
    return predictions
  if not isinstance(predictions, dict):
    raise ValueError('predict_keys needs dict predictions.')
  keys = [keys] if isinstance(keys, str) else list(keys)
  missing = sorted(set(keys) - set(predictions))
  if missing:
    raise ValueError('predict_keys %s are not in the predictions %s.' %
                     (missing, sorted(predictions)))
  return {key: predictions[key] for key in keys}


def _unbatch(batch):
  """Splits a batch of predictions (array or dict of arrays) into examples."""
  if not isinstance(batch, dict):
    return list(batch)
  sizes = {key: np.shape(value)[0] if np.ndim(value) else None
           for key, value in batch.items()}
  if None in sizes.values() or len(set(sizes.values())) != 1:
    raise ValueError('yield_single_examples needs every prediction to have '
                     'the same batch size; got %s. Use '
                     'yield_single_examples=False.' % sizes)
  (size,) = set(sizes.values())
  return [{key: value[i] for key, value in batch.items()}
          for i in range(size)]
