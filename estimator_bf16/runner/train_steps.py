"""How many training steps a program's `train` calls ran.

A run that trains nothing is easy to mistake for a good one: an empty input
or a model_dir already at `max_steps` ends `train` at once, with exit code
0. The report says how many steps ran (`report.format_run_report`), read
from the global step, which is what `max_steps`, schedules and checkpoints
count: one step per update, whatever the device loop or gradient
accumulation does inside it.
"""

import tensorflow as tf


class StepCountHook(tf.compat.v1.train.SessionRunHook):
  """Reads the global step when the session starts and when it ends.

  Reading it at the end (`end`) rather than with each step's fetches: a
  fetch of the step in the same `run` as the train op may see the value
  from before the op's increment.

  Attributes:
    first: int, the global step when the (first) session was created, or
      None before that, or for a graph without a global step.
    last: int, the global step when training ended, or None if it has not
      ended normally (the program raised).
    calls: int, `run` calls made: one per step off the TPU.
  """

  def __init__(self):
    self._step = None
    self.first = None
    self.last = None
    self.calls = 0

  def begin(self):
    self._step = tf.compat.v1.train.get_global_step()

  def after_create_session(self, session, coord):
    del coord
    # A session created again (after a recoverable error) continues the
    # count: the first value stays.
    if self._step is not None and self.first is None:
      self.first = int(session.run(self._step))

  def after_run(self, run_context, run_values):
    del run_context, run_values
    self.calls += 1

  def end(self, session):
    if self._step is not None:
      self.last = int(session.run(self._step))

  @property
  def steps(self):
    """int, global steps advanced during the call (0 if none ran).

    When training did not end normally, the `run` calls made, which is
    the step count off the TPU.
    """
    if self.first is None or self.last is None:
      return self.calls
    return self.last - self.first
