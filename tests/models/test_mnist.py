"""Tests for the MNIST-size nets, the MNIST reader and the digits converter.

The accuracy test trains the Keras-tutorial MLP on scikit-learn's shipped
digits in both precisions: at least 95% test accuracy each, and the two
within 1 point.
"""

import os
import subprocess
import sys

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import training
from estimator_bf16.models import digits
from estimator_bf16.models import mnist
from estimator_bf16.models import mnist_input
from tests.support import isolated_cache
from tests.support import paths

_PRECISIONS = (
    dict(testcase_name='float32', precision='float32'),
    dict(testcase_name='bfloat16', precision='bfloat16'),
)
_NETWORKS_AND_PRECISIONS = tuple(
    dict(testcase_name='%s_%s' % (net, p), network=net, precision=p)
    for net in ('mnist_mlp', 'mnist_cnn') for p in eb.PRECISIONS)
_REPO = paths.REPO

# Stated targets of the acceptance test (300 Adam steps of batch 64).
_MIN_ACCURACY = 0.95
_MAX_ACCURACY_GAP = 0.01

_CACHE = isolated_cache.IsolatedCache()


def setUpModule():
  tf.compat.v1.disable_eager_execution()
  _CACHE.start()


def tearDownModule():
  _CACHE.stop()


def _example(pixels, label):
  """An MNIST-format record, built here rather than with the module's code."""
  return tf.train.Example(features=tf.train.Features(feature={
      'image_raw': tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[pixels.astype(np.uint8).tobytes()])),
      'label': tf.train.Feature(int64_list=tf.train.Int64List(
          value=[label])),
  })).SerializeToString()


def _read_all(input_fn, params, max_batches=100):
  """Runs `input_fn(params)` to its end (or max_batches); returns lists."""
  with tf.Graph().as_default():
    dataset = input_fn(params)
    next_batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    batches = []
    with tf.compat.v1.Session() as sess:
      for _ in range(max_batches):
        try:
          batches.append(sess.run(next_batch))
        except tf.errors.OutOfRangeError:
          break
  return batches


class NetworkTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_NETWORKS_AND_PRECISIONS)
  def test_logits_follow_input_dtype_and_variables_stay_float32(
      self, network, precision):
    dtype = eb.compute_dtype(precision)
    build = getattr(mnist, network)(mnist.MnistConfig())
    with tf.Graph().as_default():
      images = tf.random.uniform([4, 28, 28, 1], dtype=tf.float32)
      with eb.bfloat16_scope(precision):
        logits = build(tf.cast(images, dtype), is_training=True)
      self.assertEqual(logits.dtype, dtype)
      self.assertEqual(logits.shape.as_list(), [4, 10])
      variables = tf.compat.v1.global_variables()
      self.assertNotEmpty(variables)
      for variable in variables:
        self.assertEqual(variable.dtype.base_dtype, tf.float32, variable.name)
      with self.session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        self.assertTrue(np.all(np.isfinite(
            sess.run(tf.cast(logits, tf.float32)))))

  @parameterized.named_parameters(*_PRECISIONS)
  def test_mlp_is_the_keras_tutorial_model(self, precision):
    build = mnist.mnist_mlp(mnist.MnistConfig())
    with tf.Graph().as_default():
      images = tf.zeros([2, 28, 28, 1], eb.compute_dtype(precision))
      with eb.bfloat16_scope(precision):
        build(images, is_training=True)
      shapes = {v.op.name: v.shape.as_list()
                for v in tf.compat.v1.trainable_variables()}
    # Same names in both precisions, so checkpoints move between them.
    self.assertEqual(shapes, {
        'mnist_mlp/hidden/kernel': [784, 512],
        'mnist_mlp/hidden/bias': [512],
        'mnist_mlp/logits/kernel': [512, 10],
        'mnist_mlp/logits/bias': [10],
    })

  def test_dropout_only_while_training(self):
    build = mnist.mnist_mlp(mnist.MnistConfig())
    with tf.Graph().as_default() as graph:
      images = tf.constant(np.random.RandomState(1).uniform(
          size=[8, 28, 28, 1]).astype(np.float32))
      with tf.compat.v1.variable_scope('eval'):
        eval_logits = build(images, is_training=False)
      self.assertFalse([op for op in graph.get_operations()
                        if 'dropout' in op.name])
      with tf.compat.v1.variable_scope('train'):
        build(images, is_training=True)
      self.assertTrue([op for op in graph.get_operations()
                       if 'dropout' in op.name])
      with self.session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        self.assertAllEqual(sess.run(eval_logits), sess.run(eval_logits))


class MnistReaderTest(tf.test.TestCase, parameterized.TestCase):

  def _write(self, count=5, size=28):
    rng = np.random.RandomState(0)
    pixels = rng.randint(0, 256, size=(count, size, size)).astype(np.uint8)
    labels = np.arange(count) % 10
    path = os.path.join(self.create_tempdir().full_path, 'test.tfrecords')
    with tf.io.TFRecordWriter(path) as writer:
      for image, label in zip(pixels, labels):
        writer.write(_example(image, int(label)))
    return path, pixels, labels

  @parameterized.named_parameters(*_PRECISIONS)
  def test_eval_reads_written_records_once_in_order(self, precision):
    path, pixels, labels = self._write(count=5)
    input_fn = mnist_input.mnist_input_fn_builder(path, is_training=False)
    batches = _read_all(input_fn, {'batch_size': 2, 'precision': precision})
    # 5 records in batches of 2: the partial last batch is dropped (TPUs
    # need static shapes).
    self.assertLen(batches, 2)
    images = np.concatenate([f['image'] for f, _ in batches])
    read_labels = np.concatenate([l for _, l in batches])
    self.assertEqual(images.dtype.name, precision)
    self.assertEqual(images.shape, (4, 28, 28, 1))
    self.assertEqual(read_labels.dtype, np.int32)
    self.assertAllEqual(read_labels, labels[:4])
    # bfloat16 keeps 8 bits of mantissa: values in [0, 1] within 2**-8.
    atol = 2.0**-8 if precision == 'bfloat16' else 1e-6
    self.assertAllClose(images.astype(np.float32)[..., 0],
                        pixels[:4] / 255.0, atol=atol, rtol=0)

  def test_training_repeats_and_seed_fixes_the_order(self):
    path, _, _ = self._write(count=5)

    def labels_read(seed):
      input_fn = mnist_input.mnist_input_fn_builder(path, is_training=True,
                                                    seed=seed)
      batches = _read_all(input_fn, {'batch_size': 4}, max_batches=10)
      return np.concatenate([l for _, l in batches])

    first = labels_read(seed=3)
    self.assertLen(first, 40)  # 10 batches from 5 records: it repeats
    self.assertAllEqual(first, labels_read(seed=3))
    self.assertCountEqual(set(first), {0, 1, 2, 3, 4})


class DigitsTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Converted once for the tests that read the converted set.
    cls.digits = digits.digits_as_mnist()

  def test_digits_look_like_mnist(self):
    images, labels = self.digits
    self.assertEqual(images.shape, (1797, 28, 28))
    self.assertEqual(images.dtype, np.uint8)
    self.assertEqual(images.max(), 255)
    self.assertEqual(set(labels.tolist()), set(range(10)))
    # A 2-pixel empty border around the scaled 24x24 digit, as in MNIST.
    self.assertEqual(images[:, :2].max(), 0)
    self.assertEqual(images[:, :, -2:].max(), 0)

  def test_split_is_fixed_and_disjoint(self):
    images, labels = self.digits
    index = np.arange(len(labels))
    (_, train), (_, test) = digits.split(images, index, seed=0)
    (_, train_again), _ = digits.split(images, index, seed=0)
    (_, other_train), _ = digits.split(images, index, seed=1)
    self.assertLen(train, 1437)
    self.assertLen(test, digits.NUM_TEST)
    self.assertEmpty(set(train) & set(test))
    self.assertAllEqual(train, train_again)
    self.assertNotAllEqual(train, other_train)

  def test_written_digits_read_back(self):
    out_dir = self.create_tempdir().full_path
    self.assertEqual(digits.write_digits(out_dir), {'train': 1437,
                                                    'test': 360})
    _, (test_images, test_labels) = digits.split(*self.digits)
    _, test_file = mnist_input.data_files(out_dir)
    input_fn = mnist_input.mnist_input_fn_builder(test_file,
                                                  is_training=False)
    batches = _read_all(input_fn, {'batch_size': 120})
    self.assertLen(batches, 3)
    images = np.concatenate([f['image'] for f, _ in batches])[..., 0]
    self.assertAllClose(images, test_images / 255.0, atol=1e-6)
    self.assertAllEqual(np.concatenate([l for _, l in batches]), test_labels)

  def test_ensure_digits_writes_once(self):
    cache = self.create_tempdir().full_path
    data_dir = digits.ensure_digits(cache)
    train_file, _ = mnist_input.data_files(data_dir)
    written = os.path.getmtime(train_file)
    self.assertEqual(digits.ensure_digits(cache), data_dir)
    self.assertEqual(os.path.getmtime(train_file), written)
    self.assertEqual(sorted(os.listdir(cache)), [os.path.basename(data_dir)])

  @pytest.mark.slow
  def test_command_writes_records(self):
    out_dir = self.create_tempdir().full_path
    subprocess.run([sys.executable, '-m', 'estimator_bf16.apps.digits_cli',
                    '--out_dir=' + out_dir], cwd=_REPO, check=True,
                   capture_output=True, timeout=300)
    self.assertCountEqual(os.listdir(out_dir),
                          ['train.tfrecords', 'test.tfrecords'])


class MlpAccuracyTest(tf.test.TestCase):

  @pytest.mark.slow
  def test_mlp_on_digits_reaches_accuracy_in_both_precisions(self):
    accuracy = {}
    for precision in eb.PRECISIONS:
      result = training.run(training.TrainOptions(
          model='mnist_mlp', precision=precision, train_steps=300,
          train_batch_size=64, export=False,
          model_dir=os.path.join(self.create_tempdir().full_path, precision)))
      accuracy[precision] = result['eval']['accuracy']
      self.assertEqual(result['eval']['global_step'], 300)
    for precision, value in accuracy.items():
      self.assertGreaterEqual(value, _MIN_ACCURACY, precision)
    self.assertLessEqual(abs(accuracy['bfloat16'] - accuracy['float32']),
                         _MAX_ACCURACY_GAP, accuracy)


if __name__ == '__main__':
  tf.test.main()
