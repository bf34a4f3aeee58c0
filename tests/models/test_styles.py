"""Unmodified models of every style train in bfloat16 (autocast acceptance).

Each style model (estimator_bf16/models/styles) is legacy code that knows nothing of this
package. Under precision 'bfloat16' at least 95% of its matmul/conv ops --
forward and backward -- must compute in bfloat16, none may be a SparseMatMul,
and every variable must be float32 under the name a float32 build gives it.
Trained side by side, both precisions reach the same quality, and one
model_dir continues float32 -> bfloat16 -> float32.
"""

import functools
import os

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import op_lists
from estimator_bf16.models.styles import STYLES
from estimator_bf16.safety import audit as audit_lib
from tests.support import scratch

MATRIX_OPS = op_lists.MATMUL_CONV_OPS
MIN_OP_SHARE = 0.95
# Largest bfloat16-vs-float32 gap allowed after the same training: eval loss
# (nats) and accuracy. Measured gaps are a third of these or less; a
# precision mistake (a bfloat16 loss, a broken mask) costs far more.
LOSS_TOLERANCE = 0.15
ACCURACY_TOLERANCE = 0.04
TRAIN_STEPS = 150
STYLE_NAMES = sorted(STYLES)
_SCRATCH = scratch.ModuleScratch()


def setUpModule():
  tf.compat.v1.disable_eager_execution()
  _SCRATCH.start()


def tearDownModule():
  _SCRATCH.stop()


def _compute_dtype(op):
  # As a TPU runs it: SparseMatMul in float32, an op computed in float32
  # only for a slow bfloat16 CPU kernel in bfloat16.
  return audit_lib.compute_dtype(op)


@functools.lru_cache(maxsize=None)
def _build_train_graph(style, precision):
  """Returns (graph, spec) of the TRAIN graph of `style` in `precision`.

  Built once per module: the tests read it, or run it in their own session.
  """
  module = STYLES[style]
  graph = tf.Graph()
  with graph.as_default():
    params = {'batch_size': 8, 'precision': precision, 'use_tpu': False}
    dataset = eb.wrap_input_fn(module.input_fn_builder(32, 1, True),
                               precision)(params)
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        dataset).get_next()
    model_fn = eb.wrap_model_fn(module.model_fn_builder(), precision)
    spec = model_fn(features, labels, tf.estimator.ModeKeys.TRAIN, params)
  return graph, spec


def _variables(graph):
  with graph.as_default():
    return sorted((v.op.name, v.dtype.base_dtype.name, tuple(v.shape.as_list()))
                  for v in tf.compat.v1.global_variables())


@pytest.mark.slow
class StyleGraphTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*STYLE_NAMES)
  def test_matmul_conv_ops_in_bfloat16_with_float32_variables(self, style):
    graph16, spec = _build_train_graph(style, 'bfloat16')
    graph32, _ = _build_train_graph(style, 'float32')
    matrix = [op for op in graph16.get_operations() if op.type in MATRIX_OPS]
    self.assertGreater(len(matrix), 4)
    in_bf16 = [op for op in matrix if _compute_dtype(op) == tf.bfloat16]
    self.assertGreaterEqual(
        len(in_bf16) / len(matrix), MIN_OP_SHARE,
        [op.name for op in matrix if op not in in_bf16])
    backward = [op for op in in_bf16 if op.name.startswith('gradients')]
    self.assertNotEmpty(backward)
    self.assertEmpty([op for op in matrix if op.type == 'SparseMatMul'])
    with graph16.as_default():
      report = eb.check_graph(strict=True, loss=spec.loss)
    self.assertGreaterEqual(report.bfloat16_flop_share, MIN_OP_SHARE)
    self.assertEqual(spec.loss.dtype, tf.float32)
    # The float32 build runs TensorFlow's own float32 ops, untouched...
    self.assertEqual({_compute_dtype(op) for op in graph32.get_operations()
                      if op.type in MATRIX_OPS}, {tf.float32})
    # ...and both store the same float32 variables under the same names.
    variables = _variables(graph16)
    self.assertEqual(variables, _variables(graph32))
    self.assertEqual({dtype for _, dtype, _ in variables} - {'int64'},
                     {'float32'})

  @parameterized.parameters(*[(style, precision) for style in STYLE_NAMES
                              for precision in eb.PRECISIONS])
  def test_one_step_updates_every_variable(self, style, precision):
    # An update TensorFlow's executor never reaches (a cycle made by graph
    # rewrites, a gradient cut off) fails silently: the step still returns.
    graph, spec = _build_train_graph(style, precision)
    with graph.as_default():
      trainable = tf.compat.v1.trainable_variables()
      with self.session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        before = sess.run(trainable)
        sess.run(spec.train_op)
        after = sess.run(trainable)
    unchanged = [v.op.name for v, old, new in zip(trainable, before, after)
                 if np.array_equal(old, new)]
    self.assertNotEmpty(trainable)
    self.assertEmpty(unchanged)


def _estimator(style, model_dir, precision):
  return eb.make_tpu_estimator(
      STYLES[style].model_fn_builder(), model_dir=model_dir,
      precision=precision, train_batch_size=32, eval_batch_size=64,
      estimator_options=eb.EstimatorOptions(save_checkpoints_steps=10**6,
                                            log_step_count_steps=10**6,
                                            tf_random_seed=1))


def _train_and_evaluate(style, model_dir, precision, steps):
  module = STYLES[style]
  estimator = _estimator(style, model_dir, precision)
  estimator.train(eb.wrap_input_fn(module.input_fn_builder(1024, 1, True),
                                   precision), max_steps=steps)
  metrics = estimator.evaluate(
      eb.wrap_input_fn(module.input_fn_builder(512, 2, False), precision),
      steps=8)
  accuracy = metrics.get('accuracy', metrics.get('eval_accuracy'))
  return float(metrics['loss']), float(accuracy)


@_SCRATCH.cached
def _trained(style, precision):
  """(model_dir, eval loss, eval accuracy) after TRAIN_STEPS from scratch.

  Trained once per module; the float32 model_dir then goes on training in
  the round-trip test (nothing else reads it).
  """
  model_dir = os.path.join(_SCRATCH.root, style, precision)
  loss, accuracy = _train_and_evaluate(style, model_dir, precision,
                                       TRAIN_STEPS)
  return model_dir, loss, accuracy


def _checkpoint_variables(model_dir):
  reader = tf.train.load_checkpoint(model_dir)
  return sorted((name, reader.get_variable_to_dtype_map()[name].name)
                for name in reader.get_variable_to_shape_map())


@pytest.mark.slow
class StyleTrainingTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.parameters(*STYLE_NAMES)
  def test_bfloat16_trains_like_float32(self, style):
    results = {precision: _trained(style, precision)[1:]
               for precision in eb.PRECISIONS}
    (loss32, accuracy32), (loss16, accuracy16) = (
        results['float32'], results['bfloat16'])
    self.assertGreater(accuracy32, 0.85)
    self.assertLess(abs(loss16 - loss32), LOSS_TOLERANCE, results)
    self.assertLess(abs(accuracy16 - accuracy32), ACCURACY_TOLERANCE, results)

  @parameterized.parameters(*STYLE_NAMES)
  def test_checkpoint_round_trip_float32_bfloat16_float32(self, style):
    # The float32 leg is the float32 run above: a checkpoint at TRAIN_STEPS.
    model_dir, loss, _ = _trained(style, 'float32')
    seen = []
    for steps, precision in ((TRAIN_STEPS, 'float32'),
                             (TRAIN_STEPS + 20, 'bfloat16'),
                             (TRAIN_STEPS + 40, 'float32')):
      if steps > TRAIN_STEPS:
        loss, _ = _train_and_evaluate(style, model_dir, precision, steps)
      self.assertTrue(np.isfinite(loss))
      self.assertEqual(tf.train.load_variable(model_dir, 'global_step'),
                       steps)
      seen.append(_checkpoint_variables(model_dir))
    self.assertEqual(seen[0], seen[1])
    self.assertEqual(seen[1], seen[2])
    self.assertEqual({dtype for _, dtype in seen[0]}, {'float32', 'int64'})
    self.assertTrue(os.path.exists(os.path.join(model_dir, 'checkpoint')))


if __name__ == '__main__':
  tf.test.main()
