"""Simulating the tensor lifetimes of one training step, on paper.

`simulate` runs a built step (`plan_build.Build`) in its op order, as a
dataflow executor running one op at a time does: each op's outputs are
allocated when it runs and freed after their last consumer ran; reshapes
and reads share their input's buffer (alias ops), elementwise ops reuse an
input buffer that dies there, as TensorFlow's kernels do (forwarding ops),
and constants and variables exist outside the step (persistent ops). Sizes
are `(fixed, per_example)` pairs, so the live bytes at each moment are a
line in the batch size; the result is the upper envelope of those lines.
It also counts, separately, the float32 copies a CPU without bfloat16
arithmetic makes around each bfloat16 matmul.

With `compiled=True` it plans the step as XLA compiles it instead:

  * XLA fuses an elementwise op into the ops that read its result, so a
    chain such as GELU, the layer-norm arithmetic or a dropout mask
    computes in registers and only the chain's last result gets a buffer.
    An elementwise op whose readers are all elementwise, reductions or
    rearrangements (`op_lists.XLA_FUSING_OPS`) gets no buffer here; each
    reader reads its inputs in its place (they live until the last such
    reader ran). With several readers, only a cheap op (not
    `op_lists.XLA_EXPENSIVE_OPS`) whose inputs are no larger than its
    result is computed again in each.
  * XLA keeps no control dependencies and its schedule puts the variable
    updates after the backprop (seen in the CPU compile's buffer
    assignment, where every weight gradient is live at the end of the
    step; no TPU's was seen): here updates run only when nothing else
    can.
"""

import heapq

import tensorflow as tf

from estimator_bf16.precision import op_lists
from estimator_bf16.levers import recompute_path

# The op kinds the simulation reads (aliases, forwarding, persistent, XLA's
# fusions) are op_lists'. With grappler's fusions, matmul + bias (+
# activation) is one op; Einsum runs on the same kernels.
_MATMUL_OPS = op_lists.MATMUL_OPS | op_lists.EINSUM_OPS
# Ops that hold float32 copies of their bfloat16 operands and result on a
# CPU that emulates bfloat16: TensorFlow's matmul kernels, and the ops
# autocast computes in float32 there (autocast.cpu_kernels).
_UPCAST_OPS = _MATMUL_OPS | op_lists.CPU_SLOW_BFLOAT16_OPS['emulated']
_NO_BYTES = (0.0, 0.0)


def tensor_bytes(tensor, tile=None):
  """Bytes of a tensor with a static shape; 0 for resources and unknowns.

  Args:
    tensor: a tf.Tensor (or tf.Variable).
    tile: None, or (rows, lanes): the two minor dimensions are padded up
      to multiples of these, as XLA lays tensors out on a TPU
      (`platform.tpu.TPU_TILE`).
  """
  dtype = tensor.dtype.base_dtype
  if dtype in (tf.resource, tf.variant, tf.string):
    return 0
  if not tensor.shape.is_fully_defined():
    return 0
  dims = tensor.shape.as_list()
  if tile is not None and dims:
    rows, lanes = tile
    dims[-1] = -(-dims[-1] // lanes) * lanes
    if len(dims) > 1:
      dims[-2] = -(-dims[-2] // rows) * rows
  elements = 1
  for dim in dims:
    elements *= dim
  return elements * dtype.size


def simulate(build, size_of, compiled=False):
  """Runs one step on paper; returns the upper envelope of live bytes.

  Args:
    build: a `plan_build.Build`.
    size_of: `size_of(tensor) -> (fixed, per_example)` bytes.
    compiled: plan the step as XLA compiles it: elementwise chains fused
      into their readers, updates last (see the module docstring).

  Returns:
    Two lists of (fixed, per_example) lines: live transient bytes at each
    moment of the step, reduced to those that can be the maximum; the
    second adds the float32 copies a CPU makes for bfloat16 matmuls.
  """
  # What a session runs for the fetches: data and control inputs.
  needed = recompute_path.ancestor_ops(build.fetches, control_inputs=True)
  fused = _fused(needed) if compiled else frozenset()
  reads = _Reads(fused)
  consumers = {}
  for op in needed:
    if op in fused:
      continue
    for tensor in reads.of(op):
      consumers[tensor] = consumers.get(tensor, 0) + 1
  memory = _Liveness(consumers, size_of)
  points, upcast_points = [], []
  for op in _execution_order(needed, build.graph, updates_last=compiled):
    if op in fused:
      continue  # computed inside its reader
    inputs = reads.of(op)
    memory.run(op, inputs)
    points.append(tuple(memory.live))
    scratch = _upcast_scratch(op, size_of)
    upcast_points.append((memory.live[0] + scratch[0],
                          memory.live[1] + scratch[1]))
    memory.finish(op, inputs)
  return _upper_envelope(points), _upper_envelope(upcast_points)


def _fused(needed):
  """The ops of `needed` XLA computes inside the ops that read them."""
  readers = {}
  for op in needed:
    for tensor in op.inputs:
      readers.setdefault(tensor, []).append(op)
  fused = set()
  for op in needed:
    if op.type not in op_lists.XLA_FUSED_OPS or len(op.outputs) != 1:
      continue
    users = set(readers.get(op.outputs[0], ()))
    if not users or not all(user.type in op_lists.XLA_FUSING_OPS
                            for user in users):
      continue
    if len(users) == 1:
      fused.add(op)
      continue
    # Computed again inside each of several readers, the op keeps its
    # inputs alive until the last of them: only a cheap op, and only where
    # its inputs are no larger than its own result. (A dropout mask that
    # recompute keeps as booleans would otherwise keep the float32 random
    # numbers it compares.)
    inputs = set(t for t in op.inputs
                 if t.op.type not in op_lists.PERSISTENT_OPS)
    if op.type not in op_lists.XLA_EXPENSIVE_OPS and sum(
        map(tensor_bytes, inputs)) <= tensor_bytes(op.outputs[0]):
      fused.add(op)
  return frozenset(fused)


class _Reads:
  """The buffers each op reads: a fused input stands for its own inputs.

  An op's own inputs are listed as it reads them, twice where it reads a
  tensor twice (`x * x`, which TensorFlow's kernels then cannot write into
  `x`'s buffer). What its fused inputs read is added once per tensor not
  already listed, however often the chain reads it (a GELU reads its input
  five times), so that chains of fused ops do not multiply the list.
  Counting and finishing the reads with the same list keeps them paired.
  """

  def __init__(self, fused):
    self._fused = fused
    self._memo = {}

  def of(self, op):
    """The tensors with buffers that `op` reads: its own inputs in their
    order, then those its fused inputs add."""
    # Iterative: a chain of fused ops can be longer than Python's stack.
    stack = [op]
    while stack:
      top = stack[-1]
      if top in self._memo:
        stack.pop()
        continue
      waiting = [t.op for t in top.inputs
                 if t.op in self._fused and t.op not in self._memo]
      if waiting:
        stack.extend(waiting)
        continue
      stack.pop()
      tensors = [t for t in top.inputs if t.op not in self._fused]
      listed = set(tensors)
      for tensor in top.inputs:
        if tensor.op in self._fused:
          for part in self._memo[tensor.op]:
            if part not in listed:
              listed.add(part)
              tensors.append(part)
      self._memo[top] = tuple(tensors)
    return self._memo[op]


def _is_update(op):
  """Whether `op` writes a variable (an optimizer's update)."""
  return (op.type.startswith(op_lists.OPTIMIZER_UPDATE_PREFIX) or
          op.type in op_lists.VARIABLE_WRITE_OPS)


def _execution_order(needed, graph, updates_last=False):
  """Yields the `needed` ops in the order a one-op-at-a-time executor runs.

  Of the ops whose inputs (data and control) have all run, the one created
  first in `graph` runs next; with `updates_last`, variable updates run
  only when nothing else can. The next op is chosen only after the caller
  resumes the generator, i.e. after it has simulated the previous one.
  """
  order = {op: (updates_last and _is_update(op), i)
           for i, op in enumerate(graph.get_operations())}
  pending = {op: len(set(t.op for t in op.inputs) | set(op.control_inputs))
             for op in needed}
  users = {}
  for op in needed:
    for source in set(t.op for t in op.inputs) | set(op.control_inputs):
      users.setdefault(source, []).append(op)
  ready = [(order[op], op.name, op) for op, count in pending.items()
           if count == 0]
  heapq.heapify(ready)
  while ready:
    _, _, op = heapq.heappop(ready)
    yield op
    for user in users.get(op, ()):
      pending[user] -= 1
      if pending[user] == 0:
        heapq.heappush(ready, (order[user], user.name, user))


class _Liveness:
  """The buffers of a simulated step and the bytes they hold.

  Aliased tensors share one buffer, identified by the id of the tensor that
  allocated it; a buffer is freed once every read of every tensor sharing
  it has happened.

  Attributes:
    live: [fixed, per_example] bytes allocated now.
  """

  def __init__(self, consumers, size_of):
    """Starts with nothing allocated.

    Args:
      consumers: {tf.Tensor: int reads of it in the step}.
      size_of: `size_of(tensor) -> (fixed, per_example)` bytes.
    """
    self._consumers = consumers
    self._size_of = size_of
    self._buffers = {}  # tensor -> buffer id (aliases share one)
    self._remaining = {}  # buffer id -> uses left
    self._buffer_size = {}  # buffer id -> (fixed, per_example)
    self.live = [0.0, 0.0]

  def run(self, op, inputs):
    """Allocates (or aliases) the outputs of `op`, which reads `inputs`."""
    if op.type in op_lists.PERSISTENT_OPS:
      for tensor in op.outputs:
        self._allocate(tensor, _NO_BYTES)
      return
    for index, tensor in enumerate(op.outputs):
      size = self._size_of(tensor)
      if op.type in op_lists.ALIAS_OPS and index < len(op.inputs) and (
          op.inputs[index] in self._buffers):
        self._allocate(tensor, size, self._buffers[op.inputs[index]])
        continue
      if op.type in op_lists.FORWARDING_OPS and index == 0:
        reused = self._dying_input_of_size(inputs, size)
        if reused is not None:
          # Take over the buffer: it stays allocated for the new tensor.
          self._allocate(tensor, size, reused)
          continue
      self._allocate(tensor, size)

  def finish(self, op, inputs):
    """Counts the reads `op` made of `inputs`; frees what no one reads any
    more."""
    for tensor in inputs:
      buffer_id = self._buffers.get(tensor)
      if buffer_id is not None:
        self._remaining[buffer_id] -= 1
        self._release(buffer_id)
    # Outputs nothing reads die at once.
    for tensor in op.outputs:
      self._release(self._buffers[tensor])

  def _allocate(self, tensor, size, buffer_id=None):
    """Gives `tensor` a new buffer of `size`, or the existing `buffer_id`."""
    if buffer_id is None:
      buffer_id = id(tensor)
      self._buffer_size[buffer_id] = size
      self._remaining[buffer_id] = 0
      self.live[0] += size[0]
      self.live[1] += size[1]
    self._buffers[tensor] = buffer_id
    self._remaining[buffer_id] += self._consumers.get(tensor, 0)

  def _release(self, buffer_id):
    if self._remaining[buffer_id] == 0 and buffer_id in self._buffer_size:
      size = self._buffer_size.pop(buffer_id)
      self.live[0] -= size[0]
      self.live[1] -= size[1]

  def _dying_input_of_size(self, inputs, size):
    """A buffer of `size` read for the last time in `inputs`, or None."""
    for tensor in inputs:
      buffer_id = self._buffers.get(tensor)
      if (buffer_id is not None and buffer_id in self._buffer_size and
          self._remaining[buffer_id] == 1 and
          self._buffer_size[buffer_id] == size and size != _NO_BYTES):
        return buffer_id
    return None


def _upcast_scratch(op, size_of):
  """Bytes of float32 copies a non-bfloat16 CPU makes for a bfloat16 matmul.

  TensorFlow's CPU matmul kernels without bfloat16 hardware convert the
  operands to float32, multiply, and convert the result back, and autocast
  computes the ops whose emulated kernels are slow (the conv gradients,
  einsum, ...) in float32 the same way: while the op runs, float32 copies
  (twice the bfloat16 bytes) of every bfloat16 operand and of the result
  are live.
  """
  if op.type not in _UPCAST_OPS or op.outputs[0].dtype != tf.bfloat16:
    return _NO_BYTES
  tensors = [t for t in op.inputs if t.dtype == tf.bfloat16]
  tensors.append(op.outputs[0])
  sizes = [size_of(t) for t in tensors]
  return (2.0 * sum(a for a, _ in sizes), 2.0 * sum(c for _, c in sizes))


def _upper_envelope(points, min_batch=1.0):
  """Keeps the (fixed, per_example) lines that are the max for some b >= 1."""
  best = {}
  for fixed, per_example in points:
    best[per_example] = max(best.get(per_example, float('-inf')), fixed)
  lines = sorted(best.items())  # by per_example, ascending
  hull = []
  for per_example, fixed in lines:
    while hull:
      last_c, last_a = hull[-1]
      # The new, steeper line overtakes the last one at this batch size.
      crossing = (last_a - fixed) / (per_example - last_c)
      if crossing <= min_batch:
        hull.pop()
        continue
      if len(hull) >= 2:
        prev_c, prev_a = hull[-2]
        if crossing <= (prev_a - last_a) / (last_c - prev_c):
          hull.pop()
          continue
      break
    hull.append((per_example, fixed))
  return [(fixed, per_example) for per_example, fixed in hull]
