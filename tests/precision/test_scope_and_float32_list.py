"""Tests for bfloat16_scope and the float32 list."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from tensorflow.python.framework import op_def_library


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _dense_net(x):
  """A tf.compat.v1.layers network whose dtype follows its input."""
  net = tf.compat.v1.layers.dense(x, 8, activation=tf.nn.relu, name='hidden')
  return tf.compat.v1.layers.dense(net, 3, name='logits')


class ScopeTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*eb.PRECISIONS)
  def test_variables_stored_float32_read_in_compute_dtype(self, precision):
    with tf.Graph().as_default():
      x = eb.cast_features(tf.ones([2, 4]), precision)
      with eb.bfloat16_scope(precision):
        logits = _dense_net(x)
      self.assertEqual(logits.dtype, eb.compute_dtype(precision))
      for var in tf.compat.v1.global_variables():
        self.assertEqual(var.dtype.base_dtype, tf.float32, var.name)
      matmuls = [op for op in tf.compat.v1.get_default_graph().get_operations()
                 if op.type == 'MatMul']
      self.assertLen(matmuls, 2)
      for op in matmuls:
        self.assertEqual(op.inputs[1].dtype, eb.compute_dtype(precision))

  def test_names_identical_across_precisions(self):
    names = {}
    for precision in eb.PRECISIONS:
      with tf.Graph().as_default():
        with tf.compat.v1.variable_scope('model'):
          x = eb.cast_features(tf.ones([2, 4]), precision)
          with eb.bfloat16_scope(precision):
            _dense_net(x)
        names[precision] = sorted(
            v.op.name for v in tf.compat.v1.global_variables())
    self.assertEqual(names['float32'], names['bfloat16'])
    self.assertIn('model/hidden/kernel', names['bfloat16'])

  def test_float32_precision_changes_nothing(self):
    with tf.Graph().as_default():
      outer = tf.compat.v1.get_variable_scope()
      with eb.bfloat16_scope('float32') as scope:
        self.assertIs(scope, outer)
        v = tf.compat.v1.get_variable('v', [2], dtype=tf.bfloat16)
      # Without the getter, a bfloat16 request makes a bfloat16 variable.
      self.assertEqual(v.dtype.base_dtype, tf.bfloat16)

  def test_bfloat16_constant_initializer_and_reuse(self):
    with tf.Graph().as_default():
      init = tf.constant([1.5, -2.0], tf.bfloat16)
      with eb.bfloat16_scope('bfloat16'):
        read = tf.compat.v1.get_variable('w', initializer=init)
      with eb.bfloat16_scope('bfloat16'), tf.compat.v1.variable_scope(
          tf.compat.v1.get_variable_scope(), reuse=True):
        again = tf.compat.v1.get_variable('w', [2], dtype=tf.bfloat16)
      self.assertEqual(read.dtype, tf.bfloat16)
      self.assertLen(tf.compat.v1.global_variables(), 1)
      var = tf.compat.v1.global_variables()[0]
      self.assertEqual(var.dtype.base_dtype, tf.float32)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        self.assertAllEqual(sess.run(tf.cast(again, tf.float32)), [1.5, -2.])

  def test_gradient_reaches_float32_variable(self):
    with tf.Graph().as_default():
      x = tf.ones([2, 4], tf.bfloat16)
      with eb.bfloat16_scope('bfloat16'):
        logits = _dense_net(x)
      loss = tf.reduce_sum(tf.cast(logits, tf.float32))
      grads = tf.gradients(loss, tf.compat.v1.trainable_variables())
      for grad in grads:
        self.assertIsNotNone(grad)
        self.assertEqual(grad.dtype, tf.float32)

  def test_bad_precision(self):
    with self.assertRaisesRegex(ValueError, 'must be one of'):
      with eb.bfloat16_scope('half'):
        pass


def _op_dtypes(op_type):
  graph = tf.compat.v1.get_default_graph()
  return [op.inputs[0].dtype for op in graph.get_operations()
          if op.type == op_type]


class Float32ListTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(
      ('nn', lambda x: tf.nn.softmax(x)),
      ('v1', lambda x: tf.compat.v1.nn.softmax(x)),
      ('math', lambda x: tf.math.softmax(x)),
      ('log', lambda x: tf.nn.log_softmax(x)))
  def test_softmax_computes_float32_keeps_dtype(self, _, fn):
    with tf.Graph().as_default():
      x = tf.constant([[1., 2., 3.]], tf.bfloat16)
      with eb.float32_ops():
        y = fn(x)
      self.assertEqual(y.dtype, tf.bfloat16)
      kinds = _op_dtypes('Softmax') + _op_dtypes('LogSoftmax')
      self.assertEqual(kinds, [tf.float32])

  @parameterized.named_parameters(
      ('sparse_nn', lambda l, x: tf.nn.sparse_softmax_cross_entropy_with_logits(
          labels=l, logits=x)),
      ('dense_nn', lambda l, x: tf.nn.softmax_cross_entropy_with_logits(
          labels=tf.one_hot(l, 3, dtype=x.dtype), logits=x)),
      ('losses', lambda l, x: tf.compat.v1.losses.sparse_softmax_cross_entropy(
          l, x)),
      ('sigmoid', lambda l, x: tf.compat.v1.losses.sigmoid_cross_entropy(
          tf.one_hot(l, 3), x)),
      ('mse', lambda l, x: tf.compat.v1.losses.mean_squared_error(
          tf.one_hot(l, 3), x)))
  def test_losses_are_float32(self, loss_fn):
    with tf.Graph().as_default():
      labels = tf.constant([2, 0])
      logits32 = tf.constant([[1., 2., 3.], [0.5, -1., 2.]])
      logits16 = tf.cast(logits32, tf.bfloat16)
      reference = loss_fn(labels, logits32)
      with eb.float32_ops():
        loss = loss_fn(labels, logits16)
        mean = tf.reduce_mean(loss)
      # Some TensorFlow loss functions cast their float32 result back to the
      # logits' dtype; what leaves a model_fn (to_float32) and what reduces
      # it is the float32 result itself, not a copy of its rounding.
      exact = eb.to_float32(loss)
      self.assertEqual(exact.dtype, tf.float32)
      self.assertNotEqual(exact.op.type, 'Cast')
      self.assertEqual(mean.dtype, tf.float32)
      with self.cached_session() as sess:
        got, want = sess.run([exact, reference])
      # Only the bfloat16 rounding of the logits differs.
      self.assertAllClose(got, want, rtol=1e-2)

  def test_in_top_k_and_metrics_accept_bfloat16(self):
    with tf.Graph().as_default():
      logits = tf.constant([[1., 2., 3.], [3., 2., 1.]], tf.bfloat16)
      with eb.float32_ops():
        hits = tf.math.in_top_k(tf.constant([2, 1]), logits, 1)
        mean, update = tf.compat.v1.metrics.mean(logits)
      self.assertEqual(mean.dtype, tf.float32)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.local_variables_initializer())
        sess.run(update)
        self.assertAllEqual(sess.run(hits), [True, False])
        self.assertAllClose(sess.run(mean), 2.0)

  def test_hook_undone_on_exit_and_on_error(self):
    original = op_def_library._apply_op_helper
    with eb.float32_ops():
      self.assertIsNot(op_def_library._apply_op_helper, original)
      with eb.float32_ops():  # nested: still in force, installed once
        pass
      self.assertIsNot(op_def_library._apply_op_helper, original)
    self.assertIs(op_def_library._apply_op_helper, original)
    with self.assertRaises(RuntimeError):
      with eb.float32_ops():
        raise RuntimeError('boom')
    self.assertIs(op_def_library._apply_op_helper, original)
    with tf.Graph().as_default():  # and nothing is left in force
      y = tf.nn.softmax(tf.constant([[1., 2.]], tf.bfloat16))
      self.assertEqual(_op_dtypes('Softmax'), [tf.bfloat16])
      self.assertEqual(y.dtype, tf.bfloat16)

  def test_float32_inputs_unchanged(self):
    with tf.Graph().as_default():
      x = tf.constant([[1., 2.]])
      with eb.float32_ops():
        y = tf.nn.softmax(x)
      self.assertEqual(_op_dtypes('Cast'), [])
      with self.cached_session() as sess:
        self.assertAllClose(sess.run(y), [[np.exp(1) / (np.exp(1) + np.exp(2)),
                                           np.exp(2) / (np.exp(1) + np.exp(2))]])


if __name__ == '__main__':
  tf.test.main()
