"""Gradient accumulation inside the device's training loop (use_tpu=True).

On a TPU, TPUEstimator runs `iterations_per_loop` steps in one compiled
loop on the device, so the host cannot run micro-steps between updates the
way `accumulation.AccumulationHook` does. Here one step of that loop is one
whole update, and its micro-steps are a loop inside the step:

  * the input_fn delivers the effective batch (per core), as the program's
    `train_batch_size` says; the model_fn gets the first micro-batch, a
    slice of it along each input's batch dimension, and
    `params['batch_size']` = batch / K;
  * when the model_fn asks for the gradients of its variables, micro-batch
    0's come from its own graph, and those of micro-batches 1 .. K-1 from a
    `tf.compat.v1.while_loop` whose body is a copy of the forward ops that
    depend on the input (same op types and attributes, reading micro-batch
    i) with TensorFlow's own gradients of the copy;
  * the loop differentiates with respect to the tensors its copies read
    from outside (the variables' values, their float32 reads under
    bfloat16), sums those gradients in float32, and after the loop sends
    the sums back to the variables once: the ops between a variable and
    what the copies read do not depend on the input, so one backprop of
    the sum is the sum of the backprops;
  * the model_fn gets the mean gradient and builds its own update on it,
    unchanged: clipping, an `apply_gradients` override, a separate
    `global_step.assign`.

So `global_step` counts updates without any conditional, the update is
the big batch's (for a loss that is a mean over the batch), checkpoints do
not change (the sums are loop values, not variables), and K can change
between runs. The loop's sums start only once micro-batch 0's gradients
exist, so one micro-batch's activations are alive at a time.

What differs from the host version: batch norm's moving averages follow
micro-batch 0 only (the copies compute the statistics of their own
micro-batch for the forward pass but update nothing), the program's loss
tensor is micro-batch 0's, and stateful ops other than random ones are
not run for the other micro-batches. Random ops that depend on the input
(a dropout over `tf.shape(x)`) run again in the copies, so each micro-batch
gets its own mask; one of a static shape is drawn once per update and
shared by its micro-batches.

Nothing here depends on the precision or on tf.estimator.
"""

import tensorflow as tf
from tensorflow.python.ops import gradients_impl

from estimator_bf16.levers import batch_dim
from estimator_bf16.levers import op_copy
from estimator_bf16.levers import recompute as recompute_lib
from estimator_bf16.levers import recompute_path
from estimator_bf16.levers import xla_order
from estimator_bf16.platform import xla_context
from estimator_bf16.safety import audit as audit_lib
from estimator_bf16.precision import op_lists


def _batch_axis(tensor, batch_size):
  """The dimension of `tensor` holding the batch (`batch_dim.batch_axis`)."""
  axis = batch_dim.batch_axis(tensor.shape, batch_size)
  if tensor.shape[axis] != batch_size:
    raise ValueError(
        'gradient accumulation on a TPU splits every input along its batch '
        'dimension, but no dimension of the input %s (shape %s) is the '
        'batch %d.' % (tensor.name, tensor.shape, batch_size))
  return axis


def _micro_batch(tensor, axis, steps, index):
  """Micro-batch `index` of `steps` along `axis` (index: int or tensor).

  The batch dimension is split into `[steps, batch / steps]` and one entry
  of the first gathered: XLA compiles that to a slice of the buffer, where
  a `tf.slice` at a loop-dependent offset made it materialize a padded
  copy of the whole input (seen: 16 times the input's bytes).
  """
  dims = tensor.shape.as_list()
  micro = dims[axis] // steps
  split = tf.reshape(tensor, dims[:axis] + [steps, micro] + dims[axis + 1:])
  result = tf.gather(split, index, axis=axis)
  result.set_shape(dims[:axis] + [micro] + dims[axis + 1:])
  return result


class DeviceAccumulation(object):
  """Micro-batch 0 of one TRAIN step's inputs, and the loop over the rest.

  Args:
    features, labels: nests of the step's input tensors (the effective
      batch); labels may be None.
    batch_size: int, the effective batch per core (`params['batch_size']`).
    steps: int >= 2, micro-batches per update.

  Attributes:
    features, labels: the same nests holding micro-batch 0.
    micro_batch: int, batch_size / steps.

  Raises:
    ValueError: `steps` does not divide `batch_size`, or an input has no
      dimension of the batch's size.
  """

  def __init__(self, features, labels, batch_size, steps):
    if batch_size % steps:
      raise ValueError(
          'the batch per core, %d, is not divisible by '
          'gradient_accumulation_steps=%d: an update is %d micro-batches of '
          'equal size.' % (batch_size, steps, steps))
    self.steps = steps
    self.micro_batch = batch_size // steps
    self._inputs = []  # (effective-batch tensor, its micro-batch 0, axis)

    def first(tensor):
      if not isinstance(tensor, tf.Tensor):
        return tensor
      axis = _batch_axis(tensor, batch_size)
      with tf.name_scope('micro_batch_0'):
        micro = _micro_batch(tensor, axis, steps, 0)
      self._inputs.append((tensor, micro, axis))
      return micro

    self.features = tf.nest.map_structure(first, features)
    self.labels = (None if labels is None else
                   tf.nest.map_structure(first, labels))

  def mean_gradients(self, ys, xs, grad_ys, first_grads, options,
                     gradients_fn=None):
    """The mean gradient of the K micro-batches, for each x.

    Args:
      ys: list of tensors differentiated (the loss), built on micro-batch 0.
      xs: list of variables.
      grad_ys: None or a list aligned with `ys`.
      first_grads: list aligned with `xs`, micro-batch 0's gradients.
      options: dict of further `tf.compat.v1.gradients` arguments.
      gradients_fn: `f(ys, xs, grad_ys, **options)` used in the loop;
        default TensorFlow's (recompute passes its own).

    Returns:
      A list aligned with `xs`: None where `first_grads` has None, else a
      dense tensor of the variable's dtype and shape.

    Raises:
      ValueError: the ops between the input and `ys` use TensorFlow 1.x
        control flow (a tf.cond / while_loop of the model itself), which
        the loop cannot copy.
    """
    gradients_fn = gradients_fn or gradients_impl.gradients
    graph = ys[0].graph
    x_tensors = [recompute_lib.x_tensor(x) for x in xs]
    region, handles = self._region(graph, ys, x_tensors)
    shapes = _value_shapes(handles, xs, recompute_path.in_graph(x_tensors,
                                                                graph))
    sums = self._loop_sums(region, handles, shapes, ys, grad_ys,
                           first_grads, options, gradients_fn)
    with tf.name_scope('gradient_accumulation'):
      # The ys that do not depend on the input (a weight penalty given as
      # a separate loss) count in every micro-batch.
      constant_ys = [(y, grad_ys[n] if grad_ys else None)
                     for n, y in enumerate(ys) if y.op not in region]
      extra = [None] * len(xs)
      if constant_ys:
        extra = gradients_impl.gradients(
            [y for y, _ in constant_ys], x_tensors,
            [g for _, g in constant_ys] if grad_ys else None)
      chained = self._to_variables(sums, handles, x_tensors, graph)
      means = []
      for n, x in enumerate(xs):
        if first_grads[n] is None:
          means.append(None)
          continue
        total = tf.cast(_dense(first_grads[n]), tf.float32)
        if chained[n] is not None:
          total += chained[n]
        if extra[n] is not None:
          total += (self.steps - 1) * tf.cast(_dense(extra[n]), tf.float32)
        means.append(tf.cast(total / self.steps, x.dtype.base_dtype))
      return means

  def _region(self, graph, ys, x_tensors):
    """The forward ops to copy, and the tensors they read from outside.

    Returns:
      (set of tf.Operation, list of tf.Tensor): the ops on a data path from
      micro-batch 0's inputs to `ys` (plus the bfloat16 casts of the
      weights they read, so the loop differentiates the float32 values),
      and the tensors from outside that set that they read and the xs
      reach: the points the loop's gradients are taken at.
    """
    starts = [micro for _, micro, _ in self._inputs]
    reached = _descendants(starts)
    ancestors = recompute_path.ancestor_ops([y.op for y in ys],
                                            control_inputs=False)
    region = {op for op in reached & ancestors
              if op not in {t.op for t in starts}}
    from_xs = _descendants(recompute_path.in_graph(x_tensors, graph))
    context = graph._get_control_flow_context()  # pylint: disable=protected-access
    for op in list(region):
      for tensor in op.inputs:
        source = tensor.op
        if (source not in region and source.type == op_lists.OP.Cast and
            source in from_xs and source.inputs[0].dtype == tf.float32):
          region.add(source)
    for op in region:
      if op._get_control_flow_context() is not context:  # pylint: disable=protected-access
        where = audit_lib.where_made(op)
        raise ValueError(
            'gradient accumulation on a TPU copies the forward pass for each '
            'micro-batch, but %s (%s%s) is inside a tf.cond or while_loop of '
            'the model, which cannot be copied. Use K=1 on the TPU, or '
            'use_tpu=False.' % (op.name, op.type,
                                ', made at ' + where if where else ''))
    outside, seen = [], set()
    for op in sorted(region, key=lambda o: o._id):  # pylint: disable=protected-access
      for tensor in op.inputs:
        if (tensor.op not in region and tensor not in outside and
            tensor.op in from_xs and _differentiable(tensor)):
          outside.append(tensor)
          seen.add(tensor.ref())
    return region, outside

  def _loop_sums(self, region, handles, shapes, ys, grad_ys, first_grads,
                 options, gradients_fn):
    """Builds the loop over micro-batches 1 .. K-1.

    Returns:
      For each tensor of `handles` (what the copies read from outside and
      the xs reach), the float32 sum of its gradients over those
      micro-batches (zeros when none reached it).
    """
    ordered = sorted(region, key=lambda o: o._id)  # pylint: disable=protected-access
    ys_inside = [y for y in ys if y.op in region]
    grad_ys_inside = ([grad_ys[n] for n, y in enumerate(ys) if y.op in region]
                      if grad_ys else None)

    def body(i, *sums):
      # Tensors are not hashable in every graph (a function's): keyed by
      # their refs.
      copies = {}
      for effective, micro, axis in self._inputs:
        copies[micro.ref()] = _micro_batch(effective, axis, self.steps, i)
      # Each differentiable outside tensor enters the loop through an
      # identity, the point its gradient is taken at (a gradient through
      # the loop's own entry would be a gradient of the loop).
      entries = [tf.identity(t) for t in handles]
      copies.update((t.ref(), e) for t, e in zip(handles, entries))
      # Created in the loop body's graph (a function's, with control flow
      # v2), which captures what the copies read from outside.
      _copy_ops(tf.compat.v1.get_default_graph(), ordered, copies)
      grads = gradients_fn([copies[y.ref()] for y in ys_inside], entries,
                           grad_ys_inside, **options)
      return (i + 1,) + tuple(
          total if grad is None else total + tf.cast(_dense(grad), tf.float32)
          for total, grad in zip(sums, grads))

    with tf.name_scope('gradient_accumulation'):
      waits = _ops_of(first_grads)
      with tf.control_dependencies(waits):
        # Started once micro-batch 0's gradients exist: its activations are
        # gone before the next micro-batch's forward pass.
        start = [tf.constant(1)] + [tf.zeros(s, tf.float32) for s in shapes]
      firsts = [op.outputs[0] for op in waits if op.outputs]
      if firsts and xla_context.in_xla_computation(start[0].graph):
        # XLA drops the control dependency and ran the loop first, keeping
        # micro-batch 0's activations alive through it (XLA's CPU compile
        # of the BERT-style mini model at 4 x 8: 273 MiB, against 195 MiB
        # with this wait); the wait has to be data.
        zero = xla_order.zero_after(firsts)
        start = start[:1] + [s + zero for s in start[1:]]
      results = tf.compat.v1.while_loop(
          lambda i, *unused: i < self.steps, body, start,
          parallel_iterations=1, back_prop=False,
          name='micro_batches')
    return list(results[1:])

  def _to_variables(self, sums, handles, x_tensors, graph):
    """Backprops the loop's sums from what the copies read to the xs."""
    chained = [None] * len(x_tensors)
    through_ops = []
    inner = [t.ref() for t in recompute_path.in_graph(x_tensors, graph)]
    for tensor, total in zip(handles, sums):
      if tensor.ref() in inner:
        # The variable itself (a gathered embedding): its gradient.
        n = inner.index(tensor.ref())
        chained[n] = total if chained[n] is None else chained[n] + total
      else:
        through_ops.append((tensor, total))
    if through_ops:
      grads = gradients_impl.gradients(
          [t for t, _ in through_ops], x_tensors,
          [tf.cast(s, t.dtype.base_dtype) for t, s in through_ops])
      for n, grad in enumerate(grads):
        if grad is not None:
          grad = tf.cast(_dense(grad), tf.float32)
          chained[n] = grad if chained[n] is None else chained[n] + grad
    return chained


def _differentiable(tensor):
  dtype = tensor.dtype
  return (dtype.is_floating or dtype == tf.resource or
          dtype._is_ref_dtype)  # pylint: disable=protected-access


def _value_shapes(handles, xs, inner_xs):
  """The shape of each handle's gradient (static, as a TPU needs)."""
  variables = {t.ref(): x for t, x in zip(inner_xs, xs)}
  shapes = []
  for tensor in handles:
    if tensor.ref() in variables:
      # A variable's handle or ref (a gathered embedding): its shape.
      shape = variables[tensor.ref()].shape
    else:
      shape = tensor.shape
    if not shape.is_fully_defined():
      raise ValueError('gradient accumulation on a TPU needs static shapes; '
                       '%s has shape %s.' % (tensor.name, shape))
    shapes.append(shape.as_list())
  return shapes


def _dense(gradient):
  if isinstance(gradient, tf.IndexedSlices):
    return tf.convert_to_tensor(gradient)
  return gradient


def _ops_of(values):
  ops = []
  for value in values:
    if value is None:
      continue
    parts = ([value.values, value.indices]
             if isinstance(value, tf.IndexedSlices) else [value])
    ops.extend(part.op for part in parts)
  return ops


def _descendants(tensors):
  """Ops reached from `tensors` along data edges (a set)."""
  found = set()
  stack = [consumer for t in tensors for consumer in t.consumers()]
  while stack:
    op = stack.pop()
    if op in found:
      continue
    found.add(op)
    for output in op.outputs:
      stack.extend(output.consumers())
  return found | {t.op for t in tensors}


def _copy_ops(graph, ops, copies):
  """Copies `ops` (creation order) into the current context, in place.

  Args:
    graph: the tf.Graph.
    ops: list of tf.Operation.
    copies: dict {tf.Tensor ref: tf.Tensor}, the replacements of tensors
      read; every copied op's outputs are added to it.
  """
  for op in ops:
    new = op_copy.copy_op(graph, op, [copies.get(t.ref(), t)
                                      for t in op.inputs],
                          op.name.split('/')[-1])
    for old, copied in zip(op.outputs, new.outputs):
      copies[old.ref()] = copied
