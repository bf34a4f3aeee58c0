"""Small learnable synthetic tasks for the style models, made on the fly."""

import numpy as np
import tensorflow as tf

from estimator_bf16.models import head

IMAGE_SIZE = 8
IMAGE_CLASSES = 4
_PROJECTION = np.random.RandomState(0).randn(IMAGE_SIZE * IMAGE_SIZE,
                                             IMAGE_CLASSES)


def images(num, seed):
  """Images whose label is the argmax of a fixed linear projection.

  Returns:
    float32 [num, 8, 8, 1] images in [0, 1) and int32 [num] labels in [0, 4).
  """
  pixels = np.random.RandomState(seed).rand(num, IMAGE_SIZE, IMAGE_SIZE, 1)
  labels = np.argmax(pixels.reshape(num, -1) @ _PROJECTION, axis=1)
  return pixels.astype(np.float32), labels.astype(np.int32)


def tokens(num, seed, seq_length, vocab_size):
  """Token sequences labelled 1 if their tokens come mostly from the low half.

  The first token is a [CLS]-like id 0 and the tail of each sequence is
  padding (id 0, mask 0): the classifier must average over the real tokens
  only, so a mask that does not work shows in the accuracy.

  Returns:
    dict of int32 [num, seq_length] 'input_ids', 'input_mask',
    'segment_ids', and int32 [num] labels in {0, 1}.
  """
  rng = np.random.RandomState(seed)
  labels = rng.randint(0, 2, size=num)
  # Each token is from the low half with probability 0.8 (label 1) or 0.2.
  low = rng.rand(num, seq_length) < np.where(labels == 1, 0.8, 0.2)[:, None]
  half = vocab_size // 2
  ids = np.where(low, rng.randint(1, half, size=(num, seq_length)),
                 rng.randint(half, vocab_size, size=(num, seq_length)))
  ids[:, 0] = 0
  lengths = rng.randint(seq_length // 2, seq_length + 1, size=num)
  mask = (np.arange(seq_length)[None, :] < lengths[:, None]).astype(np.int32)
  ids = ids * mask
  segments = (np.arange(seq_length)[None, :] >= lengths[:, None] // 2)
  features = {'input_ids': ids.astype(np.int32), 'input_mask': mask,
              'segment_ids': (segments * mask).astype(np.int32)}
  return features, labels.astype(np.int32)


def dataset_input_fn(features, labels, training):
  """An input_fn(params) over in-memory arrays, batched by params."""

  def input_fn(params):
    data = tf.data.Dataset.from_tensor_slices((features, labels))
    if training:
      data = data.shuffle(len(labels), seed=0).repeat()
    return data.batch(params['batch_size'], drop_remainder=True)

  return input_fn


def image_model_fn_builder(network_fn, learning_rate):
  """A legacy classifier model_fn around `network_fn(images, is_training)`."""
  return head.classifier_model_fn_builder(
      lambda params: network_fn, num_classes=IMAGE_CLASSES, optimizer='adam',
      learning_rate=learning_rate, feature_key='image')


def image_input_fn_builder(num, seed, training):
  """Returns input_fn(params) over `num` synthetic images ({'image': ...})."""
  pixels, labels = images(num, seed)
  return dataset_input_fn({'image': pixels}, labels, training)
