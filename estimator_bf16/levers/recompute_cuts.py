"""Where a recomputing gradient cuts the forward path into segments.

The forward ops on the path from `xs` to `ys` (`recompute_path`) are cut
into contiguous segments; the tensors that cross a cut are the checkpoints
the step keeps, and each segment but the last is computed again in
backprop. `choose_cuts` balances the segments by the bytes their copied ops
produce, places each cut where few bytes cross it (between layers rather
than inside one), and, unless told how many, picks the count that keeps the
fewest "checkpoints + one segment" bytes (about sqrt(n) segments: Chen et
al. 2016, "Training deep nets with sublinear memory cost").

Some cuts are never used. Inside a TF1 cond or while frame, which must stay
whole. And between two ops that TensorFlow's CPU rewrites fuse
(MatMul/Conv2D + BiasAdd, batch norm + Relu, and their gradients, e.g.
Conv2DBackpropFilter + BiasAddGrad): the fused backward op would belong to
two segments, one segment's recomputation would wait for itself, and the
step failed with "Retval[i] does not have value" (seen with oneDNN on; not
with TF_ENABLE_ONEDNN_OPTS=0).
"""

import math

import tensorflow as tf

from estimator_bf16.precision import op_lists
from estimator_bf16.levers import recompute_path



def choose_cuts(path, kept, segments):
  """Cut positions (sorted ints in 1..n-1) splitting `path` into segments.

  Position i cuts between path[i - 1] and path[i]. Segments are balanced by
  the bytes their recomputable ops produce; each cut is moved, within a
  quarter of a segment of its balanced place, to where the fewest bytes
  cross it (between layers rather than inside one). With `segments=None`
  the count is chosen around sqrt(activation bytes / typical checkpoint
  bytes) to minimise "checkpoints + one segment".

  Args:
    path: list of tf.Operation in topological order.
    kept: set of tf.Operation that are not copied (`recompute_path`).
    segments: None, or the int number of segments wanted.

  Returns:
    list of int cut positions; empty when nothing is worth cutting.
  """
  n = len(path)
  if n < 2:
    return []
  op_bytes = [0 if op in kept else
              sum(recompute_path.tensor_bytes(t) for t in op.outputs)
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
  return _cuts_of_best_count(allowed, crossing, cumulative, n)


def _cuts_of_best_count(allowed, crossing, cumulative, n):
  """Cuts for the segment count with the fewest bytes kept, tried on paper.

  Args:
    allowed: sorted int cut positions that may be used.
    crossing: bytes crossing each position (`_crossing_bytes`).
    cumulative: bytes produced by the ops before each position.
    n: the number of ops on the path.

  Returns:
    list of int cut positions.
  """
  total = cumulative[-1]
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
  """Cuts for `segments` segments balanced by bytes (see `choose_cuts`)."""
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
    if op.type not in op_lists.CPU_FUSED_PRODUCER_OPS:
      continue
    for tensor in op.outputs:
      for consumer in tensor.consumers():
        q = index_of.get(consumer)
        if (q is not None and q > p and
            consumer.type in op_lists.CPU_FUSED_CONSUMER_OPS):
          forbidden.update(range(p + 1, q + 1))
  first = {}
  last = {}
  # Frames around the gradient call (TPUEstimator's training loop with
  # control flow v1) hold the whole step: only the model's own count.
  around = tf.compat.v1.get_default_graph()._get_control_flow_context()  # pylint: disable=protected-access
  for index, op in enumerate(path):
    context = op._get_control_flow_context()  # pylint: disable=protected-access
    outermost = None
    while context is not None and context is not around:
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
        size = recompute_path.tensor_bytes(tensor)
        delta[p + 1] += size
        delta[q + 1] -= size
  crossing = []
  running = 0
  for i in range(len(path) + 1):
    running += delta[i]
    crossing.append(running)
  return crossing
