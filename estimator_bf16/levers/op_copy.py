"""Copies of forward ops, for recompute and for accumulation on a device.

Both levers build a forward op again from new inputs: recompute to run a
segment a second time during backprop, the TPU's accumulation to run the
forward pass of another micro-batch inside the step. A copy has the
original's type, attributes (gradient overrides `_gradient_op_type` and
colocation `_class` included), device and static shapes, so TensorFlow
gives it the same kernel and the same gradient.
"""

# Attributes a compile context stamps on every op built inside it (XLA's
# `xla.compile`, a TPU's replicate). A copy built in that context is stamped
# again; one that arrived with the stamp already is refused as "nested".
_CONTEXT_ATTRS = ('_xla_compile_id', '_tpu_replicate')


def copy_op(graph, op, inputs, name):
  """Builds a copy of `op` reading `inputs`, in `graph`'s current context.

  Args:
    graph: the tf.Graph (or function graph) to build in: the default one.
    op: the tf.Operation to copy.
    inputs: list of tf.Tensor, aligned with `op.inputs`.
    name: the copy's name, within the current name scope.

  Returns:
    The new tf.Operation; its outputs have `op`'s outputs' static shapes.
  """
  attrs = {key: op.node_def.attr[key] for key in op.node_def.attr
           if key not in _CONTEXT_ATTRS}
  new = graph._create_op_internal(  # pylint: disable=protected-access
      op.type, inputs, dtypes=[t.dtype for t in op.outputs], name=name,
      attrs=attrs, op_def=op.op_def, compute_device=False)
  if op.device:
    new._set_device(op.device)  # pylint: disable=protected-access
  for old, copied in zip(op.outputs, new.outputs):
    copied.set_shape(old.shape)
  return new
