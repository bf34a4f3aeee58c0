"""Tests for the GELU gradient that reads only `x` and `tanh` (or `erf`)."""

import math

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.autocast import gelu_gradient

BF16 = tf.bfloat16
_C = math.sqrt(2.0 / math.pi)
_A = 0.044715
_ERF_C = 1 / math.sqrt(2.0)
# The forms public code writes it in: (name, function, kind).
_GELUS = (
    # google-research/bert modeling.py.
    ('bert', lambda x: x * (0.5 * (1.0 + tf.tanh(
        np.sqrt(2 / np.pi) * (x + 0.044715 * tf.pow(x, 3))))), 'Tanh'),
    # tf.nn.gelu / Keras' gelu: (0.5 * x) * (1 + tanh(...)).
    ('tf_nn', lambda x: tf.nn.gelu(x, approximate=True), 'Tanh'),
    # Constants after the tensors, the cube as products.
    ('reordered', lambda x: (1.0 + tf.tanh(
        ((x * x * x) * 0.044715 + x) * _C)) * (x * 0.5), 'Tanh'),
    # Factors other than 0.5 and 1 on each side, the cube through Square.
    ('negated', lambda x: (-x) * (-0.5 * (1.0 + tf.tanh(
        _C * (x + 0.044715 * (tf.square(x) * x))))), 'Tanh'),
    # Hugging Face's TF gelu: constants computed with tf.sqrt and tf.cast.
    ('computed_constants', lambda x: x * (0.5 * (1.0 + tf.tanh(
        tf.sqrt(2.0 / tf.cast(math.pi, x.dtype)) *
        (x + tf.cast(0.044715, x.dtype) * tf.pow(x, 3))))), 'Tanh'),
    # The exact GELU: tf.nn.gelu's default (x / sqrt(2) as a division).
    ('erf_tf_nn', tf.nn.gelu, 'Erf'),
    # (x * 0.5) * (1 + erf(x * (1 / sqrt(2)))).
    ('erf_product', lambda x: x * 0.5 * (1.0 + tf.math.erf(x * _ERF_C)),
     'Erf'),
    # Hugging Face's: x * (0.5 * (1 + erf(x / cast(sqrt(2.0))))).
    ('erf_computed_constant', lambda x: x * (0.5 * (1.0 + tf.math.erf(
        x / tf.cast(tf.sqrt(2.0), x.dtype)))), 'Erf'),
    ('erf_negated', lambda x: (-x) * (-0.5 * (1.0 + tf.math.erf(
        x * _ERF_C))), 'Erf'),
    # TensorFlow 2.16+'s tf.nn.gelu: 0.5 * x * erfc(-x * (1 / sqrt(2))).
    ('erfc', lambda x: 0.5 * x * tf.math.erfc(-x * _ERF_C), 'Erfc'),
)


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _gelu_prime(x, kind='Tanh'):
  """float64 derivative of the tanh approximation or of the exact GELU."""
  if kind in ('Erf', 'Erfc'):
    erf = np.vectorize(math.erf)(x * _ERF_C)
    return 0.5 * (1 + erf) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
  t = np.tanh(_C * (x + _A * x**3))
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * _A * x * x)


def _chain_ops(graph, y, x):
  """Forward ops between `x` and `y` (the GELU's intermediates), not `y`."""
  between, stack = set(), [y.op]
  while stack:
    op = stack.pop()
    for tensor in op.inputs:
      if tensor.op not in between and tensor.name != x.name and (
          not tensor.op.name.startswith('gradients') and
          tensor.op.type not in ('Const', 'Cast')):
        between.add(tensor.op)
        stack.append(tensor.op)
  between.discard(x.op)
  return [op for op in between if op.graph is graph]


def _waits_for_control_input(op, scope):
  """True if `op` or an input made in `scope` has a control input.

  TensorFlow gives an op made under `control_dependencies` no control input
  of its own when one of its inputs was made there too (a constant).
  """
  if op.control_inputs:
    return True
  return any(_waits_for_control_input(tensor.op, scope) for tensor in op.inputs
             if tensor.op.name.startswith(scope))


class GeluGradientTest(tf.test.TestCase, parameterized.TestCase):

  def _build(self, gelu, precision, extra_loss=None):
    """A bfloat16 input through `gelu`, and a loss weighting each output.

    Returns:
      (graph, x, y, float32 dloss/dx, float64 weights of the loss).
    """
    rng = np.random.RandomState(0)
    weights = rng.randn(16, 24)
    graph = tf.Graph()
    with graph.as_default():
      x = tf.identity(tf.constant(3 * rng.randn(16, 24), BF16))
      with eb.autocast(precision):
        y = gelu(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) *
                             tf.constant(weights, tf.float32))
        if extra_loss is not None:
          loss += extra_loss(y)
        grad = tf.gradients(loss, x)[0]
      grad = tf.cast(grad, tf.float32)
    return graph, x, y, grad, weights.astype(np.float32).astype(np.float64)

  def _values(self, graph, *tensors):
    with self.session(graph=graph) as sess:
      return sess.run([tf.cast(t, tf.float32) for t in tensors])

  @parameterized.named_parameters(*_GELUS)
  def test_gradient_reads_only_x_and_tanh(self, gelu, kind):
    graph, x, y, _, _ = self._build(gelu, 'bfloat16')
    self.assertEqual(y.op.get_attr('_gradient_op_type'),
                     b'EstimatorBf16Gelu')
    (tanh,) = [op for op in graph.get_operations()
               if op.type in (kind, 'Erfc')]
    # No gradient op reads any of the chain's intermediates but tanh's
    # output: they are freed during the forward pass.
    chain = _chain_ops(graph, y, x)
    self.assertIn(tanh, chain)
    read_late = sorted(
        op.name for op in chain if op is not tanh and any(
            consumer.name.startswith('gradients')
            for t in op.outputs for consumer in t.consumers()))
    self.assertEqual(read_late, [])
    # The derivative's ops wait for the incoming gradient (they would
    # otherwise run, and hold their results, in the forward pass).
    scope = 'gradients/%s_grad/' % y.op.name
    readers = {op for tensor in (x, tanh.outputs[0])
               for op in tensor.consumers() if op.name.startswith(scope)}
    # tanh: x * x, x * slope, 1 - t, t + 1; erf: x * x, exp(...) * x, t + 1.
    self.assertLen(readers, 4 if kind == 'Tanh' else 3)  # erfc: t itself
    for op in readers:
      self.assertTrue(_waits_for_control_input(op, scope), op.name)

  @parameterized.named_parameters(*_GELUS)
  def test_gradient_values_match_float64(self, gelu, kind):
    graph, x, _, grad, weights = self._build(gelu, 'bfloat16')
    x_values, got = self._values(graph, x, grad)
    want = _gelu_prime(x_values.astype(np.float64), kind) * weights
    # bfloat16 keeps 8 significant bits: each of the few ops in the
    # derivative rounds at 2**-9 relative, and so does the product with
    # the incoming gradient.
    self.assertAllClose(got, want, atol=0.02 * np.abs(want).max(), rtol=0.02)

  @parameterized.named_parameters(*_GELUS)
  def test_float32_chain_gets_the_float64_derivative(self, gelu, kind):
    # A chain the model keeps in float32 is marked too; in float32 the
    # derivative's formula is checked to float32 precision.
    rng = np.random.RandomState(3)
    x_values = 2 * rng.randn(64, 8)
    with tf.Graph().as_default() as graph:
      x = tf.identity(tf.constant(x_values, tf.float32))
      with eb.autocast('bfloat16'):
        y = gelu(x)
        grad = tf.gradients(tf.reduce_sum(y), x)[0]
      self.assertEqual(y.dtype, tf.float32)
      self.assertEqual(y.op.get_attr('_gradient_op_type'),
                       b'EstimatorBf16Gelu')
    (got,) = self._values(graph, grad)
    x64 = x_values.astype(np.float32).astype(np.float64)
    self.assertAllClose(got, _gelu_prime(x64, kind), rtol=1e-5, atol=1e-5)

  @parameterized.named_parameters(*_GELUS)
  def test_close_to_tensorflows_own_bfloat16_gradient(self, gelu, kind):
    del kind
    # The same bfloat16 chain without autocast: the op-by-op bfloat16
    # gradient TensorFlow computes.
    graph, _, _, got, _ = self._build(gelu, 'bfloat16')
    (got,) = self._values(graph, got)
    graph, _, y, want, _ = self._build(gelu, 'float32')
    self.assertNotIn('_gradient_op_type', y.op.node_def.attr)
    (want,) = self._values(graph, want)
    self.assertAllClose(got, want, atol=0.03 * np.abs(want).max())

  def test_intermediate_used_elsewhere_still_gets_its_gradient(self):
    # The model also reads tanh: that path keeps TensorFlow's gradient and
    # adds to the marked one.
    def gelu(x):
      return tf.nn.gelu(x, approximate=True)

    def tanh_penalty(y):
      (tanh,) = [op for op in y.graph.get_operations() if op.type == 'Tanh']
      return tf.reduce_sum(tf.cast(tanh.outputs[0], tf.float32))

    graph, x, _, got, weights = self._build(gelu, 'bfloat16', tanh_penalty)
    x_values, got = self._values(graph, x, got)
    x64 = x_values.astype(np.float64)
    t = np.tanh(_C * (x64 + _A * x64**3))
    want = (_gelu_prime(x64) * weights +
            (1 - t * t) * _C * (1 + 3 * _A * x64 * x64))
    self.assertAllClose(got, want, atol=0.02 * np.abs(want).max(), rtol=0.02)

  @parameterized.named_parameters(
      ('other_tensor_inside', lambda x, z: 0.5 * x * (1.0 + tf.tanh(
          _C * (z + 0.044715 * tf.pow(x, 3))))),
      ('square_not_cube', lambda x, z: 0.5 * x * (1.0 + tf.tanh(
          _C * (x + 0.044715 * tf.pow(x, 2))))),
      ('offset_two', lambda x, z: 0.5 * x * (2.0 + tf.tanh(
          _C * (x + 0.044715 * tf.pow(x, 3))))),
      ('no_half', lambda x, z: x * (1.0 + tf.tanh(
          _C * (x + 0.044715 * tf.pow(x, 3))))),
      ('other_outer_tensor', lambda x, z: 0.5 * z * (1.0 + tf.tanh(
          _C * (x + 0.044715 * tf.pow(x, 3))))),
      ('sigmoid', lambda x, z: 0.5 * x * (1.0 + tf.sigmoid(
          _C * (x + 0.044715 * tf.pow(x, 3))))),
      ('erf_of_another_tensor', lambda x, z: 0.5 * x * (1.0 + tf.math.erf(
          z * _ERF_C))),
      ('erf_of_a_square', lambda x, z: 0.5 * x * (1.0 + tf.math.erf(
          x * x))),
      ('one_minus_erf', lambda x, z: 0.5 * x * (1.0 - tf.math.erf(
          x * _ERF_C))),
      ('erfc_of_another_tensor', lambda x, z: 0.5 * x * tf.math.erfc(
          -z * _ERF_C)),
      ('erfc_without_half', lambda x, z: x * tf.math.erfc(-x * _ERF_C)),
      # A factor computed from a value fed at run time is no constant.
      ('fed_factor', lambda x, z: 0.5 * x * (1.0 + tf.math.erf(
          x / tf.cast(tf.sqrt(tf.compat.v1.placeholder_with_default(
              2.0, [])), x.dtype)))),
      ('cube_of_two_tensors', lambda x, z: 0.5 * x * (1.0 + tf.tanh(
          _C * (x + 0.044715 * (x * x * z))))),
      # A [1, 1] factor broadcasts a rank-1 x to rank 2.
      ('rank_two_half', lambda x, z: tf.constant([[0.5]], BF16) * x[0] * (
          1.0 + tf.tanh(_C * (x[0] + 0.044715 * tf.pow(x[0], 3))))))
  def test_other_expressions_keep_tensorflows_gradient(self, fn):
    rng = np.random.RandomState(1)
    with tf.Graph().as_default() as graph:
      x = tf.identity(tf.constant(rng.randn(8, 4), BF16))
      z = tf.identity(tf.constant(rng.randn(8, 4), BF16))
      with eb.autocast('bfloat16'):
        y = fn(x, z)
      self.assertIsNone(gelu_gradient.match(y.op))
      # Ops of a slow bfloat16 CPU kernel computed in float32 (a sigmoid on
      # some CPUs) carry a gradient of their own, not GELU's.
      marked = [op.name for op in graph.get_operations()
                if '_gradient_op_type' in op.node_def.attr and
                not cpu_kernels.is_substituted(op)]
      self.assertEqual(marked, [])

  def test_functional_cond_gets_the_gradient(self):
    # TensorFlow 2's cond (the default) builds its branches as functions.
    rng = np.random.RandomState(4)
    x_values = rng.randn(8, 4)
    with tf.Graph().as_default():
      x = tf.identity(tf.constant(x_values, BF16))
      with eb.autocast('bfloat16'):
        y = tf.compat.v1.cond(tf.identity(tf.constant(True)),
                              lambda: tf.nn.gelu(x, approximate=True),
                              lambda: x)
        grad = tf.gradients(tf.reduce_sum(tf.cast(y, tf.float32)), x)[0]
      with self.cached_session() as sess:
        got = sess.run(tf.cast(grad, tf.float32))
    x64 = x_values.astype(np.float32).astype(np.float64)
    self.assertAllClose(got, _gelu_prime(x64), atol=0.03, rtol=0.03)

  def test_folded_constant_cannot_be_fed(self):
    # The gradient is built with the folded value: a fed one would differ.
    with tf.Graph().as_default() as graph:
      x = tf.identity(tf.constant([[1.0, -2.0]], BF16))
      with eb.autocast('bfloat16'):
        y = x * (0.5 * (1.0 + tf.math.erf(x / tf.sqrt(tf.constant(
            2.0, BF16) + tf.constant(0.0, BF16)))))
      self.assertIsNotNone(gelu_gradient.match(y.op))
      (root,) = [op for op in graph.get_operations() if op.type == 'Sqrt']
      self.assertFalse(graph.is_feedable(root.outputs[0]))

  def test_scalar_outside_a_gelu_stays_feedable(self):
    # Matching folds it on the way, then finds no GELU.
    with tf.Graph().as_default() as graph:
      x = tf.identity(tf.constant([[1.0, -2.0]], BF16))
      with eb.autocast('bfloat16'):
        scale = tf.sqrt(tf.constant(2.0, BF16) + tf.constant(0.0, BF16))
        y = x * (0.5 * (1.0 + tf.math.tanh(x * scale)))
      self.assertIsNone(gelu_gradient.match(y.op))
      self.assertTrue(graph.is_feedable(scale))

  def test_model_gradient_override_stays(self):
    with tf.Graph().as_default() as graph:
      x = tf.identity(tf.constant([[1.0, -2.0]], BF16))
      with eb.autocast('bfloat16'), graph.gradient_override_map(
          {'Mul': 'ModelOwnMul'}):
        y = tf.nn.gelu(x, approximate=True)
      self.assertIsNotNone(gelu_gradient.match(y.op))
      self.assertEqual(y.op.get_attr('_gradient_op_type'), b'ModelOwnMul')

  def test_training_step_in_a_while_loop(self):
    # TF1 control flow (as TPUEstimator's iterations_per_loop builds): the
    # recomputation sits in the gradient loop and waits for its gradient.
    rng = np.random.RandomState(2)
    x_values = rng.randn(8, 4)
    with tf.Graph().as_default():
      was_v2 = tf.compat.v1.control_flow_v2_enabled()
      tf.compat.v1.disable_control_flow_v2()
      try:
        x = tf.identity(tf.constant(x_values, BF16))

        def body(i, value):
          return i + 1, tf.nn.gelu(value, approximate=True)

        with eb.autocast('bfloat16'):
          y = tf.compat.v1.while_loop(lambda i, _: i < 2, body, [0, x])[1]
          grad = tf.gradients(tf.reduce_sum(tf.cast(y, tf.float32)), x)[0]
        with self.cached_session() as sess:
          got = sess.run(tf.cast(grad, tf.float32))
      finally:
        if was_v2:
          tf.compat.v1.enable_control_flow_v2()
    x64 = x_values.astype(np.float32).astype(np.float64)
    once = 0.5 * x64 * (1 + np.tanh(_C * (x64 + _A * x64**3)))
    want = _gelu_prime(once) * _gelu_prime(x64)
    self.assertAllClose(got, want, atol=0.03 * np.abs(want).max(), rtol=0.03)
