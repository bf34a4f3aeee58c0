"""Tests for precision names and for cast_features / to_float32."""

import collections

from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import numpy as np
import tensorflow as tf

import estimator_bf16 as eb


def setUpModule():
  tf.compat.v1.disable_eager_execution()


Pair = collections.namedtuple('Pair', ['a', 'b'])

_ALL_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32,
               tf.int64, tf.bool, tf.string, tf.uint8]
_FLOATING = {tf.float16, tf.bfloat16, tf.float32, tf.float64}


def _tensor(dtype):
  if dtype == tf.string:
    return tf.constant(['x'])
  return tf.zeros([2], dtype=dtype)


# A nesting of dicts / lists / tuples / namedtuples whose leaves are dtypes.
_structures = st.recursive(
    st.sampled_from(_ALL_DTYPES),
    lambda children: st.one_of(
        st.dictionaries(st.text('abcdef', min_size=1, max_size=3), children,
                        max_size=3),
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.builds(Pair, children, children)),
    max_leaves=8)


def _to_tensors(structure):
  return tf.nest.map_structure(_tensor, structure)


class PrecisionTest(parameterized.TestCase):

  def test_precisions(self):
    self.assertEqual(eb.PRECISIONS, ('float32', 'bfloat16'))
    self.assertEqual(eb.compute_dtype('float32'), tf.float32)
    self.assertEqual(eb.compute_dtype('bfloat16'), tf.bfloat16)

  @parameterized.parameters('float16', 'fp32', 'bf16', '', None, tf.bfloat16,
                            'BFLOAT16')
  def test_bad_precision_lists_choices(self, value):
    with self.assertRaisesRegex(ValueError, "'float32', 'bfloat16'"):
      eb.compute_dtype(value)

  def test_float16_is_explained(self):
    with self.assertRaisesRegex(ValueError, 'loss scaling'):
      eb.compute_dtype('float16')


class CastFeaturesTest(tf.test.TestCase, parameterized.TestCase):

  @hypothesis.settings(max_examples=60, deadline=None)
  @hypothesis.given(structure=_structures,
                    precision=st.sampled_from(eb.PRECISIONS))
  def test_property_only_floating_leaves_change(self, structure, precision):
    with tf.Graph().as_default():
      features = _to_tensors(structure)
      cast = eb.cast_features(features, precision)
      # Same container types and nesting...
      tf.nest.assert_same_structure(features, cast, check_types=True)
      target = eb.compute_dtype(precision)
      for before, after in zip(tf.nest.flatten(features),
                               tf.nest.flatten(cast)):
        if before.dtype in _FLOATING:
          self.assertEqual(after.dtype, target)
          self.assertEqual(after.shape, before.shape)
        else:
          # ... and non-floating tensors are the very same objects.
          self.assertIs(after, before)
      for leaf in tf.nest.flatten(eb.to_float32(cast)):
        if leaf.dtype in _FLOATING:
          self.assertEqual(leaf.dtype, tf.float32)

  def test_exclude_keeps_keys_at_any_depth(self):
    features = {'image': tf.zeros([2, 3]), 'mask': tf.zeros([2, 3]),
                'nested': {'mask': tf.zeros([2]), 'x': tf.zeros([2])}}
    cast = eb.cast_features(features, 'bfloat16', exclude=('mask',))
    self.assertEqual(cast['image'].dtype, tf.bfloat16)
    self.assertIs(cast['mask'], features['mask'])
    self.assertIs(cast['nested']['mask'], features['nested']['mask'])
    self.assertEqual(cast['nested']['x'].dtype, tf.bfloat16)

  def test_exclude_single_string(self):
    features = {'ab': tf.zeros([1]), 'a': tf.zeros([1])}
    cast = eb.cast_features(features, 'bfloat16', exclude='ab')
    self.assertIs(cast['ab'], features['ab'])
    self.assertEqual(cast['a'].dtype, tf.bfloat16)

  def test_sparse_and_ragged_values(self):
    sparse = tf.SparseTensor([[0, 1]], tf.constant([1.5]), [2, 2])
    ids = tf.SparseTensor([[0, 1]], tf.constant([3], tf.int64), [2, 2])
    ragged = tf.RaggedTensor.from_row_lengths(tf.constant([1., 2., 3.]),
                                              [1, 2])
    cast = eb.cast_features({'s': sparse, 'ids': ids, 'r': ragged},
                            'bfloat16')
    self.assertIsInstance(cast['s'], tf.SparseTensor)
    self.assertEqual(cast['s'].values.dtype, tf.bfloat16)
    self.assertIs(cast['ids'], ids)
    self.assertEqual(cast['r'].dtype, tf.bfloat16)
    with self.cached_session() as sess:
      values = sess.run(eb.to_float32(cast)['s'].values)
    self.assertAllClose(values, [1.5])

  def test_values_survive_round_trip_within_bfloat16_precision(self):
    x = np.linspace(-3, 3, 101).astype(np.float32)
    round_trip = eb.to_float32(eb.cast_features(tf.constant(x), 'bfloat16'))
    with self.cached_session() as sess:
      # bfloat16 keeps 8 significant bits: relative error <= 2^-8.
      self.assertAllClose(sess.run(round_trip), x, rtol=2 ** -8, atol=1e-6)

  def test_non_tensor_leaves_are_kept(self):
    features = {'n': 3.0, 'a': np.ones(2, np.float32), 't': tf.zeros([1])}
    cast = eb.cast_features(features, 'bfloat16')
    self.assertIs(cast['n'], 3.0)
    self.assertIs(cast['a'], features['a'])

  def test_float32_precision_casts_float64(self):
    cast = eb.cast_features({'x': tf.zeros([1], tf.float64)}, 'float32')
    self.assertEqual(cast['x'].dtype, tf.float32)


if __name__ == '__main__':
  tf.test.main()
