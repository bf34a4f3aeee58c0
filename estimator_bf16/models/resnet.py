"""ResNet v1 (depths 18 to 152) in plain `tf.compat.v1` ops, channels last.

The network takes its compute dtype from the images: every convolution and
dense weight is requested with `get_variable(..., dtype=images.dtype)`, so
float32 images build a float32 network and bfloat16 images, inside
`eb.bfloat16_scope('bfloat16')`, build a bfloat16 network whose weights are
stored as float32 and read through a cast. Batch norm is the exception: its
scale, offset and moving statistics are requested as float32 (a moving
average must be assigned to, and the scope only passes float32 requests
through as real variables), and `fused_batch_norm` accepts bfloat16
activations with float32 parameters.

No Keras layers and no `tf.compat.v1.layers`, so the same code runs on
TensorFlow versions that only keep `tf.compat.v1` ops and `get_variable`.

    network_fn = resnet_v1(ResNetConfig(depth=50))
    logits = network_fn(images, is_training=True)   # [B, 1000], images' dtype

Bottleneck blocks put the stride on the 3x3 convolution (the "v1.5" layout
used by the Cloud TPU reference model and torchvision); the parameter counts
are those of the usual ResNet-18/34/50/101/152 (11.7M, 21.8M, 25.6M, 44.5M,
60.2M with 1000 classes).

Variable names depend on the depth and layout only, never on the precision,
so a checkpoint written in one precision restores in the other.
"""

import dataclasses

import tensorflow as tf

# depth -> (block kind, blocks per group); the four groups have 64, 128, 256
# and 512 base filters (bottleneck blocks output 4x that).
_LAYOUTS = {
    18: ('basic', (2, 2, 2, 2)),
    34: ('basic', (3, 4, 6, 3)),
    50: ('bottleneck', (3, 4, 6, 3)),
    101: ('bottleneck', (3, 4, 23, 3)),
    152: ('bottleneck', (3, 8, 36, 3)),
}
DEPTHS = tuple(sorted(_LAYOUTS))

_GROUP_FILTERS = (64, 128, 256, 512)
_GROUP_STRIDES = (1, 2, 2, 2)
_BOTTLENECK_EXPANSION = 4


@dataclasses.dataclass
class ResNetConfig:
  """Sizes and initialisation of a ResNet v1.

  Attributes:
    depth: one of 18, 34 (basic blocks), 50, 101, 152 (bottleneck blocks).
    num_classes: width of the logits.
    image_size: height = width of the images the input pipelines produce
      (and the serving input expects); the network itself accepts any
      spatial size of at least 32.
    batch_norm_momentum: decay of the moving statistics,
      `moving = momentum * moving + (1 - momentum) * batch`.
    batch_norm_epsilon: added to the variance; `fused_batch_norm` raises
      anything below 1.001e-5 to that value.
    zero_init_last_bn: start the last batch-norm scale of each residual
      branch at 0, so every block starts as the identity; this makes large
      batches train better (Goyal et al., 2017).
    dense_init_stddev: standard deviation of the final dense layer's
      weights (convolutions use He initialisation, fan-out, as in the paper).
  """
  depth: int = 50
  num_classes: int = 1000
  image_size: int = 224
  batch_norm_momentum: float = 0.9
  batch_norm_epsilon: float = 1e-5
  zero_init_last_bn: bool = True
  dense_init_stddev: float = 0.01


def _check_depth(depth):
  if depth not in _LAYOUTS:
    raise ValueError('ResNet depth must be one of %s, got %r.' %
                     (', '.join(str(d) for d in DEPTHS), depth))
  return _LAYOUTS[depth]


def batch_norm(inputs, is_training, *, momentum, epsilon, zero_init=False,
               name='batch_norm'):
  """Fused batch norm with float32 parameters for float32 or bfloat16 inputs.

  While training, the batch statistics normalise the batch and the moving
  statistics are updated by ops added to `tf.compat.v1.GraphKeys.UPDATE_OPS`
  (the caller runs them with the train op, as with `tf.compat.v1.layers`).

  Args:
    inputs: [B, H, W, C] float32 or bfloat16.
    is_training: Python bool; True uses batch statistics and adds updates.
    momentum: decay of the moving averages.
    epsilon: variance epsilon.
    zero_init: start the scale (gamma) at 0 instead of 1.
    name: variable scope name; variables are `gamma`, `beta`,
      `moving_mean` and `moving_variance` under it, all float32 [C].

  Returns:
    [B, H, W, C] in the dtype of `inputs`.
  """
  channels = inputs.shape[-1]
  with tf.compat.v1.variable_scope(name):
    # float32 requests pass through the bfloat16 scope untouched: the
    # parameters stay real float32 variables, which the moving-average
    # assignments below need, and which fused_batch_norm wants for bfloat16
    # inputs anyway.
    def float32_variable(var_name, initializer, trainable=True):
      return tf.compat.v1.get_variable(
          var_name, [channels], dtype=tf.float32, initializer=initializer,
          trainable=trainable)

    gamma = float32_variable(
        'gamma', tf.compat.v1.zeros_initializer() if zero_init
        else tf.compat.v1.ones_initializer())
    beta = float32_variable('beta', tf.compat.v1.zeros_initializer())
    moving_mean = float32_variable(
        'moving_mean', tf.compat.v1.zeros_initializer(), trainable=False)
    moving_variance = float32_variable(
        'moving_variance', tf.compat.v1.ones_initializer(), trainable=False)

    if not is_training:
      outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
          inputs, gamma, beta, mean=moving_mean, variance=moving_variance,
          epsilon=epsilon, is_training=False)
      return outputs

    # The batch mean and variance come back in float32 whatever the input
    # dtype (the kernel accumulates in float32), and the variance is already
    # Bessel-corrected for the moving average.
    outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(
        inputs, gamma, beta, epsilon=epsilon, is_training=True)
    decay = 1.0 - momentum
    for moving, batch in ((moving_mean, mean), (moving_variance, variance)):
      update = tf.compat.v1.assign_sub(moving, (moving - batch) * decay)
      tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
    return outputs


def _conv(inputs, filters, kernel_size, strides, name='conv'):
  """Convolution without bias; weights in the dtype of `inputs`.

  Strided convolutions pad `kernel_size - 1` in total, split as evenly as
  possible, and then use VALID padding, so the padding does not depend on
  whether the input size is odd or even (TensorFlow's SAME pads
  asymmetrically, by an input-dependent amount, when strided).

  Args:
    inputs: [B, H, W, C] float32 or bfloat16.
    filters: output channels.
    kernel_size: side of the square kernel.
    strides: 1 or 2.
    name: variable scope name; the variable is `<name>/kernel`.

  Returns:
    [B, H / strides, W / strides, filters] in the dtype of `inputs`.
  """
  padding = 'SAME'
  if strides > 1:
    total = kernel_size - 1
    before = total // 2
    inputs = tf.pad(inputs, [[0, 0], [before, total - before],
                             [before, total - before], [0, 0]])
    padding = 'VALID'
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        'kernel', [kernel_size, kernel_size, inputs.shape[-1], filters],
        dtype=inputs.dtype,
        initializer=tf.compat.v1.variance_scaling_initializer(
            scale=2.0, mode='fan_out', distribution='truncated_normal'))
  return tf.nn.conv2d(inputs, kernel, strides=strides, padding=padding)


def _basic_block(inputs, filters, strides, config, is_training):
  """Two 3x3 convolutions plus the shortcut; output has `filters` channels."""
  bn = dict(momentum=config.batch_norm_momentum,
            epsilon=config.batch_norm_epsilon)
  shortcut = _shortcut(inputs, filters, strides, bn, is_training)
  net = _conv(inputs, filters, 3, strides, name='conv1')
  net = tf.nn.relu(batch_norm(net, is_training, name='bn1', **bn))
  net = _conv(net, filters, 3, 1, name='conv2')
  net = batch_norm(net, is_training, zero_init=config.zero_init_last_bn,
                   name='bn2', **bn)
  return tf.nn.relu(net + shortcut)


def _bottleneck_block(inputs, filters, strides, config, is_training):
  """1x1 reduce, 3x3 (strided), 1x1 expand to 4 * `filters`, plus shortcut."""
  bn = dict(momentum=config.batch_norm_momentum,
            epsilon=config.batch_norm_epsilon)
  out_filters = _BOTTLENECK_EXPANSION * filters
  shortcut = _shortcut(inputs, out_filters, strides, bn, is_training)
  net = _conv(inputs, filters, 1, 1, name='conv1')
  net = tf.nn.relu(batch_norm(net, is_training, name='bn1', **bn))
  net = _conv(net, filters, 3, strides, name='conv2')
  net = tf.nn.relu(batch_norm(net, is_training, name='bn2', **bn))
  net = _conv(net, out_filters, 1, 1, name='conv3')
  net = batch_norm(net, is_training, zero_init=config.zero_init_last_bn,
                   name='bn3', **bn)
  return tf.nn.relu(net + shortcut)


def _shortcut(inputs, out_filters, strides, bn, is_training):
  # A projection only where the shape changes; an identity elsewhere keeps
  # the parameter count of the published networks.
  if strides == 1 and inputs.shape[-1] == out_filters:
    return inputs
  net = _conv(inputs, out_filters, 1, strides, name='projection')
  return batch_norm(net, is_training, name='projection_bn', **bn)


def _check_images(images):
  if images.dtype not in (tf.float32, tf.bfloat16):
    raise TypeError('ResNet images must be float32 or bfloat16 (cast them in '
                    'the input pipeline), got %s.' % images.dtype.name)
  if images.shape.rank != 4 or images.shape[-1] != 3:
    raise ValueError('ResNet images must be [batch, height, width, 3] '
                     '(channels last), got shape %s.' % images.shape)


def resnet_v1(config=None):
  """Returns a ResNet v1 network function.

  Args:
    config: a `ResNetConfig`; None means `ResNetConfig()` (ResNet-50,
      1000 classes).

  Returns:
    `network_fn(images, is_training) -> logits`. `images` is [B, H, W, 3]
    float32 or bfloat16, channels last; `is_training` a Python bool (batch
    statistics and moving-average updates in `UPDATE_OPS` when True);
    `logits` are [B, num_classes] in the dtype of `images`; the caller casts
    them to float32 before the loss. Variables live under `resnet/`.

  Raises:
    ValueError: if `config.depth` is not one of 18, 34, 50, 101, 152.
  """
  config = config or ResNetConfig()
  kind, blocks_per_group = _check_depth(config.depth)
  block_fn = _basic_block if kind == 'basic' else _bottleneck_block

  def network_fn(images, is_training):
    _check_images(images)
    with tf.compat.v1.variable_scope('resnet'):
      with tf.compat.v1.variable_scope('stem'):
        net = _conv(images, 64, 7, 2)
        net = tf.nn.relu(batch_norm(
            net, is_training, momentum=config.batch_norm_momentum,
            epsilon=config.batch_norm_epsilon))
        net = tf.nn.max_pool2d(net, ksize=3, strides=2, padding='SAME')
      for group, num_blocks in enumerate(blocks_per_group):
        for block in range(num_blocks):
          strides = _GROUP_STRIDES[group] if block == 0 else 1
          with tf.compat.v1.variable_scope('group%d/block%d' % (group + 1,
                                                                block)):
            net = block_fn(net, _GROUP_FILTERS[group], strides, config,
                           is_training)
      with tf.compat.v1.variable_scope('logits'):
        # Averaging 7x7 (or more) values is done in float32; the cast back
        # keeps the dense layer in the compute dtype.
        pooled = tf.reduce_mean(tf.cast(net, tf.float32), axis=[1, 2])
        pooled = tf.cast(pooled, images.dtype)
        kernel = tf.compat.v1.get_variable(
            'kernel', [pooled.shape[-1], config.num_classes],
            dtype=images.dtype,
            initializer=tf.compat.v1.random_normal_initializer(
                stddev=config.dense_init_stddev))
        bias = tf.compat.v1.get_variable(
            'bias', [config.num_classes], dtype=images.dtype,
            initializer=tf.compat.v1.zeros_initializer())
        return tf.nn.bias_add(tf.matmul(pooled, kernel), bias)

  return network_fn
