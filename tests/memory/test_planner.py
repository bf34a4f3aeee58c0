"""Tests for estimator_bf16/memory/planner.py: the memory planner (graphs only)."""

import functools

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from estimator_bf16.memory import peak as peak_lib
from estimator_bf16.memory import plan_build
from estimator_bf16.memory import plan_simulate
from estimator_bf16.memory import planner
from estimator_bf16.models.styles import bert_style
from estimator_bf16.platform import cpu_bfloat16
from benchmarks import configs
from benchmarks import graphs
from benchmarks import planning
from benchmarks import step_memory
from tests.support import legacy_model

_IMAGE = tf.TensorSpec([16, 16, 1], tf.float32)
_HIDDEN = 256
_CLASSES = 10
# Weights of the test network: [256, 256] + [256] + [256, 10] + [10].
_PARAMETERS = 256 * _HIDDEN + _HIDDEN + _HIDDEN * _CLASSES + _CLASSES


def _network(features, is_training):
  """Dense(256, relu) -> Dense(10), weights in the dtype of the images."""
  del is_training
  net = tf.reshape(features['image'], [-1, 256])
  for name, units in (('hidden', _HIDDEN), ('logits', _CLASSES)):
    with tf.compat.v1.variable_scope(name):
      kernel = tf.compat.v1.get_variable(
          'kernel', [net.shape[-1], units], dtype=net.dtype)
      bias = tf.compat.v1.get_variable(
          'bias', [units], dtype=net.dtype,
          initializer=tf.compat.v1.zeros_initializer())
      net = tf.nn.bias_add(tf.matmul(net, kernel), bias)
      if name == 'hidden':
        net = tf.nn.relu(net)
  return net


@functools.lru_cache(maxsize=None)
def _plan(precision='float32', optimizer='sgd', batch_sizes=(8, 16)):
  # Plans are immutable; building each once keeps the tests fast.
  return planner.memory_plan(network_fn=_network,
                             features={'image': _IMAGE}, precision=precision,
                             optimizer=optimizer, batch_sizes=batch_sizes)


class PersistentBytesTest(parameterized.TestCase):

  @parameterized.named_parameters(('float32', 'float32'),
                                  ('bfloat16', 'bfloat16'))
  def test_parameters_are_float32_master_weights(self, precision):
    plan = _plan(precision)
    self.assertEqual(plan.parameter_bytes, 4 * _PARAMETERS)
    self.assertEqual(plan.slot_bytes, 0)  # plain SGD keeps no state
    self.assertEqual(plan.precision, precision)

  def test_adam_keeps_two_slots_per_parameter(self):
    plan = _plan(optimizer='adam')
    # m and v for every weight, plus Adam's two scalar beta powers.
    self.assertEqual(plan.slot_bytes, 2 * 4 * _PARAMETERS + 2 * 4)

  def test_adafactor_keeps_rows_plus_columns(self):
    adam = _plan(optimizer='adam').slot_bytes
    adafactor = _plan(optimizer='adafactor').slot_bytes
    factored = (256 + _HIDDEN) + (_HIDDEN + _CLASSES)  # the two kernels
    full = _HIDDEN + _CLASSES  # biases keep a full second moment
    # The optimizer may also keep a step counter.
    self.assertBetween(adafactor, 4 * (factored + full),
                       4 * (factored + full) + 16)
    self.assertLess(adafactor / adam, 0.02)

  def test_optimizer_factory(self):
    plan = _plan(optimizer=lambda: tf.compat.v1.train.MomentumOptimizer(
        0.1, 0.9))
    self.assertEqual(plan.slot_bytes, 4 * _PARAMETERS)


class ActivationBytesTest(parameterized.TestCase):

  def test_bfloat16_halves_activation_bytes(self):
    fp32, bf16 = _plan('float32'), _plan('bfloat16')
    self.assertGreater(fp32.bytes_per_example, 0)
    ratio = bf16.bytes_per_example / fp32.bytes_per_example
    self.assertBetween(ratio, 0.45, 0.6)

  def test_bfloat16_weight_copies_are_batch_independent(self):
    # The scope's bfloat16 reads of the weights do not grow with the batch.
    fp32, bf16 = _plan('float32'), _plan('bfloat16')
    self.assertGreater(bf16.step_bytes(1), fp32.step_bytes(1) - 1)

  def test_step_bytes_grows_linearly_at_large_batches(self):
    plan = _plan('float32', optimizer='adam')
    a, b, c = (plan.step_bytes(n) for n in (1000, 2000, 3000))
    self.assertAlmostEqual((c - b) / (b - a), 1.0, places=6)
    self.assertAlmostEqual((c - b) / 1000.0, plan.bytes_per_example,
                           delta=1.0)
    self.assertGreaterEqual(plan.step_bytes(1), plan.persistent_bytes)

  def test_same_answer_from_other_batch_sizes(self):
    small = _plan('bfloat16', batch_sizes=(2, 4))
    large = _plan('bfloat16', batch_sizes=(16, 64))
    self.assertEqual(small.step_bytes(512), large.step_bytes(512))

  def test_weight_recast_decided_alike_at_every_planning_batch(self):
    # A conv on 4x4 inputs meets 16 rows an example: 128 at batch 8, 256
    # at 16, either side of the recast's threshold. Both builds must make
    # the large-batch decision, or they differ beyond their shapes and the
    # line through them is wrong.
    def conv_net(features, is_training):
      del is_training
      net = features['image']
      for _ in range(3):
        net = tf.compat.v1.layers.conv2d(net, 64, 3, padding='same',
                                         activation=tf.nn.relu)
      return tf.compat.v1.layers.dense(tf.compat.v1.layers.flatten(net), 10)

    def plan(batch_sizes):
      return planner.memory_plan(
          network_fn=conv_net, features={'image': tf.TensorSpec(
              [4, 4, 8], tf.float32)}, precision='bfloat16',
          optimizer='sgd', batch_sizes=batch_sizes)

    straddling, above = plan((8, 16)), plan((32, 64))
    self.assertGreater(straddling.bytes_per_example, 0)
    self.assertEqual(straddling.step_bytes(512), above.step_bytes(512))

  def test_upcast_adds_float32_copies_only_in_bfloat16(self):
    fp32, bf16 = _plan('float32'), _plan('bfloat16')
    self.assertEqual(fp32.step_bytes(64, upcast=True), fp32.step_bytes(64))
    self.assertGreater(bf16.step_bytes(64, upcast=True), bf16.step_bytes(64))


class MaxBatchTest(parameterized.TestCase):

  @parameterized.named_parameters(('float32', 'float32'),
                                  ('bfloat16', 'bfloat16'))
  def test_max_batch_is_the_boundary(self, precision):
    plan = _plan(precision, optimizer='adam')
    budget = 64 * 2**20
    batch = plan.max_batch(budget)
    self.assertGreater(batch, 0)
    self.assertLessEqual(plan.step_bytes(batch), budget)
    self.assertGreater(plan.step_bytes(batch + 1), budget)
    self.assertEqual(plan.max_batch(budget, multiple_of=8) % 8, 0)

  def test_too_small_a_budget_fits_nothing(self):
    plan = _plan(optimizer='adam')
    self.assertEqual(plan.max_batch(plan.persistent_bytes // 2), 0)

  def test_bfloat16_fits_about_twice_the_batch_on_a_tpu_core(self):
    fp32 = _plan('float32', optimizer='adam').max_batch_per_core()
    bf16 = _plan('bfloat16', optimizer='adam').max_batch_per_core()
    self.assertEqual(sorted(fp32), ['v2', 'v3'])
    self.assertBetween(bf16['v2'] / fp32['v2'], 1.7, 2.2)
    # v3 doubles the memory per core; the persistent part is tiny here.
    self.assertBetween(fp32['v3'] / fp32['v2'], 1.99, 2.01)
    self.assertIn('v2 core', _plan().summary())


class ModelFnTest(parameterized.TestCase):

  @parameterized.named_parameters(('float32', 'float32'),
                                  ('bfloat16', 'bfloat16'))
  def test_unmodified_legacy_model_fn(self, precision):
    features, labels = planner.input_specs(legacy_model.train_input_fn)
    self.assertEqual(features['image'].shape.as_list(), [8, 8, 1])
    plan = planner.memory_plan(legacy_model.model_fn, features=features,
                               labels=labels, precision=precision)
    with tf.Graph().as_default():
      # The same layers, to count the parameters independently.
      legacy_model.model_fn({'image': tf.zeros([2, 8, 8, 1])},
                            tf.zeros([2], tf.int32), 'train',
                            {'use_tpu': False})
      expected = sum(np.prod(v.shape) * 4
                     for v in tf.compat.v1.trainable_variables())
    self.assertEqual(plan.parameter_bytes, expected)
    self.assertEqual(plan.slot_bytes, 2 * expected + 8)  # Adam
    self.assertEqual(plan.optimizer, 'model_fn')
    self.assertGreater(plan.bytes_per_example, 0)


class ErrorsTest(parameterized.TestCase):

  def test_exactly_one_function(self):
    with self.assertRaisesRegex(ValueError, 'exactly one'):
      planner.memory_plan(features={'image': _IMAGE})
    with self.assertRaisesRegex(ValueError, 'exactly one'):
      planner.memory_plan(legacy_model.model_fn, network_fn=_network,
                          features={'image': _IMAGE})

  def test_model_fn_brings_its_own_optimizer(self):
    with self.assertRaisesRegex(ValueError, 'own optimizer'):
      planner.memory_plan(legacy_model.model_fn, features={'image': _IMAGE},
                          optimizer='adam')

  @parameterized.named_parameters(('same', (4, 4)), ('one', (4,)),
                                  ('zero', (0, 4)))
  def test_bad_batch_sizes(self, batch_sizes):
    with self.assertRaisesRegex(ValueError, 'batch_sizes'):
      _plan(batch_sizes=batch_sizes)

  def test_unknown_optimizer_lists_choices(self):
    with self.assertRaisesRegex(ValueError, 'adafactor'):
      _plan(optimizer='lamb')

  def test_unknown_precision(self):
    with self.assertRaisesRegex(ValueError, 'bfloat16'):
      _plan(precision='float16')

  def test_graph_without_gradients(self):
    with tf.Graph().as_default() as graph:
      tf.compat.v1.get_variable('w', [2])
    with self.assertRaisesRegex(ValueError, 'no gradients'):
      plan_build.variable_bytes(graph)


# google-research/bert-style code (raw get_variable, tanh GELU, layer norm)
# at a size that builds and runs in about a second.
_BERT_STYLE = configs.ModelSpec('bert_style_small', 'bert_style',
                                batch_size=16, optimizer='adam',
                                seq_length=64, num_classes=2, vocab_size=2000)
# The benchmark's BERT-mini widths (benchmarks/graphs.py) with two layers,
# not four: building the graph is most of a case's cost (three builds: the
# measured step and the plan's two), and it is in proportion to the layers.
# Two keep the planner within 3% of the measurement in every case below
# (TF 2.15, native and emulated bfloat16); with one, recompute has nothing
# to cut (its measured peak came out above the plain step's).
_BERT_STYLE_CONFIG = bert_style.BertStyleConfig(
    vocab_size=_BERT_STYLE.vocab_size, hidden_size=256, num_layers=2,
    num_heads=4, intermediate_size=1024,
    max_positions=_BERT_STYLE.seq_length)


def _bert_style_network(params):
  """The benchmark's BERT-style network of _BERT_STYLE, on the 2-layer net."""
  del params
  return bert_style.classifier_network(_BERT_STYLE_CONFIG,
                                       _BERT_STYLE.num_classes)


class LeversPlanTest(parameterized.TestCase):

  def test_accumulators_are_float32_slots(self):
    plain = _plan()
    accumulated = planner.memory_plan(
        network_fn=_network, features={'image': _IMAGE}, optimizer='sgd',
        gradient_accumulation_steps=4)
    self.assertEqual(accumulated.slot_bytes,
                     plain.slot_bytes + 4 * _PARAMETERS)
    self.assertEqual(accumulated.parameter_bytes, plain.parameter_bytes)

  @parameterized.parameters('float32', 'bfloat16')
  def test_batches_are_effective_batches(self, precision):
    plain = _plan(precision)
    accumulated = planner.memory_plan(
        network_fn=_network, features={'image': _IMAGE}, optimizer='sgd',
        precision=precision, gradient_accumulation_steps=4)
    # An update of 4096 examples costs about what one micro-batch of 1024
    # does, plus the accumulators; nothing like 4096 at once.
    micro = plain.step_bytes(1024)
    self.assertBetween(accumulated.step_bytes(4096), 0.9 * micro,
                       micro + 4 * _PARAMETERS * 1.05)
    self.assertLess(accumulated.step_bytes(4096),
                    0.5 * plain.step_bytes(4096))
    budget = 64 * 2**20
    batch = accumulated.max_batch(budget)
    self.assertEqual(batch % 4, 0)
    self.assertGreater(batch, 3 * plain.max_batch(budget))
    self.assertLessEqual(accumulated.step_bytes(batch), budget)

  def test_bad_levers(self):
    with self.assertRaisesRegex(ValueError, 'gradient_accumulation_steps'):
      planner.memory_plan(network_fn=_network,
                          features={'image': _IMAGE},
                          gradient_accumulation_steps=0)


def _gelu_network(features, is_training):
  """Dense(1024) -> tanh GELU -> Dense(10): an elementwise chain of six ops
  on a 1024-wide activation, as in a BERT layer's intermediate output."""
  del is_training
  net = tf.reshape(features['image'], [-1, 256])
  hidden = tf.compat.v1.layers.dense(net, 1024, name='hidden')
  gelu = 0.5 * hidden * (1.0 + tf.tanh(
      0.7978845608 * (hidden + 0.044715 * hidden * hidden * hidden)))
  return tf.compat.v1.layers.dense(gelu, _CLASSES, name='logits')


@pytest.mark.slow
class CompiledPlanTest(parameterized.TestCase):
  """`compiled=True`: the step as XLA compiles it for a TPU."""

  @parameterized.parameters('float32', 'bfloat16')
  def test_an_elementwise_chain_is_one_buffer(self, precision):
    plans = {compiled: planner.memory_plan(
        network_fn=_gelu_network, features={'image': _IMAGE},
        precision=precision, optimizer='sgd', compiled=compiled)
             for compiled in (False, True)}
    width = 1024 * (2 if precision == 'bfloat16' else 4)
    # The executor keeps several of the chain's 1024-wide results for the
    # gradient; fused, the chain reads the matmul's output and is computed
    # again where the gradient needs it.
    self.assertGreater(plans[False].bytes_per_example, 4 * width)
    self.assertLess(plans[True].bytes_per_example,
                    plans[False].bytes_per_example - 2 * width)
    self.assertEqual(plans[True].persistent_bytes,
                     plans[False].persistent_bytes)

  def test_a_long_chain_with_repeated_reads_is_one_buffer(self):
    # 2000 steps of y = y * y + x: each reads y twice and x once; longer
    # than Python's stack, and a diamond at every step.
    graph = tf.Graph()
    with graph.as_default():
      x = tf.compat.v1.placeholder(tf.float32, [8, 1024])
      y = x
      for _ in range(2000):
        y = y * y + x
      total = tf.reduce_sum(y)
    build = plan_build.Build(graph, (total.op,), 0, 0, 0)
    size = lambda t: (float(plan_simulate.tensor_bytes(t)), 0.0)
    peak = lambda lines: max(fixed for fixed, _ in lines)
    executed, _ = plan_simulate.simulate(build, size)
    compiled, _ = plan_simulate.simulate(build, size, compiled=True)
    # Fused into the sum: only x (32 KiB) and the scalar result.
    self.assertEqual(peak(compiled), 8 * 1024 * 4 + 4)
    self.assertGreaterEqual(peak(executed), 2 * 8 * 1024 * 4)

  def test_an_executed_op_reading_a_tensor_twice_does_not_write_into_it(
      self):
    # TensorFlow's square-by-multiply cannot take over its input's buffer
    # (the buffer has two references): both are live while it runs. (XLA
    # fuses the relu into the multiply, which may write in place.)
    graph = tf.Graph()
    with graph.as_default():
      x = tf.compat.v1.placeholder(tf.float32, [8, 1024])
      shifted = tf.nn.relu(x)
      squared = shifted * shifted
      total = tf.reduce_sum(tf.matmul(squared, tf.ones([1024, 1])))
    build = plan_build.Build(graph, (total.op,), 0, 0, 0)
    size = lambda t: (float(plan_simulate.tensor_bytes(t)), 0.0)
    lines, _ = plan_simulate.simulate(build, size)
    # x may die into `shifted` (it is read once), `shifted` not into
    # `squared`: two 32 KiB buffers.
    self.assertGreaterEqual(max(fixed for fixed, _ in lines),
                            2 * 8 * 1024 * 4)

  def test_which_results_read_twice_are_computed_in_each_reader(self):
    # A dropout mask read in the forward pass and again in backprop (as
    # recompute keeps it): computing it again in both places would keep
    # the float32 random numbers (4 bytes each) instead of the booleans.
    graph = tf.Graph()
    with graph.as_default():
      x = tf.compat.v1.placeholder(tf.float32, [8, 1024])
      noise = tf.random.uniform([8, 1024])
      mask = noise >= 0.1
      scaled = x * 2.0
      curved = tf.tanh(x)
      early = tf.reduce_sum(tf.cast(mask, tf.float32) * x + curved)
      late = tf.reduce_sum(tf.cast(mask, tf.float32) * scaled - curved)
      total = early + late
    ops = plan_simulate.recompute_path.ancestor_ops([total.op],
                                                    control_inputs=True)
    fused = plan_simulate._fused(ops)  # pylint: disable=protected-access
    self.assertNotIn(mask.op, fused)
    # Read twice, no larger than its input and cheap: computed in each
    # reader. A transcendental function XLA computes once.
    self.assertIn(scaled.op, fused)
    self.assertNotIn(curved.op, fused)

  def test_a_loop_on_the_device_holds_the_update_s_input(self):
    plans = {compiled: planner.memory_plan(
        network_fn=_network, features={'image': _IMAGE}, optimizer='sgd',
        gradient_accumulation_steps=4, compiled=compiled)
             for compiled in (False, True)}
    example_bytes = 16 * 16 * 4 + 4  # a float32 image and an int32 label
    self.assertEqual(plans[True].input_bytes_per_example, example_bytes)
    # Three more micro-batches of 256 examples, and micro-batch 0's
    # gradients (one float32 copy of the weights) held through the loop.
    extra = 3 * 256 * example_bytes + 4 * _PARAMETERS
    host, device = (plans[c].step_bytes(1024) for c in (False, True))
    self.assertLess(abs(device - host - extra), 0.02 * extra)
    # The same from a plan without accumulation, as `--fit` plans.
    single = planner.memory_plan(
        network_fn=_network, features={'image': _IMAGE}, optimizer='sgd',
        compiled=True)
    self.assertEqual(single.with_accumulation(1).step_bytes(1024),
                     single.step_bytes(1024))
    self.assertEqual(single.with_accumulation(4).step_bytes(1024), device)
    budget = 64 * 2**20
    batch = plans[True].max_batch(budget)
    self.assertLessEqual(plans[True].step_bytes(batch), budget)
    self.assertGreater(plans[True].step_bytes(batch + 4), budget)
    self.assertLess(batch, plans[False].max_batch(budget))
    self.assertEqual(single.with_accumulation(4).max_batch(budget), batch)

  def test_with_accumulation_needs_a_plan_without_accumulation(self):
    accumulated = planner.memory_plan(
        network_fn=_network, features={'image': _IMAGE}, optimizer='sgd',
        gradient_accumulation_steps=2)
    with self.assertRaisesRegex(ValueError, 'K = 2'):
      accumulated.with_accumulation(2)


@functools.lru_cache(maxsize=None)
def _bert_style_plan(precision, steps, recompute):
  # Each plan builds the model twice (1.5 s here): a recompute case's
  # plain plan is the plain or accumulate case's, built once.
  return planning.plan_model(_BERT_STYLE, precision,
                             gradient_accumulation_steps=steps,
                             recompute=recompute,
                             network_builder=_bert_style_network)


# (name, K, recompute, batch) of each measured case. Both levers at 32:
# micro-batches of 8. At 16 (micro-batches of 4; measured on the 4-layer
# net) the step's transient part is 11% of it and bfloat16 is planned 11%
# high.
_LEVER_CASES = (('plain', 1, False, 16), ('accumulate', 4, False, 16),
                ('recompute', 1, True, 16), ('both', 4, True, 32))


# The traced step runs one op at a time (memory.peak.traced_run_options),
# so its order, and with it the peak, does not follow the machine's load.
@pytest.mark.slow
class MeasuredPeakTest(parameterized.TestCase):
  """The plan against the same training step run on this CPU."""

  @parameterized.named_parameters(
      (precision + '_' + name, precision, steps, recompute, batch)
      for precision in ('float32', 'bfloat16')
      for name, steps, recompute, batch in _LEVER_CASES)
  def test_close_to_the_live_tensor_peak(self, precision, steps, recompute,
                                         batch):
    if not peak_lib.allocator_stats_enabled():
      self.skipTest('needs TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow '
                    'loads')
    step = graphs.build_train_step(
        _BERT_STYLE, precision, batch,
        model_fn_override=graphs.model_fn(
            _BERT_STYLE, network_builder=_bert_style_network),
        gradient_accumulation_steps=steps, recompute=recompute)
    measured = step_memory.measure_step_memory(step)['peak_tensor_bytes']
    plan = _bert_style_plan(precision, steps, recompute)
    # Without bfloat16 arithmetic the CPU's matmuls hold float32 copies,
    # which the planner adds on request; that model of them is coarser.
    emulated = cpu_bfloat16.emulated_kernels()
    estimate = plan.step_bytes(batch, upcast=emulated)
    tolerance = 0.15 if emulated and precision == 'bfloat16' else 0.10
    # Planned as built, before grappler's pruning and rewrites, this step
    # came out 17% (float32) and 11% (bfloat16) above the measurement.
    self.assertBetween(planning.relative_error(estimate, measured),
                       -tolerance, tolerance)
    if recompute:
      plain = _bert_style_plan(precision, steps, False)
      self.assertLess(estimate, plain.step_bytes(batch, upcast=emulated))


if __name__ == '__main__':
  tf.test.main()
