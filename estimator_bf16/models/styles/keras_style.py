"""A conv net from Keras layers called inside a TPUEstimator model_fn.

Written as users mix Keras into TF1 code: the layers are built and called
in the model_fn; the batch-norm moving averages are handed to the training
loop through the UPDATE_OPS collection.
"""

import tensorflow as tf

from estimator_bf16.models.styles import synthetic

NUM_CLASSES = synthetic.IMAGE_CLASSES


def network(images, is_training):
  """images float [B, 8, 8, 1] -> logits [B, NUM_CLASSES]."""
  layers = tf.keras.layers
  batch_norm = layers.BatchNormalization(momentum=0.9, name='bn')
  net = layers.Conv2D(16, 3, padding='same', use_bias=False,
                      name='conv1')(images)
  net = batch_norm(net, training=is_training)
  for update in batch_norm.updates:
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
  net = tf.nn.relu(net)
  net = layers.Conv2D(16, 3, strides=2, padding='same', activation='relu',
                      name='conv2')(net)
  net = layers.Flatten()(net)
  net = layers.Dense(64, activation='relu', name='hidden')(net)
  net = layers.LayerNormalization(name='ln')(net)
  return layers.Dense(NUM_CLASSES, name='logits')(net)


def model_fn_builder(learning_rate=3e-3):
  """Returns a legacy model_fn (features['image'] float32 [B, 8, 8, 1])."""
  return synthetic.image_model_fn_builder(network, learning_rate)


input_fn_builder = synthetic.image_input_fn_builder
