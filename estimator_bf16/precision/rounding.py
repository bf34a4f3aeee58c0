"""Which bfloat16 tensor is autocast's rounding of which float32 one.

Autocast computes some ops in float32 (softmax, uniform draws) and rounds
their results to 16 bits only so that the next op can stay bfloat16;
`bfloat16_scope` hands out bfloat16 casts of float32 variables. Each such
rounding is recorded here with the float32 tensor it rounds, so that
comparisons, float32 math and a model_fn's float32 outputs can use the
float32 value instead (`precision.casting.to_float32` gives it back).
"""

import weakref

import tensorflow as tf

from estimator_bf16.precision import op_lists

# The 16-bit floating dtypes: what a rounding of a float32 value has.
HALF_DTYPES = (tf.float16, tf.bfloat16)

# Graph -> {16-bit tensor ref: float32 tensor}. Keyed weakly by graph, so
# the entries go with the graph.
_FLOAT32_ORIGINALS = weakref.WeakKeyDictionary()

# Ops that only rearrange values, by op type: the float32 original of their
# output is the same op applied to the float32 original of their input.
# Each entry rebuilds `op` on another first input `x`.
REARRANGING = {
    op_lists.OP.Reshape: lambda op, x: tf.reshape(x, op.inputs[1]),
    op_lists.OP.ExpandDims: lambda op, x: tf.expand_dims(x, op.inputs[1]),
    op_lists.OP.Squeeze:
        lambda op, x: tf.squeeze(x, op.get_attr('squeeze_dims')),
    op_lists.OP.Identity: lambda op, x: tf.identity(x),
    op_lists.OP.Transpose: lambda op, x: tf.transpose(x, op.inputs[1]),
}


def remember_float32_original(rounded, original):
  """Records that `rounded` (bfloat16) is a rounding of `original` (float32).

  Args:
    rounded: a 16-bit `tf.Tensor`, of any shape.
    original: the float32 `tf.Tensor` of the same shape it was cast from.
  """
  _FLOAT32_ORIGINALS.setdefault(rounded.graph, {})[rounded.ref()] = original


def float32_original(tensor):
  """The float32 tensor `tensor` was rounded from by autocast, or None.

  Args:
    tensor: anything; only a `tf.Tensor` can have a float32 original.

  Returns:
    A float32 `tf.Tensor` of `tensor`'s shape, or None.
  """
  if not isinstance(tensor, tf.Tensor):
    return None
  table = _FLOAT32_ORIGINALS.get(tensor.graph)
  return table.get(tensor.ref()) if table else None


def exact_float32(tensor, depth=4):
  """`float32_original`, also through rearrangements of a rounding, or None.

  tf-slim's softmax reshapes around the op, and model code squeezes or
  reshapes probabilities before returning them: their float32 values are
  rebuilt by the same rearrangements of the float32 softmax.

  Args:
    tensor: anything; only a `tf.Tensor` can have a float32 original.
    depth: how many rearranging ops to look through.

  Returns:
    A float32 `tf.Tensor` of `tensor`'s shape (possibly built here), or None.
  """
  original = float32_original(tensor)
  if original is not None or depth == 0 or not isinstance(tensor, tf.Tensor):
    return original
  rebuild = REARRANGING.get(tensor.op.type)
  if rebuild is None:
    return None
  inner = exact_float32(tensor.op.inputs[0], depth - 1)
  return None if inner is None else rebuild(tensor.op, inner)
