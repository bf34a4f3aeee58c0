"""The classification model_fn shared by every model family.

`classifier_model_fn_builder` turns a network into a legacy TPUEstimator
model_fn: float32 loss, optimizer, eval metrics, TensorBoard summaries via
`host_call`, predictions and a serving signature. It is written like user
code: it never opens a bfloat16 scope itself. `eb.make_tpu_estimator` (or
`eb.wrap_model_fn`) runs it with the network in bfloat16 and the float32
list active; the same model_fn trains in float32 without the wrapper.

    model_fn = classifier_model_fn_builder(
        lambda params: mnist.mnist_mlp(config), num_classes=10,
        optimizer='adam', learning_rate=1e-3)
    estimator = eb.make_tpu_estimator(model_fn, precision='bfloat16', ...)
"""

import tensorflow as tf

from estimator_bf16.models import optimization
from estimator_bf16.optimizers import registry as optimizers

_SERVING_KEY = (
    tf.compat.v1.saved_model.signature_constants
    .DEFAULT_SERVING_SIGNATURE_DEF_KEY)


def l2_penalty(variables=None):
  """Returns sum(v**2) / 2 over float32 weight matrices and kernels.

  Biases and normalisation parameters (rank < 2) are left out, as is usual:
  decaying them only hurts. bfloat16 reads are never seen here because the
  scope stores every variable as float32.

  Args:
    variables: list of variables; the trainable variables if None.

  Returns:
    A float32 scalar (0.0 if nothing qualifies).
  """
  if variables is None:
    variables = tf.compat.v1.trainable_variables()
  weights = [v for v in variables
             if v.dtype.base_dtype == tf.float32 and v.shape.ndims >= 2]
  if not weights:
    return tf.constant(0.0)
  return tf.add_n([tf.nn.l2_loss(v) for v in weights])


def metric_fn_builder(top_k=None):
  """Returns `metric_fn(labels, logits)` for `TPUEstimatorSpec.eval_metrics`.

  Args:
    top_k: if set (5 for ImageNet-size problems), also report
      `top_<k>_accuracy`.

  Returns:
    A function of labels [B] int32 and logits [B, C] float32 returning a dict
    of `tf.compat.v1.metrics` (value, update) pairs. It runs on the host, so
    it may use ops TPUs lack.
  """

  def metric_fn(labels, logits):
    # in_top_k rejects bfloat16; the wrapper already hands float32 here, the
    # cast keeps this function correct without it.
    logits = tf.cast(logits, tf.float32)
    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
    metrics = {'accuracy': tf.compat.v1.metrics.accuracy(labels, predictions)}
    if top_k:
      in_top_k = tf.math.in_top_k(targets=labels, predictions=logits, k=top_k)
      metrics['top_%d_accuracy' % top_k] = tf.compat.v1.metrics.mean(
          tf.cast(in_top_k, tf.float32))
    return metrics

  return metric_fn


def summary_host_call(summary_dir, global_step, scalars, max_queue=100):
  """Returns a `host_call` that writes scalar summaries every step.

  TPU code cannot run summary ops on the device, so the values travel as
  outfeed tensors of shape [1] and a host function writes them with a
  `tf.compat.v2.summary` file writer. In local mode TPUEstimator runs the
  same function as a hook, so summaries look the same on CPU and TPU.

  Args:
    summary_dir: directory of the event files (the model_dir).
    global_step: the int64 global step tensor.
    scalars: dict {tag: float32 scalar tensor}.
    max_queue: summaries buffered before a write.

  Returns:
    (host_fn, tensors) for `TPUEstimatorSpec(host_call=...)`.
  """
  tags = sorted(scalars)

  def host_fn(step, *values):
    # Each tensor arrives concatenated over shards; shard 0 stands for all.
    step = step[0]
    writer = tf.compat.v2.summary.create_file_writer(
        summary_dir, max_queue=max_queue)
    with writer.as_default(), tf.compat.v2.summary.record_if(True):
      for tag, value in zip(tags, values):
        tf.compat.v2.summary.scalar(tag, value[0], step=step)
      return tf.compat.v1.summary.all_v2_summary_ops()

  tensors = [tf.reshape(global_step, [1])]
  tensors += [tf.reshape(tf.cast(scalars[tag], tf.float32), [1])
              for tag in tags]
  return host_fn, tensors


def _predictions(logits):
  """The predictions of float32 [B, C] `logits`.

  Returns:
    {'classes': int32 [B], 'probabilities': float32 [B, C]}.
  """
  return {
      'classes': tf.argmax(logits, axis=-1, output_type=tf.int32),
      'probabilities': tf.nn.softmax(logits),
  }


def _predict_spec(mode, predictions):
  """The PREDICT spec of `predictions`, also the serving signature."""
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode=mode, predictions=predictions,
      export_outputs={
          _SERVING_KEY: tf.estimator.export.PredictOutput(predictions)})


def _train_host_call(directory, global_step, loss, rate):
  """The TRAIN host_call writing loss and learning rate to `directory`.

  None without a directory to write to.
  """
  if not directory:
    return None
  return summary_host_call(directory, global_step,
                           {'train/loss': loss, 'train/learning_rate': rate})


def classifier_model_fn_builder(network_fn_builder, *, num_classes,
                                optimizer='momentum', learning_rate=0.1,
                                weight_decay=0.0, warmup_steps=0,
                                decay_steps=None, end_learning_rate=0.0,
                                clip_norm=None, top_k=None,
                                feature_key='image', summary_dir=None):
  """Returns a legacy TPUEstimator model_fn for a classification network.

  Args:
    network_fn_builder: `network_fn_builder(params) -> network_fn`, where
      `network_fn(inputs, is_training)` returns [B, num_classes] logits in
      any floating dtype. It is called inside model_fn so it can read
      `params['precision']` (BERT builds its dtype from it).
    num_classes: number of classes; labels are int32 in [0, num_classes).
    optimizer: a name for `optimizers.create_optimizer` ('sgd',
      'momentum', 'adam', 'adamw', 'adafactor').
    learning_rate: peak learning rate.
    weight_decay: for 'adamw', the decoupled decay rate given to the
      optimizer; for the others, the coefficient of `l2_penalty()` added to
      the loss (ResNet style). 0 turns it off.
    warmup_steps: linear warm-up steps of the schedule.
    decay_steps: polynomial decay length; None keeps the rate constant.
    end_learning_rate: rate reached after `decay_steps`.
    clip_norm: global gradient-norm clip, or None.
    top_k: also report top-k accuracy in eval (5 for ImageNet).
    feature_key: the network gets `features[feature_key]`; None hands it the
      whole features dict (BERT's ids, mask and segments).
    summary_dir: where host_call writes summaries; the Estimator's model_dir
      (from `config`) if None.

  Returns:
    `model_fn(features, labels, mode, params, config)` returning a
    `tf.compat.v1.estimator.tpu.TPUEstimatorSpec` whose loss, predictions
    ('probabilities' float32 [B, C], 'classes' int32 [B]) and export outputs
    are float32 (or integer), whatever the network's dtype.
  """
  if num_classes < 2:
    raise ValueError('num_classes must be >= 2, got %d' % num_classes)
  metric_fn = metric_fn_builder(top_k)

  def model_fn(features, labels, mode, params, config=None):
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    inputs = features[feature_key] if feature_key else features
    logits = network_fn_builder(params)(inputs, is_training)
    # Cast before softmax and loss, as tensorflow/tpu's ResNet does: the
    # wrapper's float32 list would do it anyway, and this keeps the head
    # correct when used with `eb.build_network` or no wrapper at all.
    logits = tf.cast(logits, tf.float32)
    predictions = _predictions(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
      return _predict_spec(mode, predictions)

    labels = tf.reshape(labels, [-1])
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
        labels=labels, logits=logits)
    if weight_decay and optimizer != 'adamw':
      loss += weight_decay * l2_penalty()

    if mode == tf.estimator.ModeKeys.EVAL:
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode=mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))

    global_step = tf.compat.v1.train.get_or_create_global_step()
    rate = optimization.learning_rate_schedule(
        learning_rate, global_step, warmup_steps=warmup_steps,
        decay_steps=decay_steps, end_lr=end_learning_rate)
    opt = optimizers.create_optimizer(
        optimizer, rate,
        weight_decay_rate=weight_decay if optimizer == 'adamw' else 0.0,
        use_tpu=params.get('use_tpu', False))
    train_op = optimization.train_op(loss, opt, global_step=global_step,
                                     clip_norm=clip_norm)
    host_call = _train_host_call(
        summary_dir or (config.model_dir if config else None), global_step,
        loss, rate)
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode=mode, loss=loss, train_op=train_op, host_call=host_call)

  return model_fn
