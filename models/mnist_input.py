"""Reads MNIST-format TFRecords into `({'image': ...}, label)` batches.

The format is the one TensorFlow's MNIST `convert_to_records.py` writes and
`models.digits` writes from scikit-learn's digits: one `tf.train.Example` per
image with

  image_raw: bytes, H*W uint8 pixels, row-major (0 = background).
  label:     int64, the class.

(`height`/`width`/`depth` may be present too and are ignored.) A data
directory holds `train.tfrecords` and `test.tfrecords`.
"""

import os

import tensorflow as tf

import estimator_bf16 as eb

TRAIN_FILE = 'train.tfrecords'
TEST_FILE = 'test.tfrecords'

_FEATURES = {
    'image_raw': tf.io.FixedLenFeature([], tf.string),
    'label': tf.io.FixedLenFeature([], tf.int64),
}


def data_files(data_dir):
  """Returns (train path, test path) of an MNIST-format data directory."""
  return os.path.join(data_dir, TRAIN_FILE), os.path.join(data_dir, TEST_FILE)


def parse_examples(serialized, image_size=28, dtype=tf.float32):
  """Parses a batch of serialized MNIST-format examples.

  Args:
    serialized: [B] string tensor of `tf.train.Example`s.
    image_size: side of the square images stored in `image_raw`.
    dtype: dtype of the returned images, the compute dtype of the run.

  Returns:
    (features, labels): features is {'image': [B, image_size, image_size, 1]
    `dtype` in [0, 1]}; labels is [B] int32.
  """
  parsed = tf.io.parse_example(serialized, _FEATURES)
  pixels = tf.io.decode_raw(parsed['image_raw'], tf.uint8)
  images = tf.reshape(pixels, [-1, image_size, image_size, 1])
  # Scale in float32, then cast: the cast to bfloat16 happens here in the
  # parser, so the infeed carries half the bytes on a TPU.
  images = tf.cast(tf.cast(images, tf.float32) / 255.0, dtype)
  # tf.train.Example stores only int64, but TPUs want int32 labels.
  labels = tf.cast(parsed['label'], tf.int32)
  return {'image': images}, labels


def mnist_input_fn_builder(file_pattern, *, is_training, image_size=28,
                           shuffle_buffer=4096, seed=None):
  """Returns an `input_fn(params)` over MNIST-format TFRecords.

  Args:
    file_pattern: glob of TFRecord files.
    is_training: if True the records are shuffled and repeated forever;
      otherwise they are read once, in order (evaluation).
    image_size: side of the stored square images.
    shuffle_buffer: examples in the shuffle buffer (the whole digits set).
    seed: shuffle seed, for runs that must see the same order.

  Returns:
    `input_fn(params)` returning a `tf.data.Dataset` of (features, labels):
    features {'image': [B, image_size, image_size, 1]} in the dtype of
    `params.get('precision', 'float32')`, labels [B] int32, with
    B = `params['batch_size']` (the batch TPUEstimator hands each shard).
    Batches are full (`drop_remainder`) because TPUs need static shapes.
  """

  def input_fn(params):
    batch_size = params['batch_size']
    dtype = eb.compute_dtype(params.get('precision', 'float32'))
    files = tf.data.Dataset.list_files(file_pattern, shuffle=False)
    dataset = tf.data.TFRecordDataset(files)
    # MNIST-size data fits in memory; caching skips re-reading per epoch.
    dataset = dataset.cache()
    if is_training:
      dataset = dataset.shuffle(shuffle_buffer, seed=seed).repeat()
    # Batch, then parse the batch in one vectorised op: faster than a map
    # per example, and with a fixed prefetch depth the pipeline holds a
    # steady amount of memory, so step memory measurements are repeatable.
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda records: parse_examples(records, image_size,
                                                         dtype))
    return dataset.prefetch(2)

  return input_fn
