"""A conv net from `tf.compat.v1.layers`, the tensorflow/tpu style."""

import tensorflow as tf

from estimator_bf16.models.styles import synthetic

NUM_CLASSES = synthetic.IMAGE_CLASSES


def network(images, is_training):
  """images float [B, 8, 8, 1] -> logits [B, NUM_CLASSES]."""
  layers = tf.compat.v1.layers
  net = layers.conv2d(images, 16, 3, padding='same', use_bias=False,
                      name='conv1')
  net = layers.batch_normalization(net, momentum=0.9, training=is_training,
                                    name='bn1')
  net = tf.nn.relu(net)
  net = layers.max_pooling2d(net, 2, 2)
  net = layers.conv2d(net, 16, 3, padding='same', activation=tf.nn.relu,
                      name='conv2')
  net = layers.flatten(net)
  net = layers.dense(net, 64, activation=tf.nn.relu, name='hidden')
  return layers.dense(net, NUM_CLASSES, name='logits')


def model_fn_builder(learning_rate=3e-3):
  """Returns a legacy model_fn (features['image'] float32 [B, 8, 8, 1])."""
  return synthetic.image_model_fn_builder(network, learning_rate)


input_fn_builder = synthetic.image_input_fn_builder
