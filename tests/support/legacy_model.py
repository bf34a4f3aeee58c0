"""A legacy TPUEstimator model written the way users write them (tf.layers).

Nothing here knows about estimator_bf16: the tests wrap it unmodified.
"""

import numpy as np
import tensorflow as tf

IMAGE = 8
CLASSES = 4
_PROJECTION = np.random.RandomState(0).randn(IMAGE * IMAGE, CLASSES)


def synthetic_data(num, seed):
  """A learnable task: the label is the argmax of a fixed linear projection.

  Returns:
    images float32 [num, 8, 8, 1] in [0, 1), labels int32 [num].
  """
  images = np.random.RandomState(seed).rand(num, IMAGE, IMAGE, 1)
  labels = np.argmax(images.reshape(num, -1) @ _PROJECTION, axis=1)
  return images.astype(np.float32), labels.astype(np.int32)


def train_input_fn(params):
  images, labels = synthetic_data(1024, seed=1)
  dataset = tf.data.Dataset.from_tensor_slices(({'image': images}, labels))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def eval_input_fn(params):
  images, labels = synthetic_data(256, seed=2)
  dataset = tf.data.Dataset.from_tensor_slices(({'image': images}, labels))
  return dataset.batch(params['batch_size'], drop_remainder=True)


def predict_input_fn(params):
  images, _ = synthetic_data(16, seed=3)
  return tf.data.Dataset.from_tensor_slices(
      {'image': images}).batch(params['batch_size'])


def serving_input_fn():
  image = tf.compat.v1.placeholder(tf.float32, [None, IMAGE, IMAGE, 1],
                                   name='image')
  return tf.estimator.export.ServingInputReceiver({'image': image},
                                                 {'image': image})


def model_fn(features, labels, mode, params):
  """Conv2D + Dense, softmax predictions, tf.losses, eval_metrics tuple."""
  net = tf.compat.v1.layers.conv2d(features['image'], 8, 3, padding='same',
                                   activation=tf.nn.relu)
  net = tf.compat.v1.layers.max_pooling2d(net, 2, 2)
  net = tf.compat.v1.layers.flatten(net)
  net = tf.compat.v1.layers.dense(net, 32, activation=tf.nn.relu)
  logits = tf.compat.v1.layers.dense(net, CLASSES)
  predictions = {'classes': tf.argmax(logits, axis=1),
                 'probabilities': tf.nn.softmax(logits),
                 'logits': logits}
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, predictions=predictions,
        export_outputs={'classify': tf.estimator.export.PredictOutput(
            predictions)})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)

  def metric_fn(labels, logits):
    return {'accuracy': tf.compat.v1.metrics.accuracy(
        labels=labels, predictions=tf.argmax(logits, axis=1))}

  optimizer = tf.compat.v1.train.AdamOptimizer(params.get('lr', 0.01))
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, logits]))
