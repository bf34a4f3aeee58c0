"""Tests for estimator_bf16/levers/batch_dim.py: inputs whose batch is not first.

tensorflow/tpu's image models feed `[H, W, C, N]` (`transpose_input`; now
flattened, `[H * W * C * N]`) and time-major text models feed `[T, N]`. The memory planner must put its own
batch where the input_fn has it, and then plan the same step as for the
batch-first layout. A plan that cannot be made must fail `check`.
"""

import os
import textwrap

from absl.testing import parameterized
import pytest
import tensorflow as tf

from estimator_bf16.levers import batch_dim
from estimator_bf16.memory import planner
from estimator_bf16.runner import program as runner
from estimator_bf16.runner import planning as planning_lib
from estimator_bf16.runner import report as run_report

_IMAGE = 16
_CHANNELS = 3
_CLASSES = 10
_SEQUENCE = 24
_VOCABULARY = 50
# The batch the input_fns are read at: matches no other dimension.
_READ_BATCH = 4
# Two batches to compare the plans at, and the tolerance between layouts:
# the batch-last model's one transpose of the images is its only extra.
_BATCHES = (64, 256)
_TOLERANCE = 0.10


def _image_input_fn(params):
  """Random images, `[H, W, C, N]` when `params['transpose_input']`."""
  batch = params['batch_size']
  images = tf.zeros([batch, _IMAGE, _IMAGE, _CHANNELS])
  if params.get('transpose_input'):
    # As tensorflow/tpu's imagenet_input: HWCN is cheaper to infeed, and
    # its current version also flattens it.
    images = tf.transpose(images, [1, 2, 3, 0])
    if params.get('flatten_input'):
      images = tf.reshape(images, [-1])
  labels = tf.zeros([batch], tf.int32)
  return tf.data.Dataset.from_tensors((images, labels)).repeat()


def _train_spec(logits, labels):
  """Cross-entropy and Adam: the TRAIN spec both test models end with."""
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, tf.cast(logits, tf.float32))
  train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      tf.estimator.ModeKeys.TRAIN, loss=loss, train_op=train_op)


def _image_model_fn(features, labels, mode, params):
  """Two convolutions and a dense head; NHWC inside, like resnet_main."""
  del mode
  images = features
  if params.get('transpose_input'):
    if params.get('flatten_input'):
      # As resnet_main: the image size from the vector's length.
      size = tf.cast(tf.sqrt(tf.cast(tf.shape(images)[0], tf.float32) / (
          _CHANNELS * tf.cast(tf.shape(labels)[0], tf.float32))), tf.int32)
      images = tf.reshape(images, [size, size, _CHANNELS, -1])
    images = tf.transpose(images, [3, 0, 1, 2])  # HWCN -> NHWC
  net = images
  for filters in (16, 32):
    net = tf.compat.v1.layers.conv2d(net, filters, 3, padding='same',
                                     activation=tf.nn.relu)
  net = tf.reduce_mean(net, axis=[1, 2])
  logits = tf.compat.v1.layers.dense(net, _CLASSES)
  return _train_spec(logits, labels)


def _text_input_fn(params):
  """Token ids, `[T, N]` when `params['time_major']`, labels `[N]`."""
  batch = params['batch_size']
  ids = tf.zeros([batch, _SEQUENCE], tf.int32)
  if params.get('time_major'):
    ids = tf.transpose(ids)
  return tf.data.Dataset.from_tensors(({'ids': ids},
                                       tf.zeros([batch], tf.int32))).repeat()


def _text_model_fn(features, labels, mode, params):
  """Embedding, a dense layer per token, mean over time; time-major or not.

  The time-major model computes in `[T, N, E]` throughout, as such models
  do, instead of transposing back.
  """
  del mode
  time_axis = 0 if params.get('time_major') else 1
  embeddings = tf.compat.v1.get_variable('embeddings', [_VOCABULARY, 32])
  net = tf.nn.embedding_lookup(embeddings, features['ids'])
  net = tf.compat.v1.layers.dense(net, 64, activation=tf.nn.relu)
  net = tf.compat.v1.layers.dense(net, 64, activation=tf.nn.relu)
  logits = tf.compat.v1.layers.dense(tf.reduce_mean(net, axis=time_axis),
                                     _CLASSES)
  return _train_spec(logits, labels)


class BatchAxisTest(tf.test.TestCase, parameterized.TestCase):
  """The rule: the dimension of size batch_size; 0, then the last, wins."""

  @parameterized.named_parameters(
      ('batch_first', [8, 16, 16, 3], 8, 0),
      ('batch_last_hwcn', [16, 16, 3, 8], 8, 3),
      ('time_major', [24, 8], 8, 1),
      ('labels', [8], 8, 0),
      ('ambiguous_prefers_first', [8, 16, 3, 8], 8, 0),
      ('ambiguous_without_first_takes_last', [5, 8, 8, 3], 8, 2),
      ('none_matches', [5, 6, 7], 8, 0),
      ('unknown_dimensions_never_match', [None, 16, 8], 8, 2),
      ('unknown_batch_size', [16, 16, 3, 8], None, 0))
  def test_batch_axis(self, shape, batch_size, expected):
    self.assertEqual(batch_dim.batch_axis(shape, batch_size), expected)

  @parameterized.named_parameters(
      ('flattened_hwcn', [16 * 16 * 3 * 8], 8, True),
      ('labels', [8], 8, False),
      ('not_a_multiple', [20], 8, False),
      ('matrix', [16, 24], 8, False),
      ('unknown_batch_size', [24], None, False))
  def test_is_flattened_batch(self, shape, batch_size, expected):
    self.assertEqual(batch_dim.is_flattened_batch(shape, batch_size),
                     expected)

  @parameterized.named_parameters(('scalar', []), ('unknown_rank', None))
  def test_no_batch_to_find(self, shape):
    with self.assertRaisesRegex(ValueError, 'rank >= 1'):
      batch_dim.batch_axis(tf.TensorShape(shape), 8)


class ExampleSpecTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('batch_first', [4, 16, 16, 3], [16, 16, 3], 0),
      ('batch_last', [16, 16, 3, 4], [16, 16, 3], 3),
      ('time_major', [24, 4], [24], 1))
  def test_of_batch_removes_the_batch_and_puts_it_back(
      self, batched, example, axis):
    spec = batch_dim.ExampleSpec.of_batch(batched, tf.float32, 4)
    self.assertEqual(spec.shape.as_list(), example)
    self.assertEqual(spec.batch_axis, axis)
    self.assertEqual(spec.batched_shape(4), batched)
    resized = list(batched)
    resized[axis] = 32
    self.assertEqual(spec.batched_shape(32), resized)

  def test_tensor_spec_of_one_example_has_its_batch_first(self):
    spec = batch_dim.as_example_spec(tf.TensorSpec([16, 3], tf.bfloat16))
    self.assertEqual(spec, batch_dim.ExampleSpec([16, 3], tf.bfloat16, 0))
    self.assertEqual(spec.batched_shape(8), [8, 16, 3])

  def test_batch_axis_outside_the_shape_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'outside'):
      batch_dim.ExampleSpec([16, 3], tf.float32, 3)

  def test_sparse_inputs_are_refused_as_not_dense(self):
    sparse = tf.SparseTensorSpec([4, 10], tf.float32)
    with self.assertRaisesRegex(TypeError, 'dense'):
      batch_dim.example_specs({'x': sparse}, 4)

  def test_flattened_batch_needs_another_tensor_showing_the_batch(self):
    vector = tf.TensorSpec([16 * 3 * 4], tf.float32)
    labels = tf.TensorSpec([4], tf.int32)
    features, _ = batch_dim.example_specs((vector, labels), 4)
    self.assertTrue(features.flattened)
    self.assertEqual(features.shape.as_list(), [16 * 3])
    self.assertEqual(features.batched_shape(8), [16 * 3 * 8])
    # An input_fn that batches by a number of its own: [N] vectors as ever.
    alone, labels = batch_dim.example_specs(
        (vector, tf.TensorSpec([32], tf.int32)), 4)
    self.assertFalse(alone.flattened)
    self.assertEqual(labels.batched_shape(8), [8])

  def test_static_batch_size_reads_the_batch_dimension(self):
    batch = {'image': tf.TensorSpec([16, 16, 3, 4], tf.float32)}
    self.assertEqual(batch_dim.static_batch_size(batch, 4), 4)
    self.assertEqual(batch_dim.static_batch_size(batch, None), 16)
    flat = (tf.TensorSpec([192], tf.float32), tf.TensorSpec([4], tf.int32))
    self.assertEqual(batch_dim.static_batch_size(flat, 4), 4)

  def test_input_specs_finds_the_batch_of_each_part(self):
    features, labels = planner.input_specs(
        _image_input_fn, {'batch_size': _READ_BATCH, 'transpose_input': True})
    self.assertEqual(features.shape.as_list(), [_IMAGE, _IMAGE, _CHANNELS])
    self.assertEqual(features.batch_axis, 3)
    self.assertEqual((labels.shape.as_list(), labels.batch_axis), ([], 0))


def _plan(model_fn, input_fn, layout_param, on, **extra):
  params = dict(extra, **{layout_param: on})
  features, labels = planner.input_specs(
      input_fn, dict(params, batch_size=_READ_BATCH))
  return planner.memory_plan(model_fn, features=features, labels=labels,
                             precision='bfloat16', params=params)


@pytest.mark.slow
class LayoutPlanTest(tf.test.TestCase, parameterized.TestCase):
  """Batch-last and time-major inputs plan like their batch-first twins."""

  @parameterized.named_parameters(
      ('transposed_images', _image_model_fn, _image_input_fn,
       'transpose_input'),
      ('transposed_flattened_images', _image_model_fn, _image_input_fn,
       'transpose_input', {'flatten_input': True}),
      ('time_major_text', _text_model_fn, _text_input_fn, 'time_major'))
  def test_plans_within_tolerance_of_batch_first(self, model_fn, input_fn,
                                                 layout_param, extra=None):
    first = _plan(model_fn, input_fn, layout_param, False)
    moved = _plan(model_fn, input_fn, layout_param, True, **(extra or {}))
    for batch in _BATCHES:
      self.assertAllClose(moved.step_bytes(batch), first.step_bytes(batch),
                          rtol=_TOLERANCE, msg='batch %d' % batch)
    for core, batch in first.max_batch_per_core().items():
      self.assertGreater(batch, 0)
      self.assertAllClose(moved.max_batch_per_core()[core], batch,
                          rtol=_TOLERANCE, msg='TPU %s core' % core)


_CHECKED_PROGRAM = '''
import numpy as np
import tensorflow as tf
from tensorflow.compat.v1 import estimator as tf_estimator

def input_fn(params):
  x = np.ones([8, 3], np.float32)
  return tf.data.Dataset.from_tensor_slices(
      ({'x': x}, np.zeros([8], np.int32))).repeat().batch(4)

def model_fn(features, labels, mode, params):
  w = tf.compat.v1.get_variable('w', [3, 2])
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, tf.cast(tf.matmul(features['x'], w), tf.float32))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf_estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

tf_estimator.Estimator(model_fn).train(input_fn, max_steps=1)
'''


# A plain Estimator (no params['batch_size']) fed images batch-last, as
# tensorflow/tpu's amoeba_net feeds them off the TPU.
_PLAIN_ESTIMATOR_IMAGES = '''
import numpy as np
import tensorflow as tf
from tensorflow.compat.v1 import estimator as tf_estimator

TRANSPOSED = %r

def input_fn():
  images = np.zeros([64, 16, 16, 3], np.float32)
  data = tf.data.Dataset.from_tensor_slices((images, np.zeros([64], np.int32)))
  data = data.repeat().batch(4, drop_remainder=True)
  if TRANSPOSED:
    data = data.map(lambda x, y: (tf.transpose(x, [1, 2, 3, 0]), y))
  return data

def model_fn(features, labels, mode):
  net = tf.transpose(features, [3, 0, 1, 2]) if TRANSPOSED else features
  for filters in (16, 32):
    net = tf.compat.v1.layers.conv2d(net, filters, 3, padding='same',
                                     activation=tf.nn.relu)
  logits = tf.compat.v1.layers.dense(tf.reduce_mean(net, axis=[1, 2]), 10)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, tf.cast(logits, tf.float32))
  train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf_estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

tf_estimator.Estimator(model_fn).train(input_fn, max_steps=1)
'''


class PlainEstimatorLayoutTest(tf.test.TestCase):
  """Without params['batch_size'] the labels tell where the batch is."""

  def _checked(self, transposed):
    path = os.path.join(self.create_tempdir().full_path, 'program.py')
    with open(path, 'w') as f:
      f.write(textwrap.dedent(_PLAIN_ESTIMATOR_IMAGES % transposed))
    result = runner.run_program(
        path, check=True,
        plan_fn=lambda graph: planning_lib.memory_plans(
            graph, precisions=('bfloat16',), optimizers=('adam',)))
    self.assertIsNone(result.plan_error)
    return result

  def test_batch_last_images_plan_like_batch_first(self):
    moved = self._checked(True)
    self.assertEqual(moved.train_graph.features.batch_axis, 3)
    self.assertEqual(moved.train_graph.features.shape.as_list(), [16, 16, 3])
    first = self._checked(False)
    self.assertEqual(first.train_graph.features.batch_axis, 0)
    ((_, plan),) = moved.plans.items()
    ((_, reference),) = first.plans.items()
    for batch in _BATCHES:
      self.assertAllClose(plan.step_bytes(batch), reference.step_bytes(batch),
                          rtol=_TOLERANCE, msg='batch %d' % batch)

  def test_labels_batch_size(self):
    self.assertEqual(batch_dim.labels_batch_size(
        tf.TensorSpec([4], tf.int32)), 4)
    self.assertEqual(batch_dim.labels_batch_size(
        {'a': tf.TensorSpec([4, 10], tf.float32),
         'b': tf.TensorSpec([4], tf.int32)}), 4)
    # Disagreeing, unknown, scalar or missing labels show no batch.
    for labels in ({'a': tf.TensorSpec([4], tf.int32),
                    'b': tf.TensorSpec([5], tf.int32)},
                   tf.TensorSpec([None], tf.int32),
                   tf.TensorSpec([], tf.int32), None):
      self.assertIsNone(batch_dim.labels_batch_size(labels))


class PlanFailureTest(tf.test.TestCase):
  """A plan that cannot be made fails `check`, naming its cause."""

  def test_plan_failure_is_a_problem_of_the_check(self):
    path = os.path.join(self.create_tempdir().full_path, 'program.py')
    with open(path, 'w') as f:
      f.write(textwrap.dedent(_CHECKED_PROGRAM))

    def failing_plan(train_graph):
      del train_graph
      raise ValueError('Shapes (4, 1000) and (8, 1000) are incompatible\n'
                       'Call stack: ...')

    result = runner.run_program(path, check=True, plan_fn=failing_plan)
    self.assertIsNotNone(result.train_graph)
    self.assertFalse(result.problems)  # the audit itself is clean
    self.assertFalse(run_report.check_passed(result))
    text = run_report.format_check_report(result)
    self.assertIn('memory plan: PROBLEM, it could not be made: ValueError: '
                  'Shapes (4, 1000) and (8, 1000) are incompatible\n', text)
    self.assertNotIn('Call stack', text)
    self.assertIn('result: FAILED', text)

  def test_the_same_program_planned_is_ok(self):
    path = os.path.join(self.create_tempdir().full_path, 'program.py')
    with open(path, 'w') as f:
      f.write(textwrap.dedent(_CHECKED_PROGRAM))
    result = runner.run_program(
        path, check=True,
        plan_fn=lambda graph: planning_lib.memory_plans(
            graph, precisions=('bfloat16',), optimizers=('adam',)))
    self.assertIsNone(result.plan_error)
    self.assertTrue(run_report.check_passed(result))
    self.assertIn('result: OK', run_report.format_check_report(result))


if __name__ == '__main__':
  tf.test.main()
