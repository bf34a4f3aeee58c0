"""Reads MNIST-format TFRecords into `({'image': ...}, label)` batches.

The format is the one TensorFlow's MNIST `convert_to_records.py` writes and
`estimator_bf16.models.digits` writes from scikit-learn's digits: one `tf.train.Example` per
image with

  image_raw: bytes, H*W uint8 pixels, row-major (0 = background).
  label:     int64, the class.

(`height`/`width`/`depth` may be present too and are ignored.) A data
directory holds `train.tfrecords` and `test.tfrecords`.

A record without `image_raw` or `label`, an image of the wrong size or a
label outside [0, num_classes) fails with a message naming the record's
file and byte offset (see `estimator_bf16/models/records.py`).
"""

import os

import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.models import records

TRAIN_FILE = 'train.tfrecords'
TEST_FILE = 'test.tfrecords'

# A label no writer produces, so a missing one is told apart from a bad one.
_NO_LABEL = -2**63
_FEATURES = {
    'image_raw': tf.io.FixedLenFeature([], tf.string, default_value=''),
    'label': tf.io.FixedLenFeature([], tf.int64, default_value=_NO_LABEL),
}


def data_files(data_dir):
  """Returns (train path, test path) of an MNIST-format data directory."""
  return os.path.join(data_dir, TRAIN_FILE), os.path.join(data_dir, TEST_FILE)


def _check(parsed, image_size, num_classes, paths, offsets):
  """An op failing on the first record that cannot be used, naming it."""
  sizes = tf.strings.length(parsed['image_raw'])
  labels = parsed['label']
  no_label = tf.equal(labels, _NO_LABEL)
  bad_label = tf.zeros_like(no_label)
  if num_classes is not None:
    bad_label = tf.logical_and(tf.logical_not(no_label), tf.logical_or(
        labels < 0, labels >= num_classes))
  pixels = image_size * image_size
  bad = no_label | bad_label | tf.not_equal(sizes, pixels)

  def describe(i):
    wrong_size = tf.strings.join([
        'feature image_raw holds ', tf.strings.as_string(sizes[i]),
        ' bytes, but --image_size=%d needs %d (%dx%d uint8 pixels)' % (
            image_size, pixels, image_size, image_size)])
    text = tf.where(tf.equal(sizes[i], 0), 'missing feature image_raw (bytes)',
                    wrong_size)
    text = tf.where(no_label[i], 'missing feature label (int64)', text)
    if num_classes is not None:
      text = tf.where(bad_label[i], tf.strings.join([
          'label ', tf.strings.as_string(labels[i]), ' is outside [0, %d) '
          '(--num_classes=%d)' % (num_classes, num_classes)]), text)
    return text

  return records.check_records(bad, describe, paths, offsets)


def parse_examples(serialized, image_size=28, dtype=tf.float32,
                   num_classes=None, paths=None, offsets=None):
  """Parses a batch of serialized MNIST-format examples.

  Args:
    serialized: [B] string tensor of `tf.train.Example`s.
    image_size: side of the square images stored in `image_raw`.
    dtype: dtype of the returned images, the compute dtype of the run.
    num_classes: if set, labels must lie in [0, num_classes).
    paths, offsets: [B] file and byte offset of each record, to name a bad
      one (see `records.read_records`); None names it by batch index.

  Returns:
    (features, labels): features is {'image': [B, image_size, image_size, 1]
    `dtype` in [0, 1]}; labels is [B] int32. Evaluating them fails with a
    'bad input:' error on a record with a missing feature, an image of
    another size or a label out of range.
  """
  parsed = tf.io.parse_example(serialized, _FEATURES)
  with tf.control_dependencies([_check(parsed, image_size, num_classes,
                                       paths, offsets)]):
    pixels = tf.io.decode_raw(parsed['image_raw'], tf.uint8)
  images = tf.reshape(pixels, [-1, image_size, image_size, 1])
  # Scale in float32, then cast: the cast to bfloat16 happens here in the
  # parser, so the infeed carries half the bytes on a TPU.
  images = tf.cast(tf.cast(images, tf.float32) / 255.0, dtype)
  # tf.train.Example stores only int64, but TPUs want int32 labels.
  labels = tf.cast(parsed['label'], tf.int32)
  return {'image': images}, labels


def mnist_input_fn_builder(file_pattern, *, is_training, image_size=28,
                           num_classes=None, shuffle_buffer=4096, seed=None,
                           skip_corrupt=False, skipped=None):
  """Returns an `input_fn(params)` over MNIST-format TFRecords.

  Args:
    file_pattern: glob of TFRecord files.
    is_training: if True the records are shuffled and repeated forever;
      otherwise they are read once, in order (evaluation).
    image_size: side of the stored square images.
    num_classes: if set, a label outside [0, num_classes) is an error.
    shuffle_buffer: examples in the shuffle buffer (the whole digits set).
    seed: shuffle seed, for runs that must see the same order.
    skip_corrupt: skip the unreadable rest of a damaged file (with a
      warning) instead of failing; see `records.read_records`.
    skipped: a `records.SkippedFiles` recording what was skipped, or None.

  Returns:
    `input_fn(params, input_context=None)` returning a `tf.data.Dataset` of
    (features, labels), sharded by worker when a distribution strategy
    passes a `tf.distribute.InputContext`:
    features {'image': [B, image_size, image_size, 1]} in the dtype of
    `params.get('precision', 'float32')`, labels [B] int32, with
    B = `params['batch_size']` (the batch TPUEstimator hands each shard,
    or each replica of a strategy).
    Batches are full (`drop_remainder`) because TPUs need static shapes.

  Raises:
    records.InputError: no file matches, or the files are empty.
  """

  def input_fn(params, input_context=None):
    batch_size = params['batch_size']
    dtype = eb.compute_dtype(params.get('precision', 'float32'))
    dataset = records.read_records(file_pattern, skip_corrupt=skip_corrupt,
                                   skipped=skipped)
    if input_context is not None and input_context.num_input_pipelines > 1:
      # Each worker of a multi-worker run reads its own share of the
      # records, so the replicas see different examples.
      dataset = dataset.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    # MNIST-size data fits in memory; caching skips re-reading per epoch.
    dataset = dataset.cache()
    if is_training:
      dataset = dataset.shuffle(shuffle_buffer, seed=seed).repeat()
    # Batch, then parse the batch in one vectorised op: faster than a map
    # per example, and with a fixed prefetch depth the pipeline holds a
    # steady amount of memory, so step memory measurements are repeatable.
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda serialized, paths, offsets: parse_examples(
        serialized, image_size, dtype, num_classes, paths, offsets))
    return dataset.prefetch(2)

  return input_fn
