r"""MNIST on a TPU with TPUEstimator, written as such programs are written.

A float32 TensorFlow 1-style program of the kind estimator_bf16 users own
(the shape of tensorflow/tpu's `models/official/mnist/mnist_tpu.py`): absl
flags, a convolutional network from `tf.compat.v1.layers`, an input_fn
reading MNIST TFRecords, `CrossShardOptimizer` on a TPU, an `eval_metrics`
tuple, and its own RunConfig / TPUConfig / TPUEstimator. It does not import
estimator_bf16. To train it in bfloat16 without editing it:

    python -m estimator_bf16.apps.digits_cli --out_dir=runs/digits
    python -m estimator_bf16 run models/mnist_tpu.py --use_tpu=false \
        --data_dir=runs/digits --model_dir=runs/mnist_bf16
    python models/mnist_tpu.py --use_tpu=false \
        --data_dir=runs/digits --model_dir=runs/mnist_fp32   # as it is

The data directory holds `train.tfrecords` and `test.tfrecords` of
`tf.train.Example`s with `image_raw` (28 x 28 uint8 bytes) and `label`
(int64), as TensorFlow's MNIST converter writes them.
"""

import os

from absl import app
from absl import flags
import tensorflow.compat.v1 as tf

FLAGS = flags.FLAGS
flags.DEFINE_bool('use_tpu', True, 'Train on a TPU; false runs on the CPU.')
flags.DEFINE_string('tpu', None, 'Name or address of the TPU.')
flags.DEFINE_string('tpu_zone', None, 'Zone of the TPU.')
flags.DEFINE_string('gcp_project', None, 'Project of the TPU.')
flags.DEFINE_string('data_dir', None, 'Directory of the MNIST TFRecords.')
flags.DEFINE_string('model_dir', None, 'Checkpoints and summaries.')
flags.DEFINE_integer('batch_size', 256, 'Global training batch.')
flags.DEFINE_integer('train_steps', 500, 'Training steps.')
flags.DEFINE_integer('eval_steps', 1, 'Evaluation steps (0: none).')
flags.DEFINE_float('learning_rate', 1e-3, 'Adam learning rate.')
flags.DEFINE_integer('iterations', 50, 'Steps per TPU training loop.')
flags.DEFINE_integer('num_shards', 8, 'TPU cores.')
flags.mark_flags_as_required(['data_dir', 'model_dir'])

IMAGE_SIZE = 28
NUM_CLASSES = 10


def network(images, training):
  """[B, 28, 28, 1] float images -> [B, 10] logits."""
  net = tf.layers.conv2d(images, 32, 5, padding='same',
                         activation=tf.nn.relu)
  net = tf.layers.max_pooling2d(net, 2, 2)
  net = tf.layers.conv2d(net, 64, 5, padding='same', activation=tf.nn.relu)
  net = tf.layers.max_pooling2d(net, 2, 2)
  net = tf.layers.flatten(net)
  net = tf.layers.dense(net, 1024, activation=tf.nn.relu)
  net = tf.layers.dropout(net, 0.4, training=training)
  return tf.layers.dense(net, NUM_CLASSES)


def metric_fn(labels, logits):
  predictions = tf.argmax(logits, axis=1)
  return {'accuracy': tf.metrics.accuracy(labels, predictions)}


def model_fn(features, labels, mode, params):
  """The TPUEstimator model_fn."""
  training = mode == tf.estimator.ModeKeys.TRAIN
  logits = network(features['image'], training)
  loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.tpu.TPUEstimatorSpec(
        mode=mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))
  optimizer = tf.train.AdamOptimizer(FLAGS.learning_rate)
  if params['use_tpu']:
    optimizer = tf.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf.train.get_global_step())
  return tf.estimator.tpu.TPUEstimatorSpec(mode=mode, loss=loss,
                                           train_op=train_op)


def input_fn_builder(file_name, training):
  """Returns the input_fn of one TFRecord file of the data directory."""

  def parse(record):
    parsed = tf.parse_single_example(record, {
        'image_raw': tf.FixedLenFeature([], tf.string),
        'label': tf.FixedLenFeature([], tf.int64)})
    image = tf.decode_raw(parsed['image_raw'], tf.uint8)
    image = tf.reshape(tf.cast(image, tf.float32) / 255.0,
                       [IMAGE_SIZE, IMAGE_SIZE, 1])
    # TPUs take int32 labels.
    return {'image': image}, tf.cast(parsed['label'], tf.int32)

  def input_fn(params):
    dataset = tf.data.TFRecordDataset(os.path.join(FLAGS.data_dir, file_name))
    if training:
      dataset = dataset.shuffle(1024).repeat()
    dataset = dataset.map(parse).batch(params['batch_size'],
                                       drop_remainder=True)
    return dataset.prefetch(2)

  return input_fn


def main(argv):
  del argv
  resolver = None
  if FLAGS.use_tpu:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        FLAGS.tpu, zone=FLAGS.tpu_zone, project=FLAGS.gcp_project)
  config = tf.estimator.tpu.RunConfig(
      cluster=resolver, model_dir=FLAGS.model_dir,
      save_checkpoints_steps=FLAGS.iterations,
      tpu_config=tf.estimator.tpu.TPUConfig(
          iterations_per_loop=FLAGS.iterations,
          num_shards=FLAGS.num_shards))
  estimator = tf.estimator.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=FLAGS.use_tpu, config=config,
      train_batch_size=FLAGS.batch_size, eval_batch_size=FLAGS.batch_size)
  estimator.train(input_fn_builder('train.tfrecords', True),
                  max_steps=FLAGS.train_steps)
  if FLAGS.eval_steps:
    metrics = estimator.evaluate(input_fn_builder('test.tfrecords', False),
                                 steps=FLAGS.eval_steps)
    print('eval accuracy %.4f loss %.4f at step %d' % (
        metrics['accuracy'], metrics['loss'], metrics['global_step']))


if __name__ == '__main__':
  tf.disable_v2_behavior()
  app.run(main)
