"""The stand-ins for TensorFlow's op creation and tensor conversion.

`apply_op_with_autocast` replaces `op_def_library._apply_op_helper` and
decides, by op type (`op_lists`), which rule adjusts an op before it is
created; `convert_with_autocast` replaces
`tensor_conversion_registry.convert` and turns float32/bfloat16 conversions
into casts. Both act only on threads inside an autocast context (`state`)
and leave other threads, and autocast's own ops, to TensorFlow.
"""

import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from estimator_bf16.autocast import casts
from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.autocast import float32_list
from estimator_bf16.autocast import gelu_gradient
from estimator_bf16.autocast import graph_queries
from estimator_bf16.autocast import op_inputs
from estimator_bf16.autocast import state
from estimator_bf16.autocast import uniform_draws
from estimator_bf16.autocast import weights as autocast_weights
from estimator_bf16.autocast import zero_select
from estimator_bf16.precision import op_lists


def apply_op_with_autocast(op_type_name, name=None, **keywords):
  """Stands in for `_apply_op_helper` while any thread uses autocast."""
  mode = state.STATE.mode() if not state.STATE.busy else None
  if mode is None:
    return state.original_apply_op(op_type_name, name=name, **keywords)
  op_def = op_def_registry.get(op_type_name)
  if op_def is None:
    return state.original_apply_op(op_type_name, name=name, **keywords)
  state.STATE.busy = True
  try:
    return _autocast_op(mode, op_def, op_type_name, name, keywords)
  finally:
    state.STATE.busy = False


def convert_with_autocast(value, dtype=None, name=None, as_ref=False,
                          *args, **kwargs):
  """Stands in for `tensor_conversion_registry.convert`.

  Python wrappers often convert one input to another's dtype before any op
  exists (`tf.nn.bias_add` converts the bias to the value's dtype, a
  variable's `assign` converts the value to the variable's); between float32
  and bfloat16 that conversion becomes a cast instead of a ValueError.
  """
  if (dtype is not None and not as_ref and not state.STATE.busy and
      state.STATE.mode() is not None):
    have = op_inputs.dtype_of(value)
    want = tf.as_dtype(dtype).base_dtype
    if have in casts.FLOATS and want in casts.FLOATS and have != want:
      state.STATE.busy = True
      try:
        return casts.cast(value, want)
      finally:
        state.STATE.busy = False
  return state.original_convert(value, dtype, name, as_ref, *args, **kwargs)


def _autocast_op(mode, op_def, op_type, name, keywords):
  """Adjusts one op's inputs (and, for softmax, outputs) by the rules.

  Args:
    mode: `'bfloat16'` or `'float32_list'` (`state.STATE.mode()`).
    op_def: the op's `OpDef` proto.
    op_type: the op type.
    name: the op name asked for, or None.
    keywords: the op's keyword arguments.

  Returns:
    `_apply_op_helper`'s 4-tuple.
  """
  if op_type in op_lists.FLOAT32_KEEP_DTYPE_OPS:
    return float32_list.float32_keep_dtype(op_def, op_type, name, keywords)
  if op_type in op_lists.FLOAT32_OPS:
    return float32_list.float32_op(op_def, op_type, name, keywords)
  if op_type == op_lists.OP.Cast:
    return float32_list.remember_rounding(op_type, name, keywords)
  if op_type in op_lists.FLOAT32_RANDOM_OPS:
    return uniform_draws.float32_random(op_type, name, keywords)
  if op_type in op_lists.COMPARISON_OPS:
    uniform_draws.compare_float32_originals(op_def, keywords)
    return state.original_apply_op(op_type, name=name, **keywords)
  if mode == 'bfloat16' and op_type in op_lists.ZERO_SELECT_OPS:
    masked = zero_select.zero_select_as_multiply(op_type, name, keywords)
    if masked is not None:
      return masked
  casts.cast_fixed_type_args(op_def, keywords)
  asked = None
  if (mode == 'bfloat16' and op_type in op_lists.BFLOAT16_OPS and
      autocast_weights.wants_bfloat16(op_def, keywords)):
    casts.cast_float32_inputs(op_def, keywords)
    if op_type == op_lists.SPARSE_MATMUL_OP:
      op_type, keywords = op_lists.MATMUL_OP, autocast_weights.matmul_keywords(
          keywords)
    if cpu_kernels.substitutes(op_type):
      return cpu_kernels.build_substituted(
          op_def_registry.get(op_type), op_type, name, keywords)
    result = state.original_apply_op(op_type, name=name, **keywords)
    autocast_weights.recast_weights_late(result[2])
    return result
  elif mode == 'bfloat16' and op_type in op_lists.FOLLOW_BFLOAT16_OPS:
    source = graph_queries.bfloat16_source(keywords.get('x'))
    if source is not None:
      keywords['x'] = source
  else:
    if op_type in op_lists.FLOAT32_TWIN_OPS:
      # The inputs as given, for a float32 twin of loss arithmetic.
      asked = {key: list(value) if isinstance(value, list) else value
               for key, value in keywords.items()}
    # Also under the float32 list alone: its float32 results meet the
    # bfloat16 tensors they came from in the very next op.
    casts.unify_mixed_inputs(op_def, keywords)
  if (mode == 'bfloat16' and cpu_kernels.substitutes(op_type) and
      cpu_kernels.has_bfloat16_input(op_def, keywords)):
    return cpu_kernels.build_substituted(op_def, op_type, name, keywords)
  result = state.original_apply_op(op_type, name=name, **keywords)
  if asked is not None:
    float32_list.float32_twin(op_def, op_type, asked, result)
  if mode == 'bfloat16' and op_type == op_lists.OP.Mul:
    gelu_gradient.mark(result[2])
  return result
