"""A backstop for multi-worker training: a step that never returns ends the task.

A collective op that waits for a silent peer fails after the strategy's
timeout, and the task then reports the peer and exits (`distribute.explain`).
That covers a dead peer and most hung ones, but not every wait: a task
stopped with SIGSTOP keeps its connections open, and a step has been seen
to wait out two collective timeouts and then keep waiting. The job then
hangs with every task alive, and nothing in it notices.

`StepDeadlineHook` watches the training loop from a thread of its own.
Once a first step has finished (the first one also sets up the collectives
and may wait for slow peers to start), it measures each step from one
`before_run` to the next: the step's `session.run` and every hook's work
after it (a checkpoint save's own `session.run` has been seen to hang too,
with the step itself done), and at the end, from `end()`, the hooks that
close the session (the final checkpoint save). When no new step has begun
(or the close has not finished) after

    3 x the collective timeout + 4 x the slowest step so far

it ends the process with status 1 after printing why, naming the peers. The
launcher (or the cluster manager) then stops the other tasks, and running
the job again resumes from the chief's last checkpoint. Three timeouts
leave the collectives time to fail on their own first, which gives the
more precise message. Nothing between two steps may take that long
anyway: the peers' next collectives would time out waiting for this task.
"""

import os
import sys
import threading
import time

from absl import logging
import tensorflow as tf

from estimator_bf16.compat import distribute as compat_distribute

# Status of a task that the backstop ends (a failure, as for a raised error).
EXIT_STATUS = 1
_TIMEOUTS = 3
_SLOWEST_STEPS = 4


def deadline_secs(timeout_secs, slowest_step_secs):
  """Seconds a step may run before the backstop ends the task (float)."""
  return _TIMEOUTS * timeout_secs + _SLOWEST_STEPS * slowest_step_secs


def hook_for(strategy):
  """The `StepDeadlineHook` a training session under `strategy` needs.

  Returns:
    A hook for a multi-worker strategy whose collectives have a timeout;
    None otherwise (one process, or collectives that wait for ever).
  """
  if strategy is None or not compat_distribute.is_multi_worker(strategy):
    return None
  timeout = compat_distribute.collective_timeout(strategy)
  if not timeout:
    return None
  return StepDeadlineHook(timeout, compat_distribute.task_name(strategy),
                          compat_distribute.suspects(strategy))


class StepDeadlineHook(tf.compat.v1.train.SessionRunHook):
  """Ends the process when a step, hooks included, outlives `deadline_secs`.

  Args:
    timeout_secs: the collective timeout of the strategy (seconds, > 0).
    task: this task's name ('chief:0'), for the message.
    suspects: the other training tasks, as the message names them
      (`distribute.suspects`).
    clock: seconds, monotonic (tests pass a fake).
    exit_fn: called with the status once the message is printed (default
      `os._exit`: the main thread is blocked inside TensorFlow, so only an
      exit of the whole process ends it).
    poll_secs: how often the watcher thread looks at the clock.

  The owner of the session calls `stop()` when training ends: before the
  session closes after an error (the error is what the task reports), after
  it closes otherwise (`end()` only restarts the clock for the closing
  hooks).
  """

  def __init__(self, timeout_secs, task, suspects, clock=time.monotonic,
               exit_fn=None, poll_secs=1.0):
    if not timeout_secs or timeout_secs <= 0:
      raise ValueError('timeout_secs must be > 0, got %r.' % (timeout_secs,))
    self._timeout_secs = float(timeout_secs)
    self._task = task
    self._suspects = suspects
    self._clock = clock
    self._exit_fn = exit_fn or _hard_exit
    self._poll_secs = poll_secs
    self._lock = threading.Lock()
    # Clock time the running step began (its before_run), or, right after
    # the first step, the time that step ended; None until then.
    self._began = None
    self._first_done = False
    self._slowest = 0.0
    self._stop = threading.Event()
    self._thread = None
    self.message = None    # set when the backstop fired

  def after_create_session(self, session, coord):
    # Not in begin(): a session that fails to start would leave the thread.
    self._stop.clear()
    self._thread = threading.Thread(target=self._watch, daemon=True,
                                    name='estimator_bf16_step_deadline')
    self._thread.start()

  def before_run(self, run_context):
    with self._lock:
      now = self._clock()
      if self._began is not None:
        # The previous step with its hooks (of the first step only its
        # hooks: its session.run sets up the collectives and waits for
        # peers, which says nothing about the others).
        self._slowest = max(self._slowest, now - self._began)
      if self._first_done:
        self._began = now
    return None

  def after_run(self, run_context, run_values):
    with self._lock:
      if not self._first_done:
        # From here on the loop is watched, the rest of this step's hooks
        # included.
        self._first_done = True
        self._began = self._clock()

  def end(self, session):
    # The session closes cleanly; the hooks' end() after this one (the
    # final checkpoint save) get a deadline of their own, from now. The
    # owner calls stop() once the session has closed.
    with self._lock:
      if self._began is not None:
        self._began = self._clock()

  def stop(self):
    """Stops watching (also when training ends by an error)."""
    with self._lock:
      self._stop.set()
      self._began = None

  def check(self):
    """Fires if the running step is past its deadline; True if it fired."""
    with self._lock:
      if self._began is None or self.message or self._stop.is_set():
        return False
      limit = deadline_secs(self._timeout_secs, self._slowest)
      waited = self._clock() - self._began
      if waited <= limit:
        return False
      self.message = (
          'Task %s stopped: no training step, hooks included, finished in '
          '%.0f s (%g x the '
          '%g s collective timeout + %g x the slowest step, %.1f s): %s is '
          'hung or unreachable and its collectives neither completed nor '
          'timed out. %s' % (self._task, waited, _TIMEOUTS, self._timeout_secs,
                             _SLOWEST_STEPS, self._slowest, self._suspects,
                             compat_distribute.RESUME_ADVICE))
    logging.error('%s', self.message)
    sys.stderr.write('error: %s\n' % self.message)
    sys.stderr.flush()
    self._exit_fn(EXIT_STATUS)
    return True

  def _watch(self):
    while not self._stop.wait(self._poll_secs):
      if self.check():
        return


def _hard_exit(status):
  logging.flush()
  os._exit(status)  # pylint: disable=protected-access
