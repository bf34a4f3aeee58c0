"""The TRAIN step compiled by XLA inside a device loop, as on a TPU.

The loop is `xla_step.train_loop_on_xla`: the model_fn built with
`use_tpu=True` inside a loop of `iterations_per_loop` steps, compiled by
XLA on this CPU. Gradient accumulation there runs inside each step
(`device_accumulation`); its updates are compared, in float32, with the
big batch compiled the same way and with the host version's checkpoints.
"""

import contextlib
import functools
import json
import os
import re
import shutil
import tempfile
import textwrap
import types

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.memory import plan_simulate
from estimator_bf16.memory import xla_dump
from estimator_bf16.memory import xla_step
from estimator_bf16.precision import policy
from estimator_bf16.runner import xla_check
from tensorflow.python.ops import control_flow_util
from tests.levers import test_accumulation as models
from tests.memory import test_fit
from tests.runner import test_runner
from tests.support import cli_refusal

_K = 4
_LOOP = 2  # steps per compiled loop
_LOOPS = 2
_UPDATES = _LOOP * _LOOPS
_TOLERANCE = 1e-5


def cross_shard_adam_model_fn(features, labels, mode, params):
  """Adam with a decaying rate, wrapped in CrossShardOptimizer on a TPU."""
  loss = models._loss(labels, models._network(features))  # pylint: disable=protected-access
  global_step = tf.compat.v1.train.get_global_step()
  rate = tf.compat.v1.train.polynomial_decay(0.05, global_step, _UPDATES,
                                             0.01)
  optimizer = tf.compat.v1.train.AdamOptimizer(rate)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, global_step=global_step)
  return models._spec(mode, loss, train_op)  # pylint: disable=protected-access


_MODEL_FNS = {
    'adam': models.adam_model_fn,
    'cross_shard_adam': cross_shard_adam_model_fn,
    'adamw': models._package_optimizer_model_fn('adamw'),  # pylint: disable=protected-access
    'adafactor': models._package_optimizer_model_fn('adafactor'),  # pylint: disable=protected-access
    'bert_style': models.bert_style_model_fn,
}


@contextlib.contextmanager
def _control_flow(version):
  """TF 1.x loops ('v1', as after `disable_v2_behavior()`) or 'v2'."""
  before = control_flow_util.ENABLE_CONTROL_FLOW_V2
  control_flow_util.ENABLE_CONTROL_FLOW_V2 = (version == 'v2')
  try:
    yield
  finally:
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = before


def _on_xla(model_fn, steps=1, precision='float32', **kwargs):
  return xla_step.train_loop_on_xla(
      model_fn, models.input_fn, batch_size=models._BATCH,  # pylint: disable=protected-access
      iterations_per_loop=_LOOP, loops=_LOOPS, precision=precision,
      gradient_accumulation_steps=steps, return_variables=True, **kwargs)


@functools.lru_cache(maxsize=None)
def _shared_on_xla(name, flow, steps=1, precision='float32', recompute=False):
  """`_on_xla` of _MODEL_FNS[name] (or 'deep'), run once per module.

  Several tests read the same loop (the big batch of adam, say): each
  compile costs seconds, and the result (an `XlaStep` of numbers and
  arrays) is only read.
  """
  model_fn = models.deep_model_fn if name == 'deep' else _MODEL_FNS[name]
  with _control_flow(flow):
    return _on_xla(model_fn, steps=steps, precision=precision,
                   recompute=recompute)


@pytest.mark.slow
class DeviceAccumulationTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      *[('%s_%s' % (name, flow), name, flow) for name in _MODEL_FNS
        for flow in ('v1', 'v2')])
  def test_k_micro_batches_in_the_loop_equal_the_big_batch(self, name, flow):
    big = _shared_on_xla(name, flow)
    accumulated = _shared_on_xla(name, flow, steps=_K)
    # global_step counts updates: one per step of the device loop.
    self.assertEqual(big.global_step, _UPDATES)
    self.assertEqual(accumulated.global_step, _UPDATES)
    first, second = big.variables, accumulated.variables
    # No variable of its own: a checkpoint is the same with and without
    # accumulation, so K can change when a run resumes.
    self.assertEqual(sorted(first), sorted(second))
    moved = 0
    for variable in first:
      self.assertAllClose(first[variable], second[variable],
                          rtol=_TOLERANCE, atol=_TOLERANCE, msg=variable)
      moved += int(variable.startswith(('hidden', 'logits')))
    self.assertGreater(moved, 0)

  def test_one_micro_batch_per_update_would_differ(self):
    # The comparison above can fail: an update from a quarter of the batch
    # trains other weights.
    big = _shared_on_xla('adam', 'v2')
    quarter = xla_step.train_loop_on_xla(
        models.adam_model_fn, models.input_fn,
        batch_size=models._BATCH // _K,  # pylint: disable=protected-access
        iterations_per_loop=_LOOP, loops=_LOOPS, precision='float32',
        return_variables=True)
    difference = np.max(np.abs(big.variables['hidden/kernel'] -
                               quarter.variables['hidden/kernel']))
    self.assertGreater(difference, 1e-3)

  def test_equals_the_host_accumulation(self):
    model_dir = self.create_tempdir().full_path
    estimator = eb.make_tpu_estimator(
        models.adam_model_fn,
        model_dir=model_dir,
        precision='float32',
        train_batch_size=models._BATCH,  # pylint: disable=protected-access
        options=eb.WrapOptions(gradient_accumulation_steps=_K),
        estimator_options=eb.EstimatorOptions(tf_random_seed=0,
                                              save_checkpoints_steps=1000,
                                              log_step_count_steps=None))
    estimator.train(models.input_fn, max_steps=_UPDATES)
    host = models._checkpoint(model_dir)  # pylint: disable=protected-access
    device = _on_xla(models.adam_model_fn, steps=_K,
                     config=tf.compat.v1.estimator.tpu.RunConfig(
                         tf_random_seed=0)).variables
    self.assertEqual(host['global_step'], _UPDATES)
    for name in ('hidden/kernel', 'hidden/bias', 'logits/kernel',
                 'hidden/kernel/Adam', 'hidden/kernel/Adam_1'):
      self.assertAllClose(host[name], device[name], rtol=_TOLERANCE,
                          atol=_TOLERANCE, msg=name)

  def test_bfloat16_trains_in_the_loop(self):
    result = _shared_on_xla('adam', 'v2', steps=_K, precision='bfloat16')
    self.assertEqual(result.global_step, _UPDATES)
    self.assertTrue(np.isfinite(result.loss))
    self.assertEqual(result.variables['hidden/kernel'].dtype, np.float32)

  @parameterized.named_parameters(('v1', 'v1'), ('v2', 'v2'))
  def test_with_recompute(self, flow):
    big = _shared_on_xla('deep', flow)
    both = _shared_on_xla('deep', flow, steps=_K, recompute=True)
    for name in ('layer_0/kernel', 'logits/kernel'):
      self.assertAllClose(big.variables[name], both.variables[name],
                          rtol=_TOLERANCE, atol=_TOLERANCE, msg=name)

  def test_zero_steps_compiles_and_trains_nothing(self):
    with _control_flow('v2'):
      compiled = xla_step.train_loop_on_xla(
          models.adam_model_fn, models.input_fn, batch_size=models._BATCH,  # pylint: disable=protected-access
          iterations_per_loop=_LOOP, precision='float32', steps=0)
    trained = _shared_on_xla('adam', 'v2')
    self.assertEqual((compiled.steps, compiled.loops), (0, 1))
    self.assertIsNone(compiled.loss)
    self.assertEqual(compiled.global_step, 0)
    # The same loop compiled: its buffers are those of the loop that ran.
    self.assertEqual(compiled.step_bytes, trained.step_bytes)
    self.assertEqual(trained.steps, _LOOP * _LOOPS)

  def test_batch_not_divisible(self):
    with self.assertRaisesRegex(ValueError, 'batch per core, 16, is not '
                                'divisible by gradient_accumulation_steps=3'):
      _on_xla(models.adam_model_fn, steps=3)


# 16 tanh layers: activations (batch x 256) outweigh the weights.
_tanh_stack_model_fn = models.stacked_model_fn(
    16, 256, tf.nn.tanh,
    lambda: tf.compat.v1.train.GradientDescentOptimizer(0.01))


def _wide_input_fn(params):
  rng = np.random.RandomState(5)
  x = rng.randn(2 * params['batch_size'], 256).astype(np.float32)
  y = rng.randint(0, models._CLASSES, len(x)).astype(np.int32)  # pylint: disable=protected-access
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(
      params['batch_size'], drop_remainder=True).repeat()


@pytest.mark.slow
class DeviceAccumulationBytesTest(tf.test.TestCase, parameterized.TestCase):
  """One micro-batch's activations at a time, also once XLA compiles it."""

  @parameterized.named_parameters(('v1', 'v1'), ('v2', 'v2'))
  def test_the_loop_waits_for_micro_batch_0(self, flow):
    batch, steps = 4096, 4
    with _control_flow(flow):
      accumulated = xla_step.train_loop_on_xla(
          _tanh_stack_model_fn, _wide_input_fn, batch_size=batch,
          iterations_per_loop=1, loops=1, precision='float32',
          gradient_accumulation_steps=steps, steps=0)
    # At XLA's peak: one micro-batch's 16 activations of 1024 x 256 and
    # their gradients, and its slice of the input. Measured: 32 (TF 2.15),
    # 18 (TF 2.21). Started by a control dependency alone (which XLA
    # drops), TensorFlow 2.15's XLA ran the loop before micro-batch 0's
    # backprop and kept that micro-batch's activations through it: 48.
    activation = (batch // steps) * 256 * 4
    live = _peak_buffer_sizes(accumulated.assignment_path)
    self.assertLessEqual(live.count(activation), 2 * 16 + 1)


def _peak_buffer_sizes(path):
  """Bytes of each buffer live at the peak of an XLA buffer assignment."""
  with open(path) as f:
    text = f.read()
  peak = text[text.index('(peak):'):]
  return [int(size) for size in
          re.findall(r'^\s+\S+: (\d+) bytes$', peak, re.M)]


@pytest.mark.slow
class RecomputeOnXlaTest(tf.test.TestCase, parameterized.TestCase):
  """Recompute survives XLA's compile: fewer bytes, the same training."""

  @parameterized.named_parameters(('v1', 'v1'), ('v2', 'v2'))
  def test_fewer_bytes_and_the_same_variables(self, flow):
    with _control_flow(flow):
      runs = {
          recompute: xla_step.train_loop_on_xla(
              _tanh_stack_model_fn, _wide_input_fn, batch_size=1024,
              iterations_per_loop=2, loops=1, precision='float32',
              recompute=recompute, return_variables=True)
          for recompute in (False, True)}
    # The 16 activations of 1 MiB each become about 8 checkpoints and one
    # segment. Without the data dependencies that keep the copies apart,
    # XLA merges them back into the forward pass (the ratio was 1.0-1.2).
    self.assertLess(runs[True].step_bytes, 0.95 * runs[False].step_bytes)
    for name in ('layer_0/kernel', 'layer_15/kernel', 'logits/kernel'):
      self.assertAllClose(runs[False].variables[name],
                          runs[True].variables[name], rtol=1e-5, atol=1e-5,
                          msg=name)


def _raw_variable_model_fn(features, labels, mode, params):
  """google-research/bert style: int ids, dtype-less get_variable, matmul."""
  del params
  table = tf.compat.v1.get_variable('table', [50, 8])
  weights = tf.compat.v1.get_variable('weights', [8, 3])
  embedded = tf.matmul(tf.one_hot(features['ids'], 50), table)
  logits = tf.matmul(embedded, weights)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return models._spec(mode, loss, train_op)  # pylint: disable=protected-access


class AutocastInLoopTest(tf.test.TestCase, parameterized.TestCase):
  """The TPU loop's body is a function graph with control flow v2."""

  @parameterized.named_parameters(('v1', 'v1'), ('v2', 'v2'))
  def test_raw_variables_are_read_in_bfloat16_in_the_loop(self, flow):
    graph = tf.Graph()
    wrapped = eb.wrap_model_fn(_raw_variable_model_fn, 'bfloat16',
                               eb.WrapOptions(audit='off'))
    with graph.as_default(), _control_flow(flow):
      tf.compat.v1.train.get_or_create_global_step()
      features = {'ids': tf.zeros([4], tf.int32)}
      labels = tf.zeros([4], tf.int32)

      def body(i):
        spec = wrapped(features, labels, 'train', {}, None)
        with tf.control_dependencies([spec.train_op]):
          return i + 1

      tf.compat.v1.while_loop(lambda i: i < 2, body, [0])
    forward = [op for op in xla_step.all_ops(graph)
               if op.type == 'MatMul' and 'gradients' not in op.name]
    self.assertLen(forward, 2)
    # The variables reach the body as captures (v2); they are still
    # trainable variables, so the matmuls compute in bfloat16.
    for op in forward:
      self.assertEqual(op.inputs[1].dtype, tf.bfloat16, op.name)


class BatchAxisTest(tf.test.TestCase):

  def test_an_input_without_the_batch_is_refused(self):
    def input_fn(params):
      x, y = models._data()  # pylint: disable=protected-access
      dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
          params['batch_size'], drop_remainder=True).repeat()
      # Flattened: no dimension is the batch, so no micro-batch slices.
      return dataset.map(lambda x, y: ({'x': tf.reshape(x, [-1])}, y))

    with self.assertRaisesRegex(ValueError, r'no dimension of the input .* '
                                r'is the batch 16'):
      xla_step.train_loop_on_xla(
          models.adam_model_fn, input_fn, batch_size=16, precision='float32',
          gradient_accumulation_steps=_K)

  def test_transposed_images_accumulate_like_the_big_batch(self):
    def input_fn(params):
      x, y = models._data()  # pylint: disable=protected-access
      dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
          params['batch_size'], drop_remainder=True).repeat()
      # Batch last, as tensorflow/tpu's transposed images.
      return dataset.map(lambda x, y: ({'x': tf.transpose(x)}, y))

    def model_fn(features, labels, mode, params):
      del params
      return models.adam_model_fn({'x': tf.transpose(features['x'])},
                                  labels, mode, None)

    def run(steps):
      return xla_step.train_loop_on_xla(
          model_fn, input_fn, batch_size=models._BATCH,  # pylint: disable=protected-access
          iterations_per_loop=_LOOP, loops=1, precision='float32',
          gradient_accumulation_steps=steps, return_variables=True)

    big, accumulated = run(1), run(_K)
    self.assertAllClose(big.variables['hidden/kernel'],
                        accumulated.variables['hidden/kernel'],
                        rtol=_TOLERANCE, atol=_TOLERANCE)


def _summary_then_string_model_fn(features, labels, mode, params):
  loss = models._loss(labels, models._network(features))  # pylint: disable=protected-access
  tf.compat.v1.summary.scalar('loss', loss)  # skipped, as on a TPU
  text = tf.strings.as_string(loss)
  loss += tf.strings.to_number(text) * 0.0  # XLA has no string kernels
  del params
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return models._spec(mode, loss, train_op)  # pylint: disable=protected-access


class XlaStepTest(tf.test.TestCase):

  def test_figures(self):
    result = _shared_on_xla('adam', 'v2')
    assignment = xla_dump.parse(result.assignment_path)
    self.assertEqual(result.total_bytes, assignment.total_bytes)
    # Inputs: _LOOP batches of 16 x 10 float32 features and int32 labels.
    self.assertEqual(result.input_bytes, _LOOP * 16 * (10 * 4 + 4))
    self.assertEqual(
        result.step_bytes,
        result.total_bytes - result.variable_bytes -
        result.input_bytes * (_LOOP - 1) // _LOOP)
    # Passed in: the weights, Adam's two slots and its beta powers, the
    # global step and the learning rate's state.
    weights = (10 * 16 + 16 + 16 * 3 + 3) * 4
    self.assertGreaterEqual(result.variable_bytes, 3 * weights)
    self.assertLess(result.variable_bytes, 3 * weights + 64)
    self.assertEqual(result.loops, _LOOPS)
    self.assertIsNotNone(result.seconds_per_step)
    # Two dense layers: two matmuls forward, their gradients backward.
    self.assertEqual(result.product_dtypes.get('bf16', 0), 0)
    self.assertGreaterEqual(result.product_dtypes['f32'], 4)

  def test_a_bfloat16_step_counts_its_products_by_type(self):
    result = _shared_on_xla('adam', 'v2', precision='bfloat16')
    float32_step = _shared_on_xla('adam', 'v2')
    # The same matmuls as the float32 build, each f32 or bf16, whichever
    # this XLA computes them in.
    self.assertEqual(sum(result.product_dtypes.values()),
                     sum(float32_step.product_dtypes.values()))
    self.assertContainsSubset(result.product_dtypes, {'f32', 'bf16'})

  def test_another_compile_dumped_meanwhile_is_not_taken_for_the_step(self):
    # A folder shared with other processes (pytest-xdist workers, a dump
    # folder the user named): a bigger module dumped during the step.
    decoy = os.path.join(self.create_tempdir().full_path,
                         'module_9.cpu-buffer-assignment.txt')
    with open(decoy, 'w') as f:
      f.write('allocation 0: size 94132, parameter 0, shape |f32[23533]| '
              'at ShapeIndex {}:\nTotal bytes used: 10000000\n')
    real = xla_dump.new_assignments

    def with_decoy(folder, before):
      return [xla_dump.parse(decoy)] + real(folder, before)

    with tf.compat.v1.test.mock.patch.object(
        xla_dump, 'new_assignments', with_decoy):
      result = _on_xla(models.adam_model_fn)
    self.assertNotEqual(result.assignment_path, decoy)
    self.assertLess(result.total_bytes, 10000000)

  def test_an_op_xla_cannot_compile_names_the_program_line(self):
    with self.assertRaises(xla_step.XlaCompileError) as caught:
      _on_xla(_summary_then_string_model_fn)
    message = str(caught.exception)
    self.assertNotIn('\n', message)
    self.assertRegex(message, r'AsString|StringToNumber')
    self.assertIn('test_xla_step.py:', message)

  def test_dynamic_shapes_are_refused(self):
    def input_fn(params):
      x, y = models._data()  # pylint: disable=protected-access
      return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(
          params['batch_size'])

    with self.assertRaisesRegex(xla_step.XlaCompileError, 'drop_remainder'):
      xla_step.train_loop_on_xla(models.adam_model_fn, input_fn,
                                 batch_size=16, precision='float32')


# test_fit's small text program in the TF 1.x API (`tf.get_variable`,
# `tf.layers`, `tf.train`, as google-research/bert writes it), so the runner's
# TF 1.x shim is on while check builds and XLA compiles the step. The command,
# not the model, is tested here: the same command on the bert-style program
# of docs/runner.md costs 19 s of CPU here, on this one 6 s.
_TF1_TEXT_PROGRAM = test_fit._TEXT_PROGRAM.replace('tf.compat.v1.', 'tf.')  # pylint: disable=protected-access

_UNCOMPILABLE_PROGRAM = textwrap.dedent('''\
    import tensorflow as tf

    def input_fn(params):
      x = tf.random.stateless_normal([64, 4], [1, 2])
      y = tf.zeros([64], tf.int32)
      return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
          params['batch_size'], drop_remainder=True)

    def model_fn(features, labels, mode, params):
      logits = tf.compat.v1.layers.dense(features, 2)
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
      loss += 0.0 * tf.strings.to_number(tf.strings.as_string(loss))
      train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
          loss, global_step=tf.compat.v1.train.get_global_step())
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss,
                                                         train_op=train_op)

    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn=model_fn, use_tpu=False, train_batch_size=8,
        config=tf.compat.v1.estimator.tpu.RunConfig())
    estimator.train(input_fn, max_steps=2)
    ''')


def _check_in_this_process(*args):
  """`check ARGS` by cli.main here: (exit code, stderr).

  The command's exit code and report, without a second TensorFlow import
  (the tests' XLA dump folder serves its compile, see tests/conftest.py).
  """
  with test_runner._cli_in_this_process() as main:  # pylint: disable=protected-access
    code, _, stderr, _ = main('check', *args)
  return code, stderr


@pytest.mark.slow
class CheckXlaCommandTest(tf.test.TestCase):
  """`check --xla --accumulate=2` on a TF 1.x program, run once."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._folder = tempfile.mkdtemp()
    program = os.path.join(cls._folder, 'tf1_text_program.py')
    with open(program, 'w') as f:
      f.write(_TF1_TEXT_PROGRAM)
    report = os.path.join(cls._folder, 'report.json')
    # Three steps: a whole loop of two, then one more.
    cls.code, cls.stderr = _check_in_this_process(
        '--xla', '--xla_steps=3', '--accumulate=2', '--report=' + report,
        program,
        os.path.join(cls._folder, 'model'))
    cls.data = None
    if os.path.exists(report):
      with open(report) as f:
        cls.data = json.load(f)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls._folder, ignore_errors=True)
    super().tearDownClass()

  def test_the_command_passes_on_a_tf1_program(self):
    self.assertEqual(self.code, 0, self.stderr[-3000:])
    self.assertIn('TF 1.x API: on', self.stderr)
    self.assertIn('result: OK', self.stderr)

  def test_the_step_is_compiled_with_the_levers_and_runs(self):
    self.assertIn('XLA step (the TRAIN step compiled by XLA', self.stderr)
    # The update's batch: two micro-batches of 16.
    self.assertRegex(self.stderr, r'batch 32 per core')
    self.assertRegex(self.stderr,
                     r'3 steps ran: loss [0-9.]+, global_step 3')

  def test_the_report_has_xla_s_figures(self):
    self.assertIsNotNone(self.data, self.stderr[-3000:])
    self.assertGreater(self.data['xla_step_bytes'], 0)
    self.assertGreaterEqual(self.data['xla_total_bytes'],
                            self.data['xla_step_bytes'])
    self.assertIsNone(self.data['xla_error'])
    # bfloat16 (the default): the report says how many products XLA
    # computed in bfloat16, and the JSON has the counts.
    counts = self.data['xla_product_dtypes']
    self.assertGreater(sum(counts.values()), 0)
    self.assertIn('XLA computed %d of its %d matmuls and convolutions in '
                  'bfloat16 here' % (counts.get('bf16', 0),
                                     sum(counts.values())), self.stderr)

  def test_an_uncompilable_op_is_one_line_naming_the_program(self):
    folder = self.create_tempdir().full_path
    program = os.path.join(folder, 'uncompilable.py')
    with open(program, 'w') as f:
      f.write(_UNCOMPILABLE_PROGRAM)
    code, stderr = _check_in_this_process('--xla', program)
    self.assertEqual(code, 1, stderr[-3000:])
    lines = [l for l in stderr.splitlines() if l.startswith('XLA step')]
    self.assertLen(lines, 1)
    self.assertRegex(lines[0], r'XLA step: PROBLEM, .*XLA cannot compile '
                     r'(AsString|StringToNumber) .*uncompilable\.py:12')
    self.assertIn('result: FAILED', stderr)

  def test_without_xla_steps_the_report_says_nothing_ran(self):
    check = types.SimpleNamespace(
        step=types.SimpleNamespace(
            steps=0, loss=None, global_step=0, iterations_per_loop=2,
            step_bytes=3 * 2**20, total_bytes=4 * 2**20,
            variable_bytes=2**20, product_dtypes=None),
        iterations_per_loop=None, gradient_accumulation_steps=1,
        recompute=False, batch_size=8, planned_bytes=None, plan_error=None,
        precision=policy.parse_precision('float32'))
    lines = xla_check.report_lines(
        types.SimpleNamespace(xla=check, xla_error=None))
    self.assertIn('compiled only, no step ran (--xla_steps=N', lines[-1])
    self.assertNotIn('steps ran', '\n'.join(lines))


class XlaStepsOptionTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('negative', ['--xla', '--xla_steps=-1'],
       '--xla_steps must be an integer >= 0, got -1'),
      ('without_xla', ['--xla_steps=3'], '--xla_steps needs --xla'))
  def test_refused_before_the_program_runs(self, flags, message):
    code, stderr = cli_refusal.refused(
        ['check'] + flags + ['tests/support/legacy_tpu_main.py'])
    self.assertEqual(code, 2)
    self.assertIn(message, stderr)

  def test_negative_steps_are_refused(self):
    with self.assertRaisesRegex(ValueError, 'steps must be >= 0, got -1'):
      xla_step.train_loop_on_xla(
          models.adam_model_fn, models.input_fn, batch_size=models._BATCH,  # pylint: disable=protected-access
          steps=-1)


class TilePaddingTest(tf.test.TestCase):

  def test_two_minor_dimensions_are_padded(self):
    tensor = tf.TensorSpec([3, 5, 10], tf.float32)
    self.assertEqual(plan_simulate.tensor_bytes(tensor), 3 * 5 * 10 * 4)
    self.assertEqual(plan_simulate.tensor_bytes(tensor, tpu_facts.TPU_TILE),
                     3 * 8 * 128 * 4)
    vector = tf.TensorSpec([200], tf.bfloat16)
    self.assertEqual(plan_simulate.tensor_bytes(vector, tpu_facts.TPU_TILE),
                     256 * 2)

  def test_a_tpu_plan_counts_the_padding(self):
    features = {'x': tf.TensorSpec([10], tf.float32)}
    labels = tf.TensorSpec([], tf.int32)
    plain = eb.memory_plan(models.adam_model_fn, features=features,
                           labels=labels)
    tiled = eb.memory_plan(models.adam_model_fn, features=features,
                           labels=labels, tile=tpu_facts.TPU_TILE)
    # [batch, 10] inputs and [batch, 16] activations become [batch, 128]:
    # every per-example buffer is 8 to 12.8 times its size.
    self.assertGreater(tiled.bytes_per_example, 7 * plain.bytes_per_example)
    # The weights: [10, 16] -> [16, 128] is 12.8 x; the others likewise.
    self.assertGreater(tiled.parameter_bytes, 5 * plain.parameter_bytes)


class LeversOfTest(tf.test.TestCase):

  def test_fit_choice_wins_over_the_command(self):
    # The fit's option holds a Precision (memory.fit), taken as it is.
    chosen = types.SimpleNamespace(
        precision=policy.parse_precision('float32'),
        gradient_accumulation_steps=4, recompute=True)
    with_fit = types.SimpleNamespace(
        plans={}, fit_plans=types.SimpleNamespace(chosen=chosen),
        precision=policy.parse_precision('bfloat16'),
        gradient_accumulation_steps=1, recompute=False)
    levers = xla_check.levers_of(with_fit)
    self.assertEqual(levers, ('float32', 4, True))
    self.assertIs(levers[0], chosen.precision)
    run_precision = policy.parse_precision('bfloat16')
    plain = types.SimpleNamespace(plans={}, fit_plans=None,
                                  precision=run_precision,
                                  gradient_accumulation_steps=2,
                                  recompute=False)
    levers = xla_check.levers_of(plain)
    self.assertEqual(levers, ('bfloat16', 2, False))
    self.assertIs(levers[0], run_precision)


class BufferAssignmentTest(tf.test.TestCase):

  def test_a_file_written_again_counts_as_new(self):
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, 'module_7.cpu-buffer-assignment.txt')
    with open(path, 'w') as f:
      f.write('allocation 0: size 8, constant:\nTotal bytes used: 8\n')
    before = xla_dump.assignment_files(folder)
    # Another process compiled the same module: same name, new contents.
    with open(path, 'w') as f:
      f.write('allocation 0: size 16, constant:\nTotal bytes used: 16\n')
    os.utime(path, ns=(before[path] + 10**9, before[path] + 10**9))
    (found,) = xla_dump.new_assignments(folder, before)
    self.assertEqual(found.total_bytes, 16)


  def test_parse(self):
    path = os.path.join(self.create_tempdir().full_path,
                        'module_1.buffer-assignment.txt')
    with open(path, 'w') as f:
      f.write(textwrap.dedent('''\
          BufferAssignment:
          allocation 0: size 24576, parameter 0, shape |f32[3,32,64]| at ShapeIndex {}:
           value: <187 arg0.1 @0> (size=24576,offset=0): f32[3,32,64]{2,1,0}
          allocation 1: size 2560, maybe-live-out:
           value: <173 fusion @0> (size=2560,offset=0): f32[64,10]{1,0}
          allocation 2: size 2560, parameter 7, shape |f32[64,10]| at ShapeIndex {}:
          allocation 3: size 56, output shape is |(f32[], f32[64,10])|, maybe-live-out:
          allocation 4: size 1000, preallocated-temp:

          Total bytes used: 30752 (30.0KiB)
          '''))
    parsed = xla_dump.parse(path)
    self.assertEqual(parsed.total_bytes, 30752)
    self.assertEqual(parsed.parameters(), [(0, 'f32[3,32,64]', 24576),
                                           (7, 'f32[64,10]', 2560)])
    self.assertEqual(parsed.result_copy_bytes(), 2560 + 56)

  def test_product_dtypes_read_from_the_module_beside_the_assignment(self):
    folder = self.create_tempdir().full_path
    stem = os.path.join(folder, 'module_3.cluster.cpu_after_optimizations')
    with open(stem + '-buffer-assignment.txt', 'w') as f:
      f.write('Total bytes used: 8\n')
    with open(stem + '.txt', 'w') as f:
      f.write(textwrap.dedent('''\
          %MatMul.1 = f32[64,16]{1,0} dot(%convert.2, %convert.3), lhs_contracting_dims={1}
          %conv.4 = bf16[8,4,4,2]{3,2,1,0} convolution(%p0, %p1), window={size=3x3}
          %mm.5 = bf16[64,16]{1,0} custom-call(%a, %b), custom_call_target="__onednn$matmul"
          %sort.6 = f32[64]{0} custom-call(%c), custom_call_target="TopK"
          %add.7 = f32[64,16]{1,0} add(%MatMul.1, %b)
          '''))
    self.assertEqual(
        xla_dump.product_dtypes(stem + '-buffer-assignment.txt'),
        {'f32': 1, 'bf16': 2})
    # No module dumped beside it: unknown, not zero.
    os.remove(stem + '.txt')
    self.assertIsNone(
        xla_dump.product_dtypes(stem + '-buffer-assignment.txt'))

  def test_not_an_assignment(self):
    path = os.path.join(self.create_tempdir().full_path, 'x.txt')
    with open(path, 'w') as f:
      f.write('HloModule m\n')
    with self.assertRaisesRegex(ValueError, 'Total bytes used'):
      xla_dump.parse(path)

  def test_takes_counts_repeated_shapes(self):
    assignment = xla_dump.BufferAssignment('m', 24, [
        xla_dump.Allocation(8, 'parameter 0, shape |f32[2]| at ShapeIndex {}'),
        xla_dump.Allocation(16, 'parameter 1, shape |s32[4]| at ShapeIndex {}'),
    ])
    self.assertTrue(assignment.takes(['s32[4]', 'f32[2]']))
    self.assertFalse(assignment.takes(['f32[2]', 'f32[2]']))
    self.assertFalse(assignment.takes(['f32[3]']))

  def test_nothing_dumped_says_why(self):
    folder = self.create_tempdir().full_path
    with self.assertRaisesRegex(RuntimeError, 'reads its flags once'):
      xla_dump.new_assignments(folder, {})


if __name__ == '__main__':
  tf.test.main()
