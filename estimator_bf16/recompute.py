"""Gradients that recompute activations during backprop (graph mode).

`gradients_with_recompute(ys, xs)` returns what `tf.compat.v1.gradients(ys,
xs)` returns, but the backward pass reads few of the activations the forward
pass made: the forward ops between `xs` and `ys` are cut into about
sqrt(n) contiguous segments (Chen et al. 2016, "Training deep nets with
sublinear memory cost"), only the tensors that cross a cut (checkpoints) are
kept, and each segment is computed again, from its checkpoints, just before
its gradient runs. The step then holds the checkpoints plus one segment's
activations instead of all of them, for about one more forward pass of
compute:

    grads = recompute.gradients_with_recompute(
        loss, tf.compat.v1.trainable_variables())

Why not `tf.recompute_grad`: in graph mode (TF1 sessions, TPUEstimator) it
keeps every activation anyway and saves nothing (tensorflow#36981). Here the
recomputation is made of new ops in the same graph: copies of the forward
ops (same type, attributes -- gradient overrides `_gradient_op_type` and
colocation `_class` included -- and device), fed with the checkpoints, each
segment's first copies made to wait (control dependencies) for the
gradients arriving at the segment's outputs, so the executor cannot run
them early. The gradient of a segment is `tf.compat.v1.gradients` of its
copied outputs with respect to its inputs, so every gradient function,
override and aggregation is TensorFlow's own. The original activations then
have no reader in the backward pass and are freed as soon as the forward
pass has used them. The last segment is not recomputed: its activations are
needed right when the forward pass ends.

What is not recomputed (its forward output is reused instead):

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
    inputs; no cut is placed inside such a frame. Functional `If`, `While`
    and `PartitionedCall` ops are ordinary ops here (stateful ones are
    kept).

Forward ops whose outputs are also read off the path to `ys` (summaries,
batch-norm moving-average updates in UPDATE_OPS, metrics) keep reading the
original tensors.

Grappler and oneDNN: common-subgraph elimination could in principle fold a
copy back into its original (same op, same inputs); the first copies of a
segment differ from their originals by their control inputs and later
copies read copies, so nothing is folded (the measured peak drops with
TensorFlow's default rewrites). What does break is a cut between two ops
that TensorFlow's CPU rewrites fuse (MatMul/Conv2D + BiasAdd, batch norm +
Relu, and their gradients, e.g. Conv2DBackpropFilter + BiasAddGrad): the
fused backward op would belong to two segments, one segment's recomputation
would wait for itself, and the step failed with "Retval[i] does not have
value" (seen with oneDNN on; not with TF_ENABLE_ONEDNN_OPTS=0). No cut is
placed between such pairs. Each segment's recomputation waits for every
gradient of the segment after it, not only the ones reaching its outputs:
with one op at a time the executor otherwise leaves the `BiasAddGrad`s to
the end of the step and their activation-sized inputs pile up (measured: no saving at all without it).
No session option is needed: the savings measured here (tests, benchmark)
are with TensorFlow's default rewrites.

On a TPU: XLA compiles the whole step and does its own rematerialisation,
and its CSE may merge the copies with the originals (control dependencies
only order execution in XLA, they do not keep values apart), so the saving
there is whatever XLA's scheduler leaves. This has not been verified on a
TPU; the measurements are from the CPU allocator
(`estimator_bf16.peak_memory`).
"""

import collections
import contextlib
import math
import threading

from absl import logging
import tensorflow as tf
from tensorflow.python.ops import gradients_impl

# Bytes an element of a dtype without a fixed size (strings, variants,
# resources) is counted as: such tensors are small handles in practice.
_UNSIZED_ELEMENT_BYTES = 0
# The size assumed for a dimension unknown when the graph is built (usually
# the batch): only the ratios of tensor sizes matter for placing the cuts.
_UNKNOWN_DIM_GUESS = 32
# Stateful ops whose outputs are snapshots of variables: they do not start
# a "derived from randomness" chain, so casts of them are recomputed.
_VARIABLE_READS = frozenset(['ReadVariableOp', 'ResourceGather',
                             'ResourceGatherNd', 'VariableShape'])


# Op pairs (producer -> consumer) that TensorFlow's CPU rewrites fuse, in the
# forward pass or in their gradients; a cut never separates them.
_FUSED_PRODUCERS = frozenset([
    'MatMul', 'BatchMatMul', 'BatchMatMulV2', 'BatchMatMulV3', 'Conv2D',
    'Conv3D', 'DepthwiseConv2dNative', 'FusedBatchNorm', 'FusedBatchNormV2',
    'FusedBatchNormV3', 'BiasAdd', 'BiasAddV1', 'Einsum'])
_FUSED_CONSUMERS = frozenset([
    'BiasAdd', 'BiasAddV1', 'Add', 'AddV2', 'Relu', 'Relu6', 'Elu',
    'LeakyRelu', 'Selu', 'Tanh', 'Sigmoid', 'FusedBatchNorm',
    'FusedBatchNormV2', 'FusedBatchNormV3', 'Mul'])


class _Local(threading.local):
  """Per thread: the cuts of earlier builds, while `same_cuts` is active."""

  def __init__(self):
    super().__init__()
    self.recorded = None  # list of cut lists, in call order
    self.position = 0

  def cuts(self, choose):
    if self.recorded is None:
      return choose()
    if self.position == len(self.recorded):
      self.recorded.append(choose())
    cuts = self.recorded[self.position]
    self.position += 1
    return cuts


_LOCAL = _Local()


@contextlib.contextmanager
def same_cuts():
  """Builds of one graph at several batch sizes get the same segments.

  The cuts balance bytes, and the bytes of activations grow with the batch
  while those of weights do not, so two batch sizes can cut one network in
  different places. The memory planner builds a step at two batch sizes
  and compares them tensor by tensor; inside this block the gradient calls
  of every build after the first reuse, in order, the cuts the first made.

  Yields:
    A function to call before each build after the first.
  """
  previous = (_LOCAL.recorded, _LOCAL.position)
  _LOCAL.recorded, _LOCAL.position = [], 0

  def next_build():
    _LOCAL.position = 0

  try:
    yield next_build
  finally:
    _LOCAL.recorded, _LOCAL.position = previous


def _is_resource_variable(value):
  return (isinstance(value, tf.Variable) and
          getattr(value, 'handle', None) is not None and
          value.handle.dtype == tf.resource)


def _as_list(value):
  if value is None:
    return []
  if isinstance(value, (list, tuple)):
    return list(value)
  return [value]


def _x_tensor(x):
  """The tensor `tf.gradients` differentiates with respect to for `x`."""
  if _is_resource_variable(x):
    return x.handle
  if isinstance(x, tf.Variable):
    # A reference variable: gradients flow to its ref-typed output.
    return x._ref()  # pylint: disable=protected-access
  return x


def _tensor_bytes(tensor):
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


def _in_tf1_control_flow(op):
  """True if `op` is inside a tf.compat.v1 cond or while_loop frame.

  XLA/TPU replication contexts are control-flow contexts too, but every op
  of a TPU model is in one; only cond and while frames matter here.
  """
  context = op._get_control_flow_context()  # pylint: disable=protected-access
  while context is not None:
    if context.IsWhileContext() or context.IsCondContext():
      return True
    context = context.outer_context
  return False


def _must_keep(op):
  """True if `op` must not be copied: its forward outputs are reused."""
  return (op._is_stateful or  # pylint: disable=protected-access
          _in_tf1_control_flow(op) or
          any(t.dtype._is_ref_dtype for t in op.inputs))  # pylint: disable=protected-access


def _path_ops(ys, x_tensors, stop_tensors):
  """Forward ops on a data path from `x_tensors` to `ys`, in creation order.

  Args:
    ys: list of tf.Tensor.
    x_tensors: list of tf.Tensor (resource handles for variables).
    stop_tensors: set of tf.Tensor through which gradients do not flow.

  Returns:
    list of tf.Operation sorted by `op._id` (a topological order: an op is
    always created after its inputs' ops).
  """
  ancestors = set()
  stack = [y.op for y in ys]
  while stack:
    op = stack.pop()
    if op in ancestors:
      continue
    ancestors.add(op)
    stack.extend(t.op for t in op.inputs)
  reached = set()
  stack = [t for t in x_tensors]
  seen_tensors = set()
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


def _classify(path, x_tensors):
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
  x_ops = set(t.op for t in x_tensors)
  for op in path:
    if op in x_ops:
      kept.add(op)
      continue
    if _must_keep(op):
      kept.add(op)
      if op.type not in _VARIABLE_READS:
        random_like.add(op)
      continue
    sources = [t for t in op.inputs if t.op in on_path]
    if sources and all(t.op in random_like for t in sources):
      # Deterministic given those kept values: keep the smaller side. A
      # derived op that is recomputed reads its (kept) inputs.
      random_like.add(op)
      in_bytes = sum(_tensor_bytes(t) for t in sources)
      out_bytes = sum(_tensor_bytes(t) for t in op.outputs)
      if out_bytes <= in_bytes:
        kept.add(op)
  return kept


def _forbidden_cuts(path):
  """Cut positions that must not be used.

  Inside a TF1 cond/while frame, which must stay whole; and between two ops
  that grappler or oneDNN fuse (MatMul/Conv + BiasAdd, batch norm + Relu,
  ...): their fused backward op would then belong to two segments, and a
  segment's recomputation, which waits for the later segment's gradients,
  would wait for itself (a cycle that leaves gradients uncomputed).
  """
  index_of = {op: i for i, op in enumerate(path)}
  forbidden = set()
  for p, op in enumerate(path):
    if op.type not in _FUSED_PRODUCERS:
      continue
    for tensor in op.outputs:
      for consumer in tensor.consumers():
        q = index_of.get(consumer)
        if q is not None and q > p and consumer.type in _FUSED_CONSUMERS:
          forbidden.update(range(p + 1, q + 1))
  first = {}
  last = {}
  for index, op in enumerate(path):
    context = op._get_control_flow_context()  # pylint: disable=protected-access
    outermost = None
    while context is not None:
      if context.IsWhileContext() or context.IsCondContext():
        outermost = context
      context = context.outer_context
    if outermost is not None:
      key = id(outermost)
      first.setdefault(key, index)
      last[key] = index
  for key, start in first.items():
    forbidden.update(range(start + 1, last[key] + 1))
  return forbidden


def _crossing_bytes(path, kept):
  """Bytes of recomputable tensors alive across each cut position.

  Position i cuts between path[i - 1] and path[i]; a tensor made at index p
  and last read at index q > p crosses positions p + 1 .. q.

  Returns:
    list of n + 1 ints (positions 0 and n are the ends, never cut).
  """
  index = {op: i for i, op in enumerate(path)}
  delta = [0] * (len(path) + 2)
  for p, op in enumerate(path):
    if op in kept:
      continue
    for tensor in op.outputs:
      readers = [index[c] for c in tensor.consumers() if c in index]
      if not readers:
        continue
      q = max(readers)
      if q > p:
        size = _tensor_bytes(tensor)
        delta[p + 1] += size
        delta[q + 1] -= size
  crossing = []
  running = 0
  for i in range(len(path) + 1):
    running += delta[i]
    crossing.append(running)
  return crossing


def _choose_cuts(path, kept, segments):
  """Cut positions (sorted ints in 1..n-1) splitting `path` into segments.

  Segments are balanced by the bytes their recomputable ops produce; each
  cut is moved, within a quarter of a segment of its balanced place, to
  where the fewest bytes cross it (between layers rather than inside one).
  With `segments=None` the count is chosen around sqrt(activation bytes /
  typical checkpoint bytes) to minimise "checkpoints + one segment".
  """
  n = len(path)
  if n < 2:
    return []
  op_bytes = [0 if op in kept else sum(_tensor_bytes(t) for t in op.outputs)
              for op in path]
  total = float(sum(op_bytes))
  if total <= 0:
    return []
  crossing = _crossing_bytes(path, kept)
  forbidden = _forbidden_cuts(path)
  allowed = [i for i in range(1, n) if i not in forbidden]
  if not allowed:
    return []
  cumulative = [0.0]
  for size in op_bytes:
    cumulative.append(cumulative[-1] + size)
  if segments is not None:
    segments = max(1, min(segments, len(allowed) + 1))
    return _place_cuts(allowed, crossing, cumulative, segments)
  positive = sorted(crossing[i] for i in allowed if crossing[i] > 0)
  if not positive:
    return []
  # A low quantile: the cheap cuts (layer boundaries) are the ones used.
  typical = positive[len(positive) // 4]
  guess = max(2, int(round(math.sqrt(total / typical))))
  # sqrt(n) is right only on average: where the cuts fall (between layers
  # or inside one) moves the peak by a third on BERT-base. So the counts
  # around it are tried on paper, and the one with the least "checkpoints
  # kept + the largest segment recomputed with its gradients" wins.
  best, best_cost = [], None
  for count in range(max(2, guess // 2), min(2 * guess, len(allowed)) + 2):
    cuts = _place_cuts(allowed, crossing, cumulative, count)
    if not cuts:
      continue
    bounds = [0] + cuts + [n]
    largest = max(cumulative[b] - cumulative[a]
                  for a, b in zip(bounds[:-1], bounds[1:]))
    cost = sum(crossing[c] for c in cuts) + 2 * largest
    if best_cost is None or cost < best_cost:
      best, best_cost = cuts, cost
  return best


def _place_cuts(allowed, crossing, cumulative, segments):
  """Cuts for `segments` segments balanced by bytes (see `_choose_cuts`)."""
  if segments < 2:
    return []
  total = cumulative[-1]
  slack = total / segments / 4.0
  cuts = []
  for j in range(1, segments):
    target = total * j / segments
    window = [i for i in allowed
              if abs(cumulative[i] - target) <= slack and
              (not cuts or i > cuts[-1])]
    if not window:
      window = [i for i in allowed if not cuts or i > cuts[-1]]
      if not window:
        break
      window = [min(window, key=lambda i: abs(cumulative[i] - target))]
    best = min(window, key=lambda i: (crossing[i],
                                      abs(cumulative[i] - target)))
    cuts.append(best)
  return cuts


def _sum_gradients(grads):
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


def _gradient_ops(grads):
  """The ops computing `grads`, past the Identity of a gradient tuple.

  Depending on the op that computed a gradient rather than on the
  `Identity` that `gate_gradients` adds avoids a cycle when grappler fuses
  that op with its neighbours (see `autocast_gradients.after_gradients`).
  """
  ops = []
  for grad in grads:
    parts = ([grad.values, grad.indices] if isinstance(grad, tf.IndexedSlices)
             else [grad])
    for part in parts:
      while part.op.type == 'Identity' and part.op.inputs:
        part = part.op.inputs[0]
      if part.op not in ops:
        ops.append(part.op)
  return ops


def _copy_segment(graph, segment, kept, wait_for, scope):
  """Copies the recomputable ops of `segment` into `graph`.

  Args:
    graph: the tf.Graph.
    segment: list of tf.Operation in topological order.
    kept: set of tf.Operation that are not copied.
    wait_for: list of tf.Operation every first copy waits for.
    scope: name prefix of the copies, within the current name scope.

  Returns:
    dict {original tf.Tensor: copied tf.Tensor}.
  """
  copies = {}
  op_copies = {}
  for op in segment:
    if op in kept:
      continue
    inputs = [copies.get(t, t) for t in op.inputs]
    control = [op_copies.get(c, c) for c in op.control_inputs]
    attrs = {key: op.node_def.attr[key] for key in op.node_def.attr}
    new = graph._create_op_internal(  # pylint: disable=protected-access
        op.type, inputs, dtypes=[t.dtype for t in op.outputs],
        name=scope + '/' + op.name, attrs=attrs, op_def=op.op_def,
        compute_device=False)
    if op.device:
      new._set_device(op.device)  # pylint: disable=protected-access
    if not any(t.op in op_copies for t in op.inputs):
      # A first copy of the segment: without this wait the executor may
      # recompute the segment during the forward pass, which would keep
      # its activations as long as the originals.
      control = control + list(wait_for)
    if control:
      new._add_control_inputs(  # pylint: disable=protected-access
          [c for c in control if c not in new.control_inputs])
    for old_tensor, new_tensor in zip(op.outputs, new.outputs):
      new_tensor.set_shape(old_tensor.shape)
      copies[old_tensor] = new_tensor
    op_copies[op] = new
  return copies


def gradients_with_recompute(ys, xs, grad_ys=None, *, segments=None,
                             name='recompute_gradients', **kwargs):
  """Like tf.compat.v1.gradients(ys, xs, grad_ys, **kwargs) but activations are recomputed during backprop.

  Args:
    ys: a tf.Tensor or list of them, usually the float32 scalar loss.
    xs: a variable or tensor, or a list of them (resource variables, as
      optimizers pass them, and/or tensors).
    grad_ys: None, or a list aligned with `ys` of the gradients flowing into
      them (None entries mean ones), as for `tf.compat.v1.gradients`.
    segments: None picks about sqrt(n) segments, balanced by the bytes the
      forward ops produce; an int >= 1 forces that many (1 is plain
      `tf.compat.v1.gradients`).
    name: name scope of the copies and gradient ops.
    **kwargs: the other arguments of `tf.compat.v1.gradients`
      (`aggregation_method`, `colocate_gradients_with_ops`,
      `stop_gradients`, `unconnected_gradients`), applied to every
      segment's gradient; `gate_gradients` is accepted and not applied
      (it orders execution only, and costs memory here: see below).

  Returns:
    A list aligned with `xs`: a tf.Tensor (or tf.IndexedSlices, e.g. for a
    gathered embedding) of each x's dtype and shape, or None where x does
    not affect `ys` (zeros with `unconnected_gradients='zero'`).

  Raises:
    ValueError: `segments` is not None or an int >= 1.
  """
  if segments is not None and (isinstance(segments, bool) or
                               not isinstance(segments, int) or
                               segments < 1):
    raise ValueError('segments must be None or an int >= 1, got %r.' %
                     (segments,))
  ys_list = _as_list(ys)
  xs_list = _as_list(xs)
  grad_ys_list = _as_list(grad_ys)

  def plain(reason):
    logging.info('gradients_with_recompute: %s; using plain gradients.',
                 reason)
    return gradients_impl.gradients(ys, xs, grad_ys, name=name, **kwargs)

  if not ys_list or not xs_list:
    return plain('nothing to differentiate')
  if grad_ys_list and len(grad_ys_list) != len(ys_list):
    return plain('grad_ys does not match ys')  # TensorFlow raises the error.
  ys_list = [tf.convert_to_tensor(y) for y in ys_list]
  graph = ys_list[0].graph
  if tf.executing_eagerly() or not isinstance(graph, tf.Graph):
    return plain('not building a graph')
  with graph.as_default():
    return _recompute_gradients(graph, ys_list, xs_list, grad_ys_list,
                                segments, name, kwargs, plain)


def _recompute_gradients(graph, ys, xs, grad_ys, segments, name, kwargs,
                         plain):
  """`gradients_with_recompute` once the arguments are checked."""
  kwargs = dict(kwargs)
  # Gating an op's gradients (`Optimizer.compute_gradients` asks for it)
  # groups all of them, so the gradients with respect to constants are
  # computed too: a Pow's exponent gets `where(x > 0, log(x), 0)`, whose
  # `ones_like` / `zeros_like` the executor runs at the start of the step
  # and keeps, activation-sized, until the segment's gradient. Gating only
  # orders execution; the values are the same without it.
  kwargs.pop('gate_gradients', None)
  unconnected = kwargs.pop('unconnected_gradients',
                           tf.UnconnectedGradients.NONE)
  stop_tensors = set(tf.convert_to_tensor(t) for t in
                     _as_list(kwargs.pop('stop_gradients', None)))
  x_tensors = [_x_tensor(x) for x in xs]
  path = _path_ops(ys, x_tensors, stop_tensors)
  kept = _classify(path, x_tensors)
  cuts = _LOCAL.cuts(lambda: _choose_cuts(path, kept, segments))
  bounds = [0] + cuts + [len(path)]
  chunks = [path[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
  # The last segment is not recomputed, so only earlier ones save memory.
  if sum(1 for chunk in chunks[:-1] if any(op not in kept for op in chunk)) < 1:
    return plain('fewer than 2 segments on the path from xs to ys (%d ops)'
                 % len(path))

  # Gradient contributions per tensor (checkpoints, xs, ys).
  grads = collections.defaultdict(list)
  with tf.name_scope(name):
    for index, y in enumerate(ys):
      grad_y = grad_ys[index] if grad_ys else None
      if grad_y is None:
        if not (y.dtype.is_floating or y.dtype.is_complex):
          continue
        grad_y = tf.ones_like(y, name='grad_ys_%d' % index)
      grads[y].append(grad_y)
    x_set = set(x_tensors)
    y_set = set(ys)
    chunk_of = {}
    for number, chunk in enumerate(chunks):
      for op in chunk:
        chunk_of[op] = number
    later_grads = []
    for number in reversed(range(len(chunks))):
      chunk = chunks[number]
      produced = [t for op in chunk for t in op.outputs]
      outputs = []
      incoming = []
      for tensor in produced:
        if tensor in stop_tensors and tensor not in y_set:
          continue
        total = _sum_gradients(grads.get(tensor, []))
        if total is not None:
          outputs.append(tensor)
          incoming.append(total)
      if not outputs:
        continue
      entries = []
      for op in chunk:
        for tensor in op.inputs:
          if tensor in entries:
            continue
          if tensor in x_set or chunk_of.get(tensor.op, number) < number:
            entries.append(tensor)
      if not entries:
        continue
      scope = 'segment_%d' % number
      last = number == len(chunks) - 1
      if last:
        copies = {}
      else:
        # Waiting for every gradient of the segment after this one, not
        # only for those reaching this segment's outputs: the executor
        # otherwise leaves side branches (a BiasAddGrad, whose input is as
        # large as an activation) for the end of the step, and their inputs
        # pile up across all segments.
        copies = _copy_segment(graph, chunk, kept,
                               _gradient_ops(incoming + later_grads),
                               scope + '_forward')
      # Stopping at the entries makes each one's gradient the partial
      # derivative through this segment only: an entry can also reach the
      # segment's outputs through another entry (a residual branch read by
      # an earlier segment), and that path is the earlier segment's to
      # differentiate, with its recomputed ops.
      # (An x made inside the segment is an entry too, but not stopped: its
      # gradient here is the total one.)
      inside = set(t for t in entries if chunk_of.get(t.op) == number)
      stops = ([t for t in entries if t not in inside] +
               [copies.get(t, t) for t in stop_tensors])
      inner = gradients_impl.gradients(
          [copies.get(t, t) for t in outputs], entries, grad_ys=incoming,
          name=scope + '_gradients', stop_gradients=stops, **kwargs)
      later_grads = [grad for grad in inner if grad is not None]
      for tensor, grad in zip(entries, inner):
        if tensor in inside:
          # Already includes what later segments sent it (its grad_ys).
          grads[tensor] = [grad] if grad is not None else []
        elif grad is not None:
          grads[tensor].append(grad)

    results = []
    for x, tensor in zip(xs, x_tensors):
      result = _sum_gradients(grads.get(tensor, []))
      if result is None and unconnected == tf.UnconnectedGradients.ZERO:
        if isinstance(x, tf.Variable):
          result = tf.zeros(x.shape, x.dtype.base_dtype)
        else:
          result = tf.zeros_like(x)
      results.append(result)
  return results
