"""Questions autocast asks of the forward graph it is building.

Whether a float32 tensor is only a copy of a bfloat16 one, whether a
bfloat16 tensor is a cast of a variable read, and whether ops are being
built inside a TF1 control-flow context. The rules ask them while building
the forward pass; the gradient overrides (`gradients`) ask the first two
again in the backward pass, to re-make those copies late.
"""

import tensorflow as tf

from estimator_bf16.precision import op_lists


def bfloat16_source(value):
  """The bfloat16 tensor `value` is a float32 copy of, or None.

  Args:
    value: anything; only a float32 `tf.Tensor` made by a `Cast` qualifies.

  Returns:
    The `Cast`'s bfloat16 input (same shape), or None.
  """
  if (isinstance(value, tf.Tensor) and value.op.type == op_lists.OP.Cast and
      value.dtype.base_dtype == tf.float32 and
      value.op.inputs[0].dtype.base_dtype == tf.bfloat16):
    return value.op.inputs[0]
  return None


def captured_source(value):
  """The outer tensor a function graph's placeholder `value` stands for.

  With control flow v2 a loop body (TPUEstimator's training loop) is a
  function graph, which reads a variable's handle through a placeholder
  of its own (a capture).

  Returns:
    The captured tensor of the enclosing graph, or None when `value` is
    not a capture.
  """
  graph = value.graph
  for external, internal in getattr(graph, 'captures', ()):
    if internal is value:
      return external
  return None


def variable_read_source(value):
  """The float32 variable read that bfloat16 `value` is a cast of, or None.

  Only reads of resource variables count: a `ReadVariableOp` result is a
  snapshot (an update made while it is held copies the variable first), so
  casting it again later gives the same weights. A reference variable's
  read aliases a buffer the optimizer updates in place.

  Args:
    value: anything; only a bfloat16 `tf.Tensor` made by a `Cast` qualifies.

  Returns:
    The float32 `ReadVariableOp` output (same shape), or None.
  """
  if (isinstance(value, tf.Tensor) and value.op.type == op_lists.OP.Cast and
      value.dtype.base_dtype == tf.bfloat16):
    read = value.op.inputs[0]
    if (read.op.type == op_lists.READ_VARIABLE_OP and
        read.dtype.base_dtype == tf.float32):
      return read
  return None


def in_tf1_control_flow():
  """True while ops are built inside a TF1 control-flow context.

  That is a v1 while loop or cond, or TPU replication. A gradient built
  there cannot read a forward tensor other than its op's own inputs and
  outputs directly, so the gradients that re-make such a tensor late (the
  weight recast, the mask recast) are not used there; on a TPU XLA plans
  memory and fuses elementwise ops itself. TensorFlow 2's functional cond
  and while_loop build their bodies as functions, outside any such context,
  and their gradients read forward tensors as captures.
  """
  graph = tf.compat.v1.get_default_graph()
  return graph._get_control_flow_context() is not None  # pylint: disable=protected-access
