"""Peak memory of a training step, read from the CPU allocator's step stats.

On a CPU, `RunOptions(trace_level=FULL_TRACE)` makes the session return, for
each op that allocated, the allocator's running `allocator_bytes_in_use`. The
largest of those is the peak of the step (parameters, optimizer slots and
activations together): the number that decides "does batch N fit", measured
rather than estimated.

TensorFlow's default CPU allocator keeps no such statistics. They exist only
when the process starts with `TF_CPU_ALLOCATOR_USE_BFC=true` (a BFC allocator
on the host, as GPUs use), and the variable must be set before TensorFlow
creates its first session; programs that measure memory set it at the top,
before importing TensorFlow (see `ALLOCATOR_ENV`).
"""

from absl import logging
import os

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


class PeakMemoryHook(tf.compat.v1.train.SessionRunHook):
  """Traces chosen training steps and keeps the allocator peak.

  Tracing slows the traced step, so only a few steps (after warm-up) are
  traced. The hook counts its own `run` calls, so it works the same in
  `TPUEstimator(use_tpu=False)`, plain `Estimator` and `MonitoredSession`.

  Attributes:
    peak_bytes: int, the largest peak over traced steps (0 before any).
    per_step: dict {call index: peak bytes} for each traced call.
  """

  def __init__(self, trace_steps=(3,), allocator_substring=''):
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
    self.per_step = {}

  def begin(self):
    if not allocator_stats_enabled():
      logging.warning(
          'PeakMemoryHook: %s=%s was not set when this process started, so '
          'the CPU allocator keeps no statistics and peak_bytes stays 0. Set '
          'it before importing TensorFlow.', *ALLOCATOR_ENV)

  def before_run(self, run_context):
    del run_context
    if self._calls in self._trace_steps:
      options = tf.compat.v1.RunOptions(
          trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
      return tf.compat.v1.train.SessionRunArgs(fetches=None, options=options)
    return None

  def after_run(self, run_context, run_values):
    del run_context
    if self._calls in self._trace_steps:
      peak = peak_bytes_from_run_metadata(run_values.run_metadata,
                                          self._allocator)
      self.per_step[self._calls] = peak
      self.peak_bytes = max(self.peak_bytes, peak)
    self._calls += 1
