"""Gradient overrides that keep autocast's float32 ops from holding float32.

Two float32-list ops would keep a float32 copy of a bfloat16 activation alive
until the backward pass if TensorFlow's own gradient ran: softmax (its
gradient reads its float32 output) and ops fed with a float32 copy of a
bfloat16 tensor (layer-norm statistics). `autocasting` marks such ops with
`round_softmax_gradient` / `read_bfloat16_inputs_in_gradient`; the
gradients registered here then read the bfloat16 tensors instead, with the
same values, so those activations cost 2 bytes an element.
"""

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import ops as tf_ops

from estimator_bf16 import casting


def bfloat16_source(value):
  """The bfloat16 tensor `value` is a float32 copy of, or None."""
  if (isinstance(value, tf.Tensor) and value.op.type == 'Cast' and
      value.dtype.base_dtype == tf.float32 and
      value.op.inputs[0].dtype.base_dtype == tf.bfloat16):
    return value.op.inputs[0]
  return None


_SOFTMAX_GRADIENT = 'EstimatorBf16RoundedSoftmax'
_FROM_BFLOAT16_GRADIENT = 'EstimatorBf16FromBfloat16Inputs'


def _set_gradient(op, gradient_name):
  # Set on the op itself rather than through the graph's gradient override
  # map, so that no op another thread creates meanwhile is affected.
  op._set_attr('_gradient_op_type', attr_value_pb2.AttrValue(  # pylint: disable=protected-access
      s=gradient_name.encode()))


class _WithInputs(object):
  """An op seen by a gradient function with other (equal-valued) inputs."""

  def __init__(self, op, inputs):
    self._op = op
    self.inputs = inputs

  def __getattr__(self, name):
    return getattr(self._op, name)


@tf.RegisterGradient(_FROM_BFLOAT16_GRADIENT)
def _gradient_from_bfloat16_inputs(op, *grads):
  """The op's own gradient, reading float32 inputs anew from bfloat16.

  A float32-list op fed with a float32 copy of a bfloat16 tensor (layer norm
  statistics: `SquaredDifference(x, mean)`) has a gradient that reads that
  copy, which would keep 4 bytes an element alive until the backward pass.
  The copy is made again from the bfloat16 tensor when the gradient runs
  (after the incoming gradient, hence late); the values are identical, since
  bfloat16 -> float32 is exact.
  """
  ready = [g for g in grads if isinstance(g, tf.Tensor)]
  with tf.control_dependencies(ready):
    inputs = [tf.cast(bfloat16_source(t), tf.float32)
              if bfloat16_source(t) is not None else t for t in op.inputs]
  gradient_fn = tf_ops.gradient_registry.lookup(op.type)
  return gradient_fn(_WithInputs(op, inputs), *grads)


@tf.RegisterGradient(_SOFTMAX_GRADIENT)
def _rounded_softmax_gradient(op, grad):
  """Softmax's gradient computed from the bfloat16 rounding of its output.

  TensorFlow's own gradient reads the float32 output, which would keep a
  float32 copy of every attention-probability tensor alive until the
  backward pass, next to the bfloat16 one the attention matmul keeps. Read
  through the rounding, the float32 output is freed as soon as it is cast:
  attention costs 2 bytes an element, as in a bfloat16 network, while the
  forward values are still those of a float32 softmax.
  """
  probabilities = op.outputs[0]
  for consumer in probabilities.consumers():
    if (consumer.type == 'Cast' and
        consumer.outputs[0].dtype.base_dtype in casting.HALF_DTYPES):
      # After the incoming gradient: a cast with no other input would run
      # in the forward pass and hold its float32 copy until now.
      with tf.control_dependencies([grad]):
        probabilities = tf.cast(consumer.outputs[0], tf.float32)
      break
  grad = tf.cast(grad, tf.float32)
  inner = tf.reduce_sum(grad * probabilities, axis=-1, keepdims=True)
  return (grad - inner) * probabilities


def round_softmax_gradient(op):
  """Makes softmax `op`'s gradient read the bfloat16 rounding of its output."""
  _set_gradient(op, _SOFTMAX_GRADIENT)


def read_bfloat16_inputs_in_gradient(op):
  """Makes `op`'s gradient re-read its float32 inputs from bfloat16 ones."""
  _set_gradient(op, _FROM_BFLOAT16_GRADIENT)
