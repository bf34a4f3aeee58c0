"""End to end: an unmodified legacy model_fn through make_tpu_estimator."""

import os
import sys
from unittest import mock

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.safety import audit as audit_lib
from tests.support import legacy_model
from tests.support import scratch


def _estimator(model_dir, precision, **kwargs):
  return eb.make_tpu_estimator(
      legacy_model.model_fn, model_dir=model_dir, precision=precision,
      train_batch_size=32, eval_batch_size=32, predict_batch_size=8,
      estimator_options=eb.EstimatorOptions(tf_random_seed=7,
                                            save_checkpoints_steps=50),
      **kwargs)


def _input(fn, precision):
  return eb.wrap_input_fn(fn, precision)


# Every stated bound below holds after 100 steps: eval loss 0.11-0.12 in
# both precisions on TensorFlow 2.15 and 2.21, accuracy 0.98.
_TRAIN_STEPS = 100
_SCRATCH = scratch.ModuleScratch()


def setUpModule():
  _SCRATCH.start()


def tearDownModule():
  _SCRATCH.stop()


@_SCRATCH.cached
def _trained(precision):
  """(model_dir, eval metrics) of one training per precision, shared.

  The end-to-end checks and the bfloat16-vs-float32 comparison read the
  same two runs.
  """
  model_dir = os.path.join(_SCRATCH.root, precision)
  estimator = _estimator(model_dir, precision)
  estimator.train(_input(legacy_model.train_input_fn, precision),
                  max_steps=_TRAIN_STEPS)
  metrics = estimator.evaluate(_input(legacy_model.eval_input_fn, precision),
                               steps=8)
  return model_dir, metrics


def _train_graph(precision):
  """Builds the TRAIN graph as TPUEstimator(use_tpu=False) would."""
  graph = tf.Graph()
  with graph.as_default():
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        _input(legacy_model.train_input_fn, precision)(
            {'batch_size': 8, 'precision': precision})).get_next()
    tf.compat.v1.train.get_or_create_global_step()
    spec = eb.wrap_model_fn(legacy_model.model_fn, precision)(
        features, labels, 'train', {'use_tpu': False})
  return graph, spec


class GraphTest(tf.test.TestCase, parameterized.TestCase):

  def test_bfloat16_graph_dtypes(self):
    graph, spec = _train_graph('bfloat16')
    by_type = {}
    for op in graph.get_operations():
      by_type.setdefault(op.type, []).append(op)
    for kind in ('Conv2D', 'MatMul', 'Conv2DBackpropFilter'):
      self.assertNotEmpty(by_type[kind])
      for op in by_type[kind]:
        # As a TPU runs it: a conv gradient this CPU computes in float32
        # from bfloat16 (autocast.cpu_kernels) counts as bfloat16.
        self.assertEqual(audit_lib.compute_dtype(op), tf.bfloat16, op.name)
    for kind in ('SparseSoftmaxCrossEntropyWithLogits',):
      for op in by_type[kind]:
        self.assertEqual(op.get_attr('T'), tf.float32, op.name)
    # The float32 list: the prediction softmax ran in float32 as well.
    self.assertEqual([op.get_attr('T') for op in by_type['Softmax']],
                     [tf.float32])
    for var in tf.compat.v1.global_variables(graph):
      if var.dtype.base_dtype.is_floating:
        self.assertEqual(var.dtype.base_dtype, tf.float32, var.name)
    self.assertEqual(spec.loss.dtype, tf.float32)
    _, metric_tensors = spec.eval_metrics
    self.assertEqual([t.dtype for t in metric_tensors],
                     [tf.int32, tf.float32])
    report = eb.check_graph(graph, loss=spec.loss)
    self.assertGreater(report.bfloat16_flop_share, 0.99)

  def test_float32_is_the_original(self):
    # Without tf_slim loaded there is nothing to repair: the very function.
    with mock.patch.dict(sys.modules):
      sys.modules.pop('tf_slim', None)
      self.assertIs(eb.wrap_model_fn(legacy_model.model_fn, 'float32'),
                    legacy_model.model_fn)
    graph, _ = _train_graph('float32')
    kinds = {op.get_attr('T') for op in graph.get_operations()
             if op.type in ('Conv2D', 'MatMul')}
    self.assertEqual(kinds, {tf.float32})

  def test_variable_names_match_across_precisions(self):
    names = {}
    for precision in eb.PRECISIONS:
      graph, _ = _train_graph(precision)
      names[precision] = sorted(v.op.name for v in
                                tf.compat.v1.global_variables(graph))
    self.assertEqual(names['float32'], names['bfloat16'])


@pytest.mark.slow
@parameterized.parameters(*eb.PRECISIONS)
class EndToEndTest(tf.test.TestCase, parameterized.TestCase):

  def test_train_evaluate_predict_export(self, precision):
    model_dir, metrics = _trained(precision)
    estimator = _estimator(model_dir, precision)
    self.assertEqual(metrics['global_step'], _TRAIN_STEPS)
    self.assertGreater(metrics['accuracy'], 0.5)  # 4 classes: chance is 0.25
    self.assertTrue(np.isfinite(metrics['loss']))

    predictions = list(estimator.predict(
        _input(legacy_model.predict_input_fn, precision)))
    self.assertLen(predictions, 16)
    self.assertEqual(predictions[0]['probabilities'].dtype, np.float32)
    self.assertEqual(predictions[0]['logits'].dtype, np.float32)
    self.assertAllClose(predictions[0]['probabilities'].sum(), 1.0, atol=1e-2)

    reader = tf.train.load_checkpoint(model_dir)
    for name, dtype in reader.get_variable_to_dtype_map().items():
      if dtype.is_floating:
        self.assertEqual(dtype, tf.float32, name)

    export_dir = estimator.export_saved_model(
        os.path.join(model_dir, 'export'), legacy_model.serving_input_fn)
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      meta = tf.compat.v1.saved_model.load(sess, ['serve'], export_dir)
      signature = meta.signature_def['classify']
      self.assertEqual(signature.inputs['image'].dtype,
                       tf.float32.as_datatype_enum)
      for output in ('probabilities', 'logits'):
        self.assertEqual(signature.outputs[output].dtype,
                         tf.float32.as_datatype_enum)
      images, _ = legacy_model.synthetic_data(4, seed=3)
      probabilities = sess.run(signature.outputs['probabilities'].name,
                               {signature.inputs['image'].name: images})
    self.assertAllClose(probabilities.sum(axis=1), np.ones(4), atol=1e-2)


def _host_call_model_fn(features, labels, mode, params):
  """A metric_fn and a host_call that take the logits as the model made them.

  `in_top_k` has float32 kernels only, as a TPU program's top-5
  metric finds out when it is handed bfloat16.
  """
  spec = legacy_model.model_fn(features, labels, mode, params)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return spec
  logits = tf.compat.v1.get_default_graph().get_tensor_by_name(
      'dense_1/BiasAdd:0')

  def metric_fn(labels, logits):
    return {'top_2': tf.compat.v1.metrics.mean(
        tf.cast(tf.compat.v1.nn.in_top_k(logits, labels, 2), tf.float32))}

  def host_fn(global_step, logits):
    del global_step
    if logits.dtype != tf.float32:
      raise TypeError('host_call got %s logits' % logits.dtype.name)
    return [tf.no_op()]

  step = tf.reshape(tf.compat.v1.train.get_global_step(), [1])
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=spec.loss, train_op=spec.train_op,
      eval_metrics=(metric_fn, [labels, logits]),
      host_call=(host_fn, [step, logits]))


@parameterized.parameters(*eb.PRECISIONS)
class HostCallsTest(tf.test.TestCase, parameterized.TestCase):

  def test_metric_fn_and_host_call_get_float32_off_the_tpu(self, precision):
    estimator = eb.make_tpu_estimator(
        _host_call_model_fn, model_dir=self.create_tempdir().full_path,
        precision=precision, train_batch_size=32, eval_batch_size=32,
        estimator_options=eb.EstimatorOptions(tf_random_seed=7))
    estimator.train(_input(legacy_model.train_input_fn, precision),
                    max_steps=2)
    metrics = estimator.evaluate(_input(legacy_model.eval_input_fn, precision),
                                 steps=2)
    self.assertBetween(metrics['top_2'], 0.0, 1.0)


@pytest.mark.slow
class InterchangeTest(tf.test.TestCase):

  def test_checkpoint_moves_between_precisions(self):
    """float32 -> bfloat16 -> float32 in one model_dir, same names."""
    model_dir = self.create_tempdir().full_path
    steps = 0
    names = None
    for precision in ('float32', 'bfloat16', 'float32'):
      steps += 5  # What moves is the checkpoint, not how far it trained.
      _estimator(model_dir, precision).train(
          _input(legacy_model.train_input_fn, precision), max_steps=steps)
      reader = tf.train.load_checkpoint(model_dir)
      self.assertEqual(reader.get_tensor('global_step'), steps)
      dtypes = reader.get_variable_to_dtype_map()
      if names is None:
        names = set(dtypes)
      self.assertEqual(set(dtypes), names)
      self.assertTrue(all(d == tf.float32 for d in dtypes.values()
                          if d.is_floating))

  def test_bfloat16_loss_close_to_float32(self):
    """Same seeds and data: bfloat16 eval loss within 0.05 of float32."""
    losses = {precision: _trained(precision)[1]['loss']
              for precision in eb.PRECISIONS}
    self.assertLess(losses['float32'], 0.7)  # it learned (chance: ln 4=1.39)
    self.assertAllClose(losses['bfloat16'], losses['float32'], atol=0.05)


class MakeEstimatorErrorsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('precision', dict(precision='fp16'), 'precision must be one of'),
      ('batch', dict(train_batch_size=0), 'train_batch_size must be'),
      ('no_tpu_name', dict(use_tpu=True), 'use_tpu=True needs tpu'),
      ('shards', dict(use_tpu=True, tpu='local',
                      train_batch_size=12), 'not divisible by the 8 replicas'),
      ('reserved', dict(params={'batch_size': 3}), 'must not set batch_size'),
      ('no_model_dir', dict(model_dir=''), 'model_dir is required'),
      ('batch_before_dir', dict(model_dir='', train_batch_size=0),
       'train_batch_size must be'))
  def test_bad_arguments(self, overrides, message):
    kwargs = dict(model_dir=self.create_tempdir().full_path,
                  precision='bfloat16', train_batch_size=32)
    kwargs.update(overrides)
    with self.assertRaisesRegex(ValueError, message):
      eb.make_tpu_estimator(legacy_model.model_fn, **kwargs)

  @parameterized.named_parameters(
      ('wrap_options', dict(options={'audit': 'warn'}),
       'options must be an eb.WrapOptions'),
      ('estimator_options', dict(estimator_options=eb.WrapOptions()),
       'estimator_options must be an eb.EstimatorOptions'))
  def test_options_of_another_type(self, overrides, message):
    with self.assertRaisesRegex(TypeError, message):
      eb.make_tpu_estimator(
          legacy_model.model_fn, model_dir=self.create_tempdir().full_path,
          precision='bfloat16', train_batch_size=32, **overrides)

  @parameterized.named_parameters(
      ('audit', eb.WrapOptions, dict(audit='loud'), 'audit must be one of'),
      ('exclude', eb.WrapOptions, dict(exclude=['image', 3]),
       'exclude must be a list of feature keys'),
      ('steps', eb.WrapOptions, dict(gradient_accumulation_steps=0),
       'gradient_accumulation_steps must be'),
      ('recompute', eb.WrapOptions, dict(recompute='yes'),
       'recompute must be True or False'),
      ('kernels', eb.WrapOptions, dict(kernels='fast'),
       'kernels must be one of'),
      ('loop', eb.EstimatorOptions, dict(iterations_per_loop=0),
       'iterations_per_loop must be a positive integer'),
      ('shards', eb.EstimatorOptions, dict(num_shards=-8),
       'num_shards must be a positive integer'))
  def test_bad_options_fail_where_they_are_written(self, cls, fields,
                                                   message):
    with self.assertRaisesRegex(ValueError, message):
      cls(**fields)

  def test_options_keep_one_default_each(self):
    # The flags of `run`/`check` and the training CLI read these values.
    self.assertEqual(eb.WrapOptions(exclude=['image']).exclude, ('image',))
    # As cast_features reads exclude: one key, none, or any iterable.
    self.assertEqual(eb.WrapOptions(exclude='image').exclude, ('image',))
    self.assertEqual(eb.WrapOptions(exclude=None).exclude, ())
    self.assertEqual(
        eb.WrapOptions(exclude=(k for k in ('a', 'b'))).exclude, ('a', 'b'))
    self.assertEqual(
        eb.WrapOptions(),
        eb.WrapOptions(audit='strict', exclude=(),
                       gradient_accumulation_steps=1, recompute=False,
                       kernels='auto'))
    self.assertEqual(eb.EstimatorOptions().iterations_per_loop, 100)

  def test_params_carry_precision(self):
    estimator = eb.make_tpu_estimator(
        legacy_model.model_fn, model_dir=self.create_tempdir().full_path,
        precision='bfloat16', train_batch_size=8, params={'lr': 0.1})
    self.assertEqual(estimator.params['precision'], 'bfloat16')
    self.assertEqual(estimator.params['lr'], 0.1)

  def test_tpu_batch_error_counts_replicas(self):
    # estimator_bf16/apps/training.py checks its flags with the same function.
    self.assertIsNone(tpu_facts.tpu_batch_error(16))
    self.assertIn('by the 8 replicas (num_shards=8):',
                  tpu_facts.tpu_batch_error(12))
    self.assertIsNone(
        tpu_facts.tpu_batch_error(12, num_shards=8, num_cores_per_replica=2))
    self.assertIn(
        'by the 4 replicas (num_shards=8 / num_cores_per_replica=2)',
        tpu_facts.tpu_batch_error(10, num_shards=8, num_cores_per_replica=2))


if __name__ == '__main__':
  tf.compat.v1.disable_eager_execution()
  tf.test.main()
