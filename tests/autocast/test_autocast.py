"""Tests for autocast: op-level precision rules while a model_fn is built."""

import threading

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import tensor_conversion_registry
from tensorflow.python.ops import cond_v2

import estimator_bf16 as eb
from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.autocast import weights as autocast_weights
from estimator_bf16.memory import peak as peak_lib

BF16 = tf.bfloat16


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _ops(graph, *types):
  return [op for op in graph.get_operations() if op.type in types]


def _activation(values):
  """A bfloat16 tensor computed in the graph (not a constant)."""
  return tf.identity(tf.constant(values, BF16))


def _t_dtypes(graph, *types):
  return [tf.as_dtype(op.get_attr('T')) for op in _ops(graph, *types)]


class MixedArithmeticTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('add', lambda a, b: a + b, 'AddV2'),
      ('add_reversed', lambda a, b: b + a, 'AddV2'),
      ('multiply', tf.multiply, 'Mul'),
      ('maximum_number_first', lambda a, b: tf.maximum(0.0, a), 'Maximum'),
      ('concat', lambda a, b: tf.concat([a, b], 0), 'ConcatV2'),
      ('bias_add', lambda a, b: tf.nn.bias_add(a, b[0]), 'BiasAdd'),
      ('where', lambda a, b: tf.where(a > 0, a, b), 'SelectV2'))
  def test_float32_meets_bfloat16_in_bfloat16(self, fn, op_type):
    with tf.Graph().as_default() as graph:
      a = _activation([[1.5, -2.0]])
      b = tf.constant([[0.25, 4.0]], tf.float32)
      with eb.autocast('bfloat16'):
        out = fn(a, b)
      self.assertEqual(out.dtype, BF16)
      self.assertEqual(_t_dtypes(graph, op_type), [BF16])
    # Without autocast TensorFlow refuses the same code (except where a
    # number comes first, which it converts only when a tensor leads).
    if op_type not in ('Maximum',):
      with tf.Graph().as_default():
        with self.assertRaises((TypeError, ValueError)):
          fn(tf.constant([[1.5, -2.0]], BF16),
             tf.constant([[0.25, 4.0]], tf.float32))

  def test_matmul_bfloat16_float32_is_a_bfloat16_matmul(self):
    with tf.Graph().as_default() as graph:
      a = tf.constant(np.ones([2, 3]), BF16)
      b = tf.constant(np.full([3, 4], 0.5), tf.float32)
      with eb.autocast('bfloat16'):
        out = tf.matmul(a, b)
        out_t = tf.matmul(b, a, transpose_a=True, transpose_b=True)
      self.assertEqual(_ops(graph, 'SparseMatMul'), [])
      self.assertEqual(_t_dtypes(graph, 'MatMul'), [BF16, BF16])
      with self.cached_session() as sess:
        got, got_t = sess.run([out, out_t])
      self.assertAllClose(got, np.full([2, 4], 1.5))
      self.assertAllClose(got_t, np.full([4, 2], 1.5))
    with tf.Graph().as_default() as graph:  # TensorFlow alone: SparseMatMul.
      tf.matmul(tf.constant(np.ones([2, 3]), BF16),
                tf.constant(np.ones([3, 4]), tf.float32))
      self.assertLen(_ops(graph, 'SparseMatMul'), 1)

  def test_float32_list_computes_in_float32(self):
    with tf.Graph().as_default() as graph:
      x = tf.constant([[1.0, 2.0, 3.5]], BF16)
      with eb.autocast('bfloat16'):
        mean, variance = tf.nn.moments(x, [-1])
        hits = tf.math.in_top_k(tf.constant([2]), x, 1)  # no bfloat16 kernel
        total = tf.reduce_sum(x)
      self.assertEqual(mean.dtype, tf.float32)
      self.assertEqual(variance.dtype, tf.float32)
      self.assertEqual(total.dtype, tf.float32)
      self.assertEqual(set(_t_dtypes(graph, 'Mean', 'SquaredDifference')),
                       {tf.float32})
      with self.cached_session() as sess:
        self.assertAllEqual(sess.run(hits), [True])

  def test_bfloat16_copy_is_not_cast_back(self):
    # Keras casts bfloat16 inputs to float32; the next matmul reads the
    # bfloat16 original instead of rounding a float32 copy again.
    with tf.Graph().as_default() as graph:
      x = tf.constant(np.ones([2, 3]), BF16)
      w = tf.compat.v1.get_variable('w', [3, 2])
      with eb.autocast('bfloat16'):
        out = tf.matmul(tf.cast(x, tf.float32), w)
      matmul = _ops(graph, 'MatMul')[0]
      self.assertIs(matmul.inputs[0], x)
      self.assertEqual(out.dtype, BF16)

  def test_same_tensor_cast_once(self):
    with tf.Graph().as_default() as graph:
      adder = tf.constant([[0.0, -10000.0]])
      x = _activation([[1.0, 2.0]])
      before = len(_ops(graph, 'Cast'))
      with eb.autocast('bfloat16'):
        for _ in range(4):
          x = x + adder
      self.assertLen(_ops(graph, 'Cast'), before + 1)

  def test_keep_float32_leaves_ops_alone(self):
    with tf.Graph().as_default() as graph:
      w = tf.compat.v1.get_variable('w', [3, 2])
      with eb.autocast('bfloat16'):
        with eb.keep_float32():
          tf.matmul(tf.ones([2, 3]), w)
        tf.matmul(tf.ones([2, 3]), w)
      self.assertEqual(_t_dtypes(graph, 'MatMul'), [tf.float32, BF16])

  def test_float32_precision_changes_nothing(self):
    with tf.Graph().as_default() as graph:
      with eb.autocast('float32'):
        w = tf.compat.v1.get_variable('w', [3, 2])
        tf.nn.softmax(tf.matmul(tf.ones([2, 3]), w))
      self.assertEqual(_t_dtypes(graph, 'MatMul', 'Softmax'),
                       [tf.float32, tf.float32])
      self.assertEqual(_ops(graph, 'Cast'), [])

  def test_bad_precision(self):
    with self.assertRaisesRegex(ValueError, "'float32', 'bfloat16'"):
      with eb.autocast('float16'):
        pass


class VariableStorageTest(tf.test.TestCase):

  def test_trainable_bfloat16_variable_is_stored_float32(self):
    with tf.Graph().as_default():
      with eb.autocast('bfloat16'):
        var = tf.compat.v1.Variable(np.ones([2, 2]), dtype=BF16, name='w')
        state = tf.compat.v1.Variable(np.ones([2]), dtype=BF16,
                                      trainable=False, name='state')
      self.assertEqual(var.dtype.base_dtype, tf.float32)
      self.assertEqual(var.op.name, 'w')
      # Non-trainable state keeps what was asked (the audit reports it).
      self.assertEqual(state.dtype.base_dtype, BF16)

  def test_keras_v1_dtype_behaviour_gets_float32_weights(self):
    # With v2 dtype behaviour off (as after disable_v2_behavior()), a Keras
    # layer takes its dtype from a bfloat16 input and asks for bfloat16
    # weights.
    tf.compat.v1.keras.layers.disable_v2_dtype_behavior()
    try:
      with tf.Graph().as_default() as graph:
        x = tf.ones([4, 3], BF16)
        with eb.autocast('bfloat16'):
          out = tf.keras.layers.Dense(2, name='dense')(x)
        self.assertEqual(out.dtype, BF16)
        self.assertEqual(
            sorted((v.op.name, v.dtype.base_dtype)
                   for v in tf.compat.v1.global_variables()),
            [('dense/bias', tf.float32), ('dense/kernel', tf.float32)])
        self.assertEqual(_t_dtypes(graph, 'MatMul'), [BF16])
    finally:
      tf.compat.v1.keras.layers.enable_v2_dtype_behavior()


class RearrangedCopiesTest(tf.test.TestCase, parameterized.TestCase):
  """A rearranged float32 copy of a bfloat16 tensor is not rounded again."""

  @parameterized.named_parameters(
      ('keras_flatten', lambda x: tf.keras.layers.Flatten()(x)),
      ('reshape_of_cast', lambda x: tf.reshape(tf.cast(x, tf.float32),
                                               [4, -1])),
      ('transpose_of_reshape_of_cast', lambda x: tf.transpose(tf.reshape(
          tf.cast(x, tf.float32), [-1, 4]))))
  def test_matmul_reads_the_bfloat16_original(self, flatten):
    rng = np.random.RandomState(0)
    with tf.Graph().as_default() as graph:
      images = _activation(rng.randn(4, 3, 3, 2))
      with eb.autocast('bfloat16'):
        flat = flatten(images)
        kernel = tf.compat.v1.get_variable('kernel', [18, 5])
        out = tf.matmul(flat, kernel)
      self.assertEqual(flat.dtype, tf.float32)  # what the code asked for
      self.assertEqual(out.dtype, BF16)
      (matmul,) = _ops(graph, 'MatMul')
      # The matmul's input is the same rearrangement of the bfloat16
      # tensor: nothing rounds the float32 copy back to bfloat16, and the
      # copy, read by nothing else, never runs.
      self.assertEqual(matmul.inputs[0].dtype, BF16)
      self.assertEqual(matmul.inputs[0].op.type, flat.op.type)
      self.assertEmpty(flat.consumers())
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got, want = sess.run([tf.cast(out, tf.float32), tf.matmul(
            tf.cast(tf.cast(flat, BF16), tf.float32), kernel)])
    self.assertAllClose(got, want, rtol=2**-7, atol=2**-7 * np.abs(want).max())


def _probabilities_model_fn(features, labels, mode):
  """A tiny classifier returning softmax probabilities as predictions."""
  del labels
  logits = tf.compat.v1.layers.dense(features['x'], 5, name='logits')
  scores = tf.matmul(logits[:, :, None], logits[:, None, :])  # attention-like
  attention = tf.nn.softmax(scores)
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, predictions={
          'probabilities': tf.nn.softmax(logits),
          'logits': logits,
          'attention_dtype_is_bf16': tf.constant(attention.dtype == BF16),
      })


class ExactFloat32OutputsTest(tf.test.TestCase):

  def test_probabilities_are_float32_softmax_of_bfloat16_logits(self):
    with tf.Graph().as_default():
      x = tf.constant(np.random.RandomState(0).randn(64, 7) * 3, tf.float32)
      spec = eb.wrap_model_fn(_probabilities_model_fn, 'bfloat16')(
          {'x': x}, None, 'infer')
      predictions = spec.predictions
      self.assertEqual(predictions['probabilities'].dtype, tf.float32)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        out = sess.run(predictions)
    self.assertTrue(out['attention_dtype_is_bf16'])
    as_bfloat16 = BF16.as_numpy_dtype
    # The logits really are bfloat16 values.
    self.assertAllEqual(
        out['logits'].astype(as_bfloat16).astype(np.float32), out['logits'])
    logits = out['logits'].astype(np.float64)
    probabilities = out['probabilities']
    self.assertAllClose(probabilities.sum(axis=1), np.ones(64), atol=1e-5)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    reference = shifted / shifted.sum(axis=1, keepdims=True)
    self.assertAllClose(probabilities, reference, atol=1e-6, rtol=0)
    # A bfloat16 rounding of them would be off by far more.
    rounded = probabilities.astype(as_bfloat16).astype(np.float64)
    self.assertGreater(np.abs(rounded - reference).max(), 1e-4)


class BackwardMemoryTest(tf.test.TestCase, parameterized.TestCase):
  """The backward pass keeps bfloat16 tensors, not float32 copies of them."""

  def test_statistics_gradient_reads_the_bfloat16_input(self):
    rng = np.random.RandomState(0)
    with tf.Graph().as_default() as graph:
      x = tf.cast(tf.constant(rng.randn(4, 8), tf.float32), BF16)
      with eb.autocast('bfloat16'):
        mean, variance = tf.nn.moments(x, [-1], keepdims=True)
        normalized = (x - mean) * tf.math.rsqrt(variance + 1e-6)
        grad = tf.gradients(tf.reduce_sum(normalized * normalized * x), x)[0]
      squared = _ops(graph, 'SquaredDifference')[0]
      copy = squared.inputs[0]
      self.assertEqual(copy.op.type, 'Cast')
      # Only forward ops read the float32 copy.
      self.assertEmpty([op.name for op in copy.consumers()
                        if op.name.startswith('gradients')])
      # Same values as TensorFlow's own gradient on the same float32 math.
      x32 = tf.cast(x, tf.float32)
      mean32, variance32 = tf.nn.moments(x32, [-1], keepdims=True)
      normalized32 = ((x32 - mean32) *
                      tf.math.rsqrt(variance32 + 1e-6))
      reference = tf.gradients(
          tf.reduce_sum(normalized32 * normalized32 * x32), x32)[0]
      with self.cached_session() as sess:
        got, want = sess.run([tf.cast(grad, tf.float32), reference])
    self.assertAllClose(got, want, atol=0.05 * np.abs(want).max())


  @parameterized.named_parameters(
      ('autocast', tf.nn.softmax),
      # tensorflow/tpu-style code: float32 softmax, rounded by the model.
      ('by_hand', lambda scores: tf.cast(
          tf.nn.softmax(tf.cast(scores, tf.float32)), BF16)))
  def test_softmax_backward_reads_the_bfloat16_probabilities(self, softmax):
    rng = np.random.RandomState(0)
    with tf.Graph().as_default() as graph:
      scores32 = tf.constant(rng.randn(4, 6, 6), tf.float32)
      values32 = tf.constant(rng.randn(4, 6, 3), tf.float32)
      scores = tf.cast(scores32, BF16)
      with eb.autocast('bfloat16'):
        probabilities = softmax(scores)
        out = tf.matmul(probabilities, tf.cast(values32, BF16))
        grad = tf.gradients(tf.reduce_sum(out * out), scores)[0]
      self.assertEqual(probabilities.dtype, BF16)
      softmax_op = _ops(graph, 'Softmax')[0]
      self.assertEqual(tf.float32, softmax_op.outputs[0].dtype)
      # The float32 result feeds only its rounding: nothing in the backward
      # pass keeps a float32 copy of the probabilities alive.
      self.assertEqual([op.type for op in softmax_op.outputs[0].consumers()],
                       ['Cast'])
      # The backward pass's float32 copy of the rounding is made once the
      # incoming gradient exists, not during the forward pass.
      (rounding,) = softmax_op.outputs[0].consumers()
      (copy,) = [op for op in rounding.outputs[0].consumers()
                 if op.type == 'Cast' and op.name.startswith('gradients')]
      self.assertNotEmpty(copy.control_inputs)
      reference = tf.gradients(tf.reduce_sum(tf.square(tf.matmul(
          tf.nn.softmax(tf.cast(scores, tf.float32)), values32))), scores32)[0]
      with self.cached_session() as sess:
        got, want = sess.run([tf.cast(grad, tf.float32), reference])
    self.assertAllClose(got, want, atol=0.05 * np.abs(want).max())


class WeightCopiesTest(tf.test.TestCase, parameterized.TestCase):
  """bfloat16 copies of the weights live in the forward pass, not through it.

  Of the bfloat16 graph, with TensorFlow's own kernels: where this CPU's
  bfloat16 conv gradients or einsums are slow, autocast computes them in
  float32 (autocast.cpu_kernels, tested in test_cpu_kernels), and the
  hand-written bfloat16 gradients compared with here would differ.
  """

  def setUp(self):
    super().setUp()
    self.enter_context(cpu_kernels.kernels('bfloat16'))

  # (kind, rows the weights meet): a dense layer's batch, a conv's batch x
  # positions, the columns of `weights @ x`, and a batch only known when
  # the step runs (None), where the copy is always made again.
  @parameterized.named_parameters(
      ('matmul', 'matmul', autocast_weights.RECAST_MIN_ROWS),
      ('conv', 'conv', autocast_weights.RECAST_MIN_ROWS),
      ('weights_first', 'weights_first', autocast_weights.RECAST_MIN_ROWS),
      ('dynamic_batch', 'matmul', None))
  def test_backward_casts_the_weights_again(self, kind, rows):
    got, want, forward_cast, graph = self._layer_gradients(kind, rows or 4,
                                                           static=bool(rows))
    # The forward copy feeds only the forward op ...
    self.assertLen(forward_cast.outputs[0].consumers(), 1)
    recasts = self._recasts(graph, forward_cast)
    self.assertLen(recasts, 1)
    # ... and the new one waits for the incoming gradient, so it runs in the
    # backward pass.
    self.assertNotEmpty(recasts[0].control_inputs)
    for g, w in zip(got, want):
      self.assertAllEqual(g, w)

  @parameterized.named_parameters(
      ('matmul', 'matmul'), ('conv', 'conv'), ('weights_first', 'weights_first'))
  def test_few_rows_keep_the_forward_copy(self, kind):
    # One row fewer than the threshold: casting the weights again would cost
    # a large share of the backward matmul, so the gradient reads the
    # forward copy, as TensorFlow's own gradient would.
    got, want, forward_cast, graph = self._layer_gradients(
        kind, autocast_weights.RECAST_MIN_ROWS - 1, static=True)
    self.assertGreater(len(forward_cast.outputs[0].consumers()), 1)
    self.assertEmpty(self._recasts(graph, forward_cast))
    for g, w in zip(got, want):
      self.assertAllEqual(g, w)

  @parameterized.named_parameters(('enough', 16, True), ('few', 15, False))
  def test_channels_first_conv_counts_positions(self, side, recast):
    # NCHW (a GPU's layout): the rows are batch x height x width, not the
    # last axis. Graph only; CPU kernels run NHWC.
    with tf.Graph().as_default():
      x = _activation(np.zeros([1, 3, side, side]))
      w = tf.compat.v1.get_variable('w', [3, 3, 3, 4])
      with eb.autocast('bfloat16'):
        y = tf.nn.conv2d(x, w, 1, 'SAME', data_format='NCHW')
      self.assertEqual(y.shape.as_list(), [1, 4, side, side])
      self.assertEqual(self._marked(y.op), recast)

  # An einsum's rows are the output dimensions the weights' subscripts do
  # not name (not its last axis); with an ellipsis they are not counted,
  # and the copy is made again.
  @parameterized.named_parameters(
      ('heads_enough', 'bsh,hnd->bsnd', [2, 128, 16], [16, 4, 8], False,
       True),
      ('heads_few', 'bsh,hnd->bsnd', [1, 128, 16], [16, 4, 8], False, False),
      ('weights_first_enough', 'hd,db->hb', [8, 256], [4, 8], True, True),
      ('weights_first_few', 'hd,db->hb', [8, 255], [4, 8], True, False),
      ('ellipsis', '...h,hd->...d', [1, 8, 16], [16, 8], False, True))
  def test_einsum_counts_the_rows_its_equation_gives(
      self, equation, x_shape, w_shape, weights_first, recast):
    with tf.Graph().as_default():
      x = _activation(np.zeros(x_shape))
      w = tf.compat.v1.get_variable('w', w_shape)
      with eb.autocast('bfloat16'):
        y = (tf.einsum(equation, w, x) if weights_first
             else tf.einsum(equation, x, w))
      self.assertEqual(y.op.type, 'Einsum')
      self.assertEqual(self._marked(y.op), recast)

  def _marked(self, op):
    """True if `op`'s gradient is the weight recast."""
    try:
      return op.get_attr('_gradient_op_type') == b'EstimatorBf16RecastWeights'
    except ValueError:
      return False

  def _recasts(self, graph, forward_cast):
    """Casts the backward pass makes of the variable read `forward_cast` casts."""
    return [op for op in graph.get_operations()
            if op.type == 'Cast' and op.name.startswith('gradients/') and
            op.inputs[0] is forward_cast.inputs[0]]

  def _layer_gradients(self, kind, rows, static):
    """Gradients of one layer under autocast and written in bfloat16.

    Args:
      kind: 'matmul' (x [rows, 6] @ w), 'weights_first' (w @ x [6, rows])
        or 'conv' (x [rows, 1, 1, 3] or, for rows a square, [1, r, r, 3]).
      rows: rows of activations each weight element meets.
      static: False feeds x through a placeholder of unknown first dim.

    Returns:
      (autocast gradients, hand-written gradients) as numpy values for
      [x, w], the forward op's weight cast, and the graph.
    """
    rng = np.random.RandomState(0)
    with tf.Graph().as_default() as graph:
      if kind == 'matmul':
        values = rng.randn(rows, 6)
        w = tf.compat.v1.get_variable('w', [6, 3])
        layer = tf.matmul
      elif kind == 'weights_first':
        values = rng.randn(6, rows)
        w = tf.compat.v1.get_variable('w', [3, 6])
        layer = lambda x, w: tf.matmul(w, x)
      else:
        side = int(np.sqrt(rows))
        values = (rng.randn(1, side, side, 3) if side * side == rows else
                  rng.randn(rows, 1, 1, 3))
        w = tf.compat.v1.get_variable('w', [3, 3, 3, 4])
        layer = lambda x, w: tf.nn.conv2d(x, w, 1, 'SAME')
      if static:
        x = _activation(values)
        feed = {}
      else:
        fed = tf.compat.v1.placeholder(BF16, [None] + list(values.shape[1:]))
        x = tf.identity(fed)
        feed = {fed: values}
      with eb.autocast('bfloat16'):
        y = layer(x, w)
        got = tf.gradients(tf.reduce_sum(y * y), [x, w])
      # The same math written in bfloat16 by hand: TensorFlow's gradients
      # read the forward pass's cast.
      y_ref = layer(x, tf.cast(w, BF16))
      want = tf.gradients(tf.reduce_sum(tf.cast(y_ref * y_ref, tf.float32)),
                          [x, w])
      (forward_cast,) = [t.op for t in y.op.inputs if t.op.type == 'Cast']
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got, want = sess.run([got, want], feed)
    return got, want, forward_cast, graph

  @parameterized.named_parameters(('cond', 'cond'), ('while_loop', 'while'))
  def test_functional_control_flow_recasts_exactly(self, kind):
    # TensorFlow 2's cond and while_loop (the default control flow) build
    # their bodies as functions; the recast applies there, and the
    # gradients equal the hand-written bfloat16 graph's.
    rows = autocast_weights.RECAST_MIN_ROWS
    x_values = np.random.RandomState(0).randn(rows, 6)
    with tf.Graph().as_default():
      self.assertTrue(tf.compat.v1.control_flow_v2_enabled())
      x = _activation(x_values)
      w = tf.compat.v1.get_variable('w', [6, 3])
      matmuls = []

      def layer(weights):
        matmuls.append(tf.matmul(x, weights))
        return matmuls[-1]

      def build(weights):
        if kind == 'cond':
          return tf.compat.v1.cond(tf.identity(tf.constant(True)),
                                   lambda: layer(weights()),
                                   lambda: tf.zeros([rows, 3], BF16))
        return tf.compat.v1.while_loop(
            lambda i, _: i < 2,
            lambda i, y: (i + 1, y * tf.constant(0.5, BF16) +
                          layer(weights())),
            [0, tf.zeros([rows, 3], BF16)])[1]

      def gradients(y):
        return tf.gradients(tf.reduce_sum(tf.square(tf.cast(y, tf.float32))),
                            [x, w])

      with eb.autocast('bfloat16'):
        got = gradients(build(lambda: w))
      self.assertEqual(matmuls[0].op.get_attr('_gradient_op_type'),
                       b'EstimatorBf16RecastWeights')
      want = gradients(build(lambda: tf.cast(w, BF16)))
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        got, want = sess.run([got, want])
    for g, w in zip(got, want):
      self.assertAllEqual(g, w)

  def test_training_step_updates_every_weight(self):
    # A conv with a bias first in the network: with oneDNN, TensorFlow fuses
    # the bias gradient into the filter gradient, and a recast that waited
    # on the gradient tuple (which waits for the bias gradient) made a
    # cycle: the step returned without updating the conv.
    with tf.Graph().as_default():
      images = tf.constant(np.random.RandomState(0).rand(8, 8, 8, 1),
                           tf.float32)
      with eb.autocast('bfloat16'):
        net = tf.compat.v1.layers.conv2d(tf.cast(images, BF16), 8, 3,
                                         padding='same',
                                         activation=tf.nn.relu)
        net = tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(net), 4)
        loss = tf.reduce_mean(tf.square(net))
        train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
      weights = tf.compat.v1.trainable_variables()
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        before = sess.run(weights)
        sess.run(train)
        after = sess.run(weights)
    self.assertEmpty([v.op.name for v, old, new in zip(weights, before, after)
                      if np.array_equal(old, new)])

  def test_reference_variable_copy_is_kept(self):
    # A reference variable's read aliases the buffer the optimizer updates
    # in place: a later cast could see the new weights. (Rows enough for a
    # resource variable's copy to be made again.)
    with tf.Graph().as_default() as graph:
      x = _activation(np.ones([autocast_weights.RECAST_MIN_ROWS, 6]))
      w = tf.compat.v1.get_variable('w', [6, 3], use_resource=False)
      with eb.autocast('bfloat16'):
        y = tf.matmul(x, w)
        tf.gradients(tf.reduce_sum(y), x)
      forward_cast = y.op.inputs[1]
      self.assertEqual(forward_cast.op.type, 'Cast')
      self.assertIn('gradients/MatMul_grad/MatMul',
                    [op.name for op in forward_cast.consumers()])
      self.assertEmpty([op.name for op in graph.get_operations()
                        if op.type == 'Cast' and
                        op.inputs[0] is forward_cast.op.inputs[0] and
                        op is not forward_cast.op])

  def test_gradient_override_of_the_model_stays(self):
    # Rows enough for the recast to apply but for the model's own choice.
    with tf.Graph().as_default() as graph:
      x = _activation(np.ones([autocast_weights.RECAST_MIN_ROWS, 6]))
      w = tf.compat.v1.get_variable('w', [6, 3])
      with eb.autocast('bfloat16'), graph.gradient_override_map(
          {'MatMul': 'Identity'}):
        y = tf.matmul(x, w)
      self.assertEqual(y.op.get_attr('_gradient_op_type'), b'Identity')


class WeightCopiesPeakTest(tf.test.TestCase):
  """The measured side of WeightCopiesTest: a step's live-tensor peak."""

  def setUp(self):
    super().setUp()
    self.enter_context(cpu_kernels.kernels('bfloat16'))

  def test_live_copies_at_the_peak_are_one_layer(self):
    """Measured: the peak of a weight-heavy step holds few bfloat16 copies."""
    if not peak_lib.allocator_stats_enabled():
      self.skipTest('needs TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow '
                    'loads')
    # Activations as large as the weights, as in a real network: the peak
    # is where the backward pass starts, not where the forward one does
    # (when every weight's cast is ready to run at once).
    layers, width = 16, 512
    copy_bytes = width * width * 2

    def peak(autocast):
      with tf.Graph().as_default():
        x = _activation(np.ones([width, width]))
        net = x
        for i in range(layers):
          w = tf.compat.v1.get_variable('w%d' % i, [width, width])
          if autocast:
            with eb.autocast('bfloat16'):
              net = tf.nn.relu(tf.matmul(net, w))
          else:
            net = tf.nn.relu(tf.matmul(net, tf.cast(w, BF16)))
        loss = tf.reduce_sum(tf.cast(net, tf.float32))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            loss)
        with self.session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          sess.run(train)
          metadata = tf.compat.v1.RunMetadata()
          # One op at a time, as the package measures memory: which ready
          # op runs first then does not depend on the machine's load.
          sess.run(train, options=peak_lib.traced_run_options(),
                   run_metadata=metadata)
      return peak_lib.live_tensor_peak(metadata)

    by_hand, ours = peak(autocast=False), peak(autocast=True)
    print('live-tensor peak: by hand %d, ours %d bytes' % (by_hand, ours))
    # By hand every copy is alive when the backward pass starts; ours holds
    # the ones in use (measured: 14 of 16 copies fewer with TensorFlow 2.15
    # and 2.21, 12 with oneDNN off). More than half must be gone.
    self.assertLess(ours, by_hand - layers // 2 * copy_bytes,
                    (ours, by_hand))


class RandomNumbersTest(tf.test.TestCase, parameterized.TestCase):
  """bfloat16 uniforms are drawn in float32; comparisons use the draw."""

  @parameterized.named_parameters(('rate_0_1', 0.1), ('rate_0_3', 0.3))
  def test_dropout_keeps_one_minus_rate(self, rate):
    size = 4096 * 1024
    # Four standard deviations of the kept share of `size` draws.
    bound = 4 * np.sqrt(rate * (1 - rate) / size)
    kept = {}
    for use_autocast in (False, True):
      with tf.Graph().as_default() as graph:
        tf.compat.v1.set_random_seed(3)
        x = _activation(np.ones([4096, 1024]))
        if use_autocast:
          with eb.autocast('bfloat16'):
            y = tf.nn.dropout(x, rate=rate)
          self.assertEqual(y.dtype, BF16)
          self.assertEqual([tf.float32], [
              op.get_attr('dtype') for op in _ops(graph, 'RandomUniform')])
          self.assertEqual([tf.float32], _t_dtypes(graph, 'GreaterEqual'))
        else:
          y = tf.nn.dropout(x, rate=rate)
        with self.session(graph=graph) as sess:
          kept[use_autocast] = sess.run(tf.reduce_mean(
              tf.cast(tf.not_equal(y, 0), tf.float32)))
    self.assertNear(kept[True], 1 - rate, bound)
    # TensorFlow alone draws from 128 bfloat16 values: its keep rate is off
    # by far more than the sampling noise.
    self.assertGreater(abs(kept[False] - (1 - rate)), 3 * bound)

  def test_uniform_used_as_a_value_stays_bfloat16(self):
    with tf.Graph().as_default():
      with eb.autocast('bfloat16'):
        noise = tf.random.uniform([1000], dtype=BF16)
        scaled = noise * _activation(np.full([1000], 2.0))
      self.assertEqual(noise.dtype, BF16)
      self.assertEqual(scaled.dtype, BF16)
      with self.cached_session() as sess:
        values = sess.run(tf.cast(noise, tf.float32))
    self.assertTrue(np.all((values >= 0) & (values <= 1)))
    self.assertGreater(len(np.unique(values)), 50)


class ZeroSelectTest(tf.test.TestCase, parameterized.TestCase):
  """select(mask, x, 0) on bfloat16 is a multiply, bit for bit the select."""

  # Non-finite values and -0 where the mask drops them and keeps them.
  VALUES = np.array([[1.5, -2.0, np.inf, np.nan, -0.0, 3.0, np.nan, -np.inf],
                     [0.0, np.nan, -0.0, 7.0, np.inf, -1.0, 2.0, -np.inf]],
                    np.float32)
  MASK = np.array([[True, False, False, False, True, True, True, True],
                   [False, True, True, False, False, True, False, True]])

  @parameterized.named_parameters(
      ('zero_tensor_else', lambda c, x: tf.where(c, x, tf.zeros([], BF16))),
      ('python_zero_else', lambda c, x: tf.where(c, x, 0.0)),
      ('zero_then', lambda c, x: tf.where(c, tf.zeros([], BF16), x)),
      ('v1_select', lambda c, x: tf.compat.v1.where(c, x, tf.zeros_like(x))),
      ('broadcast_mask', lambda c, x: tf.where(c[:1], x, 0.0)),
      ('broadcast_value', lambda c, x: tf.where(c, x[:1], 0.0)))
  def test_values_and_gradient_are_the_selects(self, select):
    weights = np.arange(16, dtype=np.float32).reshape(2, 8) - 5.0
    with tf.Graph().as_default() as graph:
      x = tf.cast(tf.identity(self.VALUES), BF16)
      mask = tf.identity(self.MASK)
      outputs = {}
      for use_autocast in (True, False):
        if use_autocast:
          before = len(graph.get_operations())
          with eb.autocast('bfloat16'):
            y = select(mask, x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
            grad, = tf.gradients(loss, x)
          self.assertEqual(y.op.type, 'MulNoNan')
          self.assertEqual(grad.dtype, BF16)
          # Neither the forward nor the backward pass selects.
          self.assertEmpty([op.name for op in
                            graph.get_operations()[before:]
                            if op.type in ('Select', 'SelectV2')])
        else:
          y = select(mask, x)
          self.assertIn(y.op.type, ('Select', 'SelectV2'))
          loss = tf.reduce_sum(tf.cast(y, tf.float32) * weights)
          grad, = tf.gradients(loss, x)
        outputs[use_autocast] = (tf.bitcast(y, tf.uint16),
                                 tf.bitcast(grad, tf.uint16))
      with self.session(graph=graph) as sess:
        got, want = sess.run([outputs[True], outputs[False]])
    # Bit patterns: inf, NaN and -0 included; a dropped NaN is +0.
    self.assertAllEqual(got[0], want[0])
    self.assertAllEqual(got[1], want[1])

  def test_backward_pass_recasts_the_boolean_mask(self):
    with tf.Graph().as_default() as graph:
      x = _activation(np.ones([4, 8]))
      mask = tf.identity(tf.constant(self.MASK.repeat(2, axis=0)))
      with eb.autocast('bfloat16'):
        y = tf.where(mask, x, 0.0)
        tf.gradients(tf.reduce_sum(y * y), x)
      self.assertEmpty([op.name for op in _ops(graph, 'Select', 'SelectV2')])
      forward_mask = y.op.inputs[1]
      self.assertEqual(forward_mask.op.type, 'Cast')
      # The bfloat16 mask feeds the forward multiply only, so it is freed
      # after it; the gradient casts the boolean mask again, once its
      # incoming gradient exists (a control input keeps the two casts from
      # being merged into one that lives through the step).
      self.assertEqual([op.name for op in forward_mask.consumers()],
                       [y.op.name])
      (recast,) = [op for op in mask.consumers()
                   if op.type == 'Cast' and op is not forward_mask.op]
      self.assertTrue(recast.name.startswith('gradients'))
      self.assertNotEmpty(recast.control_inputs)

  def test_dropout_has_no_select(self):
    with tf.Graph().as_default() as graph:
      x = _activation(np.ones([64, 32]))
      with eb.autocast('bfloat16'):
        y = tf.nn.dropout(x, rate=0.25)
        tf.gradients(tf.reduce_sum(y), x)
      self.assertEmpty([op.name for op in _ops(graph, 'Select', 'SelectV2')])
      self.assertLen(_ops(graph, 'MulNoNan'), 2)

  @parameterized.named_parameters(
      ('float32_value', lambda c, x: tf.where(c, tf.cast(x, tf.float32), 0.0)),
      ('negative_zero', lambda c, x: tf.where(c, x, -0.0)),
      ('nonzero', lambda c, x: tf.where(c, x, 1.0)),
      ('computed_zero', lambda c, x: tf.where(c, x, x * 0)),
      ('zero_widens_result', lambda c, x: tf.where(
          c, x, tf.zeros([1, 1, 1], BF16))),
      ('v1_select_of_rows', lambda c, x: tf.compat.v1.where(
          c[:, 0], x, tf.zeros_like(x))))
  def test_other_selects_stay(self, select):
    with tf.Graph().as_default() as graph:
      x = _activation(np.ones([2, 8]))
      with eb.autocast('bfloat16'):
        select(tf.identity(self.MASK), x)
      self.assertEmpty(_ops(graph, 'MulNoNan'))
      self.assertNotEmpty(_ops(graph, 'Select', 'SelectV2'))

  @parameterized.named_parameters(('functional_cond', True),
                                  ('v1_cond_context', False))
  def test_inside_a_cond(self, control_flow_v2):
    # TensorFlow 2's cond builds its branches as functions, whose gradients
    # can read any forward tensor: the select becomes a multiply there too.
    # A TF1 cond context (after disable_v2_behavior()) keeps the select.
    built = []

    def branch():
      built.append(tf.where(mask, x, 0.0))
      return built[-1]

    was_v2 = tf.compat.v1.control_flow_v2_enabled()
    try:
      if control_flow_v2:
        tf.compat.v1.enable_control_flow_v2()
      else:
        tf.compat.v1.disable_control_flow_v2()
      with tf.Graph().as_default():
        x = tf.cast(tf.identity(self.VALUES), BF16)
        mask = tf.identity(self.MASK)
        pick = tf.identity(tf.constant(True))
        weights = np.arange(16, dtype=np.float32).reshape(2, 8) - 5.0
        with eb.autocast('bfloat16'):
          y = tf.compat.v1.cond(pick, branch, lambda: x)
          grad, = tf.gradients(
              tf.reduce_sum(tf.cast(y, tf.float32) * weights), x)
        # Outside autocast: TensorFlow's own select, and its gradient.
        zero = tf.zeros([], BF16)
        want_y = tf.where(mask, x, zero)
        want_grad = tf.where(mask, tf.cast(weights, BF16), zero)
        with self.cached_session() as sess:
          got = sess.run([tf.bitcast(t, tf.uint16)
                          for t in (y, want_y, grad, want_grad)])
    finally:
      if was_v2:
        tf.compat.v1.enable_control_flow_v2()
      else:
        tf.compat.v1.disable_control_flow_v2()
    self.assertEqual(built[0].op.type,
                     'MulNoNan' if control_flow_v2 else 'SelectV2')
    self.assertAllEqual(got[0], got[1])
    self.assertAllEqual(got[2], got[3])

  def test_float32_precision_keeps_the_select(self):
    with tf.Graph().as_default() as graph:
      x = _activation(np.ones([2, 8]))
      with eb.autocast('float32'):
        tf.where(tf.identity(self.MASK), x, 0.0)
      self.assertEmpty(_ops(graph, 'MulNoNan'))


class SecondThreadTest(tf.test.TestCase):

  def test_other_thread_building_meanwhile_is_untouched(self):
    inside = threading.Event()
    done = threading.Event()
    seen = {}

    def autocast_thread():
      with tf.Graph().as_default() as graph:
        with eb.autocast('bfloat16'):
          w = tf.compat.v1.get_variable('w', [3, 2])
          inside.set()
          done.wait(30)  # the other thread builds while we are inside
          tf.matmul(tf.ones([2, 3]), w)
        seen['autocast'] = _t_dtypes(graph, 'MatMul')

    thread = threading.Thread(target=autocast_thread)
    thread.start()
    try:
      self.assertTrue(inside.wait(30))
      with tf.Graph().as_default() as graph:
        w = tf.compat.v1.get_variable('w', [3, 2])
        tf.matmul(tf.ones([2, 3]), w)
        tf.matmul(tf.ones([2, 3], BF16), tf.ones([3, 2]))
        with self.assertRaisesRegex((TypeError, ValueError), 'bfloat16'):
          tf.ones([2], BF16) + tf.ones([2])
        self.assertEqual(_t_dtypes(graph, 'MatMul'), [tf.float32])
        self.assertLen(_ops(graph, 'SparseMatMul'), 1)
    finally:
      done.set()
      thread.join(30)
    self.assertEqual(seen['autocast'], [BF16])


class SwapTest(tf.test.TestCase):
  """Autocast's swap replaces what is in place when it is applied."""

  def test_a_stand_in_installed_before_is_deferred_to_and_put_back(self):
    # pylint: disable=protected-access
    before = (op_def_library._apply_op_helper,
              tensor_conversion_registry.convert)
    seen = []

    def apply_op_stand_in(op_type_name, *args, **kwargs):
      seen.append(op_type_name)
      return before[0](op_type_name, *args, **kwargs)

    def convert_stand_in(*args, **kwargs):
      seen.append('convert')
      return before[1](*args, **kwargs)

    op_def_library._apply_op_helper = apply_op_stand_in
    tensor_conversion_registry.convert = convert_stand_in
    try:
      with tf.Graph().as_default() as graph:
        with eb.autocast('bfloat16'):
          self.assertIsNot(op_def_library._apply_op_helper, apply_op_stand_in)
          w = tf.compat.v1.get_variable('w', [3, 2])
          del seen[:]
          tf.matmul(tf.ones([2, 3], BF16), w)
        # The rules still applied, and made their ops through the stand-in.
        self.assertEqual(_t_dtypes(graph, 'MatMul'), [BF16])
        self.assertIn('MatMul', seen)
        self.assertIn('convert', seen)
      # The stand-in is back, not the function TensorFlow had at import.
      self.assertIs(op_def_library._apply_op_helper, apply_op_stand_in)
      self.assertIs(tensor_conversion_registry.convert, convert_stand_in)
    finally:
      op_def_library._apply_op_helper, tensor_conversion_registry.convert = (
          before)

  def test_nested_contexts_undo_once_the_last_leaves(self):
    # pylint: disable=protected-access
    before = op_def_library._apply_op_helper
    cond_before = cond_v2.cond_v2
    with tf.Graph().as_default() as graph:
      with eb.float32_ops():
        with eb.autocast('bfloat16'):
          inside = op_def_library._apply_op_helper
          self.assertIsNot(inside, before)
          with eb.keep_float32():
            self.assertIs(op_def_library._apply_op_helper, inside)
        self.assertIs(op_def_library._apply_op_helper, inside)
        w = tf.compat.v1.get_variable('w', [3, 2])
        tf.matmul(tf.ones([2, 3]), w)
      self.assertEqual(_t_dtypes(graph, 'MatMul'), [tf.float32])
    self.assertIs(op_def_library._apply_op_helper, before)
    self.assertIs(cond_v2.cond_v2, cond_before)
    with tf.Graph().as_default():
      self.assertEqual(tf.ones([2]).dtype, tf.float32)  # Plain TF again.


def _sgd_spec(mode, loss):
  """A TRAIN spec minimizing `loss` with plain SGD."""
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_or_create_global_step())
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op)


def _bfloat16_train_spec(model_fn):
  """The wrapped model_fn's TRAIN spec on 4 examples of 5 features."""
  return eb.wrap_model_fn(model_fn, 'bfloat16')(
      tf.ones([4, 5]), tf.constant([0, 1, 2, 0]), 'train')


class LegacyCodePathsTest(tf.test.TestCase, parameterized.TestCase):
  """Code paths found in public TF1 programs."""

  def test_reference_variables(self):
    # What programs get after tf.compat.v1.disable_v2_behavior(): VariableV2
    # with ref-typed Assign inputs.
    with tf.Graph().as_default() as graph:
      with eb.autocast('bfloat16'):
        w = tf.compat.v1.get_variable('w', [3, 2], use_resource=False)
        x = tf.ones([4, 3], BF16)
        out = tf.matmul(x, w)
        update = tf.compat.v1.assign_add(w, tf.ones([3, 2], BF16))
      self.assertEqual(out.dtype, BF16)
      self.assertEqual(_t_dtypes(graph, 'AssignAdd'), [tf.float32])
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        before = sess.run(w)
        sess.run(update)
        self.assertAllClose(sess.run(w), before + 1)

  @parameterized.named_parameters(
      ('dense', lambda labels, logits: tf.compat.v1.losses.softmax_cross_entropy(
          tf.one_hot(labels, 3), logits)),
      ('dense_nn', lambda labels, logits: tf.reduce_mean(
          tf.nn.softmax_cross_entropy_with_logits(
              labels=tf.one_hot(labels, 3), logits=logits))),
      ('sparse', tf.compat.v1.losses.sparse_softmax_cross_entropy))
  def test_tensorflow_losses_pass_the_strict_audit_in_float32(self, loss_fn):
    def model_fn(features, labels, mode):
      logits = tf.compat.v1.layers.dense(features, 3, name='logits')
      return _sgd_spec(mode, loss_fn(labels, logits))

    with tf.Graph().as_default():
      spec = _bfloat16_train_spec(model_fn)
      self.assertEqual(spec.loss.dtype, tf.float32)
      self.assertNotEqual(spec.loss.op.type, 'Cast')

  def test_slim_weight_decay_total_loss_is_float32(self):
    import tf_slim as slim  # pylint: disable=g-import-not-at-top

    def model_fn(features, labels, mode):
      with slim.arg_scope([slim.fully_connected],
                          weights_regularizer=slim.l2_regularizer(1e-4)):
        net = slim.fully_connected(features, 8, scope='fc')
        logits = slim.fully_connected(net, 3, activation_fn=None,
                                      scope='logits')
      tf.compat.v1.losses.softmax_cross_entropy(tf.one_hot(labels, 3), logits)
      return _sgd_spec(mode, tf.compat.v1.losses.get_total_loss())

    with tf.Graph().as_default():
      spec = _bfloat16_train_spec(model_fn)
      self.assertEqual(spec.loss.dtype, tf.float32)
      penalties = tf.compat.v1.losses.get_regularization_losses()
      self.assertEqual({p.dtype for p in penalties}, {tf.float32})

  def test_reshaped_probabilities_keep_float32_values(self):
    def model_fn(features, mode):
      import tf_slim as slim  # pylint: disable=g-import-not-at-top
      logits = tf.compat.v1.layers.dense(features, 6, name='logits')
      probabilities = slim.softmax(tf.reshape(logits, [-1, 1, 6]))
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode, predictions={'probabilities': tf.squeeze(probabilities, 1),
                             'logits': logits})

    with tf.Graph().as_default():
      x = tf.constant(np.random.RandomState(0).randn(32, 5) * 3, tf.float32)
      spec = eb.wrap_model_fn(model_fn, 'bfloat16')(x, mode='infer')
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        out = sess.run(spec.predictions)
    self.assertAllClose(out['probabilities'].sum(axis=1), np.ones(32),
                        atol=1e-5)


def _network_with(hidden_in_float32):

  def model_fn(features, labels, mode):
    net = tf.compat.v1.layers.dense(features, 4, name='small')
    w = tf.compat.v1.get_variable('big', [4, 256])
    if hidden_in_float32:
      with eb.keep_float32():
        net = tf.matmul(tf.cast(net, tf.float32), w)
    else:
      net = tf.matmul(net, w)
    logits = tf.compat.v1.layers.dense(net, 2, name='logits')
    return _sgd_spec(
        mode, tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits))

  return model_fn


class StrictShareTest(tf.test.TestCase):

  def test_low_bfloat16_share_fails_strict_audit_naming_the_code(self):
    with tf.Graph().as_default():
      model_fn = eb.wrap_model_fn(_network_with(True), 'bfloat16')
      with self.assertRaises(eb.PrecisionError) as caught:
        model_fn(tf.ones([8, 3]), tf.zeros([8], tf.int32), 'train')
    message = str(caught.exception)
    self.assertIn('of matmul/conv FLOPs run in bfloat16', message)
    self.assertIn('MatMul', message)
    self.assertIn('test_autocast.py', message)  # where it was made
    self.assertIn('50%', message)

  def test_default_share_and_warn_mode(self):
    self.assertEqual(eb.MIN_BFLOAT16_SHARE, 0.5)
    with tf.Graph().as_default():
      model_fn = eb.wrap_model_fn(_network_with(False), 'bfloat16')
      spec = model_fn(tf.ones([8, 3]), tf.zeros([8], tf.int32), 'train')
      report = eb.check_graph(strict=False, loss=spec.loss)
      self.assertGreater(report.bfloat16_flop_share, 0.95)
    with tf.Graph().as_default():
      with self.assertLogs(level='WARNING') as logs:
        eb.wrap_model_fn(_network_with(True), 'bfloat16',
                         eb.WrapOptions(audit='warn'))(tf.ones([8, 3]),
                                                       tf.zeros([8], tf.int32),
                                                       'train')
      self.assertTrue(any('FLOPs run in bfloat16' in l for l in logs.output))

  def test_sparse_matmul_message_names_real_dtypes(self):
    with tf.Graph().as_default():
      tf.matmul(tf.ones([2, 3], BF16), tf.ones([3, 2]))
      report = eb.check_graph(strict=False)
    problem = [p for p in report.problems if 'SparseMatMul' in p][0]
    self.assertIn('bfloat16 x float32', problem)
    self.assertIn('computes in float32', problem)


if __name__ == '__main__':
  tf.test.main()
