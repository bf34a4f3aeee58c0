"""Runs the bfloat16 path once and prints its outputs as JSON (for test_onednn).

The parent runs this module with TF_ENABLE_ONEDNN_OPTS=0 and =1, which
TensorFlow reads once at start-up, so each setting needs its own process.
It prints one JSON object: whether oneDNN was on and which oneDNN ops ran,
the float32 values of a set of bfloat16 kernels (forward and gradient) on
fixed inputs, and the eval results of a few training steps of mnist_cnn in
bfloat16.
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

from models import training


def _kernel_outputs():
  """Float32 values of bfloat16 ops on fixed inputs, and the kernels used.

  The inputs are fed, not constants: grappler would otherwise fold the
  whole graph at optimisation time and no kernel under test would run.

  Returns:
    ({name: {'shape', 'values'}}, sorted oneDNN op types that ran).
  """
  rng = np.random.RandomState(0)
  shapes = {'x': [4, 16, 16, 8], 'kernel': [3, 3, 8, 16], 'a': [64, 256],
            'b': [256, 128]}
  feeds = {name: rng.normal(size=shape).astype(np.float32)
           for name, shape in shapes.items()}
  with tf.Graph().as_default():
    inputs = {name: tf.compat.v1.placeholder(tf.float32, shape, name=name)
              for name, shape in shapes.items()}
    x, kernel, a, b = (tf.cast(inputs[name], tf.bfloat16)
                       for name in ('x', 'kernel', 'a', 'b'))
    conv = tf.nn.conv2d(x, kernel, strides=1, padding='SAME')
    normed, _, _ = tf.compat.v1.nn.fused_batch_norm(
        conv, scale=tf.ones([16]), offset=tf.zeros([16]), is_training=True)
    relu = tf.nn.relu(normed)
    product = tf.matmul(a, b)
    outputs = {
        'matmul': product,
        'conv2d': conv,
        'fused_batch_norm': normed,
        'relu': relu,
        'max_pool': tf.nn.max_pool2d(relu, 2, 2, 'SAME'),
        'avg_pool': tf.nn.avg_pool2d(relu, 2, 2, 'SAME'),
        'softmax': tf.nn.softmax(product),
    }
    loss = tf.reduce_sum(tf.cast(relu, tf.float32) ** 2)
    outputs['conv2d_grad_input'], outputs['conv2d_grad_filter'] = (
        tf.gradients(loss, [x, kernel]))
    outputs['matmul_grad'] = tf.gradients(
        tf.reduce_sum(tf.cast(product, tf.float32) ** 2), a)[0]
    as_float32 = {name: tf.cast(t, tf.float32) for name, t in outputs.items()}
    metadata = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session() as session:
      values = session.run(
          as_float32, {inputs[name]: value for name, value in feeds.items()},
          options=tf.compat.v1.RunOptions(output_partition_graphs=True),
          run_metadata=metadata)
  onednn_ops = sorted({node.op for graph in metadata.partition_graphs
                       for node in graph.node if node.op.startswith('_Mkl')})
  return {name: {'shape': list(v.shape), 'values': v.ravel().tolist()}
          for name, v in values.items()}, onednn_ops


def main():
  tf.compat.v1.disable_eager_execution()
  kernels, onednn_ops = _kernel_outputs()
  result = {'onednn': bool(_pywrap_util_port.IsMklEnabled()),
            'onednn_ops': onednn_ops, 'kernels': kernels}
  with tempfile.TemporaryDirectory() as model_dir:
    run = training.run(training.TrainOptions(
        model='mnist_cnn', precision='bfloat16',
        model_dir=os.path.join(model_dir, 'model'), train_steps=4,
        train_batch_size=8, eval_batch_size=40, eval_steps=2, export=False))
  result['eval'] = run['eval']
  json.dump(result, sys.stdout)


if __name__ == '__main__':
  main()
