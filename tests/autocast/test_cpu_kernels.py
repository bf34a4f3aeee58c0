"""Slow bfloat16 CPU kernels computed in float32 (autocast.cpu_kernels).

Each CPU kind's table is exercised on any machine: the kind is set by the
test, not read from this CPU, so the emulated table (conv gradients, einsum,
depthwise conv) is checked on a native CPU and the other way round.
"""

from unittest import mock

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.precision import op_lists
from estimator_bf16.memory import planner
from estimator_bf16.safety import audit as audit_lib
from estimator_bf16.runner import program as runner
from estimator_bf16.runner import report as run_report
from estimator_bf16.runner import results

KINDS = tuple(op_lists.CPU_SLOW_BFLOAT16_OPS)


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _model_fn(features, labels, mode, params):
  """A small net that meets every op type of both tables."""
  del params
  x = features['x']                                         # [4, 8, 8, 3]
  w = tf.compat.v1.get_variable('w', [3, 3, 3, 8])
  d = tf.compat.v1.get_variable('d', [3, 3, 8, 1])
  y = tf.nn.relu(tf.nn.conv2d(x, w, 1, 'SAME'))             # Conv2D + grads
  y = tf.nn.depthwise_conv2d(y, d, [1, 1, 1, 1], 'SAME')    # depthwise
  y = tf.sigmoid(y) + tf.tanh(y)                            # Sigmoid, TanhGrad
  y = tf.nn.avg_pool2d(y, 2, 2, 'SAME')                     # AvgPoolGrad
  k = tf.compat.v1.get_variable('k', [8, 10])
  logits = tf.einsum('bhwc,ck->bk', y, k)                   # Einsum
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_or_create_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _features():
  rng = np.random.RandomState(0)
  return ({'x': tf.constant(rng.rand(4, 8, 8, 3), tf.float32)},
          tf.constant([1, 2, 3, 4], tf.int32))


def _build(kind, kernels='auto', gpu=False, model_fn=_model_fn):
  """(graph, spec) of the TRAIN step built as on CPU kind `kind`."""
  graph = tf.Graph()
  with graph.as_default(), \
      mock.patch.object(cpu_kernels, 'cpu_kind', return_value=kind), \
      mock.patch.object(cpu_kernels, '_gpu_visible', return_value=gpu):
    tf.compat.v1.set_random_seed(3)
    features, labels = _features()
    wrapped = eb.wrap_model_fn(model_fn, 'bfloat16',
                               eb.WrapOptions(kernels=kernels))
    spec = wrapped(features, labels, tf.estimator.ModeKeys.TRAIN, {})
  return graph, spec


def _substituted_types(graph):
  return {op.type for op in graph.get_operations()
          if cpu_kernels.is_substituted(op) and op.type != 'Cast'}


def _train_values(graph, spec):
  """Loss and updated variables after one step from fixed initial values."""
  with graph.as_default():
    variables = sorted(tf.compat.v1.trainable_variables(),
                       key=lambda v: v.op.name)
    rng = np.random.RandomState(7)
    assigns = [v.assign(rng.uniform(-0.5, 0.5, v.shape.as_list()))
               for v in variables]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(assigns)
      loss, _ = session.run([spec.loss, spec.train_op])
      return [loss] + session.run(variables)


class SubstitutionTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*KINDS)
  def test_the_kinds_slow_ops_and_only_those_compute_in_float32(self, kind):
    graph, _ = _build(kind)
    slow = op_lists.CPU_SLOW_BFLOAT16_OPS[kind]
    substituted = _substituted_types(graph)
    # Every slow op the net has, forward or gradient, is substituted ...
    present = {op.type for op in graph.get_operations()} & slow
    self.assertNotEmpty(present)
    self.assertContainsSubset(present - substituted, set())
    for op in graph.get_operations():
      if op.type in slow and op.type != 'Cast':
        self.assertTrue(cpu_kernels.is_substituted(op), op.name)
        self.assertEqual(op.get_attr('T'), tf.float32, op.name)
    # ... and the forward ops outside the table stay bfloat16.
    for op in graph.get_operations():
      if op.type in ('Conv2D', 'Relu') and op.type not in slow:
        self.assertFalse(cpu_kernels.is_substituted(op), op.name)
        self.assertEqual(op.get_attr('T'), tf.bfloat16, op.name)

  @parameterized.parameters(*KINDS)
  def test_results_match_the_plain_bfloat16_graph(self, kind):
    plain = _train_values(*_build(kind, kernels='bfloat16'))
    substituted = _train_values(*_build(kind))
    for want, got in zip(plain, substituted):
      # Both round to bfloat16 (8 bits of mantissa) at different places.
      scale = max(float(np.max(np.abs(want))), 1e-3)
      self.assertAllClose(want / scale, got / scale, atol=2 ** -5, rtol=0)

  @parameterized.parameters(*KINDS)
  def test_audit_and_flop_share_equal_the_plain_bfloat16_build(self, kind):
    plain_graph, plain_spec = _build(kind, kernels='bfloat16')
    graph, spec = _build(kind)
    plain = audit_lib.check_graph(plain_graph, strict=False,
                                  loss=plain_spec.loss)
    report = audit_lib.check_graph(graph, strict=False, loss=spec.loss)
    self.assertEqual(report.problems, plain.problems)
    self.assertEqual(report.mixed_precision_ops, [])
    self.assertEqual(report.bfloat16_flop_share, plain.bfloat16_flop_share)
    self.assertEqual(report.flops_by_dtype, plain.flops_by_dtype)
    self.assertNotEmpty(report.cpu_substituted_ops)
    self.assertEmpty(plain.cpu_substituted_ops)

  def test_kernels_bfloat16_turns_it_off(self):
    graph, _ = _build('emulated', kernels='bfloat16')
    self.assertEmpty(_substituted_types(graph))
    self.assertEqual(
        {op.get_attr('T') for op in graph.get_operations()
         if op.type in ('Conv2DBackpropInput', 'Conv2DBackpropFilter',
                        'Einsum')}, {tf.bfloat16})

  def test_an_outer_bfloat16_choice_wins_over_an_inner_auto(self):
    with cpu_kernels.kernels('bfloat16'):
      graph, _ = _build('emulated', kernels='auto')
    self.assertEmpty(_substituted_types(graph))

  def test_nothing_is_substituted_with_a_gpu_or_on_an_unknown_cpu(self):
    self.assertEmpty(_substituted_types(_build('emulated', gpu=True)[0]))
    self.assertEmpty(_substituted_types(_build(None)[0]))

  def test_nothing_is_substituted_inside_an_xla_computation(self):
    # pylint: disable=g-import-not-at-top
    from tensorflow.python.compiler.xla import xla

    def step(x):
      with eb.autocast('bfloat16'):
        w = tf.compat.v1.get_variable('w', [3, 3, 3, 8])
        y = tf.nn.conv2d(tf.cast(x, tf.bfloat16), w, 1, 'SAME')
        loss = tf.reduce_mean(tf.cast(y, tf.float32))
        return tf.gradients(loss, [w])[0]

    graph = tf.Graph()
    with graph.as_default(), \
        mock.patch.object(cpu_kernels, 'cpu_kind', return_value='emulated'):
      xla.compile(step, [tf.ones([2, 8, 8, 3])])
    self.assertIn('Conv2DBackpropFilter',
                  {op.type for op in graph.get_operations()})
    self.assertEmpty(_substituted_types(graph))

  def test_consecutive_substituted_ops_pass_float32_between_them(self):
    graph = tf.Graph()
    with graph.as_default(), \
        mock.patch.object(cpu_kernels, 'cpu_kind', return_value='emulated'):
      x = tf.identity(tf.ones([2, 8, 8, 4], tf.bfloat16))
      w = tf.identity(tf.ones([3, 3, 4, 1], tf.bfloat16))
      with eb.autocast('bfloat16'):
        y = tf.nn.depthwise_conv2d(
            tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], 'SAME'), w,
            [1, 1, 1, 1], 'SAME')
    inner, outer = [op for op in graph.get_operations()
                    if op.type == 'DepthwiseConv2dNative']
    self.assertEqual(outer.inputs[0], inner.outputs[0])  # no rounding between
    self.assertEqual(inner.outputs[0].dtype, tf.float32)
    self.assertEqual(y.dtype, tf.bfloat16)

  @parameterized.parameters(*KINDS)
  def test_gradients_read_bfloat16_copies_not_the_forward_float32_ones(
      self, kind):
    graph, _ = _build(kind)
    # The net's forward ops whose gradients read their inputs or outputs.
    want = {'Sigmoid', 'DepthwiseConv2dNative', 'Einsum'} & (
        op_lists.CPU_SLOW_BFLOAT16_OPS[kind])
    forward = {op.name: op for op in graph.get_operations()
               if cpu_kernels.is_substituted(op) and op.type in want and
               not op.name.startswith('gradients')}
    self.assertEqual({op.type for op in forward.values()}, want)
    for op in forward.values():
      for tensor in list(op.inputs) + list(op.outputs):
        if tensor.dtype != tf.float32:
          continue
        readers = [c.name for c in tensor.consumers()
                   if c.name.startswith('gradients')]
        self.assertEmpty(readers, '%s is read in backprop' % tensor.name)

  def test_bad_choice_raises_listing_the_choices(self):
    with self.assertRaisesRegex(ValueError, "'auto', 'bfloat16'"):
      eb.WrapOptions(kernels='float32')
    with self.assertRaisesRegex(ValueError, "'auto', 'bfloat16'"):
      with cpu_kernels.kernels('fast'):
        pass
    # The runner takes the options as a value, never a loose choice.
    with self.assertRaisesRegex(runner.ProgramError, 'eb.WrapOptions'):
      runner.run_program(__file__, options={'kernels': 'fast'})


class PlanAndReportTest(tf.test.TestCase):

  def test_the_planner_plans_the_bfloat16_graph(self):
    built = []
    make_builder = planner.plan_build.model_fn_step_builder

    def spying_builder(*args, **kwargs):
      build = make_builder(*args, **kwargs)

      def spy(features, labels, batch_size):
        step = build(features, labels, batch_size)
        built.append(_substituted_types(tf.compat.v1.get_default_graph()))
        return step
      return spy

    with mock.patch.object(cpu_kernels, 'cpu_kind', return_value='emulated'), \
        mock.patch.object(planner.plan_build, 'model_fn_step_builder',
                          spying_builder):
      plan = eb.memory_plan(
          _model_fn, features={'x': tf.TensorSpec([8, 8, 3], tf.float32)},
          labels=tf.TensorSpec([], tf.int32), precision='bfloat16')
    self.assertGreater(plan.bytes_per_example, 0)
    self.assertLen(built, 2)
    self.assertEqual(built, [set(), set()])

  def test_report_names_the_substituted_ops_and_the_choice(self):
    graph, spec = _build('emulated')
    result = results.RunResult(program='p.py', precision='bfloat16')
    result.reports.append(
        audit_lib.check_graph(graph, strict=False, loss=spec.loss))
    with mock.patch.object(cpu_kernels, 'cpu_kind', return_value='emulated'):
      (line,) = run_report.kernels_lines(result)
    self.assertIn('Conv2DBackpropFilter x1', line)
    self.assertIn('emulated bfloat16', line)
    self.assertIn('--kernels=bfloat16', line)
    plain = results.RunResult(program='p.py', precision='bfloat16',
                              kernels='bfloat16')
    plain.reports.append(
        audit_lib.check_graph(*_build('emulated', 'bfloat16')[:1],
                              strict=False))
    self.assertIn("TensorFlow's own", run_report.kernels_lines(plain)[0])
    self.assertEqual(
        run_report.report_json(result)['cpu_substituted_ops'],
        result.reports[0].cpu_substituted_ops)


if __name__ == '__main__':
  tf.test.main()
