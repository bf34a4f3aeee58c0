"""Tests for estimator_bf16.models.optimization and estimator_bf16.optimizers.adamw."""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from estimator_bf16.models import optimization
from estimator_bf16.optimizers.adafactor import AdafactorOptimizer
from estimator_bf16.optimizers.adamw import AdamWeightDecayOptimizer
from estimator_bf16.optimizers import registry as optimizers
from estimator_bf16.precision.scope import bfloat16_scope


def setUpModule():
  tf.compat.v1.disable_eager_execution()


_CLASSES = {
    'sgd': tf.compat.v1.train.GradientDescentOptimizer,
    'momentum': tf.compat.v1.train.MomentumOptimizer,
    'adam': tf.compat.v1.train.AdamOptimizer,
    'adamw': AdamWeightDecayOptimizer,
    'adafactor': AdafactorOptimizer,
}

# Rates that train the small network below in a few dozen steps; None is
# Adafactor's relative step size.
_RATES = {'sgd': 0.1, 'momentum': 0.05, 'adam': 0.01, 'adamw': 0.01,
          'adafactor': None}


def _numpy_adamw(value, grads, lr, decay_rate, decays, beta1=0.9,
                 beta2=0.999, epsilon=1e-6):
  """Reference AdamW without bias correction, in float64 numpy.

  The hyper-parameters are taken as float32 holds them, as the graph does:
  float32(0.999) is 0.99900001, so 1 - beta2 is 1.3e-5 below 0.001.
  """
  beta1, beta2, epsilon = (float(np.float32(x))
                           for x in (beta1, beta2, epsilon))
  value = np.array(value, np.float64)
  m = np.zeros_like(value)
  v = np.zeros_like(value)
  for grad in grads:
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * np.square(grad)
    update = m / (np.sqrt(v) + epsilon)
    if decays:
      update += decay_rate * value
    value = value - lr * update
  return value


class CreateOptimizerTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      [(name, name, False) for name in optimizers.OPTIMIZERS] +
      [(name + '_tpu', name, True) for name in optimizers.OPTIMIZERS])
  def test_returns_each_kind(self, name, use_tpu):
    with tf.Graph().as_default():
      optimizer = optimizers.create_optimizer(name, _RATES[name],
                                                use_tpu=use_tpu)
      if use_tpu:
        self.assertIsInstance(optimizer,
                              tf.compat.v1.tpu.CrossShardOptimizer)
        optimizer = optimizer._opt  # pylint: disable=protected-access
      self.assertIsInstance(optimizer, _CLASSES[name])

  def test_rejects_unknown_name(self):
    with self.assertRaises(ValueError) as raised:
      optimizers.create_optimizer('lamb', 0.1)
    for name in optimizers.OPTIMIZERS:
      self.assertIn(name, str(raised.exception))

  def test_rejects_weight_decay_it_would_ignore(self):
    with self.assertRaisesRegex(ValueError, 'adamw'):
      optimizers.create_optimizer('adam', 0.1, weight_decay_rate=0.01)

  def test_learning_rate_required_except_adafactor(self):
    with self.assertRaisesRegex(ValueError, 'learning_rate'):
      optimizers.create_optimizer('sgd', None)
    optimizers.create_optimizer('adafactor', None)

  def test_adafactor_options(self):
    with tf.Graph().as_default():
      var = tf.compat.v1.get_variable('w', [2, 3])
      optimizer = optimizers.create_optimizer(
          'adafactor', None, adafactor_options={'beta1': 0.9})
      optimizer.apply_gradients([(tf.ones_like(var), var)])
      self.assertEqual(optimizer.get_slot_names(), ['m', 'v_col', 'v_row'])


class AdamWeightDecayTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('resource', True), ('ref', False))
  def test_matches_numpy_reference(self, use_resource):
    rng = np.random.RandomState(0)
    # name -> (shape, decayed?) under the default exclude patterns.
    specs = {'dense/kernel': ([3, 2], True),
             'dense/bias': ([2], False),
             'LayerNorm/gamma': ([2], False),
             'batch_normalization/beta': ([2], False)}
    inits = {name: rng.normal(size=shape).astype(np.float32)
             for name, (shape, _) in specs.items()}
    grads = {name: rng.normal(size=[2] + shape).astype(np.float32)
             for name, (shape, _) in specs.items()}
    lr, decay_rate = 0.1, 0.2
    with tf.Graph().as_default():
      variables, placeholders = {}, {}
      for name in specs:
        variables[name] = tf.compat.v1.get_variable(
            name, initializer=tf.constant(inits[name]),
            use_resource=use_resource)
        placeholders[name] = tf.compat.v1.placeholder(
            tf.float32, specs[name][0])
      optimizer = optimizers.create_optimizer(
          'adamw', lr, weight_decay_rate=decay_rate)
      train = optimizer.apply_gradients(
          [(placeholders[n], variables[n]) for n in specs])
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(2):
          sess.run(train, {placeholders[n]: grads[n][step] for n in specs})
        values = sess.run(variables)
    for name, (_, decays) in specs.items():
      self.assertEqual(optimizer.decays(name), decays, name)
      expected = _numpy_adamw(inits[name], grads[name], lr, decay_rate,
                              decays)
      self.assertAllClose(values[name], expected, rtol=1e-5, atol=1e-6,
                          msg=name)

  def test_decay_alone_shrinks_only_decayed_variables(self):
    # A zero gradient leaves m = v = 0, so only the decay moves weights.
    with tf.Graph().as_default():
      kernel = tf.compat.v1.get_variable(
          'dense/kernel', initializer=tf.ones([2, 2]))
      bias = tf.compat.v1.get_variable('dense/bias', initializer=tf.ones([2]))
      optimizer = AdamWeightDecayOptimizer(0.5, weight_decay_rate=0.1)
      train = optimizer.apply_gradients(
          [(tf.zeros([2, 2]), kernel), (tf.zeros([2]), bias)])
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        self.assertAllClose(sess.run(kernel), np.full([2, 2], 0.95))
        self.assertAllClose(sess.run(bias), np.ones([2]))


def _ancestors(op):
  """Every op `op` waits for, through data and control inputs."""
  seen, stack = set(), [op]
  while stack:
    current = stack.pop()
    for parent in [t.op for t in current.inputs] + current.control_inputs:
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


class UpdateOrderTest(tf.test.TestCase, parameterized.TestCase):
  """No variable-sized tensor of an update is made before its gradient.

  Reads of a variable and of its slots have no data input, so TensorFlow
  runs them, and products such as `beta1 * m`, as soon as a step starts;
  they would then be held through the whole backward pass (for BERT's
  embedding table, tens of MiB at the step's peak).
  """

  @parameterized.named_parameters(
      ('adamw_resource', 'adamw', True, {}),
      ('adamw_ref', 'adamw', False, {}),
      ('adafactor_resource', 'adafactor', True, {}),
      ('adafactor_ref', 'adafactor', False, {}),
      ('adafactor_momentum', 'adafactor', True, {'beta1': 0.9}),
      ('adafactor_unfactored', 'adafactor', True,
       {'factored': False}))
  def test_state_is_read_after_the_gradient(self, name, use_resource,
                                            options):
    with tf.Graph().as_default() as graph:
      var = tf.compat.v1.get_variable('w', [6, 4], use_resource=use_resource)
      grad = tf.identity(tf.compat.v1.placeholder(tf.float32, [6, 4]),
                         name='the_gradient')
      # With weight decay, AdamW scales the variable before its fused
      # update kernel (which reads its inputs when it runs).
      optimizer = optimizers.create_optimizer(
          name, _RATES[name], adafactor_options=options or None,
          weight_decay_rate=0.01 if name == 'adamw' else 0.0)
      before = set(graph.get_operations())
      train = optimizer.apply_gradients([(grad, var)])
      step_ops = _ancestors(train) - before
      # Ops of the step that make a tensor of the variable's size; aliases
      # of a ref variable's buffer (its snapshot) allocate nothing.
      sized = [op for op in step_ops
               if op.type != 'Const' and
               any(t.shape == var.shape and t.dtype == tf.float32
                   for t in op.outputs) and
               not all(t.dtype._is_ref_dtype for t in op.inputs)]  # pylint: disable=protected-access
      self.assertNotEmpty(sized)
      early = [op.name for op in sized
               if op is not grad.op and grad.op not in _ancestors(op)]
      self.assertEmpty(early)


class LearningRateScheduleTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('warmup_then_linear_decay', {'warmup_steps': 10, 'decay_steps': 100},
       {0: 0.1, 4: 0.5, 9: 1.0, 10: 0.9, 55: 0.45, 100: 0.0, 150: 0.0}),
      ('quadratic_decay_to_end', {'decay_steps': 100, 'end_lr': 0.1,
                                  'power': 2.0},
       {0: 1.0, 50: 0.325, 100: 0.1, 200: 0.1}),
      ('warmup_only', {'warmup_steps': 4}, {0: 0.25, 3: 1.0, 1000: 1.0}),
      ('constant', {}, {0: 1.0, 10**6: 1.0}),
  )
  def test_values(self, options, expected):
    with tf.Graph().as_default():
      step = tf.compat.v1.placeholder(tf.int64, [])
      lr = optimization.learning_rate_schedule(1.0, step, **options)
      self.assertEqual(lr.dtype, tf.float32)
      self.assertEqual(lr.shape.rank, 0)
      with self.cached_session() as sess:
        for at, value in expected.items():
          self.assertAllClose(sess.run(lr, {step: at}), value, msg=str(at))

  @parameterized.named_parameters(
      ('negative_warmup', {'warmup_steps': -1}),
      ('zero_decay_steps', {'decay_steps': 0}),
      ('zero_power', {'decay_steps': 10, 'power': 0.0}),
  )
  def test_rejects_bad_arguments(self, options):
    with tf.Graph().as_default():
      with self.assertRaises(ValueError):
        optimization.learning_rate_schedule(1.0, tf.constant(0), **options)


@pytest.mark.slow
class TrainOpTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('%s_%s' % (name, precision), precision, name)
      for precision in ('float32', 'bfloat16')
      for name in optimizers.OPTIMIZERS)
  def test_trains_with_batch_norm(self, precision, name):
    rng = np.random.RandomState(0)
    features = rng.normal(size=[64, 8]).astype(np.float32)
    labels = (features[:, :4].sum(1) > 0).astype(np.int32)
    dtype = tf.as_dtype(precision)
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(0)
      with bfloat16_scope(precision):
        hidden = tf.compat.v1.layers.dense(tf.cast(features, dtype), 16)
        hidden = tf.compat.v1.layers.batch_normalization(hidden,
                                                         training=True)
        logits = tf.compat.v1.layers.dense(tf.nn.relu(hidden), 2)
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
          labels, tf.cast(logits, tf.float32))
      global_step = tf.compat.v1.train.get_or_create_global_step()
      lr = _RATES[name]
      if lr is not None:
        lr = optimization.learning_rate_schedule(lr, global_step,
                                                 warmup_steps=5)
      optimizer = optimizers.create_optimizer(
          name, lr, weight_decay_rate=0.01 if name == 'adamw' else 0.0)
      train = optimization.train_op(loss, optimizer, clip_norm=5.0)
      (moving_mean,) = [v for v in tf.compat.v1.global_variables()
                        if 'moving_mean' in v.name]
      for var in tf.compat.v1.global_variables():
        self.assertIn(var.dtype.base_dtype, (tf.float32, tf.int64), var.name)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        initial = sess.run(loss)
        for _ in range(60):
          sess.run(train)
        final, mean, step = sess.run([loss, moving_mean, global_step])
    self.assertEqual(step, 60)
    self.assertNotAllClose(mean, np.zeros_like(mean))
    # Measured drops: 7x (adafactor, relative step) to 2000x (adamw).
    self.assertLess(final, initial / 2)

  def test_runs_update_ops_first(self):
    with tf.Graph().as_default():
      var = tf.compat.v1.get_variable('w', initializer=tf.ones([3]))
      counter = tf.compat.v1.get_variable(
          'counter', initializer=0, trainable=False, use_resource=True)
      # The update op stores the weight it saw: it must see the pre-update
      # value, so it runs before the optimizer moves the weight.
      seen = tf.compat.v1.get_variable(
          'seen', initializer=tf.zeros([3]), trainable=False)
      tf.compat.v1.add_to_collection(
          tf.compat.v1.GraphKeys.UPDATE_OPS,
          tf.group(counter.assign_add(1), seen.assign(var.read_value())))
      loss = tf.reduce_sum(var)
      train = optimization.train_op(
          loss, tf.compat.v1.train.GradientDescentOptimizer(0.5))
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        self.assertEqual(sess.run(counter), 1)
        self.assertAllClose(sess.run(seen), np.ones([3]))
        self.assertAllClose(sess.run(var), np.full([3], 0.5))
        self.assertEqual(
            sess.run(tf.compat.v1.train.get_global_step()), 1)

  def test_clips_by_global_norm(self):
    with tf.Graph().as_default():
      var = tf.compat.v1.get_variable('w', initializer=tf.zeros([4]))
      loss = tf.reduce_sum(100.0 * var)  # Gradient norm 200.
      train = optimization.train_op(
          loss, tf.compat.v1.train.GradientDescentOptimizer(1.0),
          clip_norm=2.0)
      with self.cached_session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train)
        self.assertAllClose(sess.run(var), np.full([4], -1.0))

  def test_rejects_bfloat16_loss(self):
    with tf.Graph().as_default():
      var = tf.compat.v1.get_variable('w', initializer=tf.ones([2]))
      loss = tf.reduce_sum(tf.cast(var, tf.bfloat16))
      with self.assertRaisesRegex(ValueError, 'float32'):
        optimization.train_op(
            loss, tf.compat.v1.train.GradientDescentOptimizer(0.1))


if __name__ == '__main__':
  tf.test.main()
