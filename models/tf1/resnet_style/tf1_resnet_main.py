"""A ResNet-style TPU program as tensorflow/tpu wrote them in 2018.

Trains on scikit-learn's 8x8 digits, evaluates, and writes
`eval_results.txt` to `--model_dir`. TPU pieces come from
`tensorflow.contrib.tpu.python.tpu`, the network is built in
`bfloat16.bfloat16_scope()` when `--precision=bfloat16`, and a
`tf.contrib.summary` host_call writes the loss.
"""

import os

import numpy as np
from sklearn import datasets
import tensorflow as tf

from tensorflow.contrib import summary
from tensorflow.contrib.tpu.python.tpu import bfloat16
from tensorflow.contrib.tpu.python.tpu import tpu_config
from tensorflow.contrib.tpu.python.tpu import tpu_estimator
from tensorflow.contrib.tpu.python.tpu import tpu_optimizer

import tf1_resnet_model as resnet_model

FLAGS = tf.flags.FLAGS
tf.flags.DEFINE_string('tpu', None, 'The Cloud TPU to use.')
tf.flags.DEFINE_string('tpu_zone', None, 'Zone of the TPU.')
tf.flags.DEFINE_string('gcp_project', None, 'Project of the TPU.')
tf.flags.DEFINE_bool('use_tpu', True, 'Use TPUs rather than the CPU.')
tf.flags.DEFINE_string('model_dir', None, 'Checkpoints and summaries.')
tf.flags.DEFINE_integer('train_steps', 60, 'Training steps.')
tf.flags.DEFINE_integer('train_batch_size', 64, 'Global training batch.')
tf.flags.DEFINE_integer('eval_batch_size', 64, 'Global evaluation batch.')
tf.flags.DEFINE_integer('iterations_per_loop', 20, 'Steps per TPU loop.')
tf.flags.DEFINE_string('precision', 'bfloat16', 'bfloat16 or float32.')
tf.flags.DEFINE_bool('skip_host_call', False, 'No summaries.')

_NUM_CLASSES = 10
_TRAIN_EXAMPLES = 1536


def _digits():
  digits = datasets.load_digits()
  images = (digits.images / 16.0).astype(np.float32)[..., None]
  return images, digits.target.astype(np.int32)


class DigitsInput(object):
  """An input_fn object, as imagenet_input.ImageNetInput was."""

  def __init__(self, is_training, use_bfloat16):
    self.is_training = is_training
    self.use_bfloat16 = use_bfloat16

  def dataset_parser(self, image, label):
    if self.use_bfloat16:
      image = tf.cast(image, tf.bfloat16)
    return image, label

  def __call__(self, params):
    images, labels = _digits()
    part = slice(0, _TRAIN_EXAMPLES) if self.is_training else slice(
        _TRAIN_EXAMPLES, None)
    dataset = tf.data.Dataset.from_tensor_slices((images[part], labels[part]))
    if self.is_training:
      dataset = dataset.apply(tf.contrib.data.shuffle_and_repeat(1024, seed=4))
    dataset = dataset.apply(tf.contrib.data.map_and_batch(
        self.dataset_parser, batch_size=params['batch_size'],
        drop_remainder=True))
    return dataset.prefetch(2)


def resnet_model_fn(features, labels, mode, params):
  del params
  is_training = mode == tf.estimator.ModeKeys.TRAIN
  network = resnet_model.resnet_v1_generator(_NUM_CLASSES)

  def build_network():
    return network(inputs=features, is_training=is_training)

  if FLAGS.precision == 'bfloat16':
    with bfloat16.bfloat16_scope():
      logits = build_network()
    logits = tf.cast(logits, tf.float32)
  else:
    logits = build_network()

  one_hot_labels = tf.one_hot(labels, _NUM_CLASSES)
  cross_entropy = tf.losses.softmax_cross_entropy(
      logits=logits, onehot_labels=one_hot_labels)
  loss = cross_entropy + 1e-4 * tf.add_n(
      [tf.nn.l2_loss(v) for v in tf.trainable_variables()
       if 'batch_normalization' not in v.name])

  host_call = None
  train_op = None
  if is_training:
    global_step = tf.train.get_global_step()
    learning_rate = tf.train.exponential_decay(0.1, global_step, 20, 0.8)
    optimizer = tf.train.MomentumOptimizer(learning_rate, momentum=0.9,
                                           use_nesterov=True)
    if FLAGS.use_tpu:
      optimizer = tpu_optimizer.CrossShardOptimizer(optimizer)
    update_ops = tf.get_collection(tf.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
      train_op = optimizer.minimize(loss, global_step)

    if not FLAGS.skip_host_call:
      def host_call_fn(gs, loss, lr):
        gs = gs[0]
        with summary.create_file_writer(FLAGS.model_dir).as_default():
          with summary.always_record_summaries():
            summary.scalar('loss', loss[0], step=gs)
            summary.scalar('learning_rate', lr[0], step=gs)
            return summary.all_summary_ops()

      host_call = (host_call_fn, [tf.reshape(global_step, [1]),
                                  tf.reshape(loss, [1]),
                                  tf.reshape(learning_rate, [1])])

  eval_metrics = None
  if mode == tf.estimator.ModeKeys.EVAL:
    def metric_fn(labels, logits):
      predictions = tf.argmax(logits, axis=1)
      return {'top_1_accuracy': tf.metrics.accuracy(labels, predictions)}
    eval_metrics = (metric_fn, [labels, logits])

  return tpu_estimator.TPUEstimatorSpec(
      mode=mode, loss=loss, train_op=train_op, host_call=host_call,
      eval_metrics=eval_metrics)


def main(unused_argv):
  tpu_cluster_resolver = tf.contrib.cluster_resolver.TPUClusterResolver(
      FLAGS.tpu, zone=FLAGS.tpu_zone, project=FLAGS.gcp_project)
  config = tpu_config.RunConfig(
      cluster=tpu_cluster_resolver, model_dir=FLAGS.model_dir,
      save_checkpoints_steps=FLAGS.iterations_per_loop, tf_random_seed=9,
      tpu_config=tpu_config.TPUConfig(
          iterations_per_loop=FLAGS.iterations_per_loop,
          per_host_input_for_training=(
              tpu_config.InputPipelineConfig.PER_HOST_V2)))
  resnet_classifier = tpu_estimator.TPUEstimator(
      use_tpu=FLAGS.use_tpu, model_fn=resnet_model_fn, config=config,
      train_batch_size=FLAGS.train_batch_size,
      eval_batch_size=FLAGS.eval_batch_size)
  use_bfloat16 = FLAGS.precision == 'bfloat16'
  resnet_classifier.train(input_fn=DigitsInput(True, use_bfloat16),
                          max_steps=FLAGS.train_steps)
  eval_results = resnet_classifier.evaluate(
      input_fn=DigitsInput(False, use_bfloat16),
      steps=(1797 - _TRAIN_EXAMPLES) // FLAGS.eval_batch_size)
  tf.logging.info('Eval results: %s', eval_results)
  with tf.gfile.GFile(os.path.join(FLAGS.model_dir, 'eval_results.txt'),
                      'w') as f:
    for key in sorted(eval_results):
      f.write('%s = %s\n' % (key, eval_results[key]))
  print('eval accuracy %.4f loss %.4f' % (eval_results['top_1_accuracy'],
                                           eval_results['loss']))


if __name__ == '__main__':
  tf.logging.set_verbosity(tf.logging.WARN)
  tf.app.run()
