"""The float32 list: numerically sensitive ops computed in float32.

Losses, reductions, statistics and summaries (`op_lists.FLOAT32_OPS`)
compute in float32 and give float32 results; softmax and log-softmax
(`op_lists.FLOAT32_KEEP_DTYPE_OPS`) compute in float32 and hand back their
input's dtype, rounding the result. Each rounding, and TensorFlow's own
cast of a float32-list result back to 16 bits, is remembered (`rounding`)
so that float32 math and the model_fn's outputs use the float32 value; the
gradients of these ops read bfloat16 tensors, not float32 copies.
"""

import tensorflow as tf
from tensorflow.python.eager import execute

from estimator_bf16.autocast import casts
from estimator_bf16.autocast import gradients as autocast_gradients
from estimator_bf16.autocast import graph_queries
from estimator_bf16.autocast import op_inputs
from estimator_bf16.autocast import state
from estimator_bf16.precision import op_lists
from estimator_bf16.precision import rounding

# Ops between a float32-list op and the cast that rounds its result in
# TensorFlow's own loss code: rearrangements and the final division of a mean.
_PASS_THROUGH = frozenset(rounding.REARRANGING) | op_lists.LOSS_TAIL_OPS


def float32_op(op_def, op_type, name, keywords):
  """Builds a float32-list op (`op_lists.FLOAT32_OPS`) in float32.

  16-bit inputs are cast to float32. If an input is a float32 copy of a
  bfloat16 tensor, the op's gradient reads that tensor again instead of
  keeping the copy.

  Args:
    op_def: the op's `OpDef` proto.
    op_type: the op type.
    name: the op name asked for, or None.
    keywords: the op's keyword arguments, changed in place.

  Returns:
    `_apply_op_helper`'s 4-tuple.
  """
  casts.cast_half_inputs(op_def, keywords, tf.float32)
  result = state.original_apply_op(op_type, name=name, **keywords)
  op = result[2]
  if any(graph_queries.bfloat16_source(t) is not None for t in op.inputs):
    autocast_gradients.read_bfloat16_inputs_in_gradient(op)
  return result


def _float32_list_result(value, depth=4):
  """True if float32 `value` comes from a float32-list op within `depth` ops."""
  if value.dtype.base_dtype != tf.float32:
    return False
  op = value.op
  if (op.type in op_lists.FLOAT32_OPS or
      op.type in op_lists.FLOAT32_KEEP_DTYPE_OPS):
    return True
  if depth == 0 or op.type not in _PASS_THROUGH:
    return False
  return any(_float32_list_result(t, depth - 1) for t in op.inputs)


def remember_rounding(op_type, name, keywords):
  """A cast of a float32-list result to 16 bits is remembered as a rounding.

  TensorFlow's own loss code (`softmax_cross_entropy_with_logits`,
  `tf.compat.v1.losses.*`) computes in float32 and casts the result back to
  its input's dtype; a loss reduced from it, or returned by the model_fn,
  then uses the float32 value instead of its rounding.

  Model code written for bfloat16 by hand does the same with attention:
  `tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32)), tf.bfloat16)` (the
  tensorflow/tpu pattern). That softmax then gets the gradient autocast
  gives its own float32 softmax, which reads the rounding, so the float32
  probabilities are freed once cast instead of held for the backward pass.

  Args:
    op_type: `'Cast'`.
    name: the op name asked for, or None.
    keywords: the cast's keyword arguments (`x` is what is cast).

  Returns:
    `_apply_op_helper`'s 4-tuple for the cast, built as asked.
  """
  exact = _float32_original_of_cast(name, keywords)
  if exact is not None:
    return exact
  result = state.original_apply_op(op_type, name=name, **keywords)
  source = keywords.get('x')
  outputs = result[3]
  if (isinstance(source, tf.Tensor) and outputs and
      outputs[0].dtype.base_dtype in rounding.HALF_DTYPES and
      _float32_list_result(source)):
    rounding.remember_float32_original(outputs[0], source)
    if source.op.type == op_lists.SOFTMAX_OP:
      autocast_gradients.round_softmax_gradient(source.op)
  return result


def float32_keep_dtype(op_def, op_type, name, keywords):
  """Builds softmax or log-softmax in float32, rounded to its input's dtype.

  Args:
    op_def: the op's `OpDef` proto.
    op_type: one of `op_lists.FLOAT32_KEEP_DTYPE_OPS`.
    name: the op name asked for, or None.
    keywords: the op's keyword arguments, changed in place.

  Returns:
    `_apply_op_helper`'s 4-tuple; its outputs are 16-bit roundings of the
    float32 results (remembered as such) when an input was 16-bit.
  """
  dtypes = [op_inputs.dtype_of(op_inputs.get(keywords, place))
            for group in op_inputs.typed_inputs(op_def, keywords).values()
            for place in group]
  half = next((d for d in dtypes if d in rounding.HALF_DTYPES), None)
  if half is None:
    return state.original_apply_op(op_type, name=name, **keywords)
  casts.cast_half_inputs(op_def, keywords, tf.float32)
  structure, stateful, op, outputs = state.original_apply_op(
      op_type, name=name, **keywords)
  if op_type == op_lists.SOFTMAX_OP:
    autocast_gradients.round_softmax_gradient(op)
  rounded = []
  for output in outputs:
    if output.dtype == tf.float32:
      value = tf.cast(output, half, name=op.name.split('/')[-1] + '_' +
                      half.name)
      rounding.remember_float32_original(value, output)
      output = value
    rounded.append(output)
  return structure, stateful, op, rounded


def _float32_original_of_cast(name, keywords):
  """A cast of a rounding back to float32 is its float32 original.

  `tf.compat.v1.losses` casts the per-example loss (a bfloat16 rounding of
  the float32 cross-entropy, see `remember_rounding`) to float32 before
  weighting and reducing it; casting the rounding would put a bfloat16
  rounding inside the loss. The original is handed on under the cast's
  name (an `Identity`, so names that programs fetch stay valid).

  Args:
    name: the cast's name (`tf.cast` always gives one).
    keywords: the cast's keyword arguments (`x`, `DstT`).

  Returns:
    `_apply_op_helper`'s 4-tuple of the `Identity`, or None when `x` is not
    the rounding of a float32-list result (softmax excepted), the cast is
    not to float32, or a gradient tape records the op (it would read the
    cast's attributes).
  """
  source = keywords.get('x')
  if (not isinstance(source, tf.Tensor) or
      source.dtype.base_dtype not in rounding.HALF_DTYPES or
      tf.as_dtype(keywords.get('DstT')) != tf.float32 or
      execute.must_record_gradient()):
    return None
  original = rounding.float32_original(source)
  # Only a loss's rounding (a float32-list result that TensorFlow's loss
  # code cast): softmax gradients cast their rounding back on purpose, so
  # that the backward pass keeps no float32 copy of the probabilities.
  if (original is None or original.graph is not source.graph or
      original.op.type in op_lists.FLOAT32_KEEP_DTYPE_OPS or
      not _float32_list_result(original)):
    return None
  return state.original_apply_op(op_lists.OP.Identity, name=name,
                                 input=original)


def float32_twin(op_def, op_type, keywords, result):
  """Remembers the float32 value of scalar arithmetic on float32 values.

  `loss_a + loss_b`, `loss * 0.5`, `tf.identity(loss)` and
  `tf.compat.v1.losses.get_total_loss()` (an `Identity` or `AddN`) combine
  losses that TensorFlow's loss code rounded to bfloat16. The op is built
  as asked (its bfloat16 result is what the model code sees and
  differentiates); a float32 twin of it, computed from the float32
  originals, is remembered as the result's float32 original, so the loss
  the model_fn returns, and every float32 op reading it, use the value
  computed in float32. Only scalars get a twin: a loss is one number, and a
  twin of an activation (a softmax after dropout) would hold a float32 copy
  of a large tensor. The twin runs only if something reads it.

  Args:
    op_def: the op's `OpDef` proto.
    op_type: one of `op_lists.FLOAT32_TWIN_OPS`.
    keywords: the keyword arguments the op was built with, before
      `casts.unify_mixed_inputs` changed them.
    result: `_apply_op_helper`'s 4-tuple for the op as built.
  """
  outputs = result[3]
  if (len(outputs) != 1 or outputs[0].dtype.base_dtype != tf.bfloat16 or
      outputs[0].shape.rank != 0):
    return
  twin = dict(keywords)
  rounded = False
  for group in op_inputs.typed_inputs(op_def, twin).values():
    for place in group:
      value = op_inputs.get(twin, place)
      dtype = op_inputs.dtype_of(value)
      if dtype == tf.bfloat16:
        original = rounding.float32_original(value)
        if original is None and value.op.type != op_lists.OP.Const:
          return  # A bfloat16 activation: the op is bfloat16 arithmetic.
        rounded = rounded or original is not None
        value = original if original is not None else tf.cast(value,
                                                              tf.float32)
      elif op_inputs.is_number(value):
        value = tf.constant(value, tf.float32)
      elif dtype != tf.float32:
        return
      op_inputs.put(twin, place, value)
  if not rounded:
    return
  twin_result = state.original_apply_op(op_type, name=result[2].name.split(
      '/')[-1] + '_float32', **twin)
  rounding.remember_float32_original(outputs[0], twin_result[3][0])

