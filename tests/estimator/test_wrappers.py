"""Tests for wrap_input_fn / wrap_model_fn / build_network contracts."""

import functools
import inspect
from unittest import mock

from absl.testing import parameterized
import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.platform import slim_repair
from tensorflow.python.framework import op_def_library


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _features_labels():
  features = {'image': tf.zeros([2, 3]), 'ids': tf.zeros([2], tf.int32)}
  return features, tf.constant([0.5, 1.5])  # float labels: never cast


def _spec(mode, loss, predictions=None):
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, predictions=predictions,
      train_op=tf.no_op() if mode == 'train' else None)


class WrapInputFnTest(tf.test.TestCase, parameterized.TestCase):

  def _check(self, features, labels=None):
    self.assertEqual(features['image'].dtype, tf.bfloat16)
    self.assertEqual(features['ids'].dtype, tf.int32)
    if labels is not None:
      self.assertEqual(labels.dtype, tf.float32)

  def test_dataset_of_features_and_labels(self):
    def input_fn(params):
      features, labels = _features_labels()
      return tf.data.Dataset.from_tensors((features, labels)).repeat(
          params['n'])
    wrapped = eb.wrap_input_fn(input_fn, 'bfloat16')
    self.assertEqual(list(inspect.signature(wrapped).parameters), ['params'])
    dataset = wrapped({'n': 2})
    self.assertIsInstance(dataset, tf.data.Dataset)
    self._check(*dataset.element_spec)
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        dataset).get_next()
    with self.cached_session() as sess:
      self.assertAllEqual(sess.run(labels), [0.5, 1.5])

  def test_dataset_of_features_only(self):
    def input_fn():
      return tf.data.Dataset.from_tensors(_features_labels()[0])
    dataset = eb.wrap_input_fn(input_fn, 'bfloat16')()
    self._check(dataset.element_spec)

  @parameterized.parameters('params', 'mode_config')
  def test_tensors_and_calling_conventions(self, convention):
    if convention == 'params':
      def input_fn(params):
        del params
        return _features_labels()
      call = lambda fn: fn(params={})
    else:
      def input_fn(mode, config):
        del mode, config
        return _features_labels()
      call = lambda fn: fn(mode='train', config=None)
    wrapped = eb.wrap_input_fn(input_fn, 'bfloat16')
    self.assertEqual(inspect.signature(wrapped),
                     inspect.signature(input_fn))
    self._check(*call(wrapped))

  def test_tensor_features_alone(self):
    features = eb.wrap_input_fn(lambda: tf.zeros([2]), 'bfloat16')()
    self.assertEqual(features.dtype, tf.bfloat16)

  @parameterized.parameters((None,), ([np.zeros(3)],), ('text',),
                            ((1.0, 2.0),))
  def test_bad_return_value(self, value):
    wrapped = eb.wrap_input_fn(lambda: value, 'bfloat16')
    with self.assertRaisesRegex(TypeError, 'input_fn must return a tf.data'):
      wrapped()

  def test_not_callable_and_bad_precision(self):
    with self.assertRaisesRegex(TypeError, 'must be callable'):
      eb.wrap_input_fn('data.tfrecord', 'bfloat16')
    with self.assertRaisesRegex(ValueError, 'must be one of'):
      eb.wrap_input_fn(lambda: None, 'float64')

  def test_float32_returns_the_input_fn(self):
    fn = lambda params: None
    with mock.patch.object(slim_repair, 'tf_slim_loaded', return_value=False):
      self.assertIs(eb.wrap_input_fn(fn, 'float32'), fn)

  def test_float32_with_tf_slim_loaded_repairs_it_around_the_call(self):
    seen = []
    fn = functools.partial(lambda root, params: seen.append(
        (root, slim_repair.tf_slim_loaded())) or params['x'], 'data')
    with mock.patch.object(slim_repair, 'tf_slim_loaded', return_value=True):
      wrapped = eb.wrap_input_fn(fn, 'float32')
    self.assertIsNot(wrapped, fn)
    # The Estimator sees what it would see on `fn` (params by keyword).
    self.assertEqual(list(inspect.signature(wrapped).parameters), ['params'])
    self.assertEqual(wrapped(params={'x': 3}), 3)
    self.assertEqual(seen[0][0], 'data')


class WrapModelFnTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('no_features', lambda labels, mode: None, 'must take a `features`'),
      ('unknown_arg', lambda inputs, labels: None, "argument 'inputs'"),
      ('extra_arg', lambda features, labels, mode, hidden_units: None,
       "argument 'hidden_units'"))
  def test_unsupported_signatures(self, model_fn, message):
    with self.assertRaisesRegex(ValueError, message):
      eb.wrap_model_fn(model_fn, 'bfloat16')

  def test_supported_signatures(self):
    def minimal(features):
      return _spec('infer', None, predictions=features)
    def with_default(features, labels, mode, units=3):
      del labels, units
      return _spec(mode, None, predictions=features)
    partial = functools.partial(with_default, units=5)
    for fn in (minimal, with_default, partial):
      wrapped = eb.wrap_model_fn(fn, 'bfloat16')
      spec = wrapped(features=tf.zeros([1]), mode='infer')
      self.assertEqual(spec.predictions.dtype, tf.float32)

  def test_labels_given_to_a_model_fn_without_labels(self):
    wrapped = eb.wrap_model_fn(lambda features: None, 'bfloat16')
    with self.assertRaisesRegex(ValueError, 'does not take labels'):
      wrapped(tf.zeros([1]), labels=tf.zeros([1]), mode='train')

  def test_autocast_undone_when_model_fn_raises(self):
    original = op_def_library._apply_op_helper

    def model_fn(features, mode):
      del features, mode
      self.assertIsNot(op_def_library._apply_op_helper, original)
      raise RuntimeError('user bug')

    with self.assertRaisesRegex(RuntimeError, 'user bug'):
      eb.wrap_model_fn(model_fn, 'bfloat16')(tf.zeros([1]), mode='train')
    self.assertIs(op_def_library._apply_op_helper, original)

  def test_bfloat16_loss_cast_with_warning_when_audit_off(self):
    def model_fn(features, labels, mode):
      del labels
      # A max is exact in any dtype, so autocast leaves it in bfloat16.
      loss = tf.reduce_max(features)
      return _spec(mode, loss)

    for audit in ('off', 'warn'):
      with tf.Graph().as_default():
        with self.assertLogs(level='WARNING') as logs:
          spec = eb.wrap_model_fn(model_fn, 'bfloat16',
                                  eb.WrapOptions(audit=audit))(tf.ones([3]),
                                                               None, 'train')
        self.assertEqual(spec.loss.dtype, tf.float32)
        self.assertTrue(any('cast to float32' in line for line in logs.output))

  def test_bfloat16_loss_fails_strict_audit(self):
    def model_fn(features, labels, mode):
      del labels
      return _spec(mode, tf.reduce_max(features))  # stays bfloat16

    with tf.Graph().as_default():
      with self.assertRaisesRegex(eb.PrecisionError, 'loss'):
        eb.wrap_model_fn(model_fn, 'bfloat16')(tf.ones([3]), None, 'train')

  def test_host_call_and_export_outputs_float32(self):
    def model_fn(features, labels, mode, params):
      del labels, params
      logits = tf.compat.v1.layers.dense(features['x'], 2)
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode, predictions={'logits': logits},
          host_call=(lambda l: [], [logits]),
          export_outputs={
              'serving_default': tf.estimator.export.PredictOutput(
                  {'logits': logits}),
              'c': tf.estimator.export.ClassificationOutput(
                  scores=tf.cast(logits, tf.float32)),
              'r': tf.estimator.export.RegressionOutput(
                  value=tf.cast(logits[:, 0], tf.float32))})

    with tf.Graph().as_default():
      spec = eb.wrap_model_fn(model_fn, 'bfloat16')(
          {'x': tf.ones([2, 3])}, None, 'infer', {})
    self.assertEqual(spec.host_call[1][0].dtype, tf.float32)
    self.assertEqual(
        spec.export_outputs['serving_default'].outputs['logits'].dtype,
                     tf.float32)
    self.assertIsInstance(spec.export_outputs['c'],
                          tf.estimator.export.ClassificationOutput)
    self.assertEqual(spec.predictions['logits'].dtype, tf.float32)

  def test_not_a_spec(self):
    wrapped = eb.wrap_model_fn(lambda features: {'x': features}, 'bfloat16')
    with self.assertRaisesRegex(TypeError, 'EstimatorSpec'):
      wrapped(tf.zeros([1]))


class BuildNetworkTest(tf.test.TestCase, parameterized.TestCase):

  def test_direct_and_decorator_forms(self):
    def network(images, ids):
      self.assertEqual(images.dtype, tf.bfloat16)
      self.assertEqual(ids.dtype, tf.int32)
      return tf.compat.v1.layers.dense(images, 2)

    logits = eb.build_network(network, 'bfloat16')(tf.ones([2, 3]),
                                                   tf.zeros([2], tf.int32))
    self.assertEqual(logits.dtype, tf.float32)

    @eb.build_network(precision='bfloat16')
    def decorated(images):
      return {'logits': tf.compat.v1.layers.dense(images, 2, name='d2')}

    self.assertEqual(decorated(tf.ones([2, 3]))['logits'].dtype, tf.float32)
    for var in tf.compat.v1.global_variables():
      self.assertEqual(var.dtype.base_dtype, tf.float32)


if __name__ == '__main__':
  tf.test.main()
