"""The casts autocast makes between float32 and bfloat16, and when.

`cast` makes (or reuses) one cast per tensor, dtype and control-flow
context, and avoids a cast entirely where the other dtype already exists
(the float32 original of a rounding, the bfloat16 source of a float32
copy). The other functions apply it to an op's inputs: all 16-bit inputs to
float32 (the float32 list), all float32 inputs to bfloat16 (matmul/conv),
arguments of fixed float type, and type groups that mix the two.
"""

import tensorflow as tf

from estimator_bf16.autocast import graph_queries
from estimator_bf16.autocast import op_inputs
from estimator_bf16.autocast import state
from estimator_bf16.precision import op_lists
from estimator_bf16.precision import rounding

# The dtypes between which autocast casts.
FLOATS = frozenset([tf.bfloat16, tf.float32])


def cast(value, dtype):
  """`value` in `dtype`, reusing a cast already made for the same tensor.

  Args:
    value: a float32 or bfloat16 `tf.Tensor` or `tf.Variable`.
    dtype: `tf.float32` or `tf.bfloat16`.

  Returns:
    A `tf.Tensor` of `value`'s shape in `dtype`.
  """
  if dtype == tf.float32:
    original = rounding.float32_original(value)
    if original is not None:
      return original
  elif dtype == tf.bfloat16:
    source = graph_queries.bfloat16_source(value)
    if source is not None:
      return source  # bfloat16 -> float32 -> bfloat16 is exact: skip both.
  graph = tf.compat.v1.get_default_graph()
  # pylint: disable=protected-access
  context = graph._get_control_flow_context()
  key = (value.ref(), dtype, id(context))
  cached = state.STATE.casts.get(key)
  if cached is not None and cached.graph is graph:
    return cached
  made = None
  if dtype == tf.bfloat16:
    made = _rearranged_bfloat16_source(value)
  if made is None:
    made = tf.cast(value, dtype, name='autocast_' + dtype.name)
  # A cast made under control dependencies carries them; reusing it
  # elsewhere could order ops in a cycle, so only plain casts are kept.
  if not graph._control_dependencies_stack:
    state.STATE.casts[key] = made
  # pylint: enable=protected-access
  return made


def _rearranged_bfloat16_source(value, depth=4):
  """A rearranged float32 copy of a bfloat16 tensor, rebuilt in bfloat16.

  Keras layers cast their bfloat16 inputs to float32 and `Flatten` then
  reshapes the copy; a matmul that wants bfloat16 gets the same reshape of
  the bfloat16 original instead of a rounding of the float32 copy (same
  values), and the float32 copy, read by nothing else, never runs.

  Returns:
    The bfloat16 tensor, or None if `value` is not such a copy.
  """
  if depth == 0 or not isinstance(value, tf.Tensor):
    return None
  rebuild = rounding.REARRANGING.get(value.op.type)
  if rebuild is None:
    return None
  inner = value.op.inputs[0]
  source = graph_queries.bfloat16_source(inner)
  if source is None:
    source = _rearranged_bfloat16_source(inner, depth - 1)
  return None if source is None else rebuild(value.op, source)


def cast_half_inputs(op_def, keywords, dtype):
  """Casts every bfloat16/float16 type-attr input to `dtype` (float32)."""
  for group in op_inputs.typed_inputs(op_def, keywords).values():
    for place in group:
      value = op_inputs.get(keywords, place)
      if op_inputs.dtype_of(value) in rounding.HALF_DTYPES:
        op_inputs.put(keywords, place, cast(value, dtype))


def cast_float32_inputs(op_def, keywords):
  """Casts every float32 type-attr input to bfloat16."""
  for group in op_inputs.typed_inputs(op_def, keywords).values():
    for place in group:
      value = op_inputs.get(keywords, place)
      if op_inputs.dtype_of(value) == tf.float32:
        op_inputs.put(keywords, place, cast(value, tf.bfloat16))


def cast_fixed_type_args(op_def, keywords):
  """Casts 16-bit values given to arguments of a fixed float type to it.

  A bfloat16 tensor fed to an argument whose type is fixed to float32 (e.g.
  in_top_k's predictions) can only be meant as float32.
  """
  for arg in op_def.input_arg:
    if arg.type_attr or arg.type_list_attr or arg.name not in keywords:
      continue
    fixed = tf.as_dtype(arg.type)
    if not fixed.is_floating or arg.is_ref:
      continue
    value = keywords[arg.name]
    have = op_inputs.dtype_of(value)
    if have in rounding.HALF_DTYPES and have != fixed:
      keywords[arg.name] = cast(value, fixed)


def unify_mixed_inputs(op_def, keywords):
  """Gives each type group that mixes float32 and bfloat16 one dtype."""
  for group in op_inputs.typed_inputs(op_def, keywords).values():
    values = [(place, op_inputs.get(keywords, place)) for place in group]
    dtypes = {op_inputs.dtype_of(v) for _, v in values} - {None}
    if tf.bfloat16 not in dtypes or not dtypes <= FLOATS:
      continue
    if any(arg.is_ref for arg, _ in group):
      target = _ref_dtype(keywords, group)
    elif tf.float32 in dtypes:
      target = _mixed_target(values)
    elif any(op_inputs.is_number(v) for _, v in values):
      target = tf.bfloat16  # A number first would otherwise fix float32.
    else:
      continue
    for place, value in values:
      have = op_inputs.dtype_of(value)
      if have is not None:
        if have != target:
          op_inputs.put(keywords, place, cast(value, target))
      elif op_inputs.is_number(value):
        try:
          op_inputs.put(keywords, place,
                        tf.convert_to_tensor(value, dtype=target))
        except (TypeError, ValueError):
          pass  # Left for TensorFlow to convert, or to reject, as usual.


def _ref_dtype(keywords, group):
  """The dtype of the group's reference input: an assignment keeps it."""
  for place in group:
    arg, _ = place
    if arg.is_ref:
      return op_inputs.dtype_of(op_inputs.get(keywords, place))
  return tf.float32


def _mixed_target(values):
  """bfloat16, unless no bfloat16 input is a real bfloat16 activation.

  Roundings of float32 values (softmax outputs, weight reads) and constants
  are not: BERT's loss multiplies float32 one-hot labels by log-softmax
  output, and tf-slim's weight decay multiplies a float32 `L2Loss` by a
  bfloat16 constant; both products are computed in float32 (from the
  float32 originals), so the loss carries no bfloat16 rounding.
  """
  for _, value in values:
    if (op_inputs.dtype_of(value) == tf.bfloat16 and
        rounding.float32_original(value) is None and
        not (isinstance(value, tf.Tensor) and
             value.op.type == op_lists.OP.Const)):
      return tf.bfloat16
  return tf.float32
