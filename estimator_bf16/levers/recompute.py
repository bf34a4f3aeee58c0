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

This module holds the public entry points (`gradients_with_recompute`, and
`same_cuts` for the memory planner's builds) and puts the steps together:
the path and what is kept (`recompute_path`), the cuts (`recompute_cuts`),
and the copies and per-segment gradients (`recompute_segments`).

Why not `tf.recompute_grad`: in graph mode (TF1 sessions, TPUEstimator) it
keeps every activation anyway and saves nothing (tensorflow#36981). Here the
recomputation is made of new ops in the same graph: copies of the forward
ops fed with the checkpoints, each segment's first copies made to wait
(control dependencies) for the gradients of the segment after it, so the
executor cannot run them early. The gradient of a segment is
`tf.compat.v1.gradients` of its copied outputs with respect to its inputs,
so every gradient function, override and aggregation is TensorFlow's own.
The original activations then have no reader in the backward pass and are
freed as soon as the forward pass has used them. The last segment is not
recomputed: its activations are needed right when the forward pass ends.

Not recomputed (the forward output is reused instead): stateful ops
(dropout's random numbers, variable reads), ops inside TF1 control flow and
ops with reference inputs (`recompute_path` says which exactly). Forward ops
whose outputs are also read off the path to `ys` (summaries, batch-norm
moving-average updates in UPDATE_OPS, metrics) keep reading the original
tensors.

Grappler and oneDNN: common-subgraph elimination could in principle fold a
copy back into its original (same op, same inputs); the first copies of a
segment differ from their originals by their control inputs and later
copies read copies, so nothing is folded (the measured peak drops with
TensorFlow's default rewrites). What does break is a cut between two ops
that TensorFlow's CPU rewrites fuse; no cut is placed there
(`recompute_cuts`). No session option is needed: the savings measured here
(tests, benchmark) are with TensorFlow's default rewrites.

On a TPU: XLA compiles the whole step and does its own rematerialisation,
and its CSE may merge the copies with the originals (control dependencies
only order execution in XLA, they do not keep values apart), so the saving
there is whatever XLA's scheduler leaves. This has not been verified on a
TPU; the measurements are from the CPU allocator
(`estimator_bf16.memory.peak`).
"""

import contextlib
import threading

from absl import logging
import tensorflow as tf
from tensorflow.python.ops import gradients_impl
from tensorflow.python.util import object_identity

from estimator_bf16.levers import recompute_cuts
from estimator_bf16.levers import recompute_path
from estimator_bf16.levers import recompute_segments


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


def gradients_with_recompute(ys, xs, grad_ys=None, *, segments=None,
                             name='recompute_gradients', **kwargs):
  """`tf.compat.v1.gradients(ys, xs, grad_ys, **kwargs)`, recomputing.

  The activations between `xs` and `ys` are computed again during backprop
  instead of kept (see the module docstring).

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
  # Identity containers: a function graph's tensors are not hashable.
  stop_tensors = object_identity.ObjectIdentitySet(
      tf.convert_to_tensor(t) for t in
      _as_list(kwargs.pop('stop_gradients', None)))
  # As the ops being differentiated read them (inside a loop body with
  # control flow v2, through captures).
  x_tensors = recompute_path.in_graph([x_tensor(x) for x in xs], graph)
  path = recompute_path.path_ops(ys, x_tensors, stop_tensors)
  kept = recompute_path.kept_ops(path, x_tensors)
  cuts = _LOCAL.cuts(lambda: recompute_cuts.choose_cuts(path, kept,
                                                        segments))
  bounds = [0] + cuts + [len(path)]
  chunks = [path[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
  # The last segment is not recomputed, so only earlier ones save memory.
  if sum(1 for chunk in chunks[:-1]
         if any(op not in kept for op in chunk)) < 1:
    return plain('fewer than 2 segments on the path from xs to ys (%d ops)'
                 % len(path))

  with tf.name_scope(name):
    grads = _seed_gradients(ys, grad_ys)
    recompute_segments.backprop(graph, chunks, kept, grads, x_tensors, ys,
                                stop_tensors, kwargs)
    return _x_gradients(xs, x_tensors, grads, unconnected)


def _seed_gradients(ys, grad_ys):
  """Gradient contributions per tensor, holding those flowing into `ys`.

  Returns:
    An identity map {tf.Tensor: list of gradients}: `grad_ys`, or ones
    for the floating (and complex) `ys` they leave None.
  """
  grads = object_identity.ObjectIdentityDictionary()
  for index, y in enumerate(ys):
    grad_y = grad_ys[index] if grad_ys else None
    if grad_y is None:
      if not (y.dtype.is_floating or y.dtype.is_complex):
        continue
      grad_y = tf.ones_like(y, name='grad_ys_%d' % index)
    grads.setdefault(y, []).append(grad_y)
  return grads


def _x_gradients(xs, x_tensors, grads, unconnected):
  """The summed gradient of each x (zeros or None where none arrived)."""
  results = []
  for x, tensor in zip(xs, x_tensors):
    result = recompute_segments.sum_gradients(grads.get(tensor, []))
    if result is None and unconnected == tf.UnconnectedGradients.ZERO:
      if isinstance(x, tf.Variable):
        result = tf.zeros(x.shape, x.dtype.base_dtype)
      else:
        result = tf.zeros_like(x)
    results.append(result)
  return results


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


def x_tensor(x):
  """The tensor `tf.gradients` differentiates with respect to for `x`."""
  if _is_resource_variable(x):
    return x.handle
  if isinstance(x, tf.Variable):
    # A reference variable: gradients flow to its ref-typed output.
    return x._ref()  # pylint: disable=protected-access
  return x
