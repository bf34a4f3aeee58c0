"""A small residual conv net written with TF 1.x tf.layers."""

import tensorflow as tf


def batch_norm_relu(inputs, is_training, relu=True):
  inputs = tf.layers.batch_normalization(
      inputs=inputs, axis=3, momentum=0.9, epsilon=1e-5, center=True,
      scale=True, training=is_training, fused=True)
  return tf.nn.relu(inputs) if relu else inputs


def residual_block(inputs, filters, is_training, strides):
  shortcut = inputs
  if strides != 1 or inputs.get_shape()[3].value != filters:
    shortcut = tf.layers.conv2d(inputs, filters, 1, strides=strides,
                                padding='SAME', use_bias=False)
    shortcut = batch_norm_relu(shortcut, is_training, relu=False)
  x = tf.layers.conv2d(inputs, filters, 3, strides=strides, padding='SAME',
                       use_bias=False)
  x = batch_norm_relu(x, is_training)
  x = tf.layers.conv2d(x, filters, 3, padding='SAME', use_bias=False)
  x = batch_norm_relu(x, is_training, relu=False)
  return tf.nn.relu(x + shortcut)


def resnet_v1_generator(num_classes, width=16):
  """Returns model(inputs, is_training) -> logits, as resnet_model did."""

  def model(inputs, is_training):
    x = tf.layers.conv2d(inputs, width, 3, padding='SAME', use_bias=False)
    x = batch_norm_relu(x, is_training)
    x = residual_block(x, width, is_training, strides=1)
    x = residual_block(x, 2 * width, is_training, strides=2)
    x = tf.reduce_mean(x, axis=[1, 2])
    return tf.layers.dense(x, num_classes)

  return model
