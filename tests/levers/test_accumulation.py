"""Gradient accumulation: K micro-batches make the update of one big batch.

Every comparison trains the same data in the same order two ways -- K
micro-batches of B/K per update, and one batch of B per update -- and
compares the float32 checkpoints after several updates. Float32 sums the
same numbers in a different order, so they agree to about 1e-6; a wrong
mean (a sum, a missing micro-batch, an update per micro-batch, a clip of
the last micro-batch alone) differs by 1e-2 or more.
"""

import shutil
import tempfile

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import training
from estimator_bf16.levers import accumulation
from estimator_bf16.levers import apply
from estimator_bf16.memory import peak as peak_lib
from estimator_bf16.optimizers import registry as optimizers
from estimator_bf16.platform import backend as backend_lib
from benchmarks import configs
from benchmarks import graphs
from benchmarks import step_memory
from tests.memory import test_fit
from tests.support import isolated_cache
from tests.support import cli_refusal
from tests.runner import test_runner

_FEATURES = 10
_CLASSES = 3
_BATCH = 16
_UPDATES = 4
_TOLERANCE = 2e-6
_CACHE = isolated_cache.IsolatedCache()


def setUpModule():
  _CACHE.start()


def tearDownModule():
  _CACHE.stop()


def _data():
  rng = np.random.RandomState(3)
  x = rng.randn(_BATCH * _UPDATES * 2, _FEATURES).astype(np.float32)
  y = rng.randint(0, _CLASSES, len(x)).astype(np.int32)
  return x, y


def input_fn(params):
  """Consecutive batches of params['batch_size'], always in the same order."""
  x, y = _data()
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(
      params['batch_size'], drop_remainder=True).repeat()


def _network(features):
  hidden = tf.compat.v1.layers.dense(
      features['x'], 16, activation=tf.nn.relu, name='hidden',
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
  return tf.compat.v1.layers.dense(
      hidden, _CLASSES, name='logits',
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=2))


def _loss(labels, logits):
  return tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)


def _spec(mode, loss, train_op):
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss,
                                                     train_op=train_op)


def adam_model_fn(features, labels, mode, params):
  """`minimize` with Adam and a learning rate that decays per update."""
  del params
  loss = _loss(labels, _network(features))
  global_step = tf.compat.v1.train.get_global_step()
  rate = tf.compat.v1.train.polynomial_decay(0.05, global_step, _UPDATES, 0.01)
  train_op = tf.compat.v1.train.AdamOptimizer(rate).minimize(
      loss, global_step=global_step)
  return _spec(mode, loss, train_op)


def _package_optimizer_model_fn(name):
  def model_fn(features, labels, mode, params):
    """This package's optimizers, through `minimize`."""
    del params
    loss = _loss(labels, _network(features))
    optimizer = optimizers.create_optimizer(name, 0.01)
    train_op = optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return _spec(mode, loss, train_op)
  return model_fn


class ScaledSgd(tf.compat.v1.train.Optimizer):
  """A bert-style optimizer: `apply_gradients` replaced entirely.

  It keeps a per-variable velocity made with get_variable and never touches
  the global step, which the model_fn increments itself.
  """

  def __init__(self, rate):
    super().__init__(use_locking=False, name='ScaledSgd')
    self._rate = rate

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    del global_step
    updates = []
    for grad, var in grads_and_vars:
      velocity = tf.compat.v1.get_variable(
          var.op.name + '/velocity', shape=var.shape, dtype=tf.float32,
          trainable=False, initializer=tf.compat.v1.zeros_initializer())
      new_velocity = 0.5 * velocity + grad
      updates += [velocity.assign(new_velocity),
                  var.assign_sub(self._rate * new_velocity)]
    return tf.group(*updates, name=name)


def bert_style_model_fn(features, labels, mode, params):
  """tf.gradients, clip by a global norm that engages, a manual step."""
  del params
  loss = _loss(labels, _network(features))
  tvars = tf.compat.v1.trainable_variables()
  grads = tf.gradients(loss, tvars)
  # The gradients' global norm is about 1 here: a clip at 0.3 is always
  # active, so the update depends on the norm of exactly what is clipped.
  grads, _ = tf.clip_by_global_norm(grads, clip_norm=0.3)
  global_step = tf.compat.v1.train.get_global_step()
  update = ScaledSgd(0.2).apply_gradients(zip(grads, tvars))
  train_op = tf.group(update, global_step.assign(global_step + 1))
  return _spec(mode, loss, train_op)


def batch_norm_model_fn(features, labels, mode, params):
  del params
  net = tf.compat.v1.layers.batch_normalization(
      features['x'], training=(mode == 'train'), name='bn')
  loss = _loss(labels, _network({'x': net}))
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  with tf.control_dependencies(
      tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
  return _spec(mode, loss, train_op)


def _checkpoint(model_dir):
  reader = tf.train.load_checkpoint(model_dir)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_dtype_map()}


def _backends():
  return [(b, b) for b in backend_lib.BACKENDS
          if b == 'compat' or tf.__version__.startswith('2.15')]


class _CountRuns(tf.compat.v1.train.SessionRunHook):
  """Counts the session runs of the step itself (not the micro-steps)."""

  def __init__(self):
    self.runs = 0

  def after_run(self, run_context, run_values):
    self.runs += 1


def _styles():
  """{name: model_fn} of the trainings that several tests read."""
  return {'adam': adam_model_fn, 'bert_style': bert_style_model_fn,
          'batch_norm': batch_norm_model_fn,
          'adamw': _package_optimizer_model_fn('adamw'),
          'adafactor': _package_optimizer_model_fn('adafactor'),
          'ref_variables': ref_variables(adam_model_fn),
          'deep': deep_model_fn}


class _Training(tf.test.TestCase, parameterized.TestCase):
  """Trains the test model_fns through make_tpu_estimator; no tests."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Trainings several tests of the class read (adam at K=4 is the
    # micro-batch test's, the one-update-per-micro-batch test's and the
    # two-replica test's): each runs once, into a folder kept for the class.
    cls._shared_folder = tempfile.mkdtemp()
    cls._shared = {}

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls._shared_folder, ignore_errors=True)
    super().tearDownClass()

  def _shared_train(self, style, steps, backend, precision='float32',
                    **kwargs):
    """`_train` of _styles()[style] once per class: (model_dir, runs).

    runs: the session runs of the training step (`_CountRuns`).
    """
    key = (style, steps, backend, precision, tuple(sorted(kwargs.items())))
    if key not in self._shared:
      counter = _CountRuns()
      model_dir = self._train(
          _styles()[style], steps, backend, precision=precision,
          model_dir=tempfile.mkdtemp(dir=self._shared_folder),
          hooks=[counter], **kwargs)
      self._shared[key] = (model_dir, counter.runs)
    return self._shared[key]

  def _train(self, model_fn, steps, backend, max_steps=_UPDATES,
             model_dir=None, precision='float32', hooks=(), recompute=False,
             numeric_guard=False, **kwargs):
    model_dir = model_dir or self.create_tempdir().full_path
    estimator = eb.make_tpu_estimator(
        model_fn, model_dir=model_dir, precision=precision,
        train_batch_size=_BATCH,
        options=eb.WrapOptions(gradient_accumulation_steps=steps,
                               recompute=recompute),
        estimator_options=eb.EstimatorOptions(tf_random_seed=0,
                                              save_checkpoints_steps=1000,
                                              log_step_count_steps=None,
                                              backend=backend,
                                              numeric_guard=numeric_guard),
        **kwargs)
    estimator.train(input_fn, max_steps=max_steps, hooks=list(hooks))
    return model_dir

  def _assert_same_checkpoints(self, first, second, tolerance=_TOLERANCE):
    first, second = _checkpoint(first), _checkpoint(second)
    self.assertEqual(sorted(first), sorted(second))
    for name in first:
      self.assertAllClose(first[name], second[name], atol=tolerance,
                          rtol=tolerance, msg=name)


@pytest.mark.slow
class AccumulationTest(_Training):

  @parameterized.named_parameters(
      *[('%s_%s' % (style, backend), style, backend)
        for style in ('adam', 'bert_style', 'batch_norm', 'adamw',
                      'adafactor', 'ref_variables')
        for backend, _ in _backends()])
  def test_micro_batches_equal_the_big_batch(self, style, backend):
    accumulated, runs = self._shared_train(style, 4, backend)
    big, _ = self._shared_train(style, 1, backend)
    if style == 'batch_norm':
      # Batch norm normalizes each micro-batch by its own statistics (as
      # documented), so the updates differ; they must still be updates of
      # the same kind and size, and the moving averages must have moved
      # with every micro-batch: 16 micro-batches, not 4.
      moving = _checkpoint(accumulated)['bn/moving_mean']
      moving_big = _checkpoint(big)['bn/moving_mean']
      self.assertAllClose(moving, moving_big, atol=0.05)
      self.assertGreater(np.abs(moving).max(), 0.0)
    else:
      self._assert_same_checkpoints(accumulated, big)
    reader = tf.train.load_checkpoint(accumulated)
    self.assertEqual(reader.get_tensor('global_step'), _UPDATES)
    self.assertEqual(runs, _UPDATES)

  def test_with_the_numeric_guard(self):
    guarded = self._train(bert_style_model_fn, 4, 'compat',
                          numeric_guard=True)
    self._assert_same_checkpoints(
        guarded, self._shared_train('bert_style', 1, 'compat')[0])

  def test_the_bert_style_clip_is_engaged(self):
    # Without the clip the two runs would differ: proof that the clip (and
    # so its norm of the mean gradient) decided the update.
    def unclipped(features, labels, mode, params):
      del params
      loss = _loss(labels, _network(features))
      tvars = tf.compat.v1.trainable_variables()
      grads = tf.gradients(loss, tvars)
      global_step = tf.compat.v1.train.get_global_step()
      update = ScaledSgd(0.2).apply_gradients(zip(grads, tvars))
      return _spec(mode, loss, tf.group(update,
                                        global_step.assign(global_step + 1)))
    clipped = _checkpoint(self._shared_train('bert_style', 4, 'compat')[0])
    free = _checkpoint(self._train(unclipped, 4, 'compat'))
    self.assertGreater(np.abs(clipped['logits/kernel'] -
                              free['logits/kernel']).max(), 1e-2)

  def test_one_update_per_micro_batch_would_differ(self):
    # The same micro-batches, each applied as its own update, end elsewhere:
    # the equality above is not an accident of the data.
    accumulated = _checkpoint(self._shared_train('adam', 4, 'compat')[0])
    model_dir = self.create_tempdir().full_path
    estimator = eb.make_tpu_estimator(
        adam_model_fn, model_dir=model_dir, precision='float32',
        train_batch_size=_BATCH // 4,
        estimator_options=eb.EstimatorOptions(tf_random_seed=0,
                                              log_step_count_steps=None,
                                              backend='compat'))
    estimator.train(input_fn, max_steps=_UPDATES * 4)
    small = _checkpoint(model_dir)
    self.assertGreater(np.abs(accumulated['logits/kernel'] -
                              small['logits/kernel']).max(), 1e-2)

  @parameterized.named_parameters(*_backends())
  def test_checkpoints_interchange_between_k1_and_k4(self, backend):
    k1 = self._train(adam_model_fn, 1, backend, max_steps=2)
    k4 = self._train(adam_model_fn, 4, backend, max_steps=2)
    self.assertEqual(sorted(_checkpoint(k1)), sorted(_checkpoint(k4)))
    self.assertFalse([n for n in _checkpoint(k4) if 'accumulator' in n])
    # Each resumes the other's checkpoint and ends at the requested update.
    self._train(adam_model_fn, 4, backend, max_steps=3, model_dir=k1)
    self._train(adam_model_fn, 1, backend, max_steps=3, model_dir=k4)
    for model_dir in (k1, k4):
      self.assertEqual(
          tf.train.load_checkpoint(model_dir).get_tensor('global_step'), 3)

  def test_a_crash_mid_update_keeps_the_last_whole_update(self):
    model_dir = self.create_tempdir().full_path
    estimator = eb.make_tpu_estimator(
        adam_model_fn, model_dir=model_dir, precision='float32',
        train_batch_size=_BATCH,
        options=eb.WrapOptions(gradient_accumulation_steps=4),
        estimator_options=eb.EstimatorOptions(tf_random_seed=0,
                                              save_checkpoints_steps=1,
                                              log_step_count_steps=None,
                                              backend='compat'))
    # Updates 1 and 2 are whole and saved; update 3 crashes after one of
    # its micro-steps.
    with self.assertRaises(KeyboardInterrupt):
      estimator.train(input_fn, max_steps=10, hooks=[_CrashInMicroStep(2, 1)])
    self.assertEqual(
        tf.train.load_checkpoint(model_dir).get_tensor('global_step'), 2)
    # The run resumes from the whole update 2 and ends where it was asked.
    estimator.train(input_fn, max_steps=5)
    self.assertEqual(
        tf.train.load_checkpoint(model_dir).get_tensor('global_step'), 5)

  @parameterized.named_parameters(('float32', 'float32'),
                                  ('bfloat16', 'bfloat16'))
  def test_two_replicas_times_k_equal_one_device_times_2k(self, precision):
    replicas = self._train(
        adam_model_fn, 2, 'compat', precision=precision,
        distribute=eb.make_strategy('mirrored', cpu_devices=2))
    single, _ = self._shared_train('adam', 4, 'compat', precision=precision)
    # bfloat16: each replica sums different micro-batches in bfloat16
    # before the float32 accumulators; see test_distribute's tolerance.
    self._assert_same_checkpoints(
        replicas, single, _TOLERANCE if precision == 'float32' else 1e-2)

  def test_bfloat16_accumulators_are_float32_and_local(self):
    graphs = []

    class Keep(tf.compat.v1.train.SessionRunHook):

      def begin(self):
        graphs.append(tf.compat.v1.get_default_graph())

    self._train(bert_style_model_fn, 4, 'compat', max_steps=1,
                precision='bfloat16', hooks=[Keep()])
    accumulators = [v for v in graphs[0].get_collection(
        tf.compat.v1.GraphKeys.LOCAL_VARIABLES) if 'accumulator' in v.name]
    self.assertLen(accumulators, 4)  # two kernels, two biases
    for variable in accumulators:
      self.assertEqual(variable.dtype.base_dtype, tf.float32)
    self.assertFalse([v for v in graphs[0].get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if 'accumulator' in v.name])


class _CrashInMicroStep(tf.compat.v1.train.SessionRunHook):
  """Raises KeyboardInterrupt in micro-step `micro` of update `update`.

  Accumulation runs its micro-steps in its own before_run, which comes
  after the hooks given to train(); this hook wraps the session's `run`
  from its before_run so the wrapper sees the micro-steps that follow.
  """

  def __init__(self, update, micro):
    self._update, self._micro = update, micro
    self._steps = 0

  def before_run(self, run_context):
    session = run_context.session
    if self._steps == self._update:
      original, count = session.run, [0]

      def run(*args, **kwargs):
        count[0] += 1
        if count[0] > self._micro:
          raise KeyboardInterrupt('crash in the middle of an update')
        return original(*args, **kwargs)
      session.run = run
    self._steps += 1
    return None


def stacked_model_fn(layers, width, activation, optimizer):
  """A model_fn of `layers` dense layers of `width`, then the logits.

  Args:
    layers, width: the stack.
    activation: of each layer.
    optimizer: `optimizer()` returns the `tf.compat.v1` optimizer.
  """

  def model_fn(features, labels, mode, params):
    del params
    net = features['x']
    for index in range(layers):
      net = tf.compat.v1.layers.dense(
          net, width, activation=activation, name='layer_%d' % index,
          kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
              seed=index))
    logits = tf.compat.v1.layers.dense(
        net, _CLASSES, name='logits',
        kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
            seed=layers + 1))
    loss = _loss(labels, logits)
    train_op = optimizer().minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return _spec(mode, loss, train_op)

  return model_fn


# Eight dense layers, enough for recompute to cut into segments.
deep_model_fn = stacked_model_fn(
    8, 32, tf.nn.relu, lambda: tf.compat.v1.train.AdamOptimizer(0.01))


def ref_variables(model_fn):
  """`model_fn` with reference variables, as after `disable_v2_behavior()`.

  A v1 optimizer then differentiates with respect to each variable's
  ref-typed tensor, not the variable.
  """

  def with_ref_variables(features, labels, mode, params):
    with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                     use_resource=False):
      return model_fn(features, labels, mode, params)

  return with_ref_variables


@pytest.mark.slow
class RecomputeTest(_Training):
  """recompute=True through the Estimator, alone and with accumulation."""

  @parameterized.named_parameters(*_backends())
  def test_float32_recompute_trains_the_same_variables(self, backend):
    graphs = []

    class Keep(tf.compat.v1.train.SessionRunHook):

      def begin(self):
        graphs.append(tf.compat.v1.get_default_graph())

    recomputed = self._train(deep_model_fn, 1, backend, recompute=True,
                             hooks=[Keep()])
    plain, _ = self._shared_train('deep', 1, backend)
    self._assert_same_checkpoints(recomputed, plain, 1e-6)
    # The graph really recomputes: forward ops were copied.
    copies = [op for op in graphs[0].get_operations()
              if '_forward/' in op.name and op.type == 'MatMul']
    self.assertNotEmpty(copies)

  def test_both_levers_equal_the_big_batch(self):
    both = self._train(deep_model_fn, 4, 'compat', recompute=True)
    big, _ = self._shared_train('deep', 1, 'compat')
    self._assert_same_checkpoints(both, big, 1e-5)

  @parameterized.named_parameters(*_backends())
  def test_ref_variables_with_both_levers_equal_the_big_batch(self, backend):
    model_fn = ref_variables(deep_model_fn)
    both = self._train(model_fn, 4, backend, recompute=True)
    big = self._train(model_fn, 1, backend)
    self._assert_same_checkpoints(both, big, 1e-5)

  def test_bfloat16_recompute_trains(self):
    recomputed = _checkpoint(self._train(
        deep_model_fn, 2, 'compat', recompute=True, precision='bfloat16'))
    plain = _checkpoint(self._train(deep_model_fn, 2, 'compat',
                                    precision='bfloat16'))
    # bfloat16 sums a gradient read in two segments in two parts: close,
    # not equal (see tests/levers/test_recompute.py).
    for name in plain:
      self.assertAllClose(recomputed[name], plain[name], atol=2e-2,
                          msg=name)


class PeakMemoryTest(tf.test.TestCase):
  """The allocator's peak of an update made of micro-batches."""

  def test_an_update_of_k_micro_batches_holds_one_micro_batch(self):
    if not peak_lib.allocator_stats_enabled():
      self.skipTest('needs TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow '
                    'loads')
    spec = configs.ModelSpec('mnist_mlp', 'mnist_mlp', batch_size=4096,
                             optimizer='adam')
    # One thread per op keeps kernels from interleaving their allocations.
    # The executor's order of independent ops still follows measured kernel
    # times, so it moves with the machine's load and the allocator's history:
    # computing the dropout mask before or after a layer moves a step's peak
    # by a sixth of its activations (seen: 5.6 vs 6.6 MB). Each variant
    # counts as its smallest of three, and the activations are compared with
    # a margin of a third of one micro-batch's: holding two micro-batches
    # would be twice, and the whole batch measures 3.5 times here.
    one_thread = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    peaks = {}
    for name, batch, steps in (('micro', 1024, 1), ('accumulated', 4096, 4),
                               ('big', 4096, 1)):
      step = graphs.build_train_step(spec, 'bfloat16', batch,
                                     gradient_accumulation_steps=steps)
      peaks[name] = min(
          (step_memory.measure_step_memory(step, session_config=one_thread)
           for _ in range(3)), key=lambda m: m['peak_tensor_bytes'])
    # The accumulators are one float32 copy of the weights, kept as slots.
    accumulators = peaks['micro']['parameter_bytes']
    self.assertEqual(peaks['accumulated']['slot_bytes'],
                     peaks['micro']['slot_bytes'] + accumulators)
    # The resident input is one micro-batch, not the whole batch.
    self.assertEqual(peaks['accumulated']['state_bytes'],
                     peaks['micro']['state_bytes'])
    activations = {name: _activation_bytes(peak)
                   for name, peak in peaks.items()}
    msg = 'activation bytes per step: %s' % activations
    self.assertLess(activations['accumulated'],
                    1.35 * activations['micro'], msg)
    self.assertLess(activations['accumulated'],
                    0.4 * activations['big'], msg)


def _activation_bytes(peak):
  """A measured step's peak less its variables, slots and resident input."""
  return (peak['peak_tensor_bytes'] - peak['parameter_bytes'] -
          peak['slot_bytes'] - peak['state_bytes'])


@pytest.mark.slow
class CommandsTest(tf.test.TestCase):

  def test_run_accumulate_ends_at_the_requested_step(self):
    model_dir = self.create_tempdir().full_path
    proc = test_runner._cli_here(  # pylint: disable=protected-access
        'run', '--accumulate=4', 'tests/support/legacy_tpu_main.py',
        '--use_tpu=false', '--train_steps=6', '--eval_steps=1',
        '--model_dir=' + model_dir)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertEqual(
        tf.train.load_checkpoint(model_dir).get_tensor('global_step'), 6)
    self.assertIn('memory levers: gradient accumulation K=4 '
                  '(train_batch_size 32 = 4 x 8)', proc.stderr)

  def test_check_plans_with_the_levers(self):
    # A TF 1.x TPUEstimator program at batch 32, small enough that its plan
    # costs a second (tests/memory/test_fit.py).
    program, model_dir = test_fit._text_program(self)  # pylint: disable=protected-access
    proc = test_runner._cli_here(  # pylint: disable=protected-access
        'check', '--accumulate=4', '--recompute', program, model_dir)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('memory levers: gradient accumulation K=4 (train_batch_size '
                  '32 = 4 x 8); recompute on', proc.stderr)
    self.assertIn('With gradient accumulation K=4: batches are per update',
                  proc.stderr)
    # The plan's largest batches are whole updates: multiples of K.
    rows = [line.split() for line in proc.stderr.splitlines()
            if line.startswith(('float32 ', 'bfloat16 '))
            and 'share' not in line]
    self.assertLen(rows, 4)
    for row in rows:
      self.assertEqual(int(row[-1]) % 4, 0, row)
      self.assertEqual(int(row[-2]) % 4, 0, row)

  def test_run_rejects_a_bad_k_before_running(self):
    # cli.main here returns what `python -m estimator_bf16` exits with.
    code, stderr = cli_refusal.refused(
        ['run', '--accumulate=0', 'tests/support/legacy_tpu_main.py'])
    self.assertEqual(code, 2)
    self.assertIn('--accumulate must be an integer >= 1', stderr)

  def test_training_command_counts_updates(self):
    model_dir = self.create_tempdir().full_path
    result = training.run(training.TrainOptions(
        model='mnist_mlp', model_dir=model_dir, train_steps=5,
        train_batch_size=32, accumulate=4, eval_steps=1, export=False,
        log_every_steps=100))
    self.assertEqual(result['global_step'], 5)
    self.assertEqual(result['options']['accumulate'], 4)


class BadInputTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('zero', 0), ('negative', -2),
                                  ('float', 2.5), ('bool', True),
                                  ('string', '4'))
  def test_bad_k(self, steps):
    with self.assertRaisesRegex(ValueError, 'gradient_accumulation_steps '
                                'must be an integer >= 1.*%s' % steps):
      eb.make_tpu_estimator(
          adam_model_fn, model_dir='/tmp/unused', precision='float32',
          train_batch_size=16,
          options=eb.WrapOptions(gradient_accumulation_steps=steps))

  def test_batch_not_divisible(self):
    with self.assertRaisesRegex(
        ValueError, r'train_batch_size=18 is not divisible by '
        r'gradient_accumulation_steps=4: an update is 4 micro-batches'):
      eb.make_tpu_estimator(
          adam_model_fn, model_dir='/tmp/unused', precision='float32',
          train_batch_size=18,
          options=eb.WrapOptions(gradient_accumulation_steps=4))

  def test_batch_not_divisible_by_k_times_replicas(self):
    with self.assertRaisesRegex(
        ValueError, r'train_batch_size=12 is not divisible by '
        r'gradient_accumulation_steps=4 x 2 replicas of the strategy = 8'):
      eb.make_tpu_estimator(
          adam_model_fn, model_dir='/tmp/unused', precision='float32',
          train_batch_size=12,
          distribute=eb.make_strategy('mirrored', cpu_devices=2),
          options=eb.WrapOptions(gradient_accumulation_steps=4))

  def test_tpu_batch_not_divisible_by_k_times_cores(self):
    # On a TPU each core's share of the batch is split into K (the device
    # loop's micro-steps): 16 over 8 cores is 2 per core, not 4 x 1.
    with self.assertRaisesRegex(
        ValueError, r'train_batch_size=16 is not divisible by '
        r'gradient_accumulation_steps=4 x 8 TPU replicas = 32'):
      eb.make_tpu_estimator(
          adam_model_fn, model_dir='/tmp/unused', precision='float32',
          train_batch_size=16, use_tpu=True, tpu='local',
          options=eb.WrapOptions(gradient_accumulation_steps=4))

  def test_bad_recompute(self):
    with self.assertRaisesRegex(ValueError, 'recompute must be True or False'):
      eb.wrap_model_fn(adam_model_fn, 'bfloat16',
                       eb.WrapOptions(recompute='yes'))

  def test_model_fn_without_gradients(self):
    def keras_style(features, labels, mode):
      loss = _loss(labels, _network(features))
      return _spec(mode, loss, tf.compat.v1.assign_add(
          tf.compat.v1.train.get_global_step(), 1))
    model_dir = self.create_tempdir().full_path
    estimator = eb.make_tpu_estimator(
        keras_style, model_dir=model_dir, precision='float32',
        train_batch_size=16,
        options=eb.WrapOptions(gradient_accumulation_steps=2),
        estimator_options=eb.EstimatorOptions(backend='compat'))
    with self.assertRaisesRegex(ValueError, 'computed no gradients'):
      estimator.train(input_fn, max_steps=1)

  def test_micro_batch_size(self):
    self.assertEqual(accumulation.micro_batch_size(64, 4, replicas=8), 16)
    self.assertEqual(apply.check_levers(3, True), (3, True))


if __name__ == '__main__':
  tf.test.main()
