"""Stop cleanly on a signal: a stopped job loses at most the current step.

`stop_on_sigterm()`: on SIGTERM (a preemptible TPU VM's notice) the loop
stops after the current step and the `CheckpointSaverHook` writes a final
checkpoint as it closes; a second SIGTERM exits at once.
`stop_on_signals()` does the same for SIGTERM and SIGINT (Ctrl-C at a
terminal: the first one stops and saves, a second one stops at once, as
Python's KeyboardInterrupt). Works for any tf.compat.v1 training loop
(Estimator or MonitoredSession).
"""

import os
import signal
import threading

from absl import logging
import tensorflow as tf


class _StopHook(tf.compat.v1.train.SessionRunHook):
  """Stops the loop once a signal has arrived; counts the steps it saw."""

  def __init__(self, stopper, steps_per_run):
    self._stopper = stopper
    self._steps_per_run = steps_per_run

  def after_create_session(self, session, coord):
    del coord
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is not None:
      self._stopper.step = int(session.run(global_step))

  def after_run(self, run_context, run_values):
    del run_values
    if self._stopper.step is not None:
      self._stopper.step += self._steps_per_run
    if self._stopper.requested:
      global_step = tf.compat.v1.train.get_global_step()
      if global_step is not None:
        # Read once, at the stop: exact whatever one run trains (a TPU
        # loop of a length the caller may not know).
        self._stopper.step = int(run_context.session.run(global_step))
      logging.warning('Stopping at global step %s on %s; the final '
                      'checkpoint is written as training closes.',
                      self._stopper.step, self._stopper.signal_name)
      run_context.request_stop()


class SignalStopper(object):
  """Turns SIGTERM into a clean stop of a training loop.

  Use it as a context manager around `estimator.train(...)` and pass
  `stopper.hook` in the training hooks. The handler is installed on entry
  (main thread only: Python delivers signals there) and the previous one
  restored on exit.

  Attributes:
    requested: True once a signal arrived.
    signal_name: e.g. 'SIGTERM', once a signal arrived.
    step: global step after the last completed `session.run`, or None
      before training starts: counted `steps_per_run` a run, and read from
      the graph once a signal has stopped the loop (exact then, whatever
      `steps_per_run` says).
    hook: the `SessionRunHook` that requests the stop.
  """

  def __init__(self, signals=(signal.SIGTERM,), steps_per_run=1):
    self._signals = tuple(signals)
    self._previous = {}
    self._event = threading.Event()
    self.signal_name = None
    self.step = None
    self.hook = _StopHook(self, steps_per_run)

  @property
  def requested(self):
    return self._event.is_set()

  @property
  def exit_status(self):
    """128 + the signal's number, as a shell reports a killed process."""
    if self.signal_name is None:
      return None
    return 128 + signal.Signals[self.signal_name].value

  def _handle(self, signum, frame):
    del frame
    if self._event.is_set():
      # A second signal means "now": restore the old handler and re-send.
      self._restore()
      os.kill(os.getpid(), signum)
      return
    self.signal_name = signal.Signals(signum).name
    self._event.set()
    again = ('press Ctrl-C again' if signum == signal.SIGINT else
             'send it again')
    logging.warning('%s received: training stops after the current step '
                    'and writes a checkpoint; %s to stop at once.',
                    self.signal_name, again)

  def _restore(self):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in self._signals:
        self._previous[signum] = signal.signal(signum, self._handle)
    else:
      logging.warning('Not on the main thread: SIGTERM will not stop '
                      'training cleanly.')
    return self

  def __exit__(self, *exc_info):
    self._restore()
    return False


def stop_on_sigterm(steps_per_run=1):
  """Returns a `SignalStopper` for SIGTERM (see there)."""
  return SignalStopper((signal.SIGTERM,), steps_per_run=steps_per_run)


def stop_on_signals(steps_per_run=1):
  """Returns a `SignalStopper` for SIGTERM and SIGINT (Ctrl-C)."""
  return SignalStopper((signal.SIGTERM, signal.SIGINT),
                       steps_per_run=steps_per_run)
