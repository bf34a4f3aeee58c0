"""Converts scikit-learn's shipped handwritten digits to MNIST-format TFRecords.

scikit-learn installs 1,797 8x8 digit images (`sklearn.datasets.load_digits`,
no download), so every MNIST-size run works from a fresh clone. Each image is
scaled up 3x (nearest neighbour, 24x24) and padded by 2 pixels to MNIST's
28x28, with ink 0..16 mapped to 0..255 uint8, then split into train and test
with a fixed seed.

`write_digits(out_dir)` writes `train.tfrecords` (1,437 images) and
`test.tfrecords` (360 images); `ensure_digits()` does the same on demand into
a cache directory, and `digits_cli` from the shell.
"""

import os
import tempfile

import numpy as np

# Divisible by 8, 40, 72, 90 and 120: whole eval batches, nothing dropped.
NUM_TEST = 360
IMAGE_SIZE = 28
_SCALE = 3
_VERSION = 1  # bump when the conversion changes, so caches are rebuilt


def digits_as_mnist():
  """Returns scikit-learn's digits as MNIST-like arrays.

  Returns:
    (images, labels): images is [1797, 28, 28] uint8 with the digit in the
    central 24x24; labels is [1797] int64 in 0..9.
  """
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  images = digits.images  # [N, 8, 8] float, ink 0..16
  images = np.repeat(np.repeat(images, _SCALE, axis=1), _SCALE, axis=2)
  pad = (IMAGE_SIZE - 8 * _SCALE) // 2
  images = np.pad(images, ((0, 0), (pad, pad), (pad, pad)))
  images = np.clip(np.round(images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
  return images, digits.target.astype(np.int64)


def split(images, labels, seed=0, num_test=NUM_TEST):
  """Shuffles with `seed` and returns ((train images, labels), (test ...))."""
  order = np.random.RandomState(seed).permutation(len(labels))
  test, train = order[:num_test], order[num_test:]
  return (images[train], labels[train]), (images[test], labels[test])


def serialize_example(image, label):
  """Returns one MNIST-format `tf.train.Example` as bytes.

  Args:
    image: [H, W] uint8 array.
    label: int class.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  height, width = image.shape

  def int64(value):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

  feature = {
      'height': int64(height),
      'width': int64(width),
      'depth': int64(1),
      'label': int64(label),
      'image_raw': tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[np.ascontiguousarray(image, np.uint8).tobytes()])),
  }
  return tf.train.Example(
      features=tf.train.Features(feature=feature)).SerializeToString()


def write_records(path, images, labels):
  """Writes `images` [N, H, W] uint8 and `labels` [N] to one TFRecord file."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  with tf.io.TFRecordWriter(path) as writer:
    for image, label in zip(images, labels):
      writer.write(serialize_example(image, label))


def write_digits(out_dir, seed=0):
  """Writes `train.tfrecords` and `test.tfrecords` into `out_dir`.

  Args:
    out_dir: directory, created if missing.
    seed: seed of the train/test split.

  Returns:
    dict with the number of 'train' and 'test' examples written.
  """
  from estimator_bf16.models import mnist_input  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  (train_x, train_y), (test_x, test_y) = split(*digits_as_mnist(), seed=seed)
  train_path, test_path = mnist_input.data_files(out_dir)
  write_records(train_path, train_x, train_y)
  write_records(test_path, test_x, test_y)
  return {'train': len(train_y), 'test': len(test_y)}


def default_cache_dir():
  """`$ESTIMATOR_BF16_CACHE`, else `$XDG_CACHE_HOME/estimator_bf16`."""
  if os.environ.get('ESTIMATOR_BF16_CACHE'):
    return os.environ['ESTIMATOR_BF16_CACHE']
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'estimator_bf16')


def ensure_digits(cache_dir=None, seed=0):
  """Returns a directory holding the digits TFRecords, writing them if needed.

  The files are written into a temporary sibling directory and renamed into
  place, so concurrent runs never see half-written records.

  Args:
    cache_dir: parent directory; `default_cache_dir()` if None.
    seed: seed of the train/test split (part of the directory name).

  Returns:
    str, a data directory for `--data_dir` (MNIST-format).
  """
  cache_dir = cache_dir or default_cache_dir()
  data_dir = os.path.join(cache_dir, 'digits-v%d-seed%d' % (_VERSION, seed))
  if os.path.isdir(data_dir):
    return data_dir
  os.makedirs(cache_dir, exist_ok=True)
  staging = tempfile.mkdtemp(prefix='.digits-', dir=cache_dir)
  write_digits(staging, seed=seed)
  try:
    os.rename(staging, data_dir)
  except OSError:
    # Another process finished first; its copy is identical.
    for name in os.listdir(staging):
      os.remove(os.path.join(staging, name))
    os.rmdir(staging)
  return data_dir
