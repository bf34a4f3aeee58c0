"""Tests for the ResNet and BERT input pipelines, on records written here."""

import os
import shutil
import tempfile

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from estimator_bf16.models import bert_input
from estimator_bf16.models import imagenet_input
from estimator_bf16.precision import policy
from tests.support import record_writers

_PRECISIONS = (
    dict(testcase_name='float32', precision='float32', dtype=tf.float32),
    dict(testcase_name='bfloat16', precision='bfloat16', dtype=tf.bfloat16),
)
_ID_KEYS = ('input_ids', 'input_mask', 'segment_ids')


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _read(input_fn, params, max_batches):
  """Runs `input_fn(params)` for up to `max_batches` batches (fewer at end)."""
  with tf.Graph().as_default():
    dataset = input_fn(params)
    features, labels = tf.compat.v1.data.make_one_shot_iterator(
        dataset).get_next()
    batches = []
    with tf.compat.v1.Session() as session:
      for _ in range(max_batches):
        try:
          batches.append(session.run((features, labels)))
        except tf.errors.OutOfRangeError:
          break
  return (features, labels), batches


@pytest.mark.slow
class ImageNetInputTest(tf.test.TestCase, parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Written once for the class: every test only reads them.
    cls.directory = tempfile.mkdtemp()
    rng = np.random.RandomState(0)
    # Two files of five images each, in odd sizes; the first image of each
    # file is one flat colour, to check normalisation; labels 1..10.
    cls.labels = []
    for shard in range(2):
      images = [rng.randint(0, 256, size=(40 + 7 * i, 60 - 5 * i, 3))
                for i in range(5)]
      images[0] = np.tile(np.array([200, 100, 50], np.uint8), (48, 64, 1))
      labels = [shard * 5 + i + 1 for i in range(5)]
      record_writers.write_imagenet_tfrecord(
          os.path.join(cls.directory, 'train-%05d' % shard), images, labels)
      cls.labels += labels
    cls.pattern = os.path.join(cls.directory, 'train-*')

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.directory, ignore_errors=True)
    super().tearDownClass()

  @parameterized.named_parameters(*_PRECISIONS)
  def test_eval_reads_once_with_dtypes_and_shapes(self, precision, dtype):
    input_fn = imagenet_input.imagenet_input_fn_builder(
        self.pattern, is_training=False, image_size=24, num_classes=10)
    (features, labels), batches = _read(
        input_fn, {'batch_size': 4, 'precision': precision}, 10)
    self.assertEqual(features['image'].dtype, dtype)
    self.assertEqual(features['image'].shape.as_list(), [4, 24, 24, 3])
    self.assertEqual(labels.dtype, tf.int32)
    self.assertEqual(labels.shape.as_list(), [4])
    # 10 records, batches of 4, remainder dropped: one pass is 2 batches.
    self.assertLen(batches, 2)
    seen = np.concatenate([batch_labels for _, batch_labels in batches])
    self.assertContainsSubset(seen + 1, self.labels)
    self.assertLen(set(seen), 8)
    # The flat-colour images normalise to ((200, 100, 50) - mean) / std.
    flat = np.array([200, 100, 50])
    expected = (flat - np.array([123.675, 116.28, 103.53])) / np.array(
        [58.395, 57.12, 57.375])
    for images, batch_labels in batches:
      for image, label in zip(images['image'], batch_labels):
        if label + 1 in (1, 6):
          self.assertAllClose(image.astype(np.float32).mean(axis=(0, 1)),
                              expected, atol=0.05)

  @parameterized.named_parameters(*_PRECISIONS)
  def test_training_repeats_and_augments(self, precision, dtype):
    input_fn = imagenet_input.imagenet_input_fn_builder(
        self.pattern, is_training=True, image_size=32, num_classes=10,
        cache=True)
    (features, labels), batches = _read(
        input_fn, {'batch_size': 4, 'precision': precision}, 6)
    self.assertEqual(features['image'].dtype, dtype)
    self.assertEqual(features['image'].shape.as_list(), [4, 32, 32, 3])
    self.assertEqual(labels.dtype, tf.int32)
    self.assertLen(batches, 6)  # 24 examples out of 10 records.
    for images, batch_labels in batches:
      self.assertTrue(np.all(np.isfinite(images['image'].astype(np.float32))))
      self.assertTrue(np.all((batch_labels >= 0) & (batch_labels < 10)))

  def test_label_offset_zero_and_range_check(self):
    # Stored labels 1..10 with no offset: label 10 is out of range for 10
    # classes and must fail loudly.
    input_fn = imagenet_input.imagenet_input_fn_builder(
        self.pattern, is_training=False, image_size=16, num_classes=10,
        label_offset=0)
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                'outside'):
      _read(input_fn, {'batch_size': 10}, 1)
    input_fn = imagenet_input.imagenet_input_fn_builder(
        self.pattern, is_training=False, image_size=16, num_classes=11,
        label_offset=0)
    _, batches = _read(input_fn, {'batch_size': 10}, 1)
    self.assertCountEqual(batches[0][1], self.labels)

  def test_missing_files_fail_early(self):
    with self.assertRaisesRegex(ValueError, 'No ImageNet TFRecord'):
      imagenet_input.imagenet_input_fn_builder(
          os.path.join(self.get_temp_dir(), 'nothing-*'), is_training=True,
          image_size=32, num_classes=10)

  def test_bad_precision(self):
    input_fn = imagenet_input.imagenet_input_fn_builder(
        self.pattern, is_training=False, image_size=16, num_classes=10)
    with tf.Graph().as_default():
      with self.assertRaisesRegex(
          ValueError, r"params\['precision'\]: .*'float32', 'bfloat16', "
          "got 'float16'"):
        input_fn({'batch_size': 2, 'precision': 'float16'})


class SyntheticImageNetInputTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_PRECISIONS)
  def test_dtypes_shapes_and_determinism(self, precision, dtype):
    params = {'batch_size': 4, 'precision': precision}

    def first_batch(seed):
      input_fn = imagenet_input.synthetic_imagenet_input_fn_builder(
          image_size=16, num_classes=5, seed=seed)
      return _read(input_fn, params, 1)

    (features, labels), batches = first_batch(0)
    self.assertEqual(features['image'].dtype, dtype)
    # The runner and the trainer put a `Precision` in params: the same cast.
    (parsed, _), _ = _read(
        imagenet_input.synthetic_imagenet_input_fn_builder(
            image_size=16, num_classes=5, seed=0),
        dict(params, precision=policy.parse_precision(precision)), 1)
    self.assertEqual(parsed['image'].dtype, dtype)
    self.assertEqual(features['image'].shape.as_list(), [4, 16, 16, 3])
    self.assertEqual(labels.dtype, tf.int32)
    _, again = first_batch(0)
    _, other = first_batch(1)
    self.assertAllEqual(batches[0][0]['image'], again[0][0]['image'])
    self.assertNotAllClose(batches[0][0]['image'].astype(np.float32),
                           other[0][0]['image'].astype(np.float32))

  def test_label_is_learnable_from_image(self):
    # Nearest class mean, estimated on one seed and tested on another (same
    # task_seed), must beat chance (10%) by far.
    def examples(seed, count):
      input_fn = imagenet_input.synthetic_imagenet_input_fn_builder(
          image_size=16, num_classes=10, seed=seed, num_examples=count)
      _, batches = _read(input_fn, {'batch_size': count}, 1)
      images, labels = batches[0]
      return images['image'].reshape(count, -1), labels

    train_x, train_y = examples(0, 300)
    test_x, test_y = examples(1, 100)
    means = np.stack([train_x[train_y == c].mean(axis=0) for c in range(10)])
    distances = ((test_x[:, None] - means[None]) ** 2).sum(axis=-1)
    accuracy = np.mean(distances.argmin(axis=1) == test_y)
    self.assertGreater(accuracy, 0.9)

  def test_not_learnable_and_finite(self):
    input_fn = imagenet_input.synthetic_imagenet_input_fn_builder(
        image_size=8, num_classes=3, learnable=False, num_examples=5)
    (features, _), batches = _read(input_fn, {'batch_size': 2}, 10)
    self.assertEqual(features['image'].dtype, tf.float32)
    self.assertLen(batches, 2)  # 5 examples, remainder dropped.


class BertInputTest(tf.test.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.RandomState(0)
    self.examples = []
    for index in range(6):
      length = 3 + index
      self.examples.append({
          'input_ids': [101] + list(rng.randint(1000, 2000, length - 1)) +
                       [0] * (8 - length),
          'input_mask': [1] * length + [0] * (8 - length),
          'segment_ids': [0] * 2 + [1] * (length - 2) + [0] * (8 - length),
          'label_ids': index % 3})
    self.path = os.path.join(self.get_temp_dir(), 'bert.tfrecord')
    self.assertEqual(
        record_writers.write_bert_tfrecord(self.path, self.examples), 6)

  @parameterized.named_parameters(
      dict(testcase_name='drop_remainder', drop_remainder=True,
           sizes=[4]),
      dict(testcase_name='keep_remainder', drop_remainder=False,
           sizes=[4, 2]))
  def test_eval_round_trip(self, drop_remainder, sizes):
    input_fn = bert_input.bert_input_fn_builder(
        self.path, seq_length=8, is_training=False,
        drop_remainder=drop_remainder)
    (features, labels), batches = _read(input_fn, {'batch_size': 4}, 5)
    self.assertCountEqual(features, _ID_KEYS)
    for key in _ID_KEYS:
      self.assertEqual(features[key].dtype, tf.int32)
      self.assertEqual(features[key].shape.as_list()[1:], [8])
    self.assertEqual(labels.dtype, tf.int32)
    if drop_remainder:  # Static batch size: what a TPU needs.
      self.assertEqual(labels.shape.as_list(), [4])
    self.assertEqual([len(batch_labels) for _, batch_labels in batches], sizes)
    first_features, first_labels = batches[0]
    for row, example in enumerate(self.examples[:4]):
      for key in _ID_KEYS:
        self.assertAllEqual(first_features[key][row], example[key])
      self.assertEqual(first_labels[row], example['label_ids'])

  def test_training_repeats(self):
    input_fn = bert_input.bert_input_fn_builder(
        self.path, seq_length=8, is_training=True)
    (_, labels), batches = _read(input_fn, {'batch_size': 4}, 5)
    self.assertEqual(labels.shape.as_list(), [4])
    self.assertLen(batches, 5)  # 20 examples out of 6 records.

  def test_missing_files_fail_early(self):
    with self.assertRaisesRegex(ValueError, 'No BERT TFRecord'):
      bert_input.bert_input_fn_builder(
          os.path.join(self.get_temp_dir(), 'nothing-*'), seq_length=8,
          is_training=False)


class SyntheticBertInputTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('two_labels', 2), ('five_labels', 5))
  def test_examples_follow_the_task(self, num_labels):
    input_fn = bert_input.synthetic_bert_input_fn_builder(
        seq_length=32, vocab_size=50, num_labels=num_labels)
    (features, labels), batches = _read(input_fn, {'batch_size': 64}, 1)
    for key in _ID_KEYS:
      self.assertEqual(features[key].dtype, tf.int32)
      self.assertEqual(features[key].shape.as_list(), [64, 32])
    self.assertEqual(labels.dtype, tf.int32)
    batch, labels = batches[0]
    ids, mask = batch['input_ids'], batch['input_mask']
    self.assertTrue(np.all((ids >= 0) & (ids < 50)))
    self.assertAllEqual(mask, (ids != 0).astype(np.int32))
    self.assertAllEqual(ids[:, 0], np.ones(64))  # [CLS]
    self.assertAllEqual(batch['segment_ids'] * (1 - mask), np.zeros_like(ids))
    self.assertGreater(len(set(mask.sum(axis=1))), 5)  # Lengths vary.
    self.assertEqual(set(labels), set(range(num_labels)))
    for row, label in zip(ids, labels):
      markers = row[(row >= 3) & (row < 3 + num_labels)]
      self.assertAllEqual(markers, [3 + label])
      self.assertEqual(np.sum(row == 2), 2)  # Two [SEP].

  def test_deterministic_per_seed(self):
    def first_ids(seed):
      input_fn = bert_input.synthetic_bert_input_fn_builder(
          seq_length=16, vocab_size=100, seed=seed)
      _, batches = _read(input_fn, {'batch_size': 8}, 1)
      return batches[0][0]['input_ids']

    self.assertAllEqual(first_ids(0), first_ids(0))
    self.assertNotAllEqual(first_ids(0), first_ids(1))

  def test_bad_sizes(self):
    with self.assertRaisesRegex(ValueError, 'seq_length'):
      bert_input.synthetic_bert_input_fn_builder(seq_length=4, vocab_size=100)
    with self.assertRaisesRegex(ValueError, 'vocab_size'):
      bert_input.synthetic_bert_input_fn_builder(seq_length=16, vocab_size=10,
                                                 num_labels=5)


if __name__ == '__main__':
  tf.test.main()
