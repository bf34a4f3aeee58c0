"""Which forward ops a recomputing gradient copies, and which it reuses.

A recomputing gradient (`recompute.gradients_with_recompute`) works on the
forward ops on a data path from the tensors differentiated with respect to
(`xs`) to the differentiated tensors (`ys`). This module finds that path
and splits it into ops that are copied (recomputed in backprop) and ops
that are kept (their forward outputs reused). Kept are:

  * stateful ops: a new `random_uniform` would draw a new dropout mask, and
    variable reads and gathers (`ReadVariableOp`, `ResourceGather`) cost no
    compute to keep. Deterministic ops computed only from the output of a
    stateful op that is not a variable read (the `GreaterEqual` of a
    dropout's random numbers) are kept too when their output is no larger
    than what they read, so a segment keeps the 1-byte boolean mask rather
    than the float random numbers; a larger one (the mask's cast to the
    activation dtype) is recomputed from it. Casts of variable reads are
    recomputed;
  * ops inside TF1 control flow (`tf.compat.v1.cond` / `while_loop` frames:
    Enter, Exit, Switch, Merge and their bodies) and ops with reference
    inputs. Functional `If`, `While` and `PartitionedCall` ops are ordinary
    ops here (stateful ones are kept);
  * the ops of the `xs` themselves, so that every gradient reaches the very
    tensor asked for.
"""

import tensorflow as tf
from tensorflow.python.util import object_identity

from estimator_bf16.precision import op_lists

# Bytes an element of a dtype without a fixed size (strings, variants,
# resources) is counted as: such tensors are small handles in practice.
_UNSIZED_ELEMENT_BYTES = 0
# The size assumed for a dimension unknown when the graph is built (usually
# the batch): only the ratios of tensor sizes matter for placing the cuts.
_UNKNOWN_DIM_GUESS = 32


def tensor_bytes(tensor):
  """Static bytes of `tensor` (unknown dims counted as a fixed guess)."""
  try:
    element = tensor.dtype.base_dtype.size
  except (TypeError, ValueError):
    element = _UNSIZED_ELEMENT_BYTES
  if tensor.dtype.base_dtype in (tf.resource, tf.variant, tf.string):
    element = _UNSIZED_ELEMENT_BYTES
  shape = tensor.shape
  if shape.rank is None:
    return element * _UNKNOWN_DIM_GUESS
  count = 1
  for dim in shape.as_list():
    count *= _UNKNOWN_DIM_GUESS if dim is None else dim
  return element * count


def _in_tf1_control_flow(op, context):
  """True if `op` is inside a tf.compat.v1 cond or while_loop of the model.

  Frames around the gradient call itself (`context`: TPUEstimator's
  training loop, with control flow v1) hold the whole step and do not
  count. XLA/TPU replication contexts are control-flow contexts too; only
  cond and while frames matter here.
  """
  current = op._get_control_flow_context()  # pylint: disable=protected-access
  while current is not None and current is not context:
    if current.IsWhileContext() or current.IsCondContext():
      return True
    current = current.outer_context
  return False


# TF 1.x control-flow ops: a loop's entry of a value (a variable's handle
# entering TPUEstimator's training loop) is part of the loop, not a
# computation to repeat.
_CONTROL_FLOW_OPS = (op_lists.CONTROL_FLOW_OPS |
                     op_lists.REF_CONTROL_FLOW_OPS)


def _must_keep(op, context):
  """True if `op` must not be copied: its forward outputs are reused."""
  return (op._is_stateful or  # pylint: disable=protected-access
          op.type in _CONTROL_FLOW_OPS or
          _in_tf1_control_flow(op, context) or
          any(t.dtype._is_ref_dtype for t in op.inputs))  # pylint: disable=protected-access


def in_graph(tensors, graph):
  """Each of `tensors` as `graph` reads it.

  With control flow v2 a loop body (TPUEstimator's training loop, for one)
  is a function graph that reads outer tensors through placeholders of its
  own, its captures, one per level of nesting. TensorFlow's gradients see
  through them; a search along the consumers of a variable's handle must
  start from the placeholder the body's ops read.

  Args:
    tensors: list of tf.Tensor of `graph` or of graphs it is nested in.
    graph: the graph being built in (`tf.compat.v1.get_default_graph()`).

  Returns:
    A list aligned with `tensors`: the innermost capture of each in
    `graph`, or the tensor itself where it is not captured.
  """
  chain = [graph]
  while getattr(chain[-1], 'outer_graph', None) is not None:
    chain.append(chain[-1].outer_graph)
  result = list(tensors)
  for inner_graph in reversed(chain[:-1]):  # outermost function first
    captured = object_identity.ObjectIdentityDictionary()
    for external, internal in getattr(inner_graph, 'captures', ()):
      captured[external] = internal
    result = [captured.get(t, t) for t in result]
  return result


def ancestor_ops(ops, control_inputs):
  """`ops` and every op they depend on (a set of tf.Operation).

  TensorFlow's `op_selector.get_backward_walk_ops` does this walk, but it
  keeps the visited ops in a list: quadratic on a BERT-size graph.

  Args:
    ops: iterable of tf.Operation.
    control_inputs: also follow control inputs (what a session runs), or
      only data inputs (what a gradient flows through).
  """
  found, stack = set(), list(ops)
  while stack:
    op = stack.pop()
    if op in found:
      continue
    found.add(op)
    stack.extend(t.op for t in op.inputs)
    if control_inputs:
      stack.extend(op.control_inputs)
  return found


def path_ops(ys, x_tensors, stop_tensors):
  """Forward ops on a data path from `x_tensors` to `ys`, in creation order.

  Args:
    ys: list of tf.Tensor.
    x_tensors: list of tf.Tensor (resource handles for variables).
    stop_tensors: set of tf.Tensor through which gradients do not flow.

  Returns:
    list of tf.Operation sorted by `op._id` (a topological order: an op is
    always created after its inputs' ops).
  """
  ancestors = ancestor_ops([y.op for y in ys], control_inputs=False)
  reached = set()
  stack = [t for t in x_tensors]
  # Identity sets: tensors of a function graph are not hashable.
  seen_tensors = object_identity.ObjectIdentitySet()
  while stack:
    tensor = stack.pop()
    if tensor in seen_tensors or tensor in stop_tensors:
      continue
    seen_tensors.add(tensor)
    for consumer in tensor.consumers():
      if consumer in ancestors and consumer not in reached:
        reached.add(consumer)
        stack.extend(consumer.outputs)
  return sorted(reached, key=lambda op: op._id)  # pylint: disable=protected-access


def kept_ops(path, x_tensors):
  """Splits `path` ops into copied and kept (forward outputs reused).

  Args:
    path: list of tf.Operation in topological order.
    x_tensors: the tensors differentiated with respect to; their ops are
      kept, so that every gradient reaches the very tensor asked for.

  Returns:
    set of tf.Operation that are kept, not copied.
  """
  on_path = set(path)
  kept = set()
  random_like = set()  # Kept or derived from a stateful, non-read op.
  # The control-flow frame the gradients are built in.
  context = tf.compat.v1.get_default_graph()._get_control_flow_context()  # pylint: disable=protected-access
  x_ops = set(t.op for t in x_tensors)
  for op in path:
    if op in x_ops:
      kept.add(op)
      continue
    if _must_keep(op, context):
      kept.add(op)
      # A variable's read is a snapshot, not randomness: casts of it are
      # recomputed.
      if op.type not in op_lists.VARIABLE_READ_OPS:
        random_like.add(op)
      continue
    sources = [t for t in op.inputs if t.op in on_path]
    if sources and all(t.op in random_like for t in sources):
      # Deterministic given those kept values: keep the smaller side. A
      # derived op that is recomputed reads its (kept) inputs.
      random_like.add(op)
      in_bytes = sum(tensor_bytes(t) for t in sources)
      out_bytes = sum(tensor_bytes(t) for t in op.outputs)
      if out_bytes <= in_bytes:
        kept.add(op)
  return kept
