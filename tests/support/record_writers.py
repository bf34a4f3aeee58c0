"""Writers of the model families' TFRecord formats, for tests only.

The package reads these formats (`estimator_bf16.models.imagenet_input`,
`bert_input`); only the tests write them, from examples they make up, so
the writers live here and are not installed.
"""

import numpy as np
import tensorflow as tf

# The id features of a run_classifier example, in its order.
_ID_KEYS = ('input_ids', 'input_mask', 'segment_ids')


def _encode_jpegs(images):
  # A private graph and session, so this works whether or not the caller
  # runs eagerly (the tests run in graph mode).
  with tf.Graph().as_default():
    placeholder = tf.compat.v1.placeholder(tf.uint8, [None, None, 3])
    encode = tf.io.encode_jpeg(placeholder, quality=95)
    with tf.compat.v1.Session() as session:
      return [session.run(encode, {placeholder: image}) for image in images]


def write_imagenet_tfrecord(path, images_uint8, labels):
  """Writes images and labels as ImageNet-format TFRecords.

  Args:
    path: output file.
    images_uint8: sequence of [H, W, 3] uint8 arrays (sizes may differ).
    labels: sequence of ints, stored as given (1-based for the ImageNet
      convention that `label_offset=1` expects).
  """
  if len(images_uint8) != len(labels):
    raise ValueError('Got %d images but %d labels.' %
                     (len(images_uint8), len(labels)))
  encoded = _encode_jpegs([np.asarray(image, np.uint8)
                           for image in images_uint8])
  with tf.io.TFRecordWriter(path) as writer:
    for data, image, label in zip(encoded, images_uint8, labels):
      height, width = np.shape(image)[:2]

      def ints(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

      def raw(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

      example = tf.train.Example(features=tf.train.Features(feature={
          'image/encoded': raw(data),
          'image/format': raw(b'JPEG'),
          'image/class/label': ints(int(label)),
          'image/height': ints(int(height)),
          'image/width': ints(int(width)),
      }))
      writer.write(example.SerializeToString())


def write_bert_tfrecord(path, examples):
  """Writes classification examples as `run_classifier`-format TFRecords.

  Args:
    path: output file.
    examples: iterable of dicts with `input_ids`, `input_mask`,
      `segment_ids` (sequences of ints, all the same length) and `label_ids`
      (an int). `is_real_example` = 1 is added so BERT's own
      `run_classifier.py` reads the file too.

  Returns:
    Number of records written.
  """
  count = 0
  with tf.io.TFRecordWriter(path) as writer:
    for example in examples:
      def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(
            value=[int(v) for v in values]))

      feature = {key: ints(example[key]) for key in _ID_KEYS}
      feature['label_ids'] = ints([example['label_ids']])
      feature['is_real_example'] = ints([1])
      record = tf.train.Example(features=tf.train.Features(feature=feature))
      writer.write(record.SerializeToString())
      count += 1
  return count
