"""The one patching mechanism: swaps in force for their users, then undone.

`platform.patching.Patcher` serves every place that changes TensorFlow's
(or tf-slim's) attributes; the tf-slim repair is one of them, applied only
while a model_fn or an input_fn builds.
"""

import sys
import threading
import types

from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tf_slim  # pylint: disable=unused-import  (the repair needs it loaded)
from tf_slim.data import tfexample_decoder

import estimator_bf16 as eb
from estimator_bf16.platform import patching
from estimator_bf16.platform import slim_repair


def _counting_patcher(owner):
  calls = []

  def apply():
    calls.append('apply')
    undo = [(owner, 'value', owner.value)]
    owner.value = 'patched'
    return undo

  return patching.Patcher(apply), calls


class PatcherTest(tf.test.TestCase):

  def test_nested_users_share_one_swap_undone_by_the_last(self):
    owner = types.SimpleNamespace(value='original')
    patcher, calls = _counting_patcher(owner)
    with patcher.active():
      with patcher.active():
        self.assertEqual(owner.value, 'patched')
      self.assertEqual(owner.value, 'patched')
      self.assertTrue(patcher.started)
    self.assertEqual(owner.value, 'original')
    self.assertFalse(patcher.started)
    self.assertEqual(calls, ['apply'])

  def test_undone_when_the_body_raises(self):
    owner = types.SimpleNamespace(value='original')
    patcher, _ = _counting_patcher(owner)
    with self.assertRaisesRegex(ValueError, 'boom'):
      with patcher.active():
        raise ValueError('boom')
    self.assertEqual(owner.value, 'original')

  def test_start_stop_pairs_and_an_unmatched_stop(self):
    owner = types.SimpleNamespace(value='original')
    patcher, _ = _counting_patcher(owner)
    patcher.start()
    patcher.start()
    patcher.stop()
    self.assertEqual(owner.value, 'patched')
    patcher.stop()
    self.assertEqual(owner.value, 'original')
    with self.assertRaisesRegex(RuntimeError, 'without a matching start'):
      patcher.stop()

  def test_a_failing_apply_counts_no_user(self):
    attempts = []

    def apply():
      attempts.append(1)
      if len(attempts) == 1:
        raise OSError('cannot patch')
      return []

    patcher = patching.Patcher(apply)
    with self.assertRaises(OSError):
      patcher.start()
    self.assertFalse(patcher.started)
    with patcher.active():  # tries again, and works
      self.assertTrue(patcher.started)
    self.assertLen(attempts, 2)

  def test_missing_attributes_are_deleted_again(self):
    owner = types.SimpleNamespace()

    def apply():
      owner.added = 1
      return [(owner, 'added', patching.MISSING)]

    with patching.Patcher(apply).active():
      self.assertEqual(owner.added, 1)
    self.assertFalse(hasattr(owner, 'added'))

  def test_threads_entering_at_once_apply_once(self):
    owner = types.SimpleNamespace(value='original')
    patcher, calls = _counting_patcher(owner)
    barrier = threading.Barrier(4)
    seen = []

    def user():
      with patcher.active():
        barrier.wait()
        seen.append(owner.value)
        barrier.wait()

    threads = [threading.Thread(target=user) for _ in range(4)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join()
    self.assertEqual(seen, ['patched'] * 4)
    self.assertEqual(calls, ['apply'])
    self.assertEqual(owner.value, 'original')


  def test_users_are_listed_while_their_block_runs(self):
    patcher = patching.Patcher(lambda: [])
    first, second = object(), object()
    with patcher.active(first):
      with patcher.active(second):
        self.assertEqual(patcher.users, (first, second))
      self.assertEqual(patcher.users, (first,))
    self.assertEqual(patcher.users, ())

  def test_the_same_user_in_nested_blocks_leaves_with_its_outer_block(self):
    patcher = patching.Patcher(lambda: [])
    user, other = object(), object()
    with patcher.active(user):
      with patcher.active(other):
        with patcher.active(user):
          self.assertEqual(patcher.users, (user, other, user))
        self.assertEqual(patcher.users, (user, other))
      self.assertEqual(patcher.users, (user,))
    self.assertEqual(patcher.users, ())


class SlimRepairTest(tf.test.TestCase, parameterized.TestCase):

  def test_the_repair_is_in_force_only_while_a_build_runs(self):
    utils = sys.modules['tf_slim.layers.utils']
    before = utils.ops
    with slim_repair.tf_slim_repaired():
      inside = utils.ops
      self.assertIs(inside.Tensor, tf.Tensor)
    self.assertIs(utils.ops, before)

  def test_float32_slim_batch_norm_builds_through_wrap_model_fn(self):
    seen = {}

    def model_fn(features, labels, mode, params):
      del labels, mode, params
      seen['ops'] = sys.modules['tf_slim.layers.utils'].ops
      net = tf_slim.batch_norm(features, is_training=True)
      return tf.reduce_mean(net)

    wrapped = eb.wrap_model_fn(model_fn, 'float32')
    with tf.Graph().as_default():
      loss = wrapped(tf.ones([4, 3]), None, 'train', {})
    self.assertEqual(loss.dtype, tf.float32)
    self.assertIs(seen['ops'].Tensor, tf.Tensor)
    # Nothing of the repair is left once the model_fn returned.
    self.assertIsNot(sys.modules['tf_slim.layers.utils'].ops, seen['ops'])

  @parameterized.parameters('float32', 'bfloat16')
  def test_slim_image_decoder_builds_in_a_wrapped_input_fn(self, precision):
    # tensorflow/tpu's detection programs parse COCO records with it; its
    # image handler calls control_flow_ops.case and .cond, which
    # TensorFlow 2.15+ keeps elsewhere.
    image = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      png = session.run(tf.io.encode_png(image))
    example = tf.train.Example(features=tf.train.Features(feature={
        'image/encoded': tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[png])),
        'image/format': tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[b'png']))}))
    seen = {}

    def input_fn(params):
      del params
      decoder = tfexample_decoder.TFExampleDecoder(
          {'image/encoded': tf.io.FixedLenFeature((), tf.string),
           'image/format': tf.io.FixedLenFeature((), tf.string)},
          {'image': tfexample_decoder.Image(shape=[4, 5, 3])})
      seen['control_flow'] = tfexample_decoder.control_flow_ops

      def parse(serialized):
        decoded, = decoder.decode(serialized, ['image'])
        return {'image': tf.cast(decoded, tf.float32)}

      return tf.data.Dataset.from_tensors(
          example.SerializeToString()).map(parse)

    wrapped = eb.wrap_input_fn(input_fn, precision)
    with tf.Graph().as_default():
      features = tf.compat.v1.data.make_one_shot_iterator(
          wrapped(params={})).get_next()
      with tf.compat.v1.Session() as session:
        decoded = session.run(features['image'])
    self.assertEqual(features['image'].dtype, tf.as_dtype(precision))
    self.assertAllEqual(np.asarray(decoded, np.float32), image)
    self.assertIs(seen['control_flow'].case, tf.compat.v1.case)
    # Nothing of the repair is left once the input_fn returned.
    self.assertIsNot(tfexample_decoder.control_flow_ops,
                     seen['control_flow'])
