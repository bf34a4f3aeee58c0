"""Tests for estimator_bf16/models/resnet.py: shapes, training, batch norm and bfloat16 audit.

Small networks (ResNet-18 on 32x32 images) are run; ResNet-50 at 224x224 is
only built, and its graph audited.
"""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import op_lists
from estimator_bf16.models import imagenet_input
from estimator_bf16.models import resnet
from estimator_bf16.safety import audit as audit_lib

_PRECISIONS = (
    dict(testcase_name='float32', precision='float32'),
    dict(testcase_name='bfloat16', precision='bfloat16'),
)
# Trainable parameters with 1000 classes: conv kernels, batch-norm scale and
# offset, dense kernel and bias; the published torchvision counts.
_PARAMETERS = {18: 11689512, 34: 21797672, 50: 25557032, 101: 44549160,
               152: 60192808}


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _tiny_config(**overrides):
  return resnet.ResNetConfig(depth=18, num_classes=10, image_size=32,
                             **overrides)


def _synthetic_batch(config, precision, batch_size=8):
  """One fixed batch of the learnable synthetic task, repeated forever."""
  input_fn = imagenet_input.synthetic_imagenet_input_fn_builder(
      image_size=config.image_size, num_classes=config.num_classes)
  dataset = input_fn({'batch_size': batch_size, 'precision': precision})
  features, labels = tf.compat.v1.data.make_one_shot_iterator(
      dataset.take(1).cache().repeat()).get_next()
  return features['image'], labels


def _build(config, images, precision, is_training):
  with eb.bfloat16_scope(precision):
    return resnet.resnet_v1(config)(images, is_training)


def _relative_difference(actual, expected):
  return np.linalg.norm(actual - expected) / np.linalg.norm(expected)


@pytest.mark.slow
class ResNetTest(tf.test.TestCase, parameterized.TestCase):

  def test_bad_depth_lists_choices(self):
    with self.assertRaisesRegex(ValueError, '18, 34, 50, 101, 152.*got 20'):
      resnet.resnet_v1(resnet.ResNetConfig(depth=20))

  def test_rejects_integer_images(self):
    with tf.Graph().as_default():
      with self.assertRaisesRegex(TypeError, 'float32 or bfloat16'):
        resnet.resnet_v1(_tiny_config())(tf.zeros([1, 32, 32, 3], tf.uint8),
                                         True)

  def test_builds_with_unknown_batch(self):
    # What export does: float32 serving images, batch size unknown.
    with tf.Graph().as_default():
      images = tf.compat.v1.placeholder(tf.float32, [None, 32, 32, 3])
      logits = _build(_tiny_config(), images, 'float32', is_training=False)
      self.assertEqual(logits.shape.as_list(), [None, 10])

  @parameterized.named_parameters(*_PRECISIONS)
  def test_trains_and_updates_moving_statistics(self, precision):
    config = _tiny_config()
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(1)
      images, labels = _synthetic_batch(config, precision)
      logits = _build(config, images, precision, is_training=True)
      self.assertEqual(logits.dtype, eb.compute_dtype(precision))
      self.assertEqual(logits.shape.as_list(), [8, 10])
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
          labels, tf.cast(logits, tf.float32))
      updates = tf.compat.v1.get_collection(
          tf.compat.v1.GraphKeys.UPDATE_OPS)
      moving_means = [v for v in tf.compat.v1.global_variables()
                      if v.name.endswith('moving_mean:0')]
      # Two updates (mean, variance) per batch norm, 20 batch norms in
      # ResNet-18 (stem, 2 per block, 3 projections).
      self.assertLen(moving_means, 20)
      self.assertLen(updates, 2 * len(moving_means))
      with tf.control_dependencies(updates):
        train_op = tf.compat.v1.train.MomentumOptimizer(
            0.05, 0.9).minimize(loss)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        losses = [session.run([train_op, loss])[1] for _ in range(6)]
        means = session.run(moving_means)
    self.assertTrue(np.all(np.isfinite(losses)), losses)
    self.assertLess(np.mean(losses[-2:]), losses[0])
    for mean in means:
      self.assertGreater(np.abs(mean).max(), 0.0)

  @parameterized.named_parameters(*_PRECISIONS)
  def test_batch_norm_moves_toward_batch_statistics(self, precision):
    dtype = eb.compute_dtype(precision)
    values = np.random.RandomState(0).normal(3.0, 2.0, [16, 4, 4, 8])
    with tf.Graph().as_default():
      inputs = tf.cast(tf.constant(values, tf.float32), dtype)
      with eb.bfloat16_scope(precision):
        outputs = resnet.batch_norm(inputs, True, momentum=0.9, epsilon=1e-5)
      self.assertEqual(outputs.dtype, dtype)
      variables = {v.op.name.split('/')[-1]: v
                   for v in tf.compat.v1.global_variables()}
      for variable in variables.values():
        self.assertEqual(variable.dtype.base_dtype, tf.float32)
      updates = tf.compat.v1.get_collection(
          tf.compat.v1.GraphKeys.UPDATE_OPS)
      self.assertLen(updates, 2)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        seen, normalized, _ = session.run(
            [tf.cast(inputs, tf.float32), tf.cast(outputs, tf.float32),
             updates])
        mean, variance = session.run(
            [variables['moving_mean'], variables['moving_variance']])
    # Statistics of what the layer saw (bfloat16-rounded in bfloat16).
    batch_mean = seen.mean(axis=(0, 1, 2))
    batch_variance = seen.var(axis=(0, 1, 2), ddof=1)
    self.assertAllClose(mean, 0.1 * batch_mean, rtol=1e-4, atol=1e-5)
    self.assertAllClose(variance, 0.9 + 0.1 * batch_variance, rtol=1e-4)
    tolerance = 0.02 if precision == 'bfloat16' else 1e-4
    self.assertAllClose(normalized.mean(axis=(0, 1, 2)), np.zeros(8),
                        atol=tolerance)
    self.assertAllClose(normalized.std(axis=(0, 1, 2)), np.ones(8),
                        atol=tolerance)

  def test_variable_names_do_not_depend_on_precision(self):
    signatures = {}
    for precision in ('float32', 'bfloat16'):
      with tf.Graph().as_default():
        _build(_tiny_config(), tf.zeros([1, 32, 32, 3],
                                        eb.compute_dtype(precision)),
               precision, is_training=True)
        signatures[precision] = sorted(
            (v.op.name, tuple(v.shape.as_list()), v.dtype.base_dtype.name)
            for v in tf.compat.v1.global_variables())
    self.assertEqual(signatures['float32'], signatures['bfloat16'])
    self.assertEqual({dtype for _, _, dtype in signatures['bfloat16']},
                     {'float32'})
    names = [name for name, _, _ in signatures['float32']]
    self.assertIn('resnet/stem/conv/kernel', names)
    self.assertIn('resnet/group2/block0/projection/kernel', names)
    self.assertIn('resnet/logits/kernel', names)

  # Inference (moving statistics) is the precise comparison. With batch
  # statistics at random initialisation the network itself amplifies any
  # perturbation: rounding a float32 ResNet-50's input by 0.4% moves its
  # logits by ~23% (16 images of 64x64), so the training case uses the
  # shallow net, larger images and a looser bound.
  @parameterized.named_parameters(
      dict(testcase_name='resnet18_inference', depth=18, image_size=32,
           batch_size=8, is_training=False, rtol=0.02),
      dict(testcase_name='resnet50_inference', depth=50, image_size=64,
           batch_size=4, is_training=False, rtol=0.02),
      dict(testcase_name='resnet18_training', depth=18, image_size=64,
           batch_size=8, is_training=True, rtol=0.05))
  def test_bfloat16_logits_close_to_float32(self, depth, image_size,
                                            batch_size, is_training, rtol):
    # Non-zero residual branches, so every layer's rounding shows.
    config = resnet.ResNetConfig(depth=depth, num_classes=10,
                                 image_size=image_size,
                                 zero_init_last_bn=False)
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(2)
      images, _ = _synthetic_batch(config, 'float32', batch_size)
      expected = _build(config, images, 'float32', is_training)
      # The bfloat16 network reads the same float32 variables.
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       reuse=True):
        actual = _build(config, tf.cast(images, tf.bfloat16), 'bfloat16',
                        is_training)
      self.assertEqual(actual.dtype, tf.bfloat16)
      if not is_training:
        self.assertEmpty(tf.compat.v1.get_collection(
            tf.compat.v1.GraphKeys.UPDATE_OPS))
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        expected, actual = session.run([expected, tf.cast(actual, tf.float32)])
    difference = _relative_difference(actual, expected)
    print('ResNet-%d bfloat16 vs float32 logits (%s, %dx%d): relative L2 '
          '%.4f, max abs %.4f of max %.3f' % (
              depth, 'training' if is_training else 'inference', image_size,
              image_size, difference, np.abs(actual - expected).max(),
              np.abs(expected).max()))
    self.assertLess(difference, rtol)

  def test_parameter_counts_match_published_networks(self):
    # ResNet-50's count is checked on the graph
    # test_resnet50_graph_is_bfloat16 builds anyway.
    for depth, expected in _PARAMETERS.items():
      if depth == 50:
        continue
      with tf.Graph().as_default():
        logits = _build(resnet.ResNetConfig(depth=depth),
                        tf.zeros([1, 32, 32, 3], tf.bfloat16), 'bfloat16',
                        is_training=False)
        self.assertEqual(logits.shape.as_list(), [1, 1000])
        count = sum(np.prod(v.shape.as_list())
                    for v in tf.compat.v1.trainable_variables())
      self.assertEqual(count, expected, 'ResNet-%d' % depth)

  def test_resnet50_graph_is_bfloat16(self):
    config = resnet.ResNetConfig(depth=50, image_size=224)
    with tf.Graph().as_default() as graph:
      images = tf.zeros([2, 224, 224, 3], tf.bfloat16)
      logits = _build(config, images, 'bfloat16', is_training=True)
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
          tf.zeros([2], tf.int32), tf.cast(logits, tf.float32))
      # The backward pass must stay in bfloat16 too.
      tf.gradients(loss, tf.compat.v1.trainable_variables())
      report = eb.check_graph(graph, strict=True, loss=loss)
      variables = tf.compat.v1.global_variables()
      count = sum(np.prod(v.shape.as_list())
                  for v in tf.compat.v1.trainable_variables())
    # The published count (test_parameter_counts_match_published_networks
    # checks the other depths).
    self.assertEqual(logits.shape.as_list(), [2, 1000])
    self.assertEqual(count, _PARAMETERS[50])
    self.assertEqual({v.dtype.base_dtype for v in variables}, {tf.float32})
    ops = graph.get_operations()
    self.assertEmpty([op.name for op in ops if op.type == 'SparseMatMul'])
    heavy = [op for op in ops if op.type in op_lists.MATMUL_CONV_OPS]
    self.assertGreater(len(heavy), 3 * 53)  # 53 convs + dense, fwd + bwd
    # As a TPU runs them (autocast.cpu_kernels may compute some in float32
    # on this CPU).
    self.assertEmpty([(op.name, op.get_attr('T').name)
                      for op in heavy
                      if audit_lib.compute_dtype(op) != tf.bfloat16])
    self.assertGreater(report.bfloat16_flop_share, 0.9)


if __name__ == '__main__':
  tf.test.main()
