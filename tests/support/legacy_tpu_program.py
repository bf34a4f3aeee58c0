"""A legacy TPUEstimator program, written as tensorflow/tpu's mnist_tpu.py is.

Nothing here knows about estimator_bf16. It binds `tf_estimator` when it is
imported, the way such programs do, so on TensorFlow 2.16+ it must be
imported after `estimator_bf16.compat.install()`. It exercises what a real
program uses: tf.compat.v1.layers, tf.compat.v1.losses, an `eval_metrics`
tuple, a `host_call` writing v2 summaries, export outputs, and its own
RunConfig / TPUConfig / TPUEstimator. The data are tests/support/legacy_model.py's.
"""

import tensorflow as tf
from tensorflow.compat.v1 import estimator as tf_estimator

try:
  from tests.support import legacy_model
except ImportError:  # Run as a program (`tests/` is sys.path[0], not the repo).
  import legacy_model

IMAGE = legacy_model.IMAGE
CLASSES = legacy_model.CLASSES
HOST_CALL_TAG = 'host_call/loss'

train_input_fn = legacy_model.train_input_fn
eval_input_fn = legacy_model.eval_input_fn
predict_input_fn = legacy_model.predict_input_fn


def serving_input_receiver_fn():
  image = tf.compat.v1.placeholder(tf.float32, [None, IMAGE, IMAGE, 1],
                                   name='image')
  return tf_estimator.export.ServingInputReceiver({'image': image},
                                                 {'image': image})


def model_fn_builder(model_dir, learning_rate=0.01):
  """Returns a model_fn; the host_call writes its summaries to model_dir."""

  def host_call_fn(global_step, loss):
    # Runs on the host: v2 summaries from the values the TPU sent back.
    with tf.compat.v2.summary.create_file_writer(model_dir).as_default():
      with tf.compat.v2.summary.record_if(True):
        tf.compat.v2.summary.scalar(HOST_CALL_TAG, loss[0],
                                    step=global_step[0])
        return tf.compat.v1.summary.all_v2_summary_ops()

  def metric_fn(labels, logits):
    return {'accuracy': tf.compat.v1.metrics.accuracy(
        labels=labels, predictions=tf.argmax(logits, axis=1))}

  def model_fn(features, labels, mode, params):
    net = tf.compat.v1.layers.conv2d(features['image'], 8, 3, padding='same',
                                     activation=tf.nn.relu, name='conv')
    net = tf.compat.v1.layers.max_pooling2d(net, 2, 2)
    net = tf.compat.v1.layers.flatten(net)
    net = tf.compat.v1.layers.dense(net, 32, activation=tf.nn.relu,
                                    name='hidden')
    logits = tf.compat.v1.layers.dense(net, CLASSES, name='logits')
    predictions = {'classes': tf.argmax(logits, axis=1),
                   'probabilities': tf.nn.softmax(logits)}
    if mode == tf_estimator.ModeKeys.PREDICT:
      return tf_estimator.tpu.TPUEstimatorSpec(
          mode, predictions=predictions,
          export_outputs={'classify': tf_estimator.export.PredictOutput(
              predictions)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels,
                                                            logits=logits)
    if mode == tf_estimator.ModeKeys.EVAL:
      return tf_estimator.tpu.TPUEstimatorSpec(
          mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))
    optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    global_step = tf.compat.v1.train.get_global_step()
    train_op = optimizer.minimize(loss, global_step)
    # TPUs send host_call tensors with a leading batch dimension.
    host_call = (host_call_fn, [tf.reshape(global_step, [1]),
                                tf.reshape(loss, [1])])
    return tf_estimator.tpu.TPUEstimatorSpec(mode, loss=loss,
                                             train_op=train_op,
                                             host_call=host_call)

  return model_fn


def build_estimator(model_fn, model_dir, use_tpu=False, seed=7):
  """The program's own estimator, as mnist_tpu.py builds it."""
  config = tf_estimator.tpu.RunConfig(
      model_dir=model_dir, tf_random_seed=seed, save_checkpoints_steps=20,
      keep_checkpoint_max=3, save_summary_steps=5, log_step_count_steps=20,
      tpu_config=tf_estimator.tpu.TPUConfig(
          iterations_per_loop=10, num_shards=None,
          per_host_input_for_training=(
              tf_estimator.tpu.InputPipelineConfig.PER_HOST_V2)))
  return tf_estimator.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=use_tpu, train_batch_size=32,
      eval_batch_size=32, predict_batch_size=8, config=config)
