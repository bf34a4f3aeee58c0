"""Runs the bfloat16 path once and prints its outputs as JSON (for test_onednn).

The parent runs this module with TF_ENABLE_ONEDNN_OPTS=0 and =1, which
TensorFlow reads once at start-up, so each setting needs its own process.
It prints one JSON object: whether oneDNN was on and which oneDNN ops ran,
for each kernel under test its bfloat16 output and a float64 reference of
the same op on the same inputs, and the eval results of a few training
steps of mnist_cnn in bfloat16.
"""

import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import _pywrap_util_port
# pylint: enable=g-direct-tensorflow-import

from estimator_bf16.apps import training

# Every kernel gets its own fed inputs, all exactly representable in
# bfloat16, so each output is one kernel's work on the very numbers the
# float64 reference sees: no error is inherited from an upstream bfloat16
# op. (Chained, a softmax of a bfloat16 matmul measures the matmul's
# rounding of large logits, amplified, not the softmax.)
_IMAGE = [4, 16, 16, 8]
_CONV_OUT = [4, 16, 16, 16]
_FILTER = [3, 3, 8, 16]
_SHAPES = {
    'image': _IMAGE, 'filter': _FILTER, 'conv_out': _CONV_OUT,
    'conv_grad': _CONV_OUT, 'a': [64, 256], 'b': [256, 128],
    'logits': [64, 128], 'product_grad': [64, 128],
}


def _inputs():
  """Fixed float32 inputs, rounded to bfloat16 so both dtypes hold them."""
  rng = np.random.RandomState(0)
  values = {}
  for name, shape in _SHAPES.items():
    value = rng.normal(size=shape)
    if name == 'logits':
      # Logits of a trained classifier: a spread of a few units.
      value *= 3.0
    values[name] = value.astype(tf.bfloat16.as_numpy_dtype).astype(
        np.float32)
  return values


def _batch_norm(x, dtype):
  """Training-mode batch norm, unit scale, zero offset, in `dtype`."""
  if dtype == tf.float64:
    # FusedBatchNorm has no float64 kernel: the same formula by hand.
    mean, variance = tf.nn.moments(x, axes=[0, 1, 2])
    return (x - mean) * tf.math.rsqrt(variance + 1e-3)
  normed, _, _ = tf.compat.v1.nn.fused_batch_norm(
      x, scale=tf.ones([x.shape[-1]]), offset=tf.zeros([x.shape[-1]]),
      is_training=True)
  return normed


def _kernels(t, dtype):
  """The kernels under test, in `dtype`, on the tensors `t` (by name)."""
  conv_in = lambda image, kernel: tf.nn.conv2d(image, kernel, 1, 'SAME')
  grad_input, grad_filter = tf.gradients(
      conv_in(t['image'], t['filter']), [t['image'], t['filter']],
      grad_ys=t['conv_grad'])
  return {
      'matmul': tf.matmul(t['a'], t['b']),
      'matmul_grad': tf.gradients(tf.matmul(t['a'], t['b']), t['a'],
                                  grad_ys=t['product_grad'])[0],
      'conv2d': conv_in(t['image'], t['filter']),
      'conv2d_grad_input': grad_input,
      'conv2d_grad_filter': grad_filter,
      'fused_batch_norm': _batch_norm(t['conv_out'], dtype),
      'relu': tf.nn.relu(t['conv_out']),
      'max_pool': tf.nn.max_pool2d(t['conv_out'], 2, 2, 'SAME'),
      'avg_pool': tf.nn.avg_pool2d(t['conv_out'], 2, 2, 'SAME'),
      'softmax': tf.nn.softmax(t['logits']),
  }


def _kernel_outputs():
  """bfloat16 outputs and float64 references, and the oneDNN ops that ran.

  The inputs are fed, not constants: grappler would otherwise fold the
  whole graph at optimisation time and no kernel under test would run.

  Returns:
    ({name: {'shape', 'values', 'reference'}}, sorted oneDNN op types).
  """
  feeds = _inputs()
  with tf.Graph().as_default():
    placeholders = {name: tf.compat.v1.placeholder(tf.float32, shape,
                                                   name=name)
                    for name, shape in _SHAPES.items()}
    outputs = {}
    for dtype in (tf.bfloat16, tf.float64):
      with tf.name_scope(dtype.name):
        cast = {name: tf.cast(p, dtype) for name, p in placeholders.items()}
        outputs[dtype.name] = {
            name: tf.cast(value, tf.float64)
            for name, value in _kernels(cast, dtype).items()}
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session() as session:
      values = session.run(
          outputs, {placeholders[name]: v for name, v in feeds.items()},
          options=tf.compat.v1.RunOptions(output_partition_graphs=True),
          run_metadata=metadata)
  onednn_ops = sorted({node.op for graph in metadata.partition_graphs
                       for node in graph.node if node.op.startswith('_Mkl')})
  return {name: {'shape': list(value.shape),
                 'values': value.ravel().tolist(),
                 'reference': values['float64'][name].ravel().tolist()}
          for name, value in values['bfloat16'].items()}, onednn_ops


def main():
  tf.compat.v1.disable_eager_execution()
  kernels, onednn_ops = _kernel_outputs()
  result = {'onednn': bool(_pywrap_util_port.IsMklEnabled()),
            'onednn_ops': onednn_ops, 'kernels': kernels}
  if '--kernels_only' not in sys.argv:
    with tempfile.TemporaryDirectory() as model_dir:
      run = training.run(training.TrainOptions(
          model='mnist_cnn', precision='bfloat16',
          model_dir=os.path.join(model_dir, 'model'), train_steps=4,
          train_batch_size=8, eval_batch_size=40, eval_steps=2,
          export=False))
    result['eval'] = run['eval']
  json.dump(result, sys.stdout)


if __name__ == '__main__':
  main()
