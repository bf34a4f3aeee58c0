"""Tests for estimator_bf16.optimizers.adafactor: memory, numerics, bfloat16, TPU."""

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

from estimator_bf16.optimizers.adafactor import AdafactorOptimizer
from estimator_bf16.precision.scope import bfloat16_scope

_ONES = tf.compat.v1.ones_initializer()
_ZEROS = tf.compat.v1.zeros_initializer()


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _slot_floats(optimizer, variables):
  """Total number of slot values the optimizer keeps for `variables`."""
  total = 0
  for name in optimizer.get_slot_names():
    for var in variables:
      slot = optimizer.get_slot(var, name)
      if slot is not None:
        total += slot.shape.num_elements()
  return total


def _slot_floats_after_apply(optimizer_fn, shapes):
  """Builds apply_gradients for variables of `shapes`; returns slot count."""
  with tf.Graph().as_default():
    variables = [
        tf.compat.v1.get_variable('v%d' % i, shape, initializer=_ONES)
        for i, shape in enumerate(shapes)
    ]
    optimizer = optimizer_fn()
    optimizer.apply_gradients([(tf.ones_like(v), v) for v in variables])
    return _slot_floats(optimizer, variables)


def _numpy_adafactor(value, grads, learning_rate=None, beta1=0.0,
                     clipping_threshold=1.0, factored=True):
  """Reference Adafactor in float64 numpy, written from the paper."""
  value = np.array(value, np.float64)
  factor = factored and value.ndim >= 2
  row = np.zeros(value.shape[:-1]) if factor else None
  col = (np.zeros(value.shape[:-2] + value.shape[-1:]) if factor else None)
  full = None if factor else np.zeros(value.shape)
  momentum = np.zeros(value.shape)
  for t, grad in enumerate(grads, start=1):
    decay = 1.0 - t ** -0.8
    grad_sq = np.square(grad) + 1e-30
    if factor:
      row = decay * row + (1 - decay) * grad_sq.mean(-1)
      col = decay * col + (1 - decay) * grad_sq.mean(-2)
      v_hat = (row[..., :, None] * col[..., None, :] /
               row.mean(-1)[..., None, None])
    else:
      full = decay * full + (1 - decay) * grad_sq
      v_hat = full
    update = grad / np.sqrt(v_hat)
    if clipping_threshold is not None:
      rms = np.sqrt(np.mean(np.square(update)))
      update /= max(1.0, rms / clipping_threshold)
    lr = min(1e-2, t ** -0.5) if learning_rate is None else learning_rate
    delta = lr * max(1e-3, np.sqrt(np.mean(np.square(value)))) * update
    if beta1:
      momentum = beta1 * momentum + (1 - beta1) * delta
      delta = momentum
    value = value - delta
  return value


class SlotTest(tf.test.TestCase, parameterized.TestCase):

  def test_factored_slot_memory_is_rows_plus_columns(self):
    adafactor = _slot_floats_after_apply(AdafactorOptimizer, [[1024, 1024]])
    adam = _slot_floats_after_apply(tf.compat.v1.train.AdamOptimizer,
                                    [[1024, 1024]])
    self.assertEqual(adafactor, 1024 + 1024)
    self.assertEqual(adam, 2 * 1024 * 1024)

  def test_bert_layer_slot_memory(self):
    # One BERT-base encoder layer: q, k, v, output and two feed-forward
    # kernels with their biases, and two layer norms.
    hidden, inner = 768, 3072
    shapes = (4 * [[hidden, hidden], [hidden]] +
              [[hidden, inner], [inner], [inner, hidden], [hidden]] +
              4 * [[hidden]])
    adafactor = _slot_floats_after_apply(AdafactorOptimizer, shapes)
    adam = _slot_floats_after_apply(tf.compat.v1.train.AdamOptimizer, shapes)
    expected = sum(sum(s) if len(s) == 2 else s[0] for s in shapes)
    self.assertEqual(adafactor, expected)
    self.assertEqual(adam, 2 * sum(int(np.prod(s)) for s in shapes))
    self.assertLess(adafactor / adam, 0.002)

  @parameterized.named_parameters(
      ('scalar', [], {'v': []}),
      ('vector', [7], {'v': [7]}),
      ('matrix', [3, 5], {'v_row': [3], 'v_col': [5]}),
      ('rank3', [2, 3, 4], {'v_row': [2, 3], 'v_col': [2, 4]}),
  )
  def test_slot_shapes(self, shape, expected):
    with tf.Graph().as_default():
      var = tf.compat.v1.get_variable('w', shape, initializer=_ONES)
      optimizer = AdafactorOptimizer()
      optimizer.apply_gradients([(tf.ones_like(var), var)])
      self.assertEqual(optimizer.get_slot_names(), sorted(expected))
      for name, slot_shape in expected.items():
        self.assertEqual(optimizer.get_slot(var, name).shape.as_list(),
                         slot_shape)

  def test_momentum_and_unfactored_slots(self):
    with tf.Graph().as_default():
      var = tf.compat.v1.get_variable('w', [3, 5], initializer=_ONES)
      optimizer = AdafactorOptimizer(beta1=0.9, factored=False)
      optimizer.apply_gradients([(tf.ones_like(var), var)])
      self.assertEqual(optimizer.get_slot_names(), ['m', 'v'])
      for name in ('m', 'v'):
        self.assertEqual(optimizer.get_slot(var, name).shape.as_list(), [3, 5])

  @parameterized.named_parameters(
      ('var_%s_grad_%s' % (var_dtype, grad_dtype), var_dtype, grad_dtype)
      for var_dtype in ('float32', 'bfloat16')
      for grad_dtype in ('float32', 'bfloat16'))
  def test_slots_are_float32(self, var_dtype, grad_dtype):
    with tf.Graph().as_default():
      # A bfloat16 variable is what a Keras layer inside a bfloat16 scope
      # may create; the optimizer must still keep float32 state.
      var = tf.compat.v1.get_variable(
          'w', [4, 6], dtype=var_dtype,
          initializer=_ONES)
      grad = tf.cast(tf.fill([4, 6], 0.5), grad_dtype)
      optimizer = AdafactorOptimizer(beta1=0.5)
      train = optimizer.apply_gradients([(grad, var)])
      for slot in optimizer.variables():
        self.assertEqual(slot.dtype.base_dtype, tf.float32, slot.name)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        value = sess.run(var)
      self.assertEqual(var.dtype.base_dtype, tf.as_dtype(var_dtype))
      # A positive gradient moves every weight down from 1.
      self.assertTrue(np.all(value.astype(np.float32) < 1.0))


class NumericsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('factored', [3, 4], {}),
      ('factored_ref_variable', [3, 4], {}, False),
      ('rank3', [2, 3, 4], {}),
      ('vector', [5], {}),
      ('unfactored', [3, 4], {'factored': False}),
      ('momentum', [3, 4], {'beta1': 0.9}),
      ('fixed_lr_no_clipping', [3, 4],
       {'learning_rate': 0.1, 'clipping_threshold': None}),
  )
  def test_matches_numpy_reference(self, shape, options, use_resource=True):
    rng = np.random.RandomState(0)
    init = rng.normal(size=shape).astype(np.float32)
    grads = rng.normal(size=[3] + shape).astype(np.float32)
    with tf.Graph().as_default():
      var = tf.compat.v1.get_variable(
          'w', initializer=tf.constant(init), use_resource=use_resource)
      grad = tf.compat.v1.placeholder(tf.float32, shape)
      train = AdafactorOptimizer(**options).apply_gradients([(grad, var)])
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for g in grads:
          sess.run(train, {grad: g})
        value = sess.run(var)
    self.assertAllClose(value, _numpy_adafactor(init, grads, **options),
                        rtol=1e-5, atol=1e-6)

  def test_update_clipping_bounds_update_rms(self):
    # A small gradient then a 100x larger one: the second moment lags, so
    # the unclipped update has an RMS well above 1.
    grads = [np.full([4, 4], 0.01, np.float32),
             np.full([4, 4], 1.0, np.float32)]
    deltas = {}
    for threshold in (None, 1.0, 0.5):
      with tf.Graph().as_default():
        var = tf.compat.v1.get_variable('w', [4, 4], initializer=_ZEROS)
        grad = tf.compat.v1.placeholder(tf.float32, [4, 4])
        optimizer = AdafactorOptimizer(
            learning_rate=1.0, multiply_by_parameter_scale=False,
            clipping_threshold=threshold)
        train = optimizer.apply_gradients([(grad, var)])
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          sess.run(train, {grad: grads[0]})
          before = sess.run(var)
          sess.run(train, {grad: grads[1]})
          deltas[threshold] = np.sqrt(np.mean(np.square(sess.run(var) -
                                                        before)))
    self.assertGreater(deltas[None], 1.2)
    self.assertAllClose(deltas[1.0], 1.0, rtol=1e-5)
    self.assertAllClose(deltas[0.5], 0.5, rtol=1e-5)

  def test_sparse_gradient_matches_dense(self):
    init = np.random.RandomState(1).normal(size=[10, 4]).astype(np.float32)
    ids = [1, 3, 3, 7]  # A repeated id: its gradients must add up.
    values = {}
    for mode in ('sparse', 'dense'):
      with tf.Graph().as_default():
        table = tf.compat.v1.get_variable('emb', initializer=tf.constant(init))
        loss = tf.reduce_sum(tf.square(tf.gather(table, ids)))
        optimizer = AdafactorOptimizer()
        ((grad, _),) = optimizer.compute_gradients(loss, [table])
        self.assertIsInstance(grad, tf.IndexedSlices)
        if mode == 'dense':
          grad = tf.convert_to_tensor(grad)
        train = optimizer.apply_gradients([(grad, table)])
        with tf.compat.v1.Session() as sess:
          sess.run(tf.compat.v1.global_variables_initializer())
          sess.run(train)
          values[mode] = sess.run(table)
    self.assertAllClose(values['sparse'], values['dense'])
    untouched = [i for i in range(10) if i not in ids]
    self.assertAllEqual(values['sparse'][untouched], init[untouched])
    self.assertNotAllClose(values['sparse'][ids], init[ids])

  def test_counts_its_own_updates(self):
    with tf.Graph().as_default():
      global_step = tf.compat.v1.train.get_or_create_global_step()
      var = tf.compat.v1.get_variable('w', [3], initializer=_ONES)
      optimizer = AdafactorOptimizer()
      train = optimizer.apply_gradients([(tf.ones_like(var), var)])
      (counter,) = [v for v in optimizer.variables() if v.shape.rank == 0]
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
          sess.run(train)
        self.assertEqual(sess.run(counter), 3.0)
        self.assertEqual(sess.run(global_step), 0)


class TrainingTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('relative_step', {}),
      ('momentum', {'beta1': 0.9}),
      ('fixed_lr', {'learning_rate': 0.05}),
  )
  def test_least_squares_converges(self, options):
    rng = np.random.RandomState(0)
    x = rng.normal(size=[64, 8]).astype(np.float32)
    y = x.dot(rng.normal(size=[8, 4])).astype(np.float32)
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(0)
      w = tf.compat.v1.get_variable(
          'w', [8, 4], initializer=tf.compat.v1.random_normal_initializer())
      b = tf.compat.v1.get_variable('b', [4], initializer=_ZEROS)
      loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
      train = AdafactorOptimizer(**options).minimize(loss)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        initial = sess.run(loss)
        for _ in range(300):
          sess.run(train)
        final = sess.run(loss)
    # At least a 20x drop in 300 steps (measured: about 40x with the default
    # relative step, far more with a fixed rate of 0.05).
    self.assertLess(final, initial / 20)

  @parameterized.named_parameters(('float32', 'float32'),
                                  ('bfloat16', 'bfloat16'))
  def test_trains_in_bfloat16_scope(self, precision):
    rng = np.random.RandomState(0)
    features = rng.normal(size=[128, 16]).astype(np.float32)
    labels = (features[:, :8].sum(1) > 0).astype(np.int32)
    dtype = tf.as_dtype(precision)
    with tf.Graph().as_default() as graph:
      tf.compat.v1.set_random_seed(0)
      with bfloat16_scope(precision):
        inputs = tf.cast(features, dtype)
        hidden = tf.compat.v1.layers.dense(inputs, 16, tf.nn.relu)
        logits = tf.compat.v1.layers.dense(hidden, 2)
      self.assertEqual(logits.dtype, dtype)
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
          labels, tf.cast(logits, tf.float32))
      optimizer = AdafactorOptimizer()
      train = optimizer.minimize(
          loss, global_step=tf.compat.v1.train.get_or_create_global_step())
      matmul_dtypes = {op.get_attr('T') for op in graph.get_operations()
                       if op.type == 'MatMul'}
      self.assertIn(dtype, matmul_dtypes)
      for var in tf.compat.v1.global_variables():
        self.assertIn(var.dtype.base_dtype, (tf.float32, tf.int64), var.name)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        initial = sess.run(loss)
        for _ in range(150):
          sess.run(train)
        final = sess.run(loss)
    # Measured: about a 30x drop in both precisions.
    self.assertLess(final, initial / 5)

  def test_builds_under_cross_shard_optimizer(self):
    # CrossReplicaSum has no CPU kernel, so on a CPU the wrapped train op
    # can only be built, not run; building exercises every method the
    # wrapper delegates to.
    with tf.Graph().as_default() as graph:
      x = tf.ones([2, 3])
      w = tf.compat.v1.get_variable('w', [3, 4], initializer=_ONES)
      b = tf.compat.v1.get_variable('b', [4], initializer=_ZEROS)
      loss = tf.reduce_sum(tf.matmul(x, w) + b)
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(AdafactorOptimizer())
      grads_and_vars = optimizer.compute_gradients(loss)
      self.assertEqual([v for _, v in grads_and_vars], [w, b])
      train = optimizer.apply_gradients(
          grads_and_vars,
          global_step=tf.compat.v1.train.get_or_create_global_step())
      self.assertIsInstance(train, tf.Operation)
      self.assertIn('CrossReplicaSum',
                    {op.type for op in graph.get_operations()})
      self.assertEqual(optimizer.get_slot_names(), ['v', 'v_col', 'v_row'])
      self.assertEqual(optimizer.get_slot(w, 'v_row').shape.as_list(), [3])
      self.assertEqual(optimizer.get_slot(b, 'v').shape.as_list(), [4])


if __name__ == '__main__':
  tf.test.main()
