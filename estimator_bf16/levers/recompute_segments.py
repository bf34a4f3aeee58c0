"""Backprop through cut segments, each recomputed from its checkpoints.

Given the forward path cut into segments (`recompute_cuts`), `backprop`
walks the segments from last to first. For each, it copies the segment's
recomputable forward ops into the graph (`op_copy`), fed with the
checkpoints, and takes `tf.compat.v1.gradients`
of the copied outputs with respect to the segment's inputs, so every
gradient function, override and aggregation is TensorFlow's own. The last
segment is not copied: its activations are needed right when the forward
pass ends.

A segment's first copies wait (control dependencies) for every gradient of
the segment after it, not only for those reaching its outputs: with one op
at a time the executor otherwise runs the copies early, or leaves side
branches (a `BiasAddGrad`, whose input is as large as an activation) to
the end of the step, and their inputs pile up across all segments
(measured: no saving at all without it).
"""

import tensorflow as tf
from tensorflow.python.ops import gradients_impl
from tensorflow.compiler.tf2xla.python import xla as tf2xla
from tensorflow.python.util import object_identity

from estimator_bf16.levers import op_copy
from estimator_bf16.levers import xla_order
from estimator_bf16.platform import xla_context
from estimator_bf16.precision import op_lists


def sum_gradients(grads):
  """Sums gradient contributions (tf.Tensor and/or tf.IndexedSlices)."""
  grads = [g for g in grads if g is not None]
  if not grads:
    return None
  if len(grads) == 1:
    return grads[0]
  if all(isinstance(g, tf.IndexedSlices) for g in grads):
    # As TensorFlow aggregates sparse gradients: concatenated rows, the
    # duplicates summed by whoever applies them.
    dense_shape = next((g.dense_shape for g in grads
                        if g.dense_shape is not None), None)
    return tf.IndexedSlices(tf.concat([g.values for g in grads], 0),
                            tf.concat([g.indices for g in grads], 0),
                            dense_shape)
  return tf.math.add_n([tf.convert_to_tensor(g) for g in grads])


def backprop(graph, chunks, kept, grads, x_tensors, ys, stop_tensors,
             kwargs):
  """Sends the gradients in `grads` back through `chunks`, last first.

  Args:
    graph: the tf.Graph.
    chunks: the segments, lists of tf.Operation in topological order, in
      forward order.
    kept: set of tf.Operation that are not copied.
    grads: identity map {tf.Tensor: list of gradient contributions}, seeded
      with the gradients of `ys`; the gradients of every segment's inputs
      (checkpoints and `x_tensors`) are added to it.
    x_tensors: the tensors differentiated with respect to.
    ys: the differentiated tensors.
    stop_tensors: set of tf.Tensor through which gradients do not flow.
    kwargs: other arguments of `tf.compat.v1.gradients`.
  """
  # Identity sets and maps throughout: the tensors of a function graph (a
  # loop body with control flow v2) are neither hashable nor comparable.
  x_set = object_identity.ObjectIdentitySet(x_tensors)
  y_set = object_identity.ObjectIdentitySet(ys)
  chunk_of = {}
  for number, chunk in enumerate(chunks):
    for op in chunk:
      chunk_of[op] = number
  later_grads = []
  for number in reversed(range(len(chunks))):
    chunk = chunks[number]
    outputs, incoming = _outputs_with_gradients(chunk, grads, stop_tensors,
                                                y_set)
    if not outputs:
      continue
    entries = _entries(chunk, number, chunk_of, x_set)
    if not entries:
      continue
    scope = 'segment_%d' % number
    if number == len(chunks) - 1:
      copies = object_identity.ObjectIdentityDictionary()
    else:
      # Waiting for all of the later segment's gradients, not only those
      # reaching this segment's outputs (see the module docstring).
      copies = _copy_segment(graph, chunk, kept,
                             _gradient_ops(incoming + later_grads),
                             scope + '_forward', entries)
    # An x made inside the segment is an entry too, but its gradient here
    # is the total one.
    inside = object_identity.ObjectIdentitySet(
        t for t in entries if chunk_of.get(t.op) == number)
    inner = _segment_gradients(copies, outputs, incoming, entries, inside,
                               stop_tensors, scope + '_gradients', kwargs)
    later_grads = [grad for grad in inner if grad is not None]
    for tensor, grad in zip(entries, inner):
      if tensor in inside:
        # Already includes what later segments sent it (its grad_ys).
        grads[tensor] = [grad] if grad is not None else []
      elif grad is not None:
        grads.setdefault(tensor, []).append(grad)


def _outputs_with_gradients(chunk, grads, stop_tensors, y_set):
  """The tensors of `chunk` that gradients reached, and those gradients."""
  outputs = []
  incoming = []
  for tensor in [t for op in chunk for t in op.outputs]:
    if tensor in stop_tensors and tensor not in y_set:
      continue
    total = sum_gradients(grads.get(tensor, []))
    if total is not None:
      outputs.append(tensor)
      incoming.append(total)
  return outputs, incoming


def _entries(chunk, number, chunk_of, x_set):
  """Inputs of segment `number`: earlier segments' tensors and xs."""
  entries = []
  seen = object_identity.ObjectIdentitySet()
  for op in chunk:
    for tensor in op.inputs:
      if tensor in seen:
        continue
      if tensor in x_set or chunk_of.get(tensor.op, number) < number:
        entries.append(tensor)
        seen.add(tensor)
  return entries


def _segment_gradients(copies, outputs, incoming, entries, inside,
                       stop_tensors, name, kwargs):
  """Gradients of `entries` through one segment's (copied) ops.

  Stopping at the entries makes each one's gradient the partial derivative
  through this segment only: an entry can also reach the segment's outputs
  through another entry (a residual branch read by an earlier segment), and
  that path is the earlier segment's to differentiate, with its recomputed
  ops. The entries made inside the segment (`inside`) are not stopped.

  Returns:
    A list aligned with `entries` of gradients or None.
  """
  # Under XLA the copies read the entries through a barrier (`copies`
  # maps them): the gradients are taken where the copies read them.
  stops = ([copies.get(t, t) for t in entries if t not in inside] +
           [copies.get(t, t) for t in stop_tensors])
  return gradients_impl.gradients(
      [copies.get(t, t) for t in outputs],
      [copies.get(t, t) for t in entries], grad_ys=incoming,
      name=name, stop_gradients=stops, **kwargs)


def _gradient_ops(grads):
  """The ops computing `grads`, past the Identity of a gradient tuple.

  Depending on the op that computed a gradient rather than on the
  `Identity` that `gate_gradients` adds avoids a cycle when grappler fuses
  that op with its neighbours (see `autocast.gradients.after_gradients`).
  """
  ops = []
  for grad in grads:
    parts = ([grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices)
             else [grad])
    for part in parts:
      while part.op.type == op_lists.OP.Identity and part.op.inputs:
        part = part.op.inputs[0]
      if part.op not in ops:
        ops.append(part.op)
  return ops


def _behind_barrier(entries, wait_for):
  """The segment's entries, released only with the later gradients (XLA).

  XLA ignores control dependencies and merges identical computations, so
  there the copies would be computed with (or as) the forward pass, and
  nothing would be freed. An optimization barrier over the segment's
  entries (the checkpoints it starts from) and the later segment's
  gradients gives the copies inputs that XLA cannot tell from new values
  and cannot have before those gradients exist (what JAX's
  rematerialization does too). The gradients are taken at the barrier's
  outputs, so none flows through it.

  Args:
    entries: the segment's inputs from earlier segments and the xs.
    wait_for: list of tf.Operation, the later segment's gradient ops.

  Returns:
    An identity map {entry: the barrier's output}; empty when there is
    nothing to hold back.
  """
  held = [t for t in entries if t.dtype != tf.resource]
  waits = [op.outputs[0] for op in wait_for
           if op.outputs and op.outputs[0].dtype != tf.resource]
  mapping = object_identity.ObjectIdentityDictionary()
  if not held or not waits:
    return mapping
  released = tf2xla.optimization_barrier(*(held + waits))
  # XLA's CPU compiler drops optimization barriers before it merges equal
  # computations; a data dependency it cannot remove keeps the copies
  # apart and late there too: each entry plus a zero made from every later
  # gradient (`xla_order`). Depending on all of them, not one, also makes
  # the later segment's weight gradients be computed first, which frees
  # what they read.
  anchor = xla_order.zero_after(released[len(held):])
  for tensor, output in zip(held, released):
    mapping[tensor] = output + tf.cast(anchor, output.dtype)
  return mapping


def _copy_segment(graph, segment, kept, wait_for, scope, entries):
  """Copies the recomputable ops of `segment` into `graph`.

  Args:
    graph: the tf.Graph.
    segment: list of tf.Operation in topological order.
    kept: set of tf.Operation that are not copied.
    wait_for: list of tf.Operation every first copy waits for.
    scope: name prefix of the copies, within the current name scope.
    entries: the segment's inputs from earlier segments and the xs; under
      XLA the copies read them through a barrier (`_behind_barrier`).

  Returns:
    dict {original tf.Tensor: copied tf.Tensor}.
  """
  copies = object_identity.ObjectIdentityDictionary()
  if xla_context.in_xla_computation(graph):
    copies.update(_behind_barrier(entries, wait_for))
  op_copies = {}
  for op in segment:
    if op in kept:
      continue
    inputs = [copies.get(t, t) for t in op.inputs]
    control = [op_copies.get(c, c) for c in op.control_inputs]
    new = op_copy.copy_op(graph, op, inputs, scope + '/' + op.name)
    if not any(t.op in op_copies for t in op.inputs):
      # A first copy of the segment: without this wait the executor may
      # recompute the segment during the forward pass, which would keep
      # its activations as long as the originals.
      control = control + list(wait_for)
    if control:
      new._add_control_inputs(  # pylint: disable=protected-access
          [c for c in control if c not in new.control_inputs])
    for old_tensor, new_tensor in zip(op.outputs, new.outputs):
      copies[old_tensor] = new_tensor
    op_copies[op] = new
  return copies
