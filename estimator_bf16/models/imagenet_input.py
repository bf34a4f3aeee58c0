"""ImageNet-format input pipelines: TFRecords of JPEGs, and a synthetic task.

Both return `input_fn(params)` closures for (TPU)Estimator: `params` carries
`batch_size` (the Estimator sets it) and `precision` ('float32' by default).
The image is cast to the compute dtype in the parser, before batching, so a
bfloat16 run moves half the bytes through the infeed and the network gets
bfloat16 input with no cast of its own. Labels stay int32 (TPUs have no
int64 arithmetic worth using).

Batches drop their remainder: a TPU compiles for one static batch shape.
"""

import numpy as np
import tensorflow as tf

from estimator_bf16.models import records
from estimator_bf16.precision import policy

# Per-channel RGB mean and standard deviation of ImageNet, on a 0..255 scale.
_MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# A label no writer produces, so a missing one is told apart from a bad one.
_NO_LABEL = -2**63
# Eval crops the centre `image_size / (image_size + 32)` of the shorter side,
# i.e. 224 out of 256, the usual ImageNet evaluation crop.
_EVAL_CROP_PADDING = 32


def _compute_dtype(params):
  """The image dtype: params['precision']'s compute dtype (float32 if unset).

  Raises:
    ValueError: params['precision'] is no precision; the message lists them.
  """
  try:
    return policy.compute_dtype(params.get('precision', 'float32'))
  except ValueError as e:
    raise ValueError("params['precision']: %s" % e) from e


def _check_example(example, label_offset, num_classes, path, offset):
  """An op failing, with the record named, on a missing or bad feature.

  A wrong label_offset would otherwise surface as a NaN loss or a silent
  gather error far from its cause.
  """
  encoded = example['image/encoded']
  stored = example['image/class/label']
  label = stored - label_offset
  no_image = tf.equal(tf.strings.length(encoded), 0)
  no_label = tf.equal(stored, _NO_LABEL)
  bad_label = tf.logical_not(no_label) & ((label < 0) | (label >= num_classes))

  def describe(_):
    text = tf.where(no_image, 'missing feature image/encoded (bytes)',
                    'missing feature image/class/label (int64)')
    return tf.where(bad_label, tf.strings.join([
        'label ', tf.strings.as_string(stored), ' - label_offset (%d) is '
        'outside [0, %d)' % (label_offset, num_classes)]), text)

  return records.check_records(
      tf.reshape(no_image | no_label | bad_label, [1]), describe,
      tf.reshape(path, [1]), tf.reshape(offset, [1]))


def _train_image(encoded, image_size):
  """Random crop covering 8%..100% of the area, random flip, resize."""
  shape = tf.image.extract_jpeg_shape(encoded)
  whole_image = tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4])
  begin, size, _ = tf.image.sample_distorted_bounding_box(
      shape, bounding_boxes=whole_image, min_object_covered=0.1,
      aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0),
      max_attempts=10, use_image_if_no_bounding_boxes=True)
  # Decoding only the crop window skips the rest of the JPEG.
  window = tf.stack([begin[0], begin[1], size[0], size[1]])
  image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
  image = tf.image.random_flip_left_right(image)
  return tf.image.resize(image, [image_size, image_size], method='bilinear')


def _eval_image(encoded, image_size):
  """Central square crop of the shorter side (minus padding), resize."""
  shape = tf.image.extract_jpeg_shape(encoded)
  height, width = shape[0], shape[1]
  fraction = image_size / (image_size + _EVAL_CROP_PADDING)
  crop = tf.cast(fraction * tf.cast(tf.minimum(height, width), tf.float32),
                 tf.int32)
  window = tf.stack([(height - crop + 1) // 2, (width - crop + 1) // 2,
                     crop, crop])
  image = tf.image.decode_and_crop_jpeg(encoded, window, channels=3)
  return tf.image.resize(image, [image_size, image_size], method='bilinear')


def _normalize(image):
  # resize returns float32 whatever the input, so this runs in float32.
  return (image - tf.constant(_MEAN_RGB)) / tf.constant(_STDDEV_RGB)


def imagenet_input_fn_builder(file_pattern, *, is_training, image_size,
                              num_classes, label_offset=1,
                              num_parallel_calls=tf.data.AUTOTUNE,
                              shuffle_buffer=1024, cache=False,
                              skip_corrupt=False, skipped=None):
  """Returns an input_fn reading ImageNet-format TFRecords.

  Each record is a tf.Example with `image/encoded` (JPEG bytes) and
  `image/class/label` (int64). Training takes a random crop (8%..100% of the
  area, aspect 3/4..4/3), flips at random and resizes; evaluation takes the
  central crop and resizes. Pixels are normalised with the ImageNet mean and
  standard deviation.

  Args:
    file_pattern: glob of TFRecord files, e.g. 'gs://bucket/train-*'.
    is_training: shuffle, augment and repeat forever when True; read once in
      order with the central crop when False.
    image_size: output height and width.
    num_classes: number of classes; labels outside [0, num_classes) after
      the offset fail at run time with the offending value.
    label_offset: subtracted from the stored label. The ImageNet TFRecords
      made by the Cloud TPU scripts (`imagenet_to_gcs.py`) store labels
      1..1000, keeping 0 for "background"; the default of 1 maps them to
      0..999. Use 0 for files with 0-based labels.
    num_parallel_calls: parallelism of the JPEG decoding map.
    shuffle_buffer: examples in the shuffle buffer while training.
    cache: keep the serialised records in memory after the first epoch
      (only for datasets that fit).
    skip_corrupt: skip the unreadable rest of a damaged file (with a
      warning) instead of failing; see `records.read_records`.
    skipped: a `records.SkippedFiles` recording what was skipped, or None.

  Returns:
    `input_fn(params)` -> `tf.data.Dataset` of `({'image': [B, S, S, 3]},
    labels [B] int32)`, with B = `params['batch_size']` and the image in
    float32 or bfloat16 per `params.get('precision', 'float32')`. A record
    without `image/encoded` or `image/class/label`, or with a label out of
    range, fails with a 'bad input:' error naming its file and offset.

  Raises:
    ValueError: if no file matches `file_pattern`.
  """
  if not tf.io.gfile.glob(file_pattern):
    raise ValueError('No ImageNet TFRecord files match %r.' % file_pattern)
  keys = {
      'image/encoded': tf.io.FixedLenFeature([], tf.string, default_value=''),
      'image/class/label': tf.io.FixedLenFeature(
          [], tf.int64, default_value=_NO_LABEL),
  }

  def input_fn(params):
    dtype = _compute_dtype(params)

    def parse(record, path, offset):
      example = tf.io.parse_single_example(record, keys)
      check = _check_example(example, label_offset, num_classes, path, offset)
      with tf.control_dependencies([check]):
        encoded = tf.identity(example['image/encoded'])
      if is_training:
        image = _train_image(encoded, image_size)
      else:
        image = _eval_image(encoded, image_size)
      image = tf.cast(_normalize(image), dtype)
      image.set_shape([image_size, image_size, 3])
      # int64 is all tf.Example stores; TPUs want int32.
      label = tf.cast(example['image/class/label'], tf.int32) - label_offset
      return {'image': image}, label

    dataset = records.read_records(file_pattern, skip_corrupt=skip_corrupt,
                                   skipped=skipped,
                                   shuffle_files=is_training, cycle_length=4)
    if cache:
      dataset = dataset.cache()
    if is_training:
      dataset = dataset.shuffle(shuffle_buffer).repeat()
    dataset = dataset.map(parse, num_parallel_calls=num_parallel_calls)
    dataset = dataset.batch(params['batch_size'], drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)

  return input_fn


def synthetic_imagenet_input_fn_builder(*, image_size, num_classes, seed=0,
                                        learnable=True, task_seed=0,
                                        noise_stddev=0.5, num_examples=None):
  """Returns an input_fn of generated images whose label the image shows.

  With `learnable=True` each class has a fixed random 8x8 RGB pattern; an
  example is its class pattern upsampled to `image_size` plus Gaussian
  noise, so a network can learn the task and the loss goes down. With
  `learnable=False` images are pure noise and labels random: only for
  throughput runs. Everything is computed with stateless TensorFlow ops (no
  Python generator, which a Cloud TPU host could not run), so the stream is
  the same on every run.

  Args:
    image_size: output height and width.
    num_classes: number of classes.
    seed: picks the examples; use different seeds for train and eval.
    learnable: see above.
    task_seed: picks the class patterns; keep it equal for train and eval so
      both see the same task.
    noise_stddev: standard deviation of the noise (patterns have unit
      standard deviation).
    num_examples: None for an endless stream, else that many examples.

  Returns:
    `input_fn(params)` -> `tf.data.Dataset` of `({'image': [B, S, S, 3]},
    labels [B] int32)` in the dtype `params.get('precision', 'float32')`
    names, B = `params['batch_size']`.
  """
  patterns = np.random.RandomState(task_seed).normal(
      size=(num_classes, 8, 8, 3)).astype(np.float32)

  def input_fn(params):
    dtype = _compute_dtype(params)
    pattern_table = tf.constant(patterns)

    def example(index):
      def op_seed(stream):
        # One independent stateless stream per (seed, draw, example).
        return tf.stack([tf.constant(seed * 2 + stream, tf.int64), index])

      label = tf.random.stateless_uniform(
          [], op_seed(0), minval=0, maxval=num_classes, dtype=tf.int32)
      noise = tf.random.stateless_normal([image_size, image_size, 3],
                                         op_seed(1))
      if not learnable:
        return {'image': tf.cast(noise, dtype)}, label
      pattern = tf.image.resize(tf.gather(pattern_table, label)[None],
                                [image_size, image_size], method='bilinear')
      image = pattern[0] + noise_stddev * noise
      return {'image': tf.cast(image, dtype)}, label

    count = num_examples if num_examples is not None else np.iinfo(np.int64).max
    dataset = tf.data.Dataset.range(count).map(
        example, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(params['batch_size'], drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)

  return input_fn
