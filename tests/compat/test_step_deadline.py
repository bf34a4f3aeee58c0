"""Tests for the multi-worker step backstop (compat/step_deadline.py)."""

import json
import threading

import tensorflow as tf

from estimator_bf16.compat import step_deadline
from estimator_bf16.distribute import strategies

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
                          'step, hooks included, finished in 68 s (3 x the '
                          '20 s collective timeout + 4 x the slowest step, '
                          '2.0 s)')
    self.assertIn('worker:0 is hung or unreachable', hook.message)
    self.assertIn('run the same command again', hook.message)
    # Fires once.
    clock.now += 100
    self.assertFalse(hook.check())
    self.assertLen(exits, 1)

  def test_a_hook_that_hangs_after_its_step_ends_the_task(self):
    # E.g. a checkpoint save's own session.run, with the step itself done.
    hook, clock, exits = self._hook()
    self._step(hook, clock, 1.0)  # the first step: not counted
    self._step(hook, clock, 1.0)
    self._step(hook, clock, 1.0)  # the deadline runs from its start
    limit = step_deadline.deadline_secs(_TIMEOUT, 1.0)
    clock.now += limit - 1.0 - 0.1
    self.assertFalse(hook.check())
    clock.now += 0.2
    self.assertTrue(hook.check())
    self.assertEqual(exits, [step_deadline.EXIT_STATUS])

  def test_slowest_step_counts_the_hooks_after_it(self):
    hook, clock, exits = self._hook()
    self._step(hook, clock, 1.0)
    self._step(hook, clock, 1.0)
    clock.now += 30.0  # a checkpoint save after the step
    self._step(hook, clock, 1.0)
    hook.before_run(None)
    clock.now += step_deadline.deadline_secs(_TIMEOUT, 31.0) - 0.1
    self.assertFalse(hook.check())
    clock.now += 0.2
    self.assertTrue(hook.check())
    self.assertIn('the slowest step, 31.0 s', hook.message)
    self.assertLen(exits, 1)

  def test_the_first_steps_hooks_are_watched_but_not_its_run(self):
    hook, clock, exits = self._hook()
    hook.before_run(None)
    clock.now += 500.0  # setup, peers starting late: not counted
    hook.after_run(None, None)
    clock.now += step_deadline.deadline_secs(_TIMEOUT, 0.0) + 0.1
    self.assertTrue(hook.check())
    self.assertIn('the slowest step, 0.0 s', hook.message)
    self.assertLen(exits, 1)

  def test_watcher_thread_ends_when_stopped(self):
    hook, clock, exits = self._hook(poll_secs=0.01)
    hook.after_create_session(None, None)
    self._step(hook, clock, 1.0)
    thread = hook._thread  # pylint: disable=protected-access
    self.assertTrue(thread.is_alive())
    hook.stop()
    thread.join(10)
    self.assertFalse(thread.is_alive())
    self.assertEqual(exits, [])

  def _watched_step(self, suspects='worker:0'):
    """A watched session two steps in, its third step running.

    Returns:
      (hook, clock, event set when the hook would end the process).
    """
    fired = threading.Event()
    clock = _Clock()
    hook = step_deadline.StepDeadlineHook(
        _TIMEOUT, 'worker:1', suspects, clock=clock,
        exit_fn=lambda status: fired.set(), poll_secs=0.01)
    hook.after_create_session(None, None)
    self._step(hook, clock, 1.0)
    self._step(hook, clock, 1.0)
    hook.before_run(None)
    return hook, clock, fired

  def test_watcher_thread_fires(self):
    hook, clock, fired = self._watched_step('one of chief:0, worker:0')
    clock.now += 1000
    self.assertTrue(fired.wait(10))
    self.assertIn('one of chief:0, worker:0 is hung', hook.message)

  def test_stopped_hook_does_not_fire(self):
    # The running step raised: after_run never comes; the owner stops it.
    hook, clock, fired = self._watched_step()
    hook.stop()
    clock.now += 1000
    self.assertFalse(hook.check())
    self.assertFalse(fired.wait(0.3))

  def test_closing_hooks_get_a_deadline_from_end(self):
    # A clean close: end() runs before the final checkpoint save's end().
    hook, clock, exits = self._hook()
    for _ in range(3):
      self._step(hook, clock, 1.0)
    clock.now += 50.0
    hook.end(None)
    limit = step_deadline.deadline_secs(_TIMEOUT, 1.0)
    clock.now += limit - 0.1
    self.assertFalse(hook.check())
    clock.now += 0.2
    self.assertTrue(hook.check())
    self.assertLen(exits, 1)

  def test_bad_timeout(self):
    for timeout in (0, -1.0, None):
      with self.assertRaisesRegex(ValueError, 'timeout_secs must be > 0'):
        step_deadline.StepDeadlineHook(timeout, 'chief:0', 'worker:0')


class HookForStrategyTest(tf.test.TestCase):
  """Which training sessions get the backstop."""

  def _multi_worker(self, timeout_seconds):
    config = {'cluster': {'chief': ['localhost:2222'],
                          'worker': ['localhost:2223', 'localhost:2224']},
              'task': {'type': 'worker', 'index': 1}}
    return strategies.make_strategy(
        'multi_worker', timeout_seconds=timeout_seconds,
        environ={'TF_CONFIG': json.dumps(config)})

  def test_multi_worker_with_a_timeout(self):
    hook = step_deadline.hook_for(self._multi_worker(7.0))
    self.assertIsInstance(hook, step_deadline.StepDeadlineHook)
    clock = _Clock()
    hook._clock = clock  # pylint: disable=protected-access
    hook._exit_fn = lambda status: None  # pylint: disable=protected-access
    for _ in range(2):
      hook.before_run(None)
      hook.after_run(None, None)
    hook.before_run(None)
    clock.now += step_deadline.deadline_secs(7.0, 0.0) + 1
    self.assertTrue(hook.check())
    self.assertStartsWith(hook.message, 'Task worker:1 stopped:')
    self.assertIn('3 x the 7 s collective timeout', hook.message)
    self.assertIn('one of chief:0, worker:0 is hung', hook.message)

  def test_none_without_collectives_or_timeout(self):
    self.assertIsNone(step_deadline.hook_for(None))
    self.assertIsNone(step_deadline.hook_for(
        strategies.make_strategy('mirrored', cpu_devices=2)))
    self.assertIsNone(step_deadline.hook_for(self._multi_worker(None)))
