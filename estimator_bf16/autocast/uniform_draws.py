"""Uniform random numbers drawn, and compared, in float32.

A bfloat16 uniform draw holds only 128 values in [0, 1), which biases
dropout (see `op_lists.FLOAT32_RANDOM_OPS`). The draw is made in float32
and rounded, the rounding is remembered (`rounding`), and a comparison that
reads a remembered rounding compares the float32 original instead, so
dropout's `uniform >= rate` keeps exactly 1 - rate.
"""

import tensorflow as tf

from estimator_bf16.autocast import casts
from estimator_bf16.autocast import op_inputs
from estimator_bf16.autocast import state
from estimator_bf16.precision import rounding


def float32_random(op_type, name, keywords):
  """A bfloat16 uniform draw made in float32 and rounded (see op_lists).

  The rounding is remembered as such: a comparison reading it (dropout's
  `uniform >= rate`) compares the float32 draw, and the rounding itself,
  then read by nothing, never runs.

  Args:
    op_type: one of `op_lists.FLOAT32_RANDOM_OPS`.
    name: the op name asked for, or None.
    keywords: the op's keyword arguments; `dtype` is the draw's dtype.

  Returns:
    `_apply_op_helper`'s 4-tuple, its output the draw in the asked dtype.
  """
  half = keywords.get('dtype')
  if half is None or tf.as_dtype(half) not in rounding.HALF_DTYPES:
    return state.original_apply_op(op_type, name=name, **keywords)
  keywords['dtype'] = tf.float32
  structure, stateful, op, outputs = state.original_apply_op(
      op_type, name=name, **keywords)
  rounded = tf.cast(outputs[0], half, name=op.name.split('/')[-1] + '_' +
                    tf.as_dtype(half).name)
  rounding.remember_float32_original(rounded, outputs[0])
  return structure, stateful, op, [rounded]


def compare_float32_originals(op_def, keywords):
  """Makes a comparison of a remembered rounding compare in float32.

  The rounding is replaced by its float32 original, other 16-bit inputs
  are cast to float32 (exactly), and Python numbers are left to become
  float32 constants, unrounded. Comparisons without such an input are left
  as they are.

  Args:
    op_def: the comparison's `OpDef` proto.
    keywords: its keyword arguments, changed in place.
  """
  for group in op_inputs.typed_inputs(op_def, keywords).values():
    values = [(place, op_inputs.get(keywords, place)) for place in group]
    originals = [rounding.float32_original(value) for _, value in values]
    if all(original is None for original in originals):
      continue
    for (place, value), original in zip(values, originals):
      if original is not None:
        op_inputs.put(keywords, place, original)
      elif op_inputs.dtype_of(value) in rounding.HALF_DTYPES:
        op_inputs.put(keywords, place, casts.cast(value, tf.float32))
