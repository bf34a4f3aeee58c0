"""`model_to_estimator` for TensorFlow 2.16+: Keras models as Estimators.

TF 1.x programs reach the Estimator from Keras with
`tf.keras.estimator.model_to_estimator(keras_model=model)`; on TensorFlow
2.16+ that function only raises ("not available in your installation"),
since it lived in tensorflow_estimator. `_install` puts this one in its
place there (TensorFlow 2.15 keeps its own).

What it builds, as the original does for the common case:

* the model_fn clones the model's architecture in the Estimator's graph
  (`clone_model`), so wrapping it (`eb.wrap_model_fn`, `run`) builds the
  Keras layers in bfloat16 like any model_fn's;
* the loss is the compiled loss, computed in float32 on the outputs, plus
  the model's own losses (regularizers); the optimizer is the compiled
  one, as its legacy Keras class with the same configuration (the
  original converts it the same way); `global_step` counts the updates;
* the compiled metrics 'accuracy' / 'acc', 'mse' and 'mae' are evaluation
  metrics under the names Keras gives them;
* the new Estimator starts from the model's current weights (a checkpoint
  written under `model_dir/keras/`, the clone's initial values) in every
  mode, until model_dir holds a checkpoint of its own;
* PREDICT returns the outputs under the model's output names.

A multi-output model, sample weights, other metrics and
`checkpoint_format='checkpoint'` raise NotImplementedError at the call,
one line each.
"""

import inspect
import os
import tempfile

import tensorflow as tf

from estimator_bf16.compat import estimator as estimator_lib
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import export as export_lib

_ACCURACY = ('accuracy', 'acc')
_REGRESSION = {'mse': tf.compat.v1.metrics.mean_squared_error,
               'mean_squared_error': tf.compat.v1.metrics.mean_squared_error,
               'mae': tf.compat.v1.metrics.mean_absolute_error,
               'mean_absolute_error': tf.compat.v1.metrics.mean_absolute_error}


def _loss_name(loss):
  """The compiled loss's name ('sparse_categorical_crossentropy', ...)."""
  if isinstance(loss, str):
    return loss
  return getattr(loss, 'name', None) or getattr(loss, '__name__', '')


def _compiled_metrics(model):
  """The metric names the model was compiled with."""
  compiled = getattr(model, 'compiled_metrics', None)
  # Keras keeps what `compile(metrics=...)` was given on its container;
  # a model compiled with eager execution off (TF 1.x's training loop)
  # keeps it on the model.
  user = (getattr(compiled, '_user_metrics', None) or
          getattr(model, '_compile_metrics', None) or [])
  if isinstance(user, dict):
    raise NotImplementedError(
        'model_to_estimator: metrics per output are not supported here; '
        'compile with a list of metric names.')
  names = []
  for metric in user:
    if not isinstance(metric, str) or (
        metric not in _ACCURACY and metric not in _REGRESSION):
      raise NotImplementedError(
          'model_to_estimator: metric %r is not supported here (only %s); '
          'drop it from compile() or compute it in an Estimator model_fn.' %
          (metric, ', '.join(_ACCURACY + tuple(_REGRESSION))))
    names.append(metric)
  return names


def _legacy_optimizer(optimizer):
  """(class, config) of the legacy Keras optimizer equal to `optimizer`.

  Read here, eagerly: the configuration of a Keras optimizer can only be
  read outside a graph.
  """
  legacy = tf.keras.optimizers.legacy
  cls = getattr(legacy, type(optimizer).__name__, None)
  if cls is None:
    raise NotImplementedError(
        'model_to_estimator: optimizer %s has no legacy Keras class; compile '
        'with one of %s.' % (type(optimizer).__name__, ', '.join(
            n for n in dir(legacy) if n[0].isupper() and n != 'Optimizer')))
  accepted = set(inspect.signature(cls.__init__).parameters)
  # Taken through **kwargs by every legacy optimizer.
  accepted.update(('name', 'clipnorm', 'clipvalue', 'global_clipnorm'))
  try:
    config = optimizer.get_config()
  except NotImplementedError:
    # The non-legacy optimizers read their values with .numpy().
    raise NotImplementedError(
        'model_to_estimator: %s was made with eager execution off, and its '
        'settings cannot be read; compile with tf.keras.optimizers.legacy.%s '
        'or a name (e.g. "adam").' % (type(optimizer).__name__,
                                       type(optimizer).__name__)) from None
  # Settings only the newer optimizers have (absent from legacy configs).
  for key, off in (('weight_decay', (None, 0, 0.0)), ('use_ema', (False,))):
    if config.get(key, off[0]) not in off:
      raise NotImplementedError(
          'model_to_estimator: %s=%r has no legacy Keras counterpart; '
          'compile without it.' % (key, config[key]))
  config = {key: value for key, value in config.items()
            if key in accepted and value is not None}
  if 'learning_rate' in config and not isinstance(config['learning_rate'],
                                                  dict):
    config['learning_rate'] = float(config['learning_rate'])
  return cls, config


def _model_inputs(model, features):
  """The model's input(s) from the input_fn's features."""
  names = list(model.input_names)
  if not isinstance(features, dict):
    return features
  if 'sample_weights' in features:
    raise NotImplementedError(
        "model_to_estimator: features with 'sample_weights' are not "
        'supported here.')
  if all(name in features for name in names):
    picked = [features[name] for name in names]
    return picked[0] if len(picked) == 1 else picked
  if len(names) == 1 and len(features) == 1:
    return next(iter(features.values()))
  raise ValueError(
      'model_to_estimator: the input_fn gave features %s, the model takes '
      'inputs %s: key the features by the input names.' %
      (sorted(features), names))


def _metric_ops(names, loss_name, labels, outputs):
  """{Keras metric name: (value, update_op)} for EVAL.

  Args:
    names: metric names from `_compiled_metrics`.
    loss_name: the compiled loss's name; it says what 'accuracy' means.
    labels: the input_fn's labels (any numeric dtype).
    outputs: float32 model outputs.
  """
  ops = {}
  for name in names:
    if name in _REGRESSION:
      ops[name] = _REGRESSION[name](tf.cast(labels, outputs.dtype), outputs)
      continue
    if 'sparse_categorical' in loss_name:
      ops[name] = tf.compat.v1.metrics.accuracy(
          tf.reshape(labels, [-1]), tf.argmax(outputs, axis=-1))
    elif 'categorical' in loss_name:
      ops[name] = tf.compat.v1.metrics.accuracy(
          tf.argmax(labels, axis=-1), tf.argmax(outputs, axis=-1))
    else:  # binary: 0/1 labels of any dtype, as Keras reads them
      ops[name] = tf.compat.v1.metrics.accuracy(
          tf.cast(tf.cast(labels, outputs.dtype) > 0.5, tf.int32),
          tf.cast(outputs > 0.5, tf.int32))
  return ops


def _model_fn_builder(model, optimizer_class, optimizer_config, metric_names,
                      export_outputs, start):
  """The Estimator's model_fn for `model` (see the module docstring).

  `start` is (checkpoint path, its variable names in `model.weights`
  order) or None: the clone's variables are initialized from it, so every
  mode starts from the Keras model's weights until model_dir has a
  checkpoint of its own (restoring one overrides initial values).
  """
  loss_name = _loss_name(model.loss)
  loss_fn = tf.keras.losses.get(model.loss)
  output_name = model.output_names[0]

  def model_fn(features, labels, mode):
    training = mode == spec_lib.ModeKeys.TRAIN
    clone = tf.keras.models.clone_model(model)
    outputs = clone(_model_inputs(model, features), training=training)
    if start is not None:
      path, names = start
      tf.compat.v1.train.init_from_checkpoint(
          path, dict(zip(names, clone.weights)))
    predictions = {output_name: outputs}
    if mode == spec_lib.ModeKeys.PREDICT:
      classes = export_outputs or {}
      export = {key: cls(outputs) for key, cls in classes.items()} or {
          export_lib.DEFAULT_SERVING_KEY:
              export_lib.PredictOutput(predictions)}
      return spec_lib.EstimatorSpec(mode, predictions=predictions,
                                    export_outputs=export)
    if isinstance(labels, dict):
      labels = labels.get(output_name, next(iter(labels.values())))
    # The recipe: the loss in float32, whatever the layers computed in.
    outputs = tf.cast(outputs, tf.float32)
    if (labels.shape.rank is not None and outputs.shape.rank is not None and
        labels.shape.rank == outputs.shape.rank - 1 and
        outputs.shape[-1] == 1 and 'sparse' not in loss_name):
      # [batch] labels for a [batch, 1] output, as Keras' fit takes them.
      labels = tf.expand_dims(labels, -1)
    loss = tf.reduce_mean(loss_fn(labels, outputs))
    if clone.losses:
      loss += tf.add_n([tf.cast(l, tf.float32) for l in clone.losses])
    train_op = None
    if training:
      optimizer = optimizer_class.from_config(dict(optimizer_config))
      params = clone.trainable_variables
      update = optimizer.apply_gradients(
          zip(optimizer.get_gradients(loss, params), params))
      with tf.control_dependencies([update] +
                                   list(getattr(clone, 'updates', []))):
        train_op = tf.compat.v1.assign_add(
            tf.compat.v1.train.get_global_step(), 1)
    metrics = None
    if mode == spec_lib.ModeKeys.EVAL:
      metrics = _metric_ops(metric_names, loss_name, labels, outputs)
    return spec_lib.EstimatorSpec(mode, predictions=predictions, loss=loss,
                                  train_op=train_op, eval_metric_ops=metrics)

  return model_fn


def _write_start_checkpoint(model, folder):
  """Saves the model's current weights under `folder`.

  Returns:
    (checkpoint path, the saved variables' names in `model.weights` order).
  """
  weights = model.get_weights()
  graph = tf.Graph()
  with graph.as_default():
    clone = tf.keras.models.clone_model(model)
    if not clone.built:
      clone.build(model.input_shape)
    variables = clone.weights
    with tf.compat.v1.Session(graph=graph) as session:
      for variable, value in zip(variables, weights):
        session.run(variable.initializer)
        variable.load(value, session)
      os.makedirs(folder, exist_ok=True)
      path = tf.compat.v1.train.Saver(var_list=variables).save(
          session, os.path.join(folder, 'keras_model.ckpt'),
          write_meta_graph=False)
  return path, [v.op.name for v in variables]


def model_to_estimator(keras_model=None, keras_model_path=None,
                       custom_objects=None, model_dir=None, config=None,
                       checkpoint_format='saver', metric_names_map=None,
                       export_outputs=None):
  """An Estimator training `keras_model` (see the module docstring).

  Args:
    keras_model: a compiled Keras model, or None with `keras_model_path`.
    keras_model_path: a saved compiled Keras model to load instead.
    custom_objects: for loading `keras_model_path`.
    model_dir: the Estimator's folder; default `config.model_dir`, else a
      new temporary folder.
    config: a `RunConfig`.
    checkpoint_format: 'saver' (the only one supported here).
    metric_names_map: {Keras metric name: name in the results}.
    export_outputs: {signature key: ExportOutput class} for the export.

  Returns:
    An `Estimator`.

  Raises:
    ValueError: not exactly one model given, or the model is not compiled.
    NotImplementedError: what the module docstring lists.
  """
  if (keras_model is None) == (keras_model_path is None):
    raise ValueError('model_to_estimator: give exactly one of keras_model '
                     'and keras_model_path.')
  if keras_model is None:
    keras_model = tf.keras.models.load_model(keras_model_path,
                                             custom_objects=custom_objects)
  if getattr(keras_model, 'optimizer', None) is None:
    raise ValueError('model_to_estimator: the Keras model is not compiled; '
                     'call model.compile(optimizer, loss, metrics) first.')
  if checkpoint_format != 'saver':
    raise NotImplementedError(
        "model_to_estimator: checkpoint_format=%r; only 'saver' is supported"
        ' here.' % (checkpoint_format,))
  if len(keras_model.outputs or [None]) != 1:
    raise NotImplementedError('model_to_estimator: models with several '
                              'outputs are not supported here.')
  names = _compiled_metrics(keras_model)
  optimizer_class, optimizer_config = _legacy_optimizer(keras_model.optimizer)
  model_dir = model_dir or getattr(config, 'model_dir', None) or (
      tempfile.mkdtemp())
  start = _write_start_checkpoint(keras_model,
                                  os.path.join(model_dir, 'keras'))
  model_fn = _model_fn_builder(keras_model, optimizer_class, optimizer_config,
                               names, export_outputs, start)
  if metric_names_map:
    model_fn = _renamed_metrics(model_fn, metric_names_map)
  return estimator_lib.Estimator(model_fn, model_dir=model_dir, config=config)


def _renamed_metrics(model_fn, names):
  """`model_fn` with its evaluation metrics renamed by `names`."""
  def renamed(features, labels, mode):
    spec = model_fn(features, labels, mode)
    if not spec.eval_metric_ops:
      return spec
    return spec._replace(eval_metric_ops={
        names.get(key, key): value
        for key, value in spec.eval_metric_ops.items()})
  return renamed
