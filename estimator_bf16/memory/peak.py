"""Peak memory of a training step, read from the CPU allocator's step stats.

On a CPU, `RunOptions(trace_level=FULL_TRACE)` makes the session return, for
each op that allocated, the allocator's running `allocator_bytes_in_use`. The
largest of those is the peak of the step (parameters, optimizer slots and
activations together): the number that decides "does batch N fit", measured
rather than estimated.

The same trace also records each allocation and free with its time, so the
step can be replayed tensor by tensor (`live_tensor_peak`): the bytes the
step's tensors asked for, without the allocator's chunk rounding or what
else the process holds. That is the figure the memory planner plans and a
TPU's compiler sizes buffers by; `PeakMemoryHook` keeps both.

TensorFlow's default CPU allocator keeps no such statistics. They exist only
when the process starts with `TF_CPU_ALLOCATOR_USE_BFC=true` (a BFC allocator
on the host, as GPUs use), and the variable must be set before TensorFlow
creates its first session; programs that measure memory set it at the top,
before importing TensorFlow (see `ALLOCATOR_ENV`).
"""

import collections
import os

from absl import logging
import tensorflow as tf

ALLOCATOR_ENV = ('TF_CPU_ALLOCATOR_USE_BFC', 'true')


def allocator_stats_enabled():
  """True if this process asked for the statistics-keeping CPU allocator."""
  return os.environ.get(ALLOCATOR_ENV[0], '').lower() in ('1', 'true')


def peak_bytes_from_run_metadata(run_metadata, allocator_substring=''):
  """Returns the allocator peak of one traced step, in bytes.

  Args:
    run_metadata: a `tf.compat.v1.RunMetadata` filled by a FULL_TRACE run.
    allocator_substring: only allocators whose name contains this
      (case-insensitive) count; `''` counts every allocator.

  Returns:
    int, the largest bytes-in-use seen by any matching allocator during the
    step; 0 if the trace carries no allocator statistics (see module doc).
  """
  peak = 0
  wanted = allocator_substring.lower()
  for device in run_metadata.step_stats.dev_stats:
    for node in device.node_stats:
      for memory in node.memory:
        if wanted in memory.allocator_name.lower():
          peak = max(peak, memory.allocator_bytes_in_use)
  return int(peak)


def live_tensor_peak(run_metadata):
  """The peak of bytes that tensors alive together asked for, in one step.

  The CPU allocator's peak counts whole chunks: it hands a request any free
  chunk up to twice its size, so which chunks earlier steps and sessions
  left decides several MiB of a peak (an 8 MiB activation held in a 16 MiB
  chunk). This replays the step's allocations and frees instead (FULL_TRACE
  records them per op, with their times) and counts each output tensor at
  the bytes it requested; kernel temporaries count at their chunk size, the
  only size recorded for them.

  A buffer that an op allocates, does not output, and that is still alive
  when the step ends was kept by a resource: an assign that copies (to a
  variable in copy-on-read mode, as every variable a sparse update has
  touched is) puts the new value in it and drops the variable's old buffer. That buffer was
  allocated in an earlier step, so the trace never records its free, and
  counting the copy for the rest of the step would count the variable
  twice (its bytes are already in the graph's variables). Such a buffer
  counts only until its op ends, when the old one goes. On a BERT-style
  step with sparse Adam updates of the embeddings this was 4 to 6 MB, and
  whether the step's peak came after those assigns depended on the
  executor's order. Two cases still count one buffer too many: between
  the first and last copy of a variable assigned several times in one
  step, and after an assign that takes over an op's output as the
  variable's value (that output is never freed in the step, like a
  fetched one, which really is alive).

  Args:
    run_metadata: a `tf.compat.v1.RunMetadata` of a FULL_TRACE run.

  Returns:
    int, the largest sum of live requested bytes during the step, counting
    only what the step allocated (not variables it found allocated).
  """
  events = []
  for device in run_metadata.step_stats.dev_stats:
    for node in device.node_stats:
      requested = collections.defaultdict(list)
      for output in node.output:
        description = output.tensor_description.allocation_description
        requested[description.allocated_bytes].append(
            description.requested_bytes)
      ended = node.all_start_micros + node.all_end_rel_micros
      for memory in node.memory:
        # chunk bytes -> [(counted bytes, is an output)] of live buffers
        live = collections.defaultdict(list)
        for record in memory.allocation_records:
          chunk = abs(record.alloc_bytes)
          if record.alloc_bytes > 0:
            output = bool(requested[chunk])
            size = requested[chunk].pop(0) if output else chunk
            live[chunk].append((size, output))
            events.append((record.alloc_micros, size))
          elif live[chunk]:
            events.append((record.alloc_micros, -live[chunk].pop(0)[0]))
        for buffers in live.values():
          events.extend((ended, -size) for size, output in buffers
                        if not output)
  in_use = peak = 0
  # Frees before allocations at the same microsecond.
  for _, delta in sorted(events, key=lambda event: (event[0], event[1])):
    in_use += delta
    peak = max(peak, in_use)
  return int(peak)


def traced_run_options():
  """`RunOptions` for a step whose memory is measured: traced, ops in order.

  FULL_TRACE makes the session record each op's allocations (module doc).
  `inter_op_thread_pool=-1` runs the step on the calling thread, one op
  after another in the order they become ready (for a graph on one device;
  with several it falls back to the first pool). With a pool of threads,
  which ready op runs first follows kernel times and the machine's load,
  and so does which tensors are alive together: a BERT-style step's peak
  read 50.2 MiB on an idle machine and 52.2 MiB with both cores busy, and
  run inline 49.8 MiB on both. One op at a time is also how the planner
  simulates a step and how a TPU's compiler schedules one.

  Returns:
    a new `tf.compat.v1.RunOptions`.
  """
  return tf.compat.v1.RunOptions(
      trace_level=tf.compat.v1.RunOptions.FULL_TRACE, inter_op_thread_pool=-1)


def graph_variable_bytes(graph):
  """Bytes of every global and local variable of `graph` (int)."""
  seen, total = set(), 0
  for variable in (
      graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) +
      graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)):
    if id(variable) in seen or not variable.shape.is_fully_defined():
      continue
    seen.add(id(variable))
    total += variable.shape.num_elements() * variable.dtype.base_dtype.size
  return total


# The `run` call traced by default (0-based): the first calls of a session
# do one-off work (initialization, the first checkpoint, warm-up), so a
# train call is measured only from its fourth step on.
TRACED_CALL = 3


class PeakMemoryHook(tf.compat.v1.train.SessionRunHook):
  """Traces chosen training steps and keeps the allocator peak.

  Tracing slows the traced step, and it runs one op at a time
  (`traced_run_options`), so only a few steps (after warm-up) are traced.
  The hook counts its own `run` calls, so it works the same in
  `TPUEstimator(use_tpu=False)`, plain `Estimator` and `MonitoredSession`.

  Attributes:
    peak_bytes: int, the largest allocator peak over traced steps (0 before
      any).
    tensor_peak_bytes: int, the largest peak of the step's tensors over
      traced steps: the graph's variables plus `live_tensor_peak` (0 before
      any).
    per_step: dict {call index: allocator peak bytes} for each traced call.
  """

  def __init__(self, trace_steps=(TRACED_CALL,), allocator_substring=''):
    """Creates the hook.

    Args:
      trace_steps: iterable of 0-based `run` call indices to trace; the
        first calls include one-off initialisation work, so skip a few.
      allocator_substring: see `peak_bytes_from_run_metadata`.
    """
    self._trace_steps = frozenset(int(s) for s in trace_steps)
    self._allocator = allocator_substring
    self._calls = 0
    self.peak_bytes = 0
    self.tensor_peak_bytes = 0
    self.per_step = {}
    self._variable_bytes = 0

  def begin(self):
    self._variable_bytes = graph_variable_bytes(
        tf.compat.v1.get_default_graph())
    if not allocator_stats_enabled():
      logging.warning(
          'PeakMemoryHook: %s=%s was not set when this process started, so '
          'the CPU allocator keeps no statistics and peak_bytes stays 0. Set '
          'it before importing TensorFlow.', *ALLOCATOR_ENV)

  def before_run(self, run_context):
    del run_context
    if self._calls in self._trace_steps:
      return tf.compat.v1.train.SessionRunArgs(
          fetches=None, options=traced_run_options())
    return None

  def after_run(self, run_context, run_values):
    del run_context
    if self._calls in self._trace_steps:
      peak = peak_bytes_from_run_metadata(run_values.run_metadata,
                                          self._allocator)
      self.per_step[self._calls] = peak
      self.peak_bytes = max(self.peak_bytes, peak)
      if peak:
        self.tensor_peak_bytes = max(
            self.tensor_peak_bytes,
            self._variable_bytes + live_tensor_peak(run_values.run_metadata))
    self._calls += 1
