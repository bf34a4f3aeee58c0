"""A conv net from tf-slim layers, batch norm included, as slim users write.

`slim.batch_norm` is passed as `normalizer_fn` through an `arg_scope`, and
its moving averages go to UPDATE_OPS, slim's default.
"""

import tf_slim as slim

from estimator_bf16.models.styles import synthetic

NUM_CLASSES = synthetic.IMAGE_CLASSES


def network(images, is_training):
  """images float [B, 8, 8, 1] -> logits [B, NUM_CLASSES]."""
  with slim.arg_scope([slim.conv2d, slim.fully_connected],
                      normalizer_fn=slim.batch_norm,
                      normalizer_params={'is_training': is_training,
                                         'decay': 0.9}):
    net = slim.conv2d(images, 16, [3, 3], scope='conv1')
    net = slim.max_pool2d(net, [2, 2], scope='pool1')
    net = slim.conv2d(net, 16, [3, 3], scope='conv2')
    net = slim.flatten(net)
    net = slim.fully_connected(net, 64, scope='fc1')
  return slim.fully_connected(net, NUM_CLASSES, activation_fn=None,
                              scope='logits')


def model_fn_builder(learning_rate=3e-3):
  """Returns a legacy model_fn (features['image'] float32 [B, 8, 8, 1])."""
  return synthetic.image_model_fn_builder(network, learning_rate)


input_fn_builder = synthetic.image_input_fn_builder
