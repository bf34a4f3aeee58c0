"""Gradient overrides that keep autocast's casts from living until backprop.

Two float32-list ops would keep a float32 copy of a bfloat16 activation alive
until the backward pass if TensorFlow's own gradient ran: softmax (its
gradient reads its float32 output) and ops fed with a float32 copy of a
bfloat16 tensor (layer-norm statistics). Autocast marks such ops with
`round_softmax_gradient` / `read_bfloat16_inputs_in_gradient`; the
gradients registered here then read the bfloat16 tensors instead, with the
same values, so those activations cost 2 bytes an element.

A matmul/conv reading a bfloat16 cast of a variable would likewise keep
that copy of the weights from the forward pass until its gradient runs, so
at the step's peak (the start of the backward pass) a bfloat16 copy of
nearly every weight would sit next to the float32 variables. Marked with
`recast_weights_in_gradient`, its gradient casts the variable's read anew
once the incoming gradient exists; the forward copy is freed after the
forward op. (`weights` marks only ops whose weights meet enough rows of
activations for that cast to be cheap: `RECAST_MIN_ROWS`.)

A `select(mask, x, 0)` that autocast computes as `multiply_no_nan(x,
cast(mask))` would keep that bfloat16 mask (2 bytes an element) for its
gradient where the select kept the boolean one (1 byte). Marked with
`recast_mask_in_gradient`, its gradient casts the boolean mask again.

(`gelu_gradient` uses `set_gradient` and `after_gradients` for a GELU
gradient that reads only the GELU's input and its tanh or erf. Which
tensors are such copies is asked of `graph_queries`.)
"""

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import ops as tf_ops

from estimator_bf16.autocast import graph_queries
from estimator_bf16.precision import rounding
from estimator_bf16.precision import op_lists

_SOFTMAX_GRADIENT = 'EstimatorBf16RoundedSoftmax'
_FROM_BFLOAT16_GRADIENT = 'EstimatorBf16FromBfloat16Inputs'
_RECAST_WEIGHTS_GRADIENT = 'EstimatorBf16RecastWeights'
_RECAST_MASK_GRADIENT = 'EstimatorBf16RecastMask'


def set_gradient(op, gradient_name):
  """Makes `op`'s gradient the one registered as `gradient_name`.

  A gradient the model asked for (`gradient_override_map`) stays.
  """
  try:
    op.get_attr('_gradient_op_type')
    return
  except ValueError:
    pass
  # Set on the op itself rather than through the graph's gradient override
  # map, so that no op another thread creates meanwhile is affected.
  op._set_attr('_gradient_op_type', attr_value_pb2.AttrValue(  # pylint: disable=protected-access
      s=gradient_name.encode()))


class WithTensors(object):
  """An op seen by a gradient function with other (equal-valued) tensors.

  Args:
    op: the `tf.Operation`.
    inputs: the inputs its gradient should read.
    outputs: the outputs its gradient should read; None: `op.outputs`.
  """

  def __init__(self, op, inputs, outputs=None):
    self._op = op
    self.inputs = inputs
    self.outputs = op.outputs if outputs is None else outputs

  def __getattr__(self, name):
    return getattr(self._op, name)


def after_gradients(grads):
  """Control dependencies that make an op run once `grads` exist.

  The dependency is on the op that computed each gradient, past the
  `Identity` of a gradient tuple (`gate_gradients`): that identity waits
  for every gradient of the op downstream, and with oneDNN TensorFlow fuses
  some of those (`BiasAddGrad`) into the very backprop op that reads our
  new op, a cycle that silently skips the update.
  """
  ops = []
  for grad in grads:
    if not isinstance(grad, tf.Tensor):
      continue
    while grad.op.type == op_lists.OP.Identity and grad.op.inputs:
      grad = grad.op.inputs[0]
    ops.append(grad.op)
  return tf.control_dependencies(ops)


def _own_gradient_recasting(op, grads, source_of):
  """TensorFlow's gradient of `op`, reading some inputs from new casts.

  Each input `t` for which `source_of(t)` names a tensor is replaced by a
  cast of that tensor to `t`'s dtype, made once `grads` exist.
  """
  with after_gradients(grads):
    inputs = [t if source_of(t) is None else tf.cast(source_of(t), t.dtype)
              for t in op.inputs]
  gradient_fn = tf_ops.gradient_registry.lookup(op.type)
  return gradient_fn(WithTensors(op, inputs), *grads)


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
  return _own_gradient_recasting(op, grads, graph_queries.bfloat16_source)


@tf.RegisterGradient(_RECAST_WEIGHTS_GRADIENT)
def _gradient_with_weights_recast(op, *grads):
  """The op's own gradient, reading its bfloat16 weights from a new cast.

  The new cast waits for the incoming gradient, so it runs in the backward
  pass, just before the gradient that reads it; it reads the same variable
  snapshot as the forward cast, so the values are identical. It costs one
  more cast of the weights per step (ResNet-50: 13 ms of kernel time in a
  4.2 s step) and saves holding them all through the peak (BERT-base at
  batch 32: 162 MiB of its 209 MiB of copies).
  """
  return _own_gradient_recasting(op, grads,
                                 graph_queries.variable_read_source)


@tf.RegisterGradient(_RECAST_MASK_GRADIENT)
def _gradient_with_mask_recast(op, grad):
  """Gradient of `multiply_no_nan(x, cast(mask))` for a boolean `mask`.

  `multiply_no_nan(grad, cast(mask))`, the select's gradient bit for bit,
  with the mask cast anew once `grad` exists: the forward cast is freed
  after the forward op, and the step keeps only the boolean mask. Where `x`
  was broadcast the gradient is summed back to its shape. The mask gets no
  gradient.
  """
  value, mask = op.inputs
  # The boolean mask behind the forward cast; a copy of the op in a loop
  # body (accumulation on a TPU) may read the cast through a capture.
  source = (mask.op.inputs[0]
            if mask.op.type == op_lists.OP.Cast and mask.op.inputs else mask)
  with after_gradients([grad]):
    mask = tf.cast(source, grad.dtype)
  grad_value = tf.math.multiply_no_nan(grad, mask)
  if not (value.shape.is_fully_defined() and
          value.shape == grad_value.shape):
    value_shape = tf.shape(value)
    axes, _ = tf.raw_ops.BroadcastGradientArgs(
        s0=value_shape, s1=tf.shape(grad_value))
    grad_value = tf.reshape(tf.reduce_sum(grad_value, axes), value_shape)
  return tf.cast(grad_value, value.dtype), None


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
    if (consumer.type == op_lists.OP.Cast and
        consumer.outputs[0].dtype.base_dtype in rounding.HALF_DTYPES):
      # After the incoming gradient: a cast with no other input would run
      # in the forward pass and hold its float32 copy until now.
      with after_gradients([grad]):
        probabilities = tf.cast(consumer.outputs[0], tf.float32)
      break
  grad = tf.cast(grad, tf.float32)
  inner = tf.reduce_sum(grad * probabilities, axis=-1, keepdims=True)
  return (grad - inner) * probabilities


def round_softmax_gradient(op):
  """Makes softmax `op`'s gradient read the bfloat16 rounding of its output."""
  set_gradient(op, _SOFTMAX_GRADIENT)


def read_bfloat16_inputs_in_gradient(op):
  """Makes `op`'s gradient re-read its float32 inputs from bfloat16 ones."""
  set_gradient(op, _FROM_BFLOAT16_GRADIENT)


def recast_weights_in_gradient(op):
  """Makes `op`'s gradient cast its variable reads to bfloat16 anew."""
  set_gradient(op, _RECAST_WEIGHTS_GRADIENT)


def recast_mask_in_gradient(op):
  """Makes `multiply_no_nan(x, cast(mask))`'s gradient cast `mask` anew."""
  set_gradient(op, _RECAST_MASK_GRADIENT)
