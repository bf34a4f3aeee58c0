"""Tests for check_graph: it must catch the mistakes seen in the field."""

from absl.testing import parameterized
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import op_lists
from estimator_bf16.safety import audit as audit_lib


def setUpModule():
  tf.compat.v1.disable_eager_execution()


class CheckGraphTest(tf.test.TestCase, parameterized.TestCase):

  def test_clean_bfloat16_graph(self):
    with tf.Graph().as_default() as graph:
      x = tf.ones([4, 8], tf.bfloat16)
      with eb.bfloat16_scope('bfloat16'):
        net = tf.compat.v1.layers.dense(x, 16)
        net = tf.compat.v1.layers.conv2d(tf.reshape(net, [4, 4, 4, 1]), 2, 3)
      loss = tf.reduce_mean(tf.cast(net, tf.float32))
      tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
      report = eb.check_graph(graph, strict=True, loss=loss)
    self.assertTrue(report.ok)
    self.assertEqual(report.loss_dtype, 'float32')
    self.assertEqual(report.half_precision_variables, [])
    # Forward and backward matmul/conv all run in bfloat16.
    self.assertAlmostEqual(report.bfloat16_flop_share, 1.0)
    self.assertGreater(report.num_casts, 0)

  def test_keras_dense_inside_scope_is_caught(self):
    with tf.Graph().as_default() as graph:
      x = tf.ones([4, 8], tf.bfloat16)
      with eb.bfloat16_scope('bfloat16'):
        # Keras ignores the scope and builds bfloat16 variables.
        tf.keras.layers.Dense(4, dtype='bfloat16', name='keras_dense')(x)
      report = eb.check_graph(graph, strict=False)
      self.assertNotEmpty(report.half_precision_variables)
      self.assertIn('keras_dense', report.half_precision_variables[0][0])
      with self.assertRaisesRegex(eb.PrecisionError,
                                  r"keras_dense.*stored as bfloat16"):
        eb.check_graph(graph, strict=True)

  def test_bfloat16_times_float32_matmul_is_caught(self):
    with tf.Graph().as_default() as graph:
      x = tf.ones([4, 8], tf.bfloat16)
      w = tf.compat.v1.get_variable('w_float32', [8, 4])  # float32 read
      y = tf.matmul(x, w)  # TensorFlow silently makes this a SparseMatMul
      self.assertEqual(y.dtype, tf.float32)
      report = eb.check_graph(graph, strict=False)
      self.assertEqual([t for _, t, _ in report.mixed_precision_ops],
                       ['SparseMatMul'])
      # SparseMatMul computes in float32: no bfloat16 FLOPs at all.
      self.assertEqual(report.bfloat16_flop_share, 0.0)
      with self.assertRaisesRegex(eb.PrecisionError, 'SparseMatMul'):
        eb.check_graph(graph)

  def test_bfloat16_loss_is_caught(self):
    with tf.Graph().as_default() as graph:
      loss = tf.reduce_mean(tf.ones([3], tf.bfloat16))
      with self.assertRaisesRegex(eb.PrecisionError, 'loss .* bfloat16'):
        eb.check_graph(graph, loss=loss)
      self.assertEqual(eb.check_graph(graph, strict=False,
                                      loss=loss).loss_dtype, 'bfloat16')

  def test_flop_share_counts_both_dtypes(self):
    with tf.Graph().as_default() as graph:
      a16 = tf.ones([2, 3], tf.bfloat16)
      tf.matmul(a16, tf.ones([3, 5], tf.bfloat16))  # 2*2*3*5 = 60 FLOPs
      tf.matmul(tf.ones([2, 3]), tf.ones([3, 5]))   # 60 FLOPs in float32
      report = eb.check_graph(graph, strict=False)
    self.assertEqual(report.flops_by_dtype, {'bfloat16': 60.0,
                                             'float32': 60.0})
    self.assertAlmostEqual(report.bfloat16_flop_share, 0.5)
    self.assertIn('50.0%', report.summary())

  @parameterized.named_parameters(
      # 2 * (b=2 * i=3 * j=4 * k=5) for 'bij,bjk->bik'.
      ('einsum', lambda x, w: tf.einsum('bij,jk->bik', x, w),
       [2, 3, 4], [4, 5], 2.0 * 2 * 3 * 4 * 5),
      ('einsum_ellipsis', lambda x, w: tf.einsum('...j,jk->...k', x, w),
       [2, 3, 4], [4, 5], 2.0 * 2 * 3 * 4 * 5),
      # 2 * output elements (1*4*4*3*2) * kernel window (3*3).
      ('depthwise', lambda x, w: tf.nn.depthwise_conv2d(
          x, w, [1, 1, 1, 1], 'SAME'), [1, 4, 4, 3], [3, 3, 3, 2],
       2.0 * (4 * 4 * 3 * 2) * 9),
      # 2 * output elements (1*2*4*4*2) * kernel window and depth (3*3*3*3).
      ('conv3d', lambda x, w: tf.nn.conv3d(x, w, [1] * 5, 'SAME'),
       [1, 2, 4, 4, 3], [3, 3, 3, 3, 2], 2.0 * (2 * 4 * 4 * 2) * 81))
  def test_matrix_ops_of_every_kind_are_counted(self, build, x_shape,
                                                w_shape, flops):
    with tf.Graph().as_default() as graph:
      build(tf.ones(x_shape), tf.ones(w_shape))
      report = eb.check_graph(graph, strict=False)
    self.assertEqual(report.flops_by_dtype, {'float32': flops})

  def test_float32_einsum_network_fails_the_share_check(self):
    with tf.Graph().as_default() as graph:
      x = tf.ones([4, 6, 8])
      w = tf.compat.v1.get_variable('einsum_w', [8, 8])
      y = tf.einsum('btd,de->bte', x, w)
      loss = tf.reduce_mean(y)
      tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
      report = eb.check_graph(graph, strict=False, loss=loss)
      self.assertGreater(report.flops_by_dtype['float32'], 0)
      self.assertEqual(report.bfloat16_flop_share, 0.0)
      with self.assertRaisesRegex(eb.PrecisionError, 'Einsum'):
        eb.check_graph(graph, strict=True, loss=loss, min_bfloat16_share=0.5)

  def test_every_autocast_matrix_op_is_counted(self):
    counted = set(audit_lib._FLOP_COUNTERS)  # pylint: disable=protected-access
    self.assertContainsSubset(op_lists.BFLOAT16_OPS, counted)
    self.assertEqual(counted, op_lists.MATMUL_CONV_OPS)


if __name__ == '__main__':
  tf.test.main()
