"""Tests for the numeric guard and the bfloat16 activation statistics."""

import json
import os
import threading

import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import training
from estimator_bf16.safety import activation_stats
from estimator_bf16.safety import guards
from tests.support import isolated_cache

_CACHE = isolated_cache.IsolatedCache()


def setUpModule():
  tf.compat.v1.disable_eager_execution()
  _CACHE.start()


def tearDownModule():
  _CACHE.stop()


def _two_variable_step(optimizer_fn, clip=False):
  """loss = a*x + sqrt(|b*x|): at x=0 only b's gradient is NaN."""
  x = tf.compat.v1.placeholder(tf.float32, [])
  global_step = tf.compat.v1.train.get_or_create_global_step()
  a = tf.compat.v1.get_variable('a', initializer=1.0)
  b = tf.compat.v1.get_variable('b', initializer=2.0)
  loss = a * x + tf.sqrt(tf.abs(b * x))
  optimizer = optimizer_fn()
  grads_and_vars = optimizer.compute_gradients(loss)
  if clip:
    grads, variables = zip(*grads_and_vars)
    grads, _ = tf.clip_by_global_norm(grads, 1.0)
    grads_and_vars = list(zip(grads, variables))
  train_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
  return x, train_op, [a, b, global_step]


class NumericGuardTest(tf.test.TestCase):

  def _run_to_failure(self, x, train_op, watched, bad_x):
    with self.session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(train_op, {x: 1.0})
      before = session.run(watched)
      with self.assertRaises(tf.errors.InvalidArgumentError) as caught:
        session.run(train_op, {x: bad_x})
      after = session.run(watched)
    return before, after, guards.translate_error(caught.exception)

  def test_nan_gradient_names_step_and_variable_and_applies_nothing(self):
    with tf.Graph().as_default():
      with guards.numeric_guard() as guard:
        x, train_op, watched = _two_variable_step(
            lambda: tf.compat.v1.train.AdamOptimizer(0.1), clip=True)
      self.assertEqual(guard.updates, 1)
      before, after, error = self._run_to_failure(x, train_op, watched, 0.0)
    self.assertIsInstance(error, guards.NumericGuardError)
    self.assertEqual(error.step, 1)
    # Checked before clipping, so only the variable where it started.
    self.assertEqual(error.tensors, ['gradient of b (1 NaN, 0 Inf of 1 '
                                     'values)'])
    self.assertIn('global step 1', str(error))
    # Neither variable moved (a's gradient was finite), nor the step.
    self.assertAllEqual(before, after)

  def test_nan_loss_is_named(self):
    with tf.Graph().as_default():
      with guards.numeric_guard():
        x, train_op, watched = _two_variable_step(
            lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1))
      before, after, error = self._run_to_failure(x, train_op, watched,
                                                  np.nan)
    self.assertEqual(error.tensors[0], 'loss (1 NaN, 0 Inf of 1 values)')
    self.assertAllEqual(before, after)

  def test_counts_per_tensor_of_any_shape_dtype_and_sparse_gradient(self):
    with tf.Graph().as_default():
      m = tf.compat.v1.placeholder(tf.float32, [3, 4])
      e = tf.compat.v1.placeholder(tf.float32, [2, 2])
      f = tf.compat.v1.placeholder(tf.bfloat16, [2])
      with guards.numeric_guard():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable('w', [3, 4])
        emb = tf.compat.v1.get_variable('emb', [5, 2])
        h = tf.compat.v1.get_variable('h', [2], tf.bfloat16)
        loss = (tf.reduce_sum(w * m) +
                tf.reduce_sum(tf.gather(emb, [1, 3]) * e) +
                tf.cast(tf.reduce_sum(h * f), tf.float32))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        train_op = optimizer.minimize(loss, global_step=global_step)
      grads = [g for g, _ in optimizer.compute_gradients(loss)]
      self.assertIsInstance(grads[1], tf.IndexedSlices)
      self.assertEqual(grads[2].dtype, tf.bfloat16)
      bad_m = np.ones([3, 4], np.float32)
      bad_m[0, 1] = bad_m[2, 3] = np.nan
      bad_m[1, 0] = -np.inf
      with self.session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        with self.assertRaises(tf.errors.InvalidArgumentError) as caught:
          session.run(train_op, {m: bad_m, e: [[1.0, np.inf], [2.0, 3.0]],
                                 f: np.array([np.nan, 1.0], np.float32)})
    self.assertEqual(guards.translate_error(caught.exception).tensors, [
        'loss (1 NaN, 0 Inf of 1 values)',
        'gradient of w (2 NaN, 1 Inf of 12 values)',
        'gradient of emb (0 NaN, 1 Inf of 4 values)',
        'gradient of h (1 NaN, 0 Inf of 2 values)'])

  def test_the_session_folds_nothing_of_the_values_length(self):
    # What the guard adds must not become a constant as long as the model
    # when the session's grappler folds what the static shapes fix: an index
    # per value did, and made a ResNet-18 run take twice as long.
    with tf.Graph().as_default():
      with guards.numeric_guard():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable('w', [1000, 1000])
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_sum(tf.square(w)), global_step=global_step)
      # A session with TensorFlow's default options, as an Estimator makes
      # (the test case's own turns constant folding off).
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        metadata = tf.compat.v1.RunMetadata()
        session.run(train_op, options=tf.compat.v1.RunOptions(
            output_partition_graphs=True), run_metadata=metadata)
    constants = {
        node.name: tf.make_ndarray(node.attr['value'].tensor).size
        for graph in metadata.partition_graphs
        for node in list(graph.node) + [
            n for f in graph.library.function for n in f.node_def]
        if node.op == 'Const' and 'numeric_guard' in node.name}
    self.assertNotEmpty(constants)
    self.assertLess(max(constants.values()), 100, constants)

  def test_gradients_spoiled_after_compute_are_named_as_applied(self):
    with tf.Graph().as_default():
      scale = tf.compat.v1.placeholder(tf.float32, [])
      with guards.numeric_guard():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        w = tf.compat.v1.get_variable('w', initializer=1.0)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        (grad, var), = optimizer.compute_gradients(w * w)
        train_op = optimizer.apply_gradients([(grad * scale, var)],
                                             global_step=global_step)
      with self.session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(train_op, {scale: 1.0})
        with self.assertRaises(tf.errors.InvalidArgumentError) as caught:
          session.run(train_op, {scale: np.inf})
        self.assertAllClose(session.run([w, global_step]), [0.8, 1])
    self.assertEqual(guards.translate_error(caught.exception).tensors,
                     ['gradient of w (as applied) (0 NaN, 1 Inf of 1 values)'])

  def test_patch_is_undone_even_when_the_body_raises(self):
    originals = (tf.compat.v1.train.Optimizer.apply_gradients,
                 tf.compat.v1.train.Optimizer.compute_gradients,
                 tf.compat.v1.tpu.CrossShardOptimizer.apply_gradients)
    with self.assertRaises(RuntimeError):
      with guards.numeric_guard():
        self.assertIsNot(tf.compat.v1.train.Optimizer.apply_gradients,
                         originals[0])
        raise RuntimeError('model_fn failed')
    self.assertEqual((tf.compat.v1.train.Optimizer.apply_gradients,
                      tf.compat.v1.train.Optimizer.compute_gradients,
                      tf.compat.v1.tpu.CrossShardOptimizer.apply_gradients),
                     originals)

  def test_other_threads_are_not_guarded(self):
    built = {}

    def build_elsewhere():
      with tf.Graph().as_default() as graph:
        _two_variable_step(
            lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1))
        built['ops'] = [op.name for op in graph.get_operations()]

    with guards.numeric_guard():
      thread = threading.Thread(target=build_elsewhere)
      thread.start()
      thread.join()
    self.assertFalse([name for name in built['ops'] if 'numeric_guard' in
                      name])

  def test_guard_model_fn_stands_aside_outside_train_and_on_tpu(self):
    def model_fn(features, labels, mode, params):
      del labels, mode, params
      w = tf.compat.v1.get_variable('w', initializer=1.0)
      loss = w * features
      return tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)

    guarded = guards.guard_model_fn(model_fn)
    for mode, params, guarded_ops in (('train', {}, True),
                                      ('train', {'use_tpu': True}, False),
                                      ('eval', {}, False)):
      with tf.Graph().as_default() as graph:
        guarded(tf.constant(1.0), None, mode, params)
        names = [op.name for op in graph.get_operations()]
      self.assertEqual(any('numeric_guard' in n for n in names), guarded_ops,
                       (mode, params))

  def test_unrelated_errors_are_not_translated(self):
    self.assertIsNone(guards.translate_error(
        tf.errors.InvalidArgumentError(None, None, 'assertion failed: [x]')))


def _diverging_run(name, **overrides):
  """mnist_mlp with a learning rate that overflows within two steps."""
  options = dict(model='mnist_mlp', precision='bfloat16',
                 model_dir=os.path.join(_CACHE.root, name), optimizer='sgd',
                 learning_rate=1e30, train_steps=6, train_batch_size=8,
                 eval_steps=1, save_checkpoints_steps=1, export=False)
  options.update(overrides)
  return training.TrainOptions(**options)


def _checkpoint_steps(model_dir):
  state = tf.train.get_checkpoint_state(model_dir)
  return sorted(int(p.rsplit('-', 1)[1])
                for p in state.all_model_checkpoint_paths)


def _all_finite(model_dir):
  reader = tf.train.load_checkpoint(model_dir)
  return all(np.all(np.isfinite(reader.get_tensor(name)))
             for name, dtype in reader.get_variable_to_dtype_map().items()
             if dtype.is_floating)


@pytest.mark.slow
class GuardedTrainingTest(tf.test.TestCase):

  def test_cli_run_stops_with_step_and_tensor_and_good_checkpoint(self):
    options = _diverging_run('guarded')
    with self.assertRaises(guards.NumericGuardError) as caught:
      training.run(options)
    error = caught.exception
    self.assertIsNotNone(error.step)
    self.assertTrue(error.tensors, str(error))
    self.assertRegex(str(error), r'global step \d+ in (loss|gradient of)')
    self.assertIn('--learning_rate', str(error))
    # A checkpoint per step up to the failing step, none after, all finite.
    self.assertEqual(_checkpoint_steps(options.model_dir)[-1], error.step)
    self.assertTrue(_all_finite(options.model_dir))

  def test_without_the_guard_the_nan_reaches_the_weights(self):
    # What the guard prevents: the Estimator's own NaN check fires after
    # the update, so the bad values are already in the variables.
    options = _diverging_run('unguarded', numeric_guard=False)
    with self.assertRaises(tf.compat.v1.train.NanLossDuringTrainingError):
      training.run(options)


class MakeTpuEstimatorGuardTest(tf.test.TestCase):

  def test_train_raises_the_guard_error(self):
    # What estimator.train raises with numeric_guard=True, as documented in
    # make_tpu_estimator: NumericGuardError, TensorFlow's error its cause.

    def model_fn(features, labels, mode, params):
      del params
      weight = tf.compat.v1.get_variable('w', initializer=tf.ones([4, 1]))
      loss = tf.reduce_mean(tf.square(tf.matmul(features, weight) - labels))
      train_op = tf.compat.v1.train.GradientDescentOptimizer(1e30).minimize(
          loss, global_step=tf.compat.v1.train.get_or_create_global_step())
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode, loss=loss, train_op=train_op)

    def input_fn(params):
      data = tf.data.Dataset.from_tensors((tf.ones([4]), tf.ones([1])))
      return data.repeat().batch(params['batch_size'], drop_remainder=True)

    estimator = eb.make_tpu_estimator(
        model_fn, model_dir=self.create_tempdir().full_path,
        precision='float32', train_batch_size=8,
        estimator_options=eb.EstimatorOptions(numeric_guard=True))
    with self.assertRaises(eb.NumericGuardError) as caught:
      estimator.train(input_fn, max_steps=10)
    error = caught.exception
    # Step 0 moves w to 1 - 1e30 * 6 (the gradient of the mean squared
    # error 3**2 is 6 per weight); step 1's loss overflows to Inf.
    self.assertEqual(error.step, 1)
    self.assertTrue(any('loss' in tensor for tensor in error.tensors),
                    error.tensors)
    self.assertIsInstance(error.__cause__, tf.errors.InvalidArgumentError)
    # Nothing non-finite reached a checkpoint: the only one is step 0's.
    self.assertEqual(estimator.get_variable_value('global_step'), 0)
    self.assertAllEqual(estimator.get_variable_value('w'), np.ones([4, 1]))

  def test_other_errors_pass_unchanged(self):

    def model_fn(features, labels, mode, params):
      del labels, params
      weight = tf.compat.v1.get_variable('w', initializer=tf.ones([4, 1]))
      loss = tf.reduce_sum(tf.matmul(features, weight))
      checked = tf.debugging.assert_less(loss, -1.0, message='user check')
      with tf.control_dependencies([checked]):
        train_op = tf.compat.v1.assign_add(
            tf.compat.v1.train.get_or_create_global_step(), 1)
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode, loss=loss, train_op=train_op)

    def input_fn(params):
      data = tf.data.Dataset.from_tensors(tf.ones([4]))
      return data.repeat().batch(params['batch_size'], drop_remainder=True)

    estimator = eb.make_tpu_estimator(
        model_fn, model_dir=self.create_tempdir().full_path,
        precision='float32', train_batch_size=8,
        estimator_options=eb.EstimatorOptions(numeric_guard=True))
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, 'user check'):
      estimator.train(input_fn, max_steps=2)


def _guard_stop():
  return tf.errors.InvalidArgumentError(
      None, None, 'numeric guard: NaN/Inf at global step 3 in loss. The '
      'update of this step was not applied.')


class RaiseGuardErrorsTest(tf.test.TestCase):
  """The train wrapper is this instance's only, and can be undone."""

  def test_only_the_guarded_estimator_is_changed_and_undone(self):

    def model_fn(features, labels, mode, params):
      del features, labels, mode, params

    def make(guarded):
      return eb.make_tpu_estimator(
          model_fn, model_dir=self.create_tempdir().full_path,
          precision='float32', train_batch_size=8,
          estimator_options=eb.EstimatorOptions(numeric_guard=guarded))

    guarded = make(True)
    estimator_class = type(guarded)
    class_train = vars(estimator_class).get('train')
    unguarded, other_guarded = make(False), make(True)
    self.assertIs(type(unguarded), estimator_class)
    self.assertIn('train', vars(guarded))
    self.assertIn('train', vars(other_guarded))
    self.assertNotIn('train', vars(unguarded))
    self.assertIs(vars(estimator_class).get('train'), class_train)
    guards.stop_raising_guard_errors(guarded)
    self.assertNotIn('train', vars(guarded))
    self.assertIs(guarded.train.__func__, estimator_class.train)
    self.assertIn('train', vars(other_guarded))  # Still its own.
    with self.assertRaisesRegex(RuntimeError, 'without a matching start'):
      guards.stop_raising_guard_errors(guarded)

  def test_a_train_the_instance_had_is_wrapped_once_and_put_back(self):
    calls = []

    def stand_in(*args, **kwargs):
      calls.append((args, kwargs))
      raise _guard_stop()

    estimator = type('FakeEstimator', (), {})()
    estimator.train = stand_in
    self.assertIs(guards.raise_guard_errors(estimator), estimator)
    guards.raise_guard_errors(estimator)  # A second user: no second wrapper.
    with self.assertRaises(guards.NumericGuardError) as caught:
      estimator.train('input_fn', max_steps=4)
    self.assertEqual(caught.exception.step, 3)
    self.assertIsInstance(caught.exception.__cause__,
                          tf.errors.InvalidArgumentError)
    self.assertEqual(calls, [(('input_fn',), {'max_steps': 4})])
    guards.stop_raising_guard_errors(estimator)
    self.assertIsNot(estimator.train, stand_in)  # One user is left.
    guards.stop_raising_guard_errors(estimator)
    self.assertIs(estimator.train, stand_in)

  def test_threads_share_the_wrapper_undone_by_the_last(self):
    estimator = type('FakeEstimator', (), {'train': lambda self: 'trained'})()
    barrier = threading.Barrier(4, timeout=30)
    wrapped = []

    def user():
      guards.raise_guard_errors(estimator)
      barrier.wait()
      wrapped.append(vars(estimator).get('train'))
      barrier.wait()
      guards.stop_raising_guard_errors(estimator)

    threads = [threading.Thread(target=user) for _ in range(4)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(30)
    self.assertLen(set(map(id, wrapped)), 1)
    self.assertIsNotNone(wrapped[0])
    self.assertNotIn('train', vars(estimator))
    self.assertEqual(estimator.train(), 'trained')


@pytest.mark.slow
class ActivationStatsTest(tf.test.TestCase):

  def test_bfloat16_run_reports_ranges_and_float32_reports_none(self):
    reports = {}
    for precision in ('bfloat16', 'float32'):
      model_dir = os.path.join(_CACHE.root, 'stats_' + precision)
      result = training.run(training.TrainOptions(
          model='mnist_mlp', precision=precision, model_dir=model_dir,
          train_steps=4, train_batch_size=8, eval_steps=1, export=False,
          activation_stats_steps=2))
      reports[precision] = result['activation_stats']
    self.assertEqual(reports['float32'], [])
    rows = reports['bfloat16']
    names = [row['tensor'] for row in rows]
    self.assertTrue(any('hidden/Relu' in n for n in names), names)
    self.assertTrue(any('logits/MatMul' in n for n in names), names)
    for row in rows:
      self.assertTrue(0 < row['max_abs'] < activation_stats.BFLOAT16_MAX)
      self.assertBetween(row['zero_share'], 0.0, 1.0)
      self.assertBetween(row['underflow_share'], 0.0, 1.0)
      self.assertEqual(row['nonfinite'], 0)
    relu = [row for row in rows if 'hidden/Relu' in row['tensor']][0]
    self.assertGreater(relu['zero_share'], 0.1)  # ReLU zeroes about half
    with open(os.path.join(_CACHE.root, 'stats_bfloat16',
                           'activation_stats.json')) as f:
      written = json.load(f)
    self.assertEqual(written['step'], 2)
    self.assertLen(written['tensors'], len(rows))


if __name__ == '__main__':
  tf.test.main()
