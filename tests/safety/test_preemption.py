"""Kill `python -m estimator_bf16.apps.train_cli` at bad moments; it must resume correctly.

A first run of the CLI is killed at a random step; each test then resumes a
copy of its model_dir in a real process of the CLI and stops it in its own
way: SIGKILL while a checkpoint is being written, SIGKILL right after one is
written, SIGKILL while the restarted run rewrites the checkpoint it
restored, SIGTERM (a preemption notice), or not at all (it trains to the
end). Each run checks that it restored exactly the newest checkpoint the
state file names that reads completely; after each stop the test finds that
checkpoint again, checks that the next run would restore it, and that no
more than one checkpoint interval of steps was lost. Unit tests cover what
the timing rarely reaches: a corrupt newest checkpoint, a garbled state
file.
"""

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl.testing import parameterized
import pytest
import tensorflow as tf

from estimator_bf16.safety import checkpoint_repair
from estimator_bf16.safety import preemption
from tests.support import paths

_REPO = paths.REPO
_STEPS = 40
_INTERVAL = 10
_SEED = 20240611  # kill moments are drawn from this, for repeatable runs
_POLL_SECONDS = 0.0005
_TIMEOUT_SECONDS = 240
_PREEMPTED_STATUS = 128 + signal.SIGTERM

_RESTORED_RE = re.compile(r'Restoring parameters from \S*model\.ckpt-(\d+)')
_STEP_RE = re.compile(r'\] step (\d+)/')  # ProgressHook, read before
_SAVING_RE = re.compile(r'Saving checkpoints for (\d+) into')
_STOPPED_RE = re.compile(r'Stopping at global step (\d+) on SIG(?:TERM|INT)')


def _state_step(model_dir):
  """Step of the checkpoint the state file names, or None."""
  state = tf.train.get_checkpoint_state(model_dir)
  if state is None:
    return None
  return checkpoint_repair.checkpoint_step(state.model_checkpoint_path)


def _read_fully(prefix):
  """The global step of a checkpoint, after reading every tensor of it."""
  reader = tf.train.load_checkpoint(prefix)
  for name in reader.get_variable_to_shape_map():
    reader.get_tensor(name)
  return int(reader.get_tensor('global_step'))


def _newest_whole(model_dir):
  """(step of the newest listed checkpoint that reads whole, skipped ones).

  Computed here independently of `checkpoint_repair`: a kill while TensorFlow
  rewrites an index in place can leave the newest one unreadable, and the
  next run must then resume from the one before.
  """
  state = tf.train.get_checkpoint_state(model_dir)
  if state is None:
    return None, []
  skipped = []
  for prefix in reversed(list(state.all_model_checkpoint_paths)):
    try:
      step = _read_fully(prefix)
    except (tf.errors.OpError, ValueError):
      skipped.append(prefix)
      continue
    if step != checkpoint_repair.checkpoint_step(prefix):
      raise AssertionError('%s holds step %d' % (prefix, step))
    return step, skipped
  raise AssertionError('no listed checkpoint in %s reads whole' % model_dir)


class _Run(object):
  """One CLI process on the shared model_dir; its log is parsed as it grows."""

  def __init__(self, model_dir, log_path, env):
    self.model_dir = model_dir
    self._log_path = log_path
    self._offset = 0
    self._text = ''
    self.last_step = None  # ProgressHook's latest 'step N/total'
    self.saves = []  # 'Saving checkpoints for N', in order
    self.restored = None  # the step of 'Restoring parameters from'
    self.stopped = None  # 'Stopping at global step N on SIGTERM'
    command = [
        sys.executable, '-m', 'estimator_bf16.apps.train_cli', '--model=mnist_mlp',
        '--precision=bfloat16', '--model_dir=' + model_dir,
        '--train_steps=%d' % _STEPS, '--train_batch_size=8',
        '--save_checkpoints_steps=%d' % _INTERVAL, '--keep_checkpoint_max=3',
        '--eval_steps=1', '--export=false', '--log_every_steps=1',
        '--verbose']  # TensorFlow's own lines name restores and saves
    self._log = open(log_path, 'w')
    self.process = subprocess.Popen(command, cwd=_REPO, env=env,
                                    stdout=subprocess.DEVNULL,
                                    stderr=self._log)

  def refresh(self):
    """Parses the log lines written since the last call."""
    with open(self._log_path) as f:
      f.seek(self._offset)
      new = f.read()
    # Only whole lines: the rest is read again next time.
    new = new[:new.rfind('\n') + 1]
    self._offset += len(new.encode())
    self._text += new
    for match in _STEP_RE.finditer(new):
      self.last_step = max(self.last_step or 0, int(match.group(1)))
    self.saves += [int(v) for v in _SAVING_RE.findall(new)]
    restored = _RESTORED_RE.findall(new)
    if restored:
      self.restored = int(restored[-1])
    stopped = _STOPPED_RE.findall(new)
    if stopped:
      self.stopped = int(stopped[-1])

  def tail(self):
    self.refresh()
    return self._text[-3000:]

  def wait_for(self, condition, what):
    deadline = time.monotonic() + _TIMEOUT_SECONDS
    while time.monotonic() < deadline:
      self.refresh()
      if condition():
        return
      if self.process.poll() is not None:
        self.refresh()
        if condition():
          return
        raise AssertionError('the run ended before %s:\n%s' % (
            what, self.tail()))
      time.sleep(_POLL_SECONDS)
    raise AssertionError('timed out waiting for %s' % what)

  def kill(self, signum=signal.SIGKILL):
    self.process.send_signal(signum)
    return self.finish()

  def finish(self):
    status = self.process.wait(timeout=_TIMEOUT_SECONDS)
    self._log.close()
    self.refresh()
    return status

  def progress(self):
    """Steps completed when the process ended, from its log."""
    done = [0]
    if self.last_step is not None:
      done.append(self.last_step)  # logged: the steps done
    if self.saves:
      done.append(max(self.saves))  # a save starts once its step is done
    return max(done)


def _temp_dir_step(model_dir):
  """Step of a checkpoint save in progress ('<prefix>_temp/'), or None."""
  try:
    names = os.listdir(model_dir)
  except FileNotFoundError:
    return None
  steps = [checkpoint_repair.checkpoint_step(name[:-len('_temp')])
           for name in names if name.endswith('_temp')]
  steps = [s for s in steps if s is not None]
  return max(steps) if steps else None


def _run_folder(test):
  """(a fresh folder, its model_dir, the CLI's environment)."""
  return _folder(test.create_tempdir().full_path)


def _folder(root):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='1',
             ESTIMATOR_BF16_CACHE=os.path.join(root, 'cache'))
  return root, os.path.join(root, 'model'), env


def _copy_model_dir(source, target):
  """Copies a model_dir, leftovers of killed saves included.

  The state file lists absolute paths; the copy's names its own files.
  """
  shutil.copytree(source, target)
  state = tf.train.get_checkpoint_state(source)
  if state is not None:
    tf.compat.v1.train.update_checkpoint_state(
        target, os.path.basename(state.model_checkpoint_path),
        [os.path.basename(p) for p in state.all_model_checkpoint_paths])


def _newest_whole_and_lost(run, model_dir):
  """(newest whole checkpoint's step, steps lost, a line for messages)."""
  newest, unreadable = _newest_whole(model_dir)
  lost = run.progress() - (newest or 0)
  line = 'exit %4s  progress %2d  newest whole ckpt %2s  lost %2d%s' % (
      run.process.returncode, run.progress(), newest, lost,
      '  (unreadable: %s)' % unreadable if unreadable else '')
  return newest, lost, line


@pytest.mark.slow
class KillAndResumeTest(tf.test.TestCase):
  """Each stop resumes the checkpoints that a first killed run left.

  The first run starts afresh and is killed at a random step past the first
  interval (setUpClass); each test then runs the CLI once on a copy of its
  model_dir and stops it in its own way. Each run first checks that it
  restored exactly the newest checkpoint that reads whole; after the stop
  the test checks what the next run would restore (the run's own
  `checkpoint_repair.ensure_restorable`, then the newest checkpoint the
  state file names, as the Estimator restores it).
  """

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._root = tempfile.mkdtemp()
    root, model_dir, env = _folder(os.path.join(cls._root, 'first'))
    os.makedirs(root)
    # SIGKILL at a random step past the first interval.
    target = random.Random(_SEED).randint(_INTERVAL + 2, 2 * _INTERVAL + 8)
    run = _Run(model_dir, os.path.join(root, 'run.log'), env)
    try:
      run.wait_for(lambda: (run.last_step or 0) >= target,
                   'step %d' % target)
    finally:
      run.kill()
    cls._first = run
    cls._first_dir = model_dir
    cls._first_newest = _newest_whole(model_dir)[0]

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls._root, ignore_errors=True)
    super().tearDownClass()

  def _resume(self):
    """(the model_dir, a run on a copy of the first run's, after its
    restore)."""
    root, model_dir, env = _run_folder(self)
    _copy_model_dir(self._first_dir, model_dir)
    run = _Run(model_dir, os.path.join(root, 'run.log'), env)
    self.addCleanup(_end, run)
    run.wait_for(lambda: run.restored is not None, 'the restore')
    self.assertEqual(run.restored, self._first_newest, run.tail())
    return model_dir, run

  def _check_stopped(self, run, model_dir, how):
    """A listed checkpoint reads whole, at most one interval is lost, and
    the next run restores that checkpoint; returns its step."""
    newest, lost, line = _newest_whole_and_lost(run, model_dir)
    message = '%s: %s\n%s' % (how, line, run.tail())
    self.assertLessEqual(lost, _INTERVAL, message)
    prefix = checkpoint_repair.ensure_restorable(model_dir)
    self.assertEqual(checkpoint_repair.checkpoint_step(prefix), newest,
                     message)
    self.assertEqual(_state_step(model_dir), newest, message)
    print('%-30s %s' % (how, line))
    return newest

  def test_sigkill_at_a_random_step(self):
    run = self._first
    self.assertEqual(run.process.returncode, -signal.SIGKILL, run.tail())
    # On a copy: the check repairs what it finds, and the other tests
    # resume the first run's model_dir as the kill left it.
    model_dir = os.path.join(self.create_tempdir().full_path, 'model')
    _copy_model_dir(self._first_dir, model_dir)
    self.assertEqual(self._check_stopped(
        run, model_dir, 'SIGKILL at step %d' % run.last_step),
                     self._first_newest)

  def test_sigkill_while_a_checkpoint_is_written(self):
    # After the restore: the run removes leftovers of killed saves before.
    model_dir, run = self._resume()
    begun = self._first_newest
    run.wait_for(lambda: (_temp_dir_step(model_dir) or 0) > begun,
                 'a checkpoint save')
    run.kill()
    saving = max(run.saves)
    mid_save = _temp_dir_step(model_dir) == saving
    newest = self._check_stopped(run, model_dir, 'SIGKILL saving ckpt-%d%s' % (
        saving, '' if mid_save else ' (late)'))
    self.assertIn(newest, (saving - _INTERVAL, saving))

  def test_sigkill_right_after_a_new_checkpoint(self):
    model_dir, run = self._resume()
    begun = self._first_newest
    run.wait_for(lambda: (_state_step(model_dir) or 0) > begun,
                 'a new checkpoint')
    saved = _state_step(model_dir)
    run.kill()
    self._check_stopped(run, model_dir, 'SIGKILL after ckpt-%d' % saved)

  def test_sigkill_while_the_restored_checkpoint_is_rewritten(self):
    # The Estimator saves once as the session starts, over the checkpoint
    # it restored.
    model_dir, run = self._resume()
    begun = self._first_newest
    run.wait_for(lambda: begun in run.saves or
                 _temp_dir_step(model_dir) == begun,
                 'the re-save of ckpt-%d' % begun)
    run.kill()
    self._check_stopped(run, model_dir, 'SIGKILL re-saving ckpt-%d' % begun)

  def test_sigterm_writes_a_checkpoint_at_the_step_reached(self):
    model_dir, run = self._resume()
    target = min(_STEPS - 5, self._first_newest +
                 random.Random(_SEED + 5).randint(3, 12))
    run.wait_for(lambda: (run.last_step or 0) >= target, 'step %d' % target)
    status = run.kill(signal.SIGTERM)
    self.assertEqual(status, _PREEMPTED_STATUS, run.tail())
    self.assertIsNotNone(run.stopped, run.tail())
    self.assertEqual(_newest_whole(model_dir)[0], run.stopped)
    self.assertEqual(self._check_stopped(
        run, model_dir, 'SIGTERM at step %d' % run.stopped), run.progress())

  def test_left_alone_it_reaches_the_final_step(self):
    model_dir, run = self._resume()
    status = run.finish()
    self.assertEqual(status, 0, run.tail())
    self.assertEqual(_state_step(model_dir), _STEPS)
    self.assertEqual(_newest_whole(model_dir)[0], _STEPS)
    self.assertIsNone(_temp_dir_step(model_dir))


def _end(run):
  """Ends a run a failed test left running."""
  if run.process.poll() is None:
    run.process.kill()
    run.process.wait()
  if not run._log.closed:  # pylint: disable=protected-access
    run._log.close()  # pylint: disable=protected-access


@pytest.mark.slow
class CtrlCTest(tf.test.TestCase):

  def test_ctrl_c_saves_the_step_reached_and_exits_130(self):
    root, model_dir, env = _run_folder(self)
    run = _Run(model_dir, os.path.join(root, 'run.log'), env)
    # Past the first periodic checkpoint, and not on another one.
    run.wait_for(lambda: (run.last_step or 0) >= _INTERVAL + 3,
                 'step %d' % (_INTERVAL + 3))
    status = run.kill(signal.SIGINT)
    self.assertEqual(status, 128 + signal.SIGINT, run.tail())
    self.assertIsNotNone(run.stopped, run.tail())
    self.assertGreater(run.stopped, _INTERVAL, run.tail())
    self.assertEqual(_newest_whole(model_dir)[0], run.stopped)
    log = run.tail()
    self.assertIn('SIGINT received: training stops after the current step '
                  'and writes a checkpoint; press Ctrl-C again', log)
    self.assertNotIn('Traceback', log)
    self.assertNotIn('KeyboardInterrupt', log)


def _train_checkpoints(model_dir, steps):
  """Writes checkpoints at each step of `steps` with a tiny graph."""
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    tf.compat.v1.get_variable('w', initializer=tf.ones([4, 4]))
    saver = tf.compat.v1.train.Saver(max_to_keep=10)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for step in steps:
        session.run(global_step.assign(step))
        saver.save(session, os.path.join(model_dir, 'model.ckpt'),
                   global_step=step)


class EnsureRestorableTest(tf.test.TestCase):

  def test_corrupt_newest_falls_back_to_previous(self):
    model_dir = self.create_tempdir().full_path
    _train_checkpoints(model_dir, [10, 20, 30])
    # What a kill during an index rewrite leaves: a truncated index.
    index = os.path.join(model_dir, 'model.ckpt-30.index')
    with open(index, 'r+b') as f:
      f.truncate(os.path.getsize(index) // 2)
    prefix = checkpoint_repair.ensure_restorable(model_dir)
    self.assertEqual(checkpoint_repair.checkpoint_step(prefix), 20)
    self.assertEqual(tf.train.latest_checkpoint(model_dir), prefix)
    self.assertEqual(_state_step(model_dir), 20)

  def test_missing_data_file_falls_back(self):
    model_dir = self.create_tempdir().full_path
    _train_checkpoints(model_dir, [10, 20])
    os.remove(os.path.join(model_dir, 'model.ckpt-20.data-00000-of-00001'))
    self.assertEqual(checkpoint_repair.checkpoint_step(
        checkpoint_repair.ensure_restorable(model_dir)), 10)

  def test_garbled_state_file_uses_newest_on_disk(self):
    model_dir = self.create_tempdir().full_path
    _train_checkpoints(model_dir, [10, 20])
    with open(os.path.join(model_dir, 'checkpoint'), 'w') as f:
      f.write('model_checkpoint_path: "model.ckpt-2')  # cut mid-write
    self.assertEqual(checkpoint_repair.checkpoint_step(
        checkpoint_repair.ensure_restorable(model_dir)), 20)
    self.assertEqual(_state_step(model_dir), 20)

  def test_nothing_readable_is_an_error(self):
    model_dir = self.create_tempdir().full_path
    _train_checkpoints(model_dir, [10])
    with open(os.path.join(model_dir, 'model.ckpt-10.index'), 'wb') as f:
      f.write(b'not an index')
    with self.assertRaisesRegex(checkpoint_repair.CheckpointError,
                                'No checkpoint in .* can be read'):
      checkpoint_repair.ensure_restorable(model_dir)

  def test_interrupted_save_is_cleaned_and_fresh_dir_is_none(self):
    model_dir = self.create_tempdir().full_path
    self.assertIsNone(checkpoint_repair.ensure_restorable(model_dir))
    self.assertIsNone(checkpoint_repair.ensure_restorable(
        os.path.join(model_dir, 'not_yet')))
    _train_checkpoints(model_dir, [10])
    temp = os.path.join(model_dir, 'model.ckpt-20_temp')
    os.makedirs(temp)
    with open(os.path.join(temp, 'part-00000-of-00001.tempstate1'), 'w') as f:
      f.write('partial')
    self.assertEqual(checkpoint_repair.checkpoint_step(
        checkpoint_repair.ensure_restorable(model_dir)), 10)
    self.assertFalse(os.path.exists(temp))


class SignalStopperTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(('sigterm', signal.SIGTERM, 143),
                                  ('ctrl_c', signal.SIGINT, 130))
  def test_a_signal_requests_a_stop_and_handlers_are_restored(
      self, signum, status):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with preemption.stop_on_signals() as stopper:
      self.assertFalse(stopper.requested)
      self.assertIsNone(stopper.exit_status)
      os.kill(os.getpid(), signum)
      deadline = time.monotonic() + 5
      while not stopper.requested and time.monotonic() < deadline:
        time.sleep(0.01)
      self.assertTrue(stopper.requested)
      self.assertEqual(stopper.signal_name, signal.Signals(signum).name)
      self.assertEqual(stopper.exit_status, status)
    self.assertEqual(
        {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)},
        before)

  def test_a_second_ctrl_c_stops_at_once(self):
    # The second Ctrl-C goes to the handler that was there before: Python's
    # own here, whatever the test runner's worker installed.
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    self.addCleanup(signal.signal, signal.SIGINT, outer)
    with self.assertRaises(KeyboardInterrupt):
      with preemption.stop_on_signals() as stopper:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # let Python run the handler
        self.assertTrue(stopper.requested)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # interrupted by the KeyboardInterrupt

  # One step a run, counted right or (a TPU loop's length the caller got
  # wrong) as three: the stop step is the graph's either way.
  @parameterized.named_parameters(('counted_right', 1), ('counted_wrong', 3))
  def test_stop_hook_stops_monitored_session_and_saves(self, steps_per_run):
    model_dir = self.create_tempdir().full_path
    with tf.Graph().as_default():
      global_step = tf.compat.v1.train.get_or_create_global_step()
      train_op = global_step.assign_add(1)
      with preemption.stop_on_sigterm(steps_per_run) as stopper:
        hooks = [stopper.hook, tf.compat.v1.train.CheckpointSaverHook(
            model_dir, save_steps=1000)]
        with tf.compat.v1.train.MonitoredSession(hooks=hooks) as session:
          for step in range(100):
            if step == 7:
              os.kill(os.getpid(), signal.SIGTERM)
              time.sleep(0.05)  # let Python run the handler
            if session.should_stop():
              break
            session.run(train_op)
    self.assertTrue(stopper.requested)
    self.assertEqual(stopper.step, 8)
    # The saver hook wrote the final checkpoint as the session closed.
    self.assertEqual(_state_step(model_dir), 8)


if __name__ == '__main__':
  tf.test.main()
