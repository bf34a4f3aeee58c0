"""MNIST-size networks: the Keras-tutorial MLP and a small CNN.

Both are written with plain `tf.compat.v1` ops and `get_variable`, in the
precision-agnostic style the wrapper expects: every weight is requested in
the dtype of the activations, so a float32 input builds a float32 network
and a bfloat16 input (inside `eb.bfloat16_scope`) builds a bfloat16 network
whose variables are still stored as float32. No Keras layers: with v2
behaviour off they would create bfloat16 variables inside the scope.

    network_fn = mnist_mlp(MnistConfig())
    logits = network_fn(images, is_training=True)   # [B, 10], images' dtype
"""

import dataclasses
from typing import Tuple

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class MnistConfig:
  """Sizes of the MNIST-size networks.

  Attributes:
    image_size: height and width of the square grayscale input.
    num_classes: number of output logits.
    hidden_units: width of the MLP hidden layer (and of the CNN's dense
      layer); 512 as in the Keras tutorial.
    dropout_rate: fraction of hidden units dropped while training.
    conv_filters: output channels of the CNN's two 5x5 convolutions.
  """
  image_size: int = 28
  num_classes: int = 10
  hidden_units: int = 512
  dropout_rate: float = 0.2
  conv_filters: Tuple[int, int] = (32, 64)


def _dense(inputs, units, name, activation=None):
  """A fully connected layer whose weights take the dtype of `inputs`.

  Args:
    inputs: [B, D] float32 or bfloat16.
    units: output width.
    name: variable scope name; variables are `<name>/kernel`, `<name>/bias`.
    activation: optional elementwise function.

  Returns:
    [B, units], same dtype as `inputs`.
  """
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        'kernel', [inputs.shape[-1], units], dtype=inputs.dtype,
        initializer=tf.compat.v1.glorot_uniform_initializer())
    bias = tf.compat.v1.get_variable(
        'bias', [units], dtype=inputs.dtype,
        initializer=tf.compat.v1.zeros_initializer())
    outputs = tf.nn.bias_add(tf.matmul(inputs, kernel), bias)
    return activation(outputs) if activation else outputs


def _conv(inputs, filters, kernel_size, name):
  """A SAME-padded, stride-1 convolution + ReLU in the dtype of `inputs`.

  Args:
    inputs: [B, H, W, C] float32 or bfloat16, channels last.
    filters: output channels.
    kernel_size: side of the square kernel.
    name: variable scope name.

  Returns:
    [B, H, W, filters], same dtype as `inputs`.
  """
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        'kernel', [kernel_size, kernel_size, inputs.shape[-1], filters],
        dtype=inputs.dtype,
        initializer=tf.compat.v1.glorot_uniform_initializer())
    bias = tf.compat.v1.get_variable(
        'bias', [filters], dtype=inputs.dtype,
        initializer=tf.compat.v1.zeros_initializer())
    outputs = tf.nn.conv2d(inputs, kernel, strides=1, padding='SAME')
    return tf.nn.relu(tf.nn.bias_add(outputs, bias))


def _dropout(inputs, rate, is_training):
  # Dropout only while training; a rate of 0 adds no op at all.
  if not is_training or not rate:
    return inputs
  return tf.nn.dropout(inputs, rate=rate)


def _as_images(images, config):
  """Reshapes [B, H, W] or [B, H, W, 1] or [B, H*W] input to [B, H, W, 1]."""
  size = config.image_size
  return tf.reshape(images, [-1, size, size, 1])


def mnist_mlp(config=MnistConfig()):
  """Returns the MLP: Flatten, Dense 512 ReLU, Dropout 0.2, Dense 10.

  Args:
    config: an `MnistConfig`.

  Returns:
    `network_fn(images, is_training) -> logits`: `images` is [B, H, W, 1] (or
    any shape with H*W values per example), float32 or bfloat16; `logits` are
    [B, num_classes] in the same dtype (the head casts them to float32).
  """

  def network_fn(images, is_training):
    with tf.compat.v1.variable_scope('mnist_mlp'):
      flat = tf.reshape(images, [-1, config.image_size * config.image_size])
      hidden = _dense(flat, config.hidden_units, 'hidden', tf.nn.relu)
      hidden = _dropout(hidden, config.dropout_rate, is_training)
      return _dense(hidden, config.num_classes, 'logits')

  return network_fn


def mnist_cnn(config=MnistConfig()):
  """Returns a small CNN: two 5x5 conv + 2x2 max-pool, dense, dropout, dense.

  The layout of tensorflow/tpu's MNIST example, smaller by default.

  Args:
    config: an `MnistConfig`.

  Returns:
    `network_fn(images, is_training) -> logits` with the same contract as
    `mnist_mlp`.
  """

  def network_fn(images, is_training):
    with tf.compat.v1.variable_scope('mnist_cnn'):
      net = _as_images(images, config)
      for index, filters in enumerate(config.conv_filters):
        net = _conv(net, filters, 5, 'conv%d' % (index + 1))
        net = tf.nn.max_pool2d(net, ksize=2, strides=2, padding='SAME')
      net = tf.reshape(net, [-1, net.shape[1] * net.shape[2] * net.shape[3]])
      net = _dense(net, config.hidden_units, 'hidden', tf.nn.relu)
      net = _dropout(net, config.dropout_rate, is_training)
      return _dense(net, config.num_classes, 'logits')

  return network_fn
