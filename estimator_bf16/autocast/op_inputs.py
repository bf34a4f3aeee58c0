"""An op's inputs by place, grouped by the type attribute they share.

The rules see an op as its `OpDef` and the keyword arguments given to
`_apply_op_helper`. An input's place is (its `OpDef` argument, the index
in a list input or None). Inputs that share a type attribute (`T`) must
end up with one dtype; a list input (AddN's, ConcatV2's) has one place per
element.
Also the two questions every rule asks of a value: its dtype, and whether
it is a plain Python or NumPy number.
"""

import numpy as np
import tensorflow as tf


def typed_inputs(op_def, keywords):
  """{type attr: [(arg, index or None)]} for the op's type-attr inputs.

  Lists (`number_attr` inputs such as AddN's or ConcatV2's) are made
  mutable lists in `keywords`, one place per element.

  Args:
    op_def: the op's `OpDef` proto.
    keywords: the op's keyword arguments (changed in place, see above).

  Returns:
    A dict from type attribute name to the places typed by it.
  """
  groups = {}
  for arg in op_def.input_arg:
    if not arg.type_attr or arg.name not in keywords:
      continue
    value = keywords[arg.name]
    if arg.number_attr and isinstance(value, (list, tuple)):
      keywords[arg.name] = list(value)
      arg_places = [(arg, i) for i in range(len(value))]
    else:
      arg_places = [(arg, None)]
    groups.setdefault(arg.type_attr, []).extend(arg_places)
  return groups


def get(keywords, place):
  """The value in `place` of `keywords`."""
  arg, index = place
  value = keywords[arg.name]
  return value if index is None else value[index]


def put(keywords, place, value):
  """Replaces the value in `place` of `keywords` by `value`."""
  arg, index = place
  if index is None:
    keywords[arg.name] = value
  else:
    keywords[arg.name][index] = value


def dtype_of(value):
  """The base `tf.DType` of a tensor or variable, or None for other values."""
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return value.dtype.base_dtype
  return None


def is_number(value):
  """True for a Python or NumPy number or numeric array (bools excluded)."""
  if isinstance(value, bool):
    return False
  if isinstance(value, (int, float, np.floating, np.integer)):
    return True
  return isinstance(value, np.ndarray) and value.dtype.kind in 'fiu'
