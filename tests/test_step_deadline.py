"""Tests for the multi-worker step backstop (compat/step_deadline.py)."""

import threading

import tensorflow as tf

from estimator_bf16.compat import step_deadline

_TIMEOUT = 20.0


class _Clock(object):
  """A clock the test moves by hand."""

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


class StepDeadlineHookTest(tf.test.TestCase):

  def _hook(self, **kwargs):
    clock, exits = _Clock(), []
    hook = step_deadline.StepDeadlineHook(
        _TIMEOUT, 'chief:0', 'worker:0', clock=clock, exit_fn=exits.append,
        **kwargs)
    return hook, clock, exits

  def _step(self, hook, clock, seconds):
    hook.before_run(None)
    clock.now += seconds
    hook.after_run(None, None)

  def test_first_step_is_never_cut_short(self):
    # It sets up the collectives and waits for peers that start late.
    hook, clock, exits = self._hook()
    hook.before_run(None)
    clock.now += 100 * _TIMEOUT
    self.assertFalse(hook.check())
    self.assertEqual(exits, [])

  def test_step_past_the_deadline_ends_the_task(self):
    hook, clock, exits = self._hook()
    self._step(hook, clock, 50.0)  # the first step: not counted
    self._step(hook, clock, 2.0)
    self._step(hook, clock, 0.5)
    limit = step_deadline.deadline_secs(_TIMEOUT, 2.0)
    self.assertEqual(limit, 3 * _TIMEOUT + 4 * 2.0)
    hook.before_run(None)
    clock.now += limit - 0.1
    self.assertFalse(hook.check())
    self.assertEqual(exits, [])
    clock.now += 0.2
    self.assertTrue(hook.check())
    self.assertEqual(exits, [step_deadline.EXIT_STATUS])
    self.assertEqual(step_deadline.EXIT_STATUS, 1)
    self.assertStartsWith(hook.message, 'Task chief:0 stopped: no training '
                          'step finished in 68 s (3 x the 20 s collective timeout + 4 x the '
                          'slowest step, 2.0 s)')
    self.assertIn('worker:0 is hung or unreachable', hook.message)
    self.assertIn('run the same command again', hook.message)
    # Fires once.
    clock.now += 100
    self.assertFalse(hook.check())
    self.assertLen(exits, 1)

  def test_between_steps_nothing_is_watched(self):
    # Checkpoint saves and evaluation happen outside session.run.
    hook, clock, exits = self._hook()
    self._step(hook, clock, 1.0)
    self._step(hook, clock, 1.0)
    clock.now += 100 * _TIMEOUT
    self.assertFalse(hook.check())
    self.assertEqual(exits, [])

  def test_watcher_thread_fires_and_stops(self):
    fired = threading.Event()
    clock = _Clock()
    hook = step_deadline.StepDeadlineHook(
        _TIMEOUT, 'worker:1', 'one of chief:0, worker:0', clock=clock,
        exit_fn=lambda status: fired.set(), poll_secs=0.01)
    hook.begin()
    self._step(hook, clock, 1.0)
    self._step(hook, clock, 1.0)
    hook.before_run(None)
    clock.now += 1000
    self.assertTrue(fired.wait(10))
    self.assertIn('one of chief:0, worker:0 is hung', hook.message)
    hook.stop()
    hook._thread.join(10)  # pylint: disable=protected-access
    self.assertFalse(hook._thread.is_alive())  # pylint: disable=protected-access

  def test_stopped_hook_does_not_fire(self):
    fired = threading.Event()
    clock = _Clock()
    hook = step_deadline.StepDeadlineHook(
        _TIMEOUT, 'chief:0', 'worker:0', clock=clock,
        exit_fn=lambda status: fired.set(), poll_secs=0.01)
    hook.begin()
    self._step(hook, clock, 1.0)
    self._step(hook, clock, 1.0)
    hook.before_run(None)
    hook.end(None)
    clock.now += 1000
    self.assertFalse(fired.wait(0.3))

  def test_bad_timeout(self):
    for timeout in (0, -1.0, None):
      with self.assertRaisesRegex(ValueError, 'timeout_secs must be > 0'):
        step_deadline.StepDeadlineHook(timeout, 'chief:0', 'worker:0')
