"""Tests for gradients with recomputation (`estimator_bf16.levers.recompute`)."""

import functools

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.memory import peak as peak_lib
from estimator_bf16.levers import recompute as recompute_lib
from benchmarks import graphs

_SCOPE = 'recompute_gradients'


def _mlp(x, layers=12, width=64):
  """float [B, D] -> float [B, width]: dense + relu layers."""
  h = x
  for i in range(layers):
    h = tf.compat.v1.layers.dense(h, width, activation=tf.nn.relu,
                                  name='dense_%d' % i)
  return h


def _conv_net(x, blocks=3, channels=8):
  """float [B, H, W, C] -> float [B, channels]: conv, batch norm, residuals."""
  h = tf.compat.v1.layers.conv2d(x, channels, 3, padding='same', name='stem')
  for i in range(blocks):
    with tf.compat.v1.variable_scope('block_%d' % i):
      r = tf.compat.v1.layers.conv2d(h, channels, 3, padding='same',
                                     use_bias=False, name='conv_a')
      r = tf.compat.v1.layers.batch_normalization(r, training=True, name='bn_a')
      r = tf.nn.relu(r)
      r = tf.compat.v1.layers.conv2d(r, channels, 3, padding='same',
                                     use_bias=False, name='conv_b')
      r = tf.compat.v1.layers.batch_normalization(r, training=True, name='bn_b')
      h = tf.nn.relu(h + r)
  return tf.reduce_mean(h, axis=[1, 2])


def _layer_norm(x, name):
  """float [..., D] -> same: layer norm with its own scale and offset."""
  with tf.compat.v1.variable_scope(name):
    depth = x.shape[-1]
    gamma = tf.compat.v1.get_variable('gamma', [depth],
                                      initializer=tf.ones_initializer())
    beta = tf.compat.v1.get_variable('beta', [depth],
                                     initializer=tf.zeros_initializer())
    mean, variance = tf.nn.moments(x, [-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-6) * gamma + beta


def _dense(x, units, name):
  """float [B, S, D] -> float [B, S, units], weights from get_variable."""
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        'kernel', [x.shape[-1], units],
        initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1))
    bias = tf.compat.v1.get_variable('bias', [units],
                                     initializer=tf.zeros_initializer())
    return tf.einsum('bsd,du->bsu', x, kernel) + bias


def _bert_like(ids, vocab=50, hidden=32, layers=3, heads=4, dropout=0.1):
  """int32 ids [B, S] -> float32 [B, 2] logits; BERT-style encoder."""
  batch, seq = ids.shape.as_list()
  table = tf.compat.v1.get_variable(
      'embeddings', [vocab, hidden],
      initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1))
  h = _layer_norm(tf.gather(table, ids), 'embedding_norm')
  size = hidden // heads
  for i in range(layers):
    with tf.compat.v1.variable_scope('layer_%d' % i):

      def split(t):
        t = tf.reshape(t, [batch, seq, heads, size])
        return tf.transpose(t, [0, 2, 1, 3])

      q = split(_dense(h, hidden, 'query'))
      k = split(_dense(h, hidden, 'key'))
      v = split(_dense(h, hidden, 'value'))
      scores = tf.matmul(q, k, transpose_b=True) * (size ** -0.5)
      probs = tf.compat.v1.nn.dropout(tf.nn.softmax(scores), rate=dropout)
      context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]),
                           [batch, seq, hidden])
      attention = tf.compat.v1.nn.dropout(_dense(context, hidden, 'output'),
                                          rate=dropout)
      h = _layer_norm(h + attention, 'attention_norm')
      inner = tf.nn.gelu(_dense(h, 4 * hidden, 'intermediate'))
      out = tf.compat.v1.nn.dropout(_dense(inner, hidden, 'ffn_output'),
                                    rate=dropout)
      h = _layer_norm(h + out, 'ffn_norm')
  pooled = tf.tanh(_dense(h[:, :1], hidden, 'pooler'))[:, 0]
  weights = tf.compat.v1.get_variable('classifier', [hidden, 2])
  return tf.matmul(pooled, weights)


def _build(name, precision='float32'):
  """Builds one test net in the default graph; returns its float32 loss."""
  tf.compat.v1.set_random_seed(1)
  with eb.autocast(precision):
    if name == 'mlp':
      x = tf.random.stateless_normal([16, 24], [1, 2])
      out = _mlp(x)
    elif name == 'conv':
      x = tf.random.stateless_normal([4, 12, 12, 3], [1, 2])
      out = _conv_net(x)
    else:
      ids = tf.random.stateless_uniform([4, 16], [1, 2], maxval=50,
                                        dtype=tf.int32)
      out = _bert_like(ids)
  return tf.reduce_mean(tf.square(tf.cast(out, tf.float32)))


def _dense_values(values):
  """Gradients as numpy arrays (IndexedSlices summed into dense form)."""
  result = []
  for value in values:
    if hasattr(value, 'indices') and hasattr(value, 'dense_shape'):
      dense = np.zeros(value.dense_shape, value.values.dtype)
      np.add.at(dense, value.indices, value.values)
      value = dense
    result.append(np.asarray(value, np.float64))
  return result


def _forward_copies(graph):
  """{original op name: [copy ops]} for every forward op that was copied."""
  copies = {}
  for op in graph.get_operations():
    parts = op.name.split('/')
    if (len(parts) > 2 and parts[0] == _SCOPE and
        parts[1].startswith('segment_') and parts[1].endswith('_forward')):
      copies.setdefault('/'.join(parts[2:]), []).append(op)
  return copies


@pytest.mark.slow
class EqualityTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters('mlp', 'conv', 'bert')
  def test_float32_gradients_equal_plain(self, name):
    graph = tf.Graph()
    with graph.as_default():
      loss = _build(name)
      variables = tf.compat.v1.trainable_variables()
      plain = tf.compat.v1.gradients(loss, variables)
      ours = recompute_lib.gradients_with_recompute(loss, variables)
      self.assertLen(ours, len(variables))
      self.assertTrue(_forward_copies(graph), 'nothing was recomputed')
      if name == 'bert':
        self.assertIsInstance(ours[0], tf.IndexedSlices)  # the embedding
      with self.session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        # One run: both read the same dropout masks.
        expected, actual = session.run([plain, ours])
    for variable, want, got in zip(variables, _dense_values(expected),
                                   _dense_values(actual)):
      self.assertAllClose(want, got, rtol=1e-6, atol=1e-7,
                          msg=variable.name)

  @parameterized.parameters('mlp', 'conv', 'bert')
  def test_training_steps_give_the_same_variables(self, name):
    results = []
    for use_recompute in (False, True):
      graph = tf.Graph()
      with graph.as_default():
        loss = _build(name)
        variables = tf.compat.v1.trainable_variables()
        if use_recompute:
          grads = recompute_lib.gradients_with_recompute(loss, variables)
        else:
          grads = tf.compat.v1.gradients(loss, variables)
        update_ops = tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(update_ops):
          train_op = tf.compat.v1.train.GradientDescentOptimizer(
              0.1).apply_gradients(zip(grads, variables))
        with self.session(graph=graph) as session:
          session.run(tf.compat.v1.global_variables_initializer())
          # Keras-style initialisers draw their own seeds: start both runs
          # from the first run's values.
          if results:
            for variable, value in zip(tf.compat.v1.global_variables(),
                                       initial):
              variable.load(value, session)
          else:
            initial = session.run(tf.compat.v1.global_variables())
          for _ in range(3):
            session.run(train_op)
          results.append(session.run(tf.compat.v1.global_variables()))
    for want, got in zip(*results):
      self.assertAllClose(want, got, rtol=1e-5, atol=1e-6)

  def test_bfloat16_autocast_gradients_equal_plain(self):
    graph = tf.Graph()
    with graph.as_default():
      loss = _build('bert', precision='bfloat16')
      variables = tf.compat.v1.trainable_variables()
      self.assertTrue(all(v.dtype.base_dtype == tf.float32
                          for v in variables))
      self.assertTrue(any(op.type == 'BatchMatMulV2' and
                          op.outputs[0].dtype == tf.bfloat16
                          for op in graph.get_operations()))
      plain = tf.compat.v1.gradients(loss, variables)
      ours = recompute_lib.gradients_with_recompute(loss, variables)
      self.assertTrue(_forward_copies(graph), 'nothing was recomputed')
      with self.session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        expected, actual = session.run([plain, ours])
    expected, actual = _dense_values(expected), _dense_values(actual)
    largest = max(np.linalg.norm(want) for want in expected)
    for variable, want, got in zip(variables, expected, actual):
      # The recomputed kernels give the same values, but a tensor read in
      # several segments gets its gradient summed in parts (in bfloat16 where
      # the activation is bfloat16), so contributions round differently:
      # about one bfloat16 ulp (2**-8) of the gradient's norm, compounded over
      # the layers below (1.2% seen on the first query kernel).
      # (A key bias has a gradient of zero up to rounding noise: measured
      # against the largest gradient's norm instead.)
      scale = max(np.linalg.norm(want), 1e-3 * largest)
      self.assertLess(np.linalg.norm(want - got) / scale, 2.0**-5,
                      variable.name)

  def test_forced_segments(self):
    graph = tf.Graph()
    with graph.as_default():
      loss = _build('mlp')
      variables = tf.compat.v1.trainable_variables()
      plain = tf.compat.v1.gradients(loss, variables)
      ours = recompute_lib.gradients_with_recompute(loss, variables, segments=6)
      segments = {op.name.split('/')[1] for ops in
                  _forward_copies(graph).values() for op in ops}
      # The last of the 6 segments is not recomputed.
      self.assertLen(segments, 5)
      with self.session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        expected, actual = session.run([plain, ours])
    self.assertAllClose(expected, actual, rtol=1e-6, atol=1e-7)

  def test_tensor_xs_and_grad_ys(self):
    graph = tf.Graph()
    with graph.as_default():
      x = tf.random.stateless_normal([8, 16], [3, 4])
      hidden = _mlp(x, layers=8, width=16)
      y = tf.reduce_sum(hidden, axis=1)
      grad_y = tf.range(8, dtype=tf.float32)
      plain = tf.compat.v1.gradients(y, [x, hidden], grad_ys=[grad_y])
      ours = recompute_lib.gradients_with_recompute(y, [x, hidden],
                                                    grad_ys=[grad_y])
      with self.session(graph=graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        expected, actual = session.run([plain, ours])
    self.assertAllClose(expected, actual, rtol=1e-6, atol=1e-7)


@functools.lru_cache(maxsize=None)
def _recomputed_bert():
  """The bert net and its gradients with recompute: (graph, forward ops).

  Built once: the structure tests only read it.
  """
  graph = tf.Graph()
  with graph.as_default():
    loss = _build('bert')
    forward = frozenset(graph.get_operations())
    recompute_lib.gradients_with_recompute(loss,
                                           tf.compat.v1.trainable_variables())
  return graph, forward


class StructureTest(tf.test.TestCase):

  def test_backward_reads_no_recomputed_original(self):
    graph, forward = _recomputed_bert()
    copies = _forward_copies(graph)
    copy_ops = {op for ops in copies.values() for op in ops}
    backward = set(graph.get_operations()) - forward - copy_ops
    self.assertGreater(len(copy_ops), 50)
    for original_name in copies:
      original = graph.get_operation_by_name(original_name)
      self.assertFalse(original._is_stateful, original_name)  # pylint: disable=protected-access
      for tensor in original.outputs:
        readers = set(tensor.consumers())
        if readers & backward:
          # Only checkpoints may be read by the backward pass: tensors also
          # read by another segment's copies or by forward ops that are not
          # recomputed (the last segment's).
          uncopied = {op for op in readers & forward if op.name not in copies}
          self.assertTrue(readers & copy_ops or uncopied, tensor.name)

  def test_dropout_masks_are_not_drawn_again(self):
    graph, forward = _recomputed_bert()
    random_ops = {op for op in forward if op.type == 'RandomUniform'}
    self.assertNotEmpty(random_ops)
    self.assertEqual(random_ops, {op for op in graph.get_operations()
                                  if op.type == 'RandomUniform'})
    # The copies read the boolean masks, not the float random numbers.
    copy_ops = {op for ops in _forward_copies(graph).values() for op in ops}
    read = {t.op.type for op in copy_ops for t in op.inputs
            if t.op not in copy_ops}
    self.assertIn('GreaterEqual', read)
    self.assertNotIn('RandomUniform', read)


@pytest.mark.slow
class PeakMemoryTest(tf.test.TestCase, parameterized.TestCase):

  def _peak_and_ops(self, build, use_recompute):
    graph = tf.Graph()
    with graph.as_default():
      loss = build()
      variables = tf.compat.v1.trainable_variables()
      if use_recompute:
        grads = recompute_lib.gradients_with_recompute(loss, variables)
      else:
        grads = tf.compat.v1.gradients(loss, variables)
      train_op = tf.compat.v1.train.GradientDescentOptimizer(
          0.01).apply_gradients(zip(grads, variables))
      init = tf.compat.v1.global_variables_initializer()
    # The session a benchmark step gets, with or without recompute.
    config = graphs.memory_session_config()
    with tf.compat.v1.Session(graph=graph, config=config) as session:
      session.run(init)
      session.run(train_op)  # warm-up
      metadata = tf.compat.v1.RunMetadata()
      session.run(train_op, options=peak_lib.traced_run_options(),
                  run_metadata=metadata)
    return (peak_lib.peak_bytes_from_run_metadata(metadata),
            len(graph.get_operations()))

  @parameterized.named_parameters(
      # Activations dominate: 16 layers of [4096, 256] float32 (4 MiB each)
      # against 4 MiB of weights.
      ('mlp', lambda: tf.reduce_mean(tf.square(_mlp(
          tf.random.stateless_normal([4096, 256], [1, 2]), layers=16,
          width=256))), 0.75),
      # Six layers of [16, 4, 64, 64] attention scores, probabilities and
      # dropout masks (1 MiB each) against 1.2 MiB of weights: recompute
      # keeps 0.22 of the peak on both TensorFlows (0.21 at [32, 128] and
      # hidden 128, in twice the time).
      ('bert', lambda: tf.reduce_mean(tf.square(_bert_like(
          tf.random.stateless_uniform([16, 64], [1, 2], maxval=50,
                                      dtype=tf.int32), hidden=64,
          layers=6))), 0.75),
  )
  def test_recompute_lowers_the_measured_peak(self, build, max_ratio):
    self.assertTrue(peak_lib.allocator_stats_enabled())
    plain_peak, plain_ops = self._peak_and_ops(build, False)
    peak, ops = self._peak_and_ops(build, True)
    self.assertGreater(plain_peak, 0)
    self.assertGreater(ops, plain_ops)  # the copies exist
    self.assertLess(peak / plain_peak, max_ratio,
                    'peak %d vs %d bytes' % (peak, plain_peak))


class BadInputTest(tf.test.TestCase, parameterized.TestCase):

  def test_empty_ys_gives_what_tf_gradients_gives(self):
    with tf.Graph().as_default():
      x = tf.constant([1.0, 2.0])
      self.assertEqual(tf.compat.v1.gradients([], [x]),
                       recompute_lib.gradients_with_recompute([], [x]))

  def test_no_path_gives_nones(self):
    with tf.Graph().as_default():
      x = tf.constant([1.0, 2.0])
      unrelated = tf.compat.v1.get_variable('v', [2])
      y = tf.reduce_sum(_mlp(x[None], layers=4, width=4))
      self.assertEqual([None],
                       recompute_lib.gradients_with_recompute(y, [unrelated]))
      self.assertEqual(tf.compat.v1.gradients(y, [unrelated]), [None])

  def test_unconnected_zero(self):
    with tf.Graph().as_default():
      x = tf.constant([1.0, 2.0])
      unrelated = tf.compat.v1.get_variable('v', [3])
      y = tf.reduce_sum(_mlp(x[None], layers=6, width=4))
      grads = recompute_lib.gradients_with_recompute(
          y, [unrelated], unconnected_gradients='zero')
      with self.session() as session:
        self.assertAllEqual([0, 0, 0], session.run(grads[0]))

  @parameterized.parameters(0, -2, 1.5, True, '3')
  def test_bad_segments_raise(self, segments):
    with tf.Graph().as_default():
      x = tf.constant([1.0])
      with self.assertRaisesRegex(ValueError, 'segments.*%s' %
                                  repr(segments).replace('.', r'\.')):
        recompute_lib.gradients_with_recompute(x * 2.0, [x], segments=segments)

  def test_one_segment_is_plain_gradients(self):
    graph = tf.Graph()
    with graph.as_default():
      loss = _build('mlp')
      recompute_lib.gradients_with_recompute(loss,
                                             tf.compat.v1.trainable_variables(),
                                             segments=1)
      self.assertFalse(_forward_copies(graph))


if __name__ == '__main__':
  tf.test.main()
