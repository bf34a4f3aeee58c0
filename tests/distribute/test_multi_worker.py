"""Multi-worker training: processes on 127.0.0.1, TF_CONFIG, failures.

`python -m estimator_bf16.apps.launch --workers=2 -- python -m estimator_bf16.apps.train_cli
--distribute=multi_worker ...` trains the MNIST MLP on the digits in
bfloat16 with MultiWorkerMirroredStrategy. Killing a worker mid-run stops
the job within a bounded time, naming the lost task, and keeps the chief's
last checkpoint; the same command (with a longer collective timeout) on a
model_dir with a checkpoint resumes there and trains to the final step, at
the accuracy of one process. A hung worker is named at the collective
timeout, and a SIGTERM to the launcher keeps the chief's last step.

Each training job costs seconds of process starts (TensorFlow imports,
graph builds), so each job is run once, for the tests of its class; the
launcher runs in a thread of the test process where its own process is
not the point (`_Job`). The module's classes run one after another on one
pytest-xdist worker (tests/conftest.py).
"""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from unittest import mock

from absl.testing import parameterized
import pytest
import tensorflow as tf

from estimator_bf16.apps import launch
from estimator_bf16.apps import training
from tests.support import isolated_cache
from tests.support import waiting
from tests.support import paths

_REPO = paths.REPO
# 150 steps reach about 0.96 accuracy on the digits (0.94 after 60, 0.98
# after 200 in one process): far enough from chance and still climbing
# slowly enough that the two set-ups compare. Training them takes about 2 s
# of a job whose task starts take about 10 s here: fewer steps would save
# about a second per job and put the comparison on the steep part of the
# curve, where the 0.03 below would be a coin toss.
_STEPS = 150
_BATCH = 64
# Checkpoints every 25 steps: the jobs that are killed or stopped get their
# signal after the first one past step 0, with 125 steps (seconds of
# training, against a 0.05 s poll) left before the job would end.
_SAVE_STEPS = 25
# The data split differs (each worker reads half the records, in its own
# order), a resumed run restarts its input, and bfloat16 rounds
# differently, so accuracies after 150 steps vary by about 0.015 between
# runs; on 360 test digits 0.03 is 11 images.
_ACCURACY_TOLERANCE = 0.03
# A killed peer is noticed within about a second when a transfer with it is
# under way (gRPC sees the connection reset), and otherwise when the
# collective that waits for it times out (e.g. the chief, the group's
# leader, waiting for the peer to join the next all-reduce). A step can
# wait out two collective timeouts in a row before it fails (the chief
# reported a stopped worker after one timeout in most runs and after two in
# one). So a report is bounded by twice the timeout, and the launcher
# (which names the dead task at once) gives the others longer than that to
# stop on their own; its grace plus its SIGKILL delay bounds the stop.
# When the collectives wait on regardless, the task's step backstop
# (compat/step_deadline.py) ends it after three timeouts plus four of its
# slowest steps (a step with the hooks after it, checkpoint saves included:
# well under a second each here).
# The tests wait out this timeout (the killed job when the kill lands
# between two transfers, the hung one always, up to three of them when
# the backstop has to end the chief), so it is short. It only bounds the
# wait between two collectives once training runs: a job that starts
# afresh first meets in the broadcast of the chief's initial values, which
# has no timeout (collective_all_reduce_strategy's broadcast_send/recv), so
# slow imports and graph builds are not timed. After the broadcast both
# tasks do the same work, the worker saving its checkpoints too (into a
# scratch directory): with --verbose the two tasks finished their local
# init, their step-0 save and their save at step 25 about 0.1 s apart on
# this machine under load, with TensorFlow 2.15 and 2.21 alike; 0.5 s on a
# machine 4.33x slower leaves 6x for its load. (At 10 s, a killed job
# whose chief waited out its backstop took 31 s to stop, against 1 s when
# the chief saw the connection reset; the hung job took 12 s at 5 s when
# its collective timed out, 17 s when the backstop ended it.)
_WORKER_TIMEOUT_SECS = 3
# A resumed job has no such broadcast: every task restores the checkpoint,
# and its first all-reduce waits for the slowest task to import
# TensorFlow, build its graph and restore (5 s apart on this machine under
# load). The rerun, which only has to resume and finish, gets the
# library's default timeout for that.
_RESUME_TIMEOUT_SECS = 120
# ResumeTest's job starts from a checkpoint of this step (of _STEPS), as a
# job killed after its second periodic checkpoint would.
_RESUME_FROM = 2 * _SAVE_STEPS


def _report_bound_secs(timeout):
  return 2 * timeout + 15


def _backstop_bound_secs(timeout):
  return 3 * timeout + 15


_GRACE_SECS = 2 * _WORKER_TIMEOUT_SECS + 10
_STOP_BOUND_SECS = _GRACE_SECS + launch._KILL_AFTER_SECS + 10  # pylint: disable=protected-access
# How long a test waits for a signalled job to end before it fails: the
# backstop's bound, then the launcher's stop.
_WAIT_BOUND_SECS = _backstop_bound_secs(_WORKER_TIMEOUT_SECS) + _STOP_BOUND_SECS

# The stopped worker of HungWorkerTest ignores SIGTERM, so the launcher's
# SIGKILL delay is part of that test's wait; a short one checks the same
# escalation (SIGTERM, then SIGKILL once the delay is over) in less time.
_SHORT_KILL_AFTER_SECS = 1.0

_CACHE = isolated_cache.IsolatedCache()


def setUpModule():
  _CACHE.start()


def tearDownModule():
  _CACHE.stop()


def _command(model_dir, steps=_STEPS, timeout=_WORKER_TIMEOUT_SECS,
             extra=()):
  return [sys.executable, '-m', 'estimator_bf16.apps.train_cli', '--model=mnist_mlp',
          '--precision=bfloat16', '--distribute=multi_worker',
          '--model_dir=%s' % model_dir, '--train_steps=%d' % steps,
          '--train_batch_size=%d' % _BATCH, '--export=false',
          '--worker_timeout_secs=%d' % timeout] + list(extra)


def _task_env():
  # Temporary files of the tasks (a non-chief's scratch directory) go
  # under the module's root, removed at the end even for killed tasks.
  return dict(os.environ, PYTHONPATH=_REPO, TMPDIR=_CACHE.root)


def _launch(command, workers=2, grace_secs=_GRACE_SECS):
  """Starts the launcher's command line; returns the Popen (merged output)."""
  return subprocess.Popen(
      [sys.executable, '-m', 'estimator_bf16.apps.launch',
       '--workers=%d' % workers,
       '--grace_secs=%d' % grace_secs, '--'] + command,
      cwd=_REPO, env=_task_env(), stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True)


def _chief_result(output):
  """The JSON the chief printed at the end (lines prefixed with its task)."""
  prefix = '[chief:0] '
  lines = [line[len(prefix):] for line in output.splitlines()
           if line.startswith(prefix)]
  start = max(i for i, line in enumerate(lines) if line == '{')
  end = start + lines[start:].index('}')
  return json.loads('\n'.join(lines[start:end + 1]))


def _read_into(process, lines):
  for line in process.stdout:
    lines.append(line)


def _task_pids(lines):
  """{task: pid} from the launcher's 'started' lines."""
  pids = {}
  for line in list(lines):
    if line.startswith('[launch] started '):
      name, rest = line[len('[launch] started '):].split(' (pid ', 1)
      pids[name] = int(rest.split(')')[0])
  return pids


def _kill_group(pid):
  try:
    os.killpg(pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass


@contextlib.contextmanager
def _drained(process):
  """Yields the list of the launcher's output lines, filled as they come.

  Drained all along: a full pipe would stall the launcher and the job. On
  exit, a launcher still running is killed with its tasks (they run in
  sessions of their own, so killing the launcher alone would leave them).
  """
  lines = []
  reader = threading.Thread(target=_read_into, args=(process, lines),
                            daemon=True)
  reader.start()
  try:
    yield lines
  finally:
    if process.poll() is None:
      for pid in _task_pids(lines).values():
        _kill_group(pid)
      process.kill()
      process.wait()
    reader.join(timeout=10)


class _Job(object):
  """`launch.run` in a thread of the test process, its output recorded.

  A launcher process would import TensorFlow (through the package) before
  it starts a task: seconds per job, for nothing these jobs check. They
  signal the tasks, not the launcher, and `launch.run` returns the status
  the launcher exits with (its main passes it to sys.exit as it is). The
  launcher's command line, and a signal to its process, are
  LauncherSigtermTest's.

  Attributes:
    lines: the launcher's output, one prefixed line per item (the launcher
      writes each line whole, under its lock).
    arrivals: (time.monotonic() of its arrival, line) for each line.
    status: what `launch.run` returned; None while it runs.
    ended_at: time.monotonic() when `launch.run` returned.
  """

  def __init__(self, command, workers=2, grace_secs=_GRACE_SECS):
    self.lines = []
    self.arrivals = []
    self.status = None
    self.ended_at = None
    self._error = None
    self._thread = threading.Thread(
        target=self._run, args=(command, workers, grace_secs),
        daemon=True)
    self._thread.start()

  def write(self, text):
    self.arrivals.append((time.monotonic(), text))
    self.lines.append(text)

  def flush(self):
    pass

  def _run(self, command, workers, grace_secs):
    try:
      self.status = launch.run(command, workers,
                               grace_secs=grace_secs, out=self,
                               env=_task_env())
    except BaseException as e:  # pylint: disable=broad-except
      self._error = e
    finally:
      self.ended_at = time.monotonic()

  def running(self):
    return self._thread.is_alive()

  def output(self):
    return ''.join(self.lines)

  def wait(self, timeout):
    """Waits for `launch.run` to return; False if it still runs."""
    self._thread.join(timeout)
    if self._error is not None:
      raise self._error
    return not self.running()

  def kill(self):
    """Kills the tasks of a job still running, then waits for the launcher.

    They run in sessions of their own: nothing else would stop them when a
    test fails half way.
    """
    if self.running():
      for pid in _task_pids(self.lines).values():
        _kill_group(pid)
      self._thread.join(timeout=30)


def _wait_until(condition, lines, running, timeout=300):
  """Polls `condition()`; fails with the job's last lines if it ends first."""
  deadline = time.monotonic() + timeout
  while not condition():
    if not running():
      raise AssertionError('the job ended first:\n' + ''.join(lines[-50:]))
    if time.monotonic() > deadline:
      raise AssertionError('not within %d s:\n%s' % (
          timeout, ''.join(lines[-50:])))
    time.sleep(0.05)


def _step(path):
  return int(tf.train.load_checkpoint(path).get_tensor('global_step'))


def _signal_worker_after_first_checkpoint(job, model_dir, sig):
  """Sends `sig` to worker:0 once the chief has saved a step >= _SAVE_STEPS.

  Returns:
    time.monotonic() of the signal.
  """
  _wait_until(lambda: waiting.checkpoint_at_or_after(model_dir, _SAVE_STEPS),
              job.lines, job.running)
  os.kill(_task_pids(job.lines)['worker:0'], sig)
  signalled_at = time.monotonic()
  return signalled_at


def _after(job, signalled_at):
  """Waits for the signalled job to end (up to _WAIT_BOUND_SECS).

  Returns:
    (seconds from the signal to the launcher's return, {line: seconds from
    the signal to its arrival} for the lines printed after the signal).
  """
  if not job.wait(timeout=max(
      0.0, signalled_at + _WAIT_BOUND_SECS - time.monotonic())):
    raise AssertionError(
        'the job was still running %d s after the signal; what it printed '
        'after the signal:\n%s' % (_WAIT_BOUND_SECS, ''.join(
            line for at, line in list(job.arrivals)
            if at >= signalled_at)[-8000:]))
  after = {line: at - signalled_at for at, line in job.arrivals
           if at >= signalled_at}
  return job.ended_at - signalled_at, after


def _train_here(model_dir, steps):
  """One process's training of the jobs' model, in this process.

  Returns:
    `training.run`'s result.
  """
  return training.run(training.TrainOptions(
      model='mnist_mlp', model_dir=model_dir, precision='bfloat16',
      train_steps=steps, train_batch_size=_BATCH, export=False,
      save_checkpoints_steps=_SAVE_STEPS))


class _Reference(object):
  """`_train_here` in a thread of its own.

  It trains while a two-worker job's tasks start up and wait for each
  other (training.run sets no signal handlers outside the main thread).
  """

  def __init__(self, model_dir, steps):
    self.result = None
    self._error = None
    self._thread = threading.Thread(target=self._run,
                                    args=(model_dir, steps), daemon=True)
    self._thread.start()

  def _run(self, model_dir, steps):
    try:
      self.result = _train_here(model_dir, steps)
    except BaseException as e:  # pylint: disable=broad-except
      self._error = e

  def join(self, timeout=600):
    self._thread.join(timeout)
    if self._error is not None:
      raise self._error
    if self._thread.is_alive():
      raise AssertionError('the one-process run took over %d s' % timeout)
    return self.result


@pytest.mark.slow
class KilledWorkerTest(tf.test.TestCase):
  """One job whose worker is killed after the chief's first periodic
  checkpoint, run once for the class's tests."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model_dir = os.path.join(tempfile.mkdtemp(dir=_CACHE.root), 'killed')
    killed = _Job(_command(cls.model_dir, extra=[
        '--save_checkpoints_steps=%d' % _SAVE_STEPS]))
    try:
      signalled_at = _signal_worker_after_first_checkpoint(
          killed, cls.model_dir, signal.SIGKILL)
      cls.stopped_after, cls.after = _after(killed, signalled_at)
    finally:
      killed.kill()
    cls.killed = killed

  def test_killed_worker_stops_the_job_naming_it(self):
    output = self.killed.output()
    tail = output[-6000:]  # what the job printed, for a failure's message
    self.assertLess(self.stopped_after, _STOP_BOUND_SECS, tail)
    self.assertEqual(128 + signal.SIGKILL, self.killed.status, tail)
    self.assertIn('[launch] worker:0 was killed by SIGKILL; stopping the '
                  'other tasks.', output)
    # When the chief reports the lost task (it does unless stuck), it names
    # worker:0, in time (see _report_bound_secs): from the failed
    # collective, or from its step backstop when the collective waited on
    # and the backstop (3 timeouts after the last step) came before the
    # launcher's stop (the grace, 3 timeouts after the kill was seen).
    reports = [line for line in self.after
               if line.startswith('[chief:0] error: Task chief:0 stopped:')]
    for line in reports:
      self.assertRegex(line, r'worker:0 (did not answer|is hung or '
                       r'unreachable)')
    if reports:
      self.assertLess(min(self.after[line] for line in reports),
                      _report_bound_secs(_WORKER_TIMEOUT_SECS), tail)

  def test_the_chiefs_checkpoint_from_before_the_kill_is_kept(self):
    # The job stopped after a periodic checkpoint and before the end; the
    # checkpoint reads back (ResumeTest resumes from one).
    self.assertBetween(_step(self.model_dir), _SAVE_STEPS, _STEPS - 1)


@pytest.mark.slow
class ResumeTest(tf.test.TestCase):
  """The multi-worker command on a model_dir that holds a checkpoint of
  step _RESUME_FROM: it resumes there, trains to the final step, and
  reaches the accuracy of one process, which trains the same steps in
  this process meanwhile (from the same checkpoint). The checkpoint is one
  process's: a two-worker job would cost another start of its tasks (a
  killed job's chief writes its checkpoints the same way:
  KilledWorkerTest)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    root = tempfile.mkdtemp(dir=_CACHE.root)
    cls.single_dir = os.path.join(root, 'one')
    cls.model_dir = os.path.join(root, 'two')
    _train_here(cls.single_dir, _RESUME_FROM)
    shutil.copytree(cls.single_dir, cls.model_dir)
    # The copy's checkpoint state names its own checkpoint.
    tf.compat.v1.train.update_checkpoint_state(
        cls.model_dir, os.path.basename(
            tf.train.latest_checkpoint(cls.single_dir)))
    reference = _Reference(cls.single_dir, _STEPS)
    # The resumed job's first all-reduce waits for its slowest task's start
    # (see _RESUME_TIMEOUT_SECS).
    rerun = _Job(_command(cls.model_dir, timeout=_RESUME_TIMEOUT_SECS,
                          extra=['--save_checkpoints_steps=%d' % _SAVE_STEPS]))
    try:
      if not rerun.wait(timeout=600):
        raise AssertionError('the rerun took over 600 s:\n' +
                             rerun.output()[-3000:])
    finally:
      rerun.kill()
    cls.rerun = rerun
    cls.single = reference.join()['eval']

  def test_resumes_from_the_checkpoint_to_the_final_step(self):
    output = self.rerun.output()
    self.assertEqual(0, self.rerun.status, output[-3000:])
    self.assertIn('[launch] all 2 tasks finished.', output)
    # Each task ran in its own process with its own TF_CONFIG task.
    self.assertIn('2 replicas, task chief:0', output)
    self.assertIn('2 replicas, task worker:0', output)
    # Both tasks start from the saved step (estimator_bf16.apps.progress
    # reads the global step once the session has restored it).
    for task in ('chief:0', 'worker:0'):
      self.assertRegex(output, r'\[%s\] .*\] resuming at step %d of %d' % (
          task, _RESUME_FROM, _STEPS))
    self.assertEqual(_STEPS, _step(self.model_dir))
    self.assertEqual(_STEPS, _chief_result(output)['eval']['global_step'])

  def test_reaches_the_accuracy_of_one_process(self):
    two = _chief_result(self.rerun.output())['eval']
    self.assertGreater(self.single['accuracy'], 0.9)
    self.assertNear(self.single['accuracy'], two['accuracy'],
                    _ACCURACY_TOLERANCE)

  def test_evaluator_task_evaluates_the_last_checkpoint(self):
    # The evaluator task of the same command (`launch --evaluator` gives it
    # this TF_CONFIG: LaunchTest) trains nothing: it evaluates the
    # checkpoints in model_dir up to --train_steps. It needs no peer, so
    # it runs here, on the one-process run's finished model_dir.
    tf_config = json.dumps({
        'cluster': {'chief': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2'],
                    'evaluator': ['127.0.0.1:3']},
        'task': {'type': 'evaluator', 'index': 0}})
    with mock.patch.dict(os.environ, {'TF_CONFIG': tf_config}):
      result = training.run(training.TrainOptions(
          model='mnist_mlp', model_dir=self.single_dir,
          precision='bfloat16', train_steps=_STEPS,
          train_batch_size=_BATCH, export=False,
          distribute='multi_worker'))
    self.assertEqual(_STEPS, result['eval']['global_step'])
    self.assertEqual([_STEPS], result['evaluated_steps'])
    self.assertNear(self.single['accuracy'], result['eval']['accuracy'],
                    1e-6)
    self.assertTrue(os.path.isdir(os.path.join(self.single_dir,
                                               'eval_evaluator')))


@pytest.mark.slow
class HungWorkerTest(tf.test.TestCase):

  def test_hung_worker_stops_the_job_at_the_collective_timeout(self):
    # A stopped (not dead) process keeps its connections open: only the
    # collective timeout can tell. The chief fails first, so the launcher
    # stops the hung worker at once (no grace: it cannot stop on its own),
    # after a short SIGKILL delay (see _SHORT_KILL_AFTER_SECS).
    model_dir = os.path.join(self.get_temp_dir(), 'hung')
    command = _command(model_dir, extra=[
        '--save_checkpoints_steps=%d' % _SAVE_STEPS])
    grace_secs = 0
    with mock.patch.object(launch, '_KILL_AFTER_SECS',
                           _SHORT_KILL_AFTER_SECS):
      job = _Job(command, grace_secs=grace_secs)
      try:
        signalled_at = _signal_worker_after_first_checkpoint(
            job, model_dir, signal.SIGSTOP)
        stopped_after, after = _after(job, signalled_at)
      finally:
        job.kill()
    tail = job.output()[-6000:]
    self.assertEqual(1, job.status, tail)

    def seconds_until(text):
      found = [at for line, at in after.items() if text in line]
      self.assertTrue(found, 'no line with %r after the signal:\n%s' % (
          text, tail))
      return min(found)

    # The chief names the silent peer when the collective times out: not
    # before, and within twice the timeout (see _report_bound_secs); or,
    # when its step waits on regardless, its backstop does.
    timed_out = [at for line, at in after.items() if line.startswith(
        '[chief:0] error: Task chief:0 stopped: worker:0 did not answer '
        '(DeadlineExceededError')]
    if timed_out:
      named = min(timed_out)
      bound = _report_bound_secs(_WORKER_TIMEOUT_SECS)
    else:
      named = seconds_until('[chief:0] error: Task chief:0 stopped: no '
                            'training step, hooks included, finished in')
      self.assertIn('worker:0 is hung or unreachable', tail)
      bound = _backstop_bound_secs(_WORKER_TIMEOUT_SECS)
    self.assertGreater(named, _WORKER_TIMEOUT_SECS - 1, tail)
    self.assertLess(named, bound, tail)
    # Once the chief has exited, the launcher stops the hung worker within
    # its grace plus the SIGKILL delay (a stopped process ignores SIGTERM).
    # How long the chief's own exit takes depends on the machine's load, so
    # it is bounded only by the wait above.
    chief_exited = seconds_until('[launch] chief:0 exited with status 1; '
                                 'stopping the other tasks.')
    self.assertLess(stopped_after - chief_exited,
                    grace_secs + _SHORT_KILL_AFTER_SECS + 10, tail)


@pytest.mark.slow
class LauncherSigtermTest(tf.test.TestCase):
  """The launcher's command line, with a signal to its process."""

  def test_sigterm_to_the_launcher_keeps_the_chiefs_last_step(self):
    # A preemption notice to the launcher: the chief stops after its step
    # and saves it; nothing since the last periodic checkpoint is lost.
    model_dir = os.path.join(self.get_temp_dir(), 'preempted')
    command = _command(model_dir, steps=100000,
                       extra=['--save_checkpoints_steps=100000',
                              '--log_every_steps=10'])
    process = _launch(command, grace_secs=30)
    with _drained(process) as lines:
      # The chief's progress lines (estimator_bf16.apps.progress), past the
      # checkpoint of step 0.
      _wait_until(
          lambda: any(int(m.group(1)) >= 20 for line in list(lines)
                      for m in [re.search(r'\] step (\d+)/', line)] if m),
          lines, lambda: process.poll() is None)
      process.send_signal(signal.SIGTERM)
      process.wait(timeout=120)
    output = ''.join(lines)
    tail = output[-6000:]
    self.assertEqual(128 + signal.SIGTERM, process.returncode, tail)
    (stop,) = [line for line in lines if line.startswith('[chief:0] W') and
               'Stopping at global step ' in line]
    stopped_at = int(stop.split('Stopping at global step ')[1].split()[0])
    self.assertGreaterEqual(stopped_at, 20, tail)
    self.assertEqual(stopped_at, _step(model_dir), tail)


@pytest.mark.slow
class LaunchTest(tf.test.TestCase, parameterized.TestCase):
  """The launcher alone, with tiny Python commands instead of training."""

  def test_tf_config_per_task_and_prefixed_logs(self):
    script = ('import json, os; c = json.loads(os.environ["TF_CONFIG"]); '
              'print(c["task"]["type"], c["task"]["index"], '
              'sorted(c["cluster"]))')
    out = _Capture()
    status = launch.run([sys.executable, '-c', script], workers=3,
                        evaluator=True, out=out)
    self.assertEqual(0, status)
    text = out.text()
    for line in ("[chief:0] chief 0 ['chief', 'evaluator', 'worker']",
                 '[worker:0] worker 0', '[worker:1] worker 1',
                 '[evaluator:0] evaluator 0',
                 '[launch] all 4 tasks finished.'):
      self.assertIn(line, text)

  def test_first_failure_stops_the_others_and_sets_the_status(self):
    # worker:0 fails at once; the chief would sleep for a minute.
    script = ('import json, os, sys, time; '
              't = json.loads(os.environ["TF_CONFIG"])["task"]["type"]; '
              'sys.exit(3) if t == "worker" else time.sleep(60)')
    out = _Capture()
    start = time.monotonic()
    status = launch.run([sys.executable, '-c', script], workers=2,
                        grace_secs=0.5, out=out)
    self.assertEqual(3, status)
    self.assertLess(time.monotonic() - start, 20)
    self.assertIn('[launch] worker:0 exited with status 3; stopping the '
                  'other tasks.', out.text())

  @parameterized.named_parameters(('sigterm', signal.SIGTERM),
                                  ('ctrl_c', signal.SIGINT))
  def test_a_stop_of_the_launcher_goes_to_the_chief_first(self, signum):
    # Each task says when it is ready. The chief then saves and exits on
    # SIGTERM, as a training task does on a preemption notice; the worker
    # only says it got SIGTERM and runs on, so the SIGKILL after it ends it.
    script = ('import json, os, signal, sys, time; '
              't = json.loads(os.environ["TF_CONFIG"])["task"]["type"]; '
              'signal.signal(signal.SIGTERM, (lambda *a: print("term worker", '
              'flush=True)) if t == "worker" else '
              '(lambda *a: (print("saved chief", flush=True), sys.exit(0)))); '
              'print("ready", flush=True); time.sleep(60)')
    # The launcher runs here, in the main thread, where it takes SIGTERM and
    # SIGINT over while it runs (its command line, signalled as a process,
    # is LauncherSigtermTest's): a launcher process would first import
    # TensorFlow, through the package. The signal goes to this process only
    # while run() has its handlers in place: the tasks say 'ready' after
    # the launcher set them, then sleep for a minute.
    self.assertIs(threading.current_thread(), threading.main_thread())
    out = _Capture()
    signalled_at = []
    finished = threading.Event()

    def stop_when_ready():
      deadline = time.monotonic() + 60
      while not finished.is_set() and time.monotonic() < deadline:
        if out.text().count('] ready\n') == 2:
          signalled_at.append(time.monotonic())
          os.kill(os.getpid(), signum)
          return
        time.sleep(0.05)

    sender = threading.Thread(target=stop_when_ready, daemon=True)
    # The worker outlives SIGTERM by the launcher's SIGKILL delay; a
    # shorter delay than the launcher's 5 s shows the same in less time
    # (a SIGKILL without the delay would end the worker at once).
    kill_after = 2.0
    with mock.patch.object(launch, '_KILL_AFTER_SECS', kill_after):
      sender.start()
      try:
        status = launch.run([sys.executable, '-c', script], workers=2,
                            grace_secs=20, out=out)
      finally:
        finished.set()
      ended_at = time.monotonic()
    sender.join(timeout=10)
    output = out.text()
    lines = output.splitlines(True)
    self.assertTrue(signalled_at, 'the tasks were not ready:\n' + output)
    stopped_after = ended_at - signalled_at[0]
    self.assertEqual(128 + signum, status, output)
    self.assertIn('[launch] got %s; passing SIGTERM to chief:0, then to the '
                  'other tasks once it has stopped (at most 20 s).' %
                  signal.Signals(signum).name, output)
    self.assertNotIn('Traceback', output)
    # The chief had saved and exited before the worker was signalled, not
    # after the 20 s grace; the worker outlived SIGTERM by the SIGKILL delay.
    order = [line for line in lines if line in (
        '[chief:0] saved chief\n', '[worker:0] term worker\n')]
    self.assertEqual(['[chief:0] saved chief\n', '[worker:0] term worker\n'],
                     order, output)
    self.assertBetween(stopped_after, kill_after - 0.5, kill_after + 10)
    for pid in _task_pids(lines).values():
      with self.assertRaises(ProcessLookupError):
        os.kill(pid, 0)

  def test_ports_are_distinct_loopback_ports(self):
    jobs = launch.cluster_jobs(3, evaluator=True)
    addresses = [a for job in jobs.values() for a in job]
    self.assertLen(set(addresses), 4)
    self.assertTrue(all(a.startswith('127.0.0.1:') for a in addresses))


class _Capture(object):
  def __init__(self):
    self._parts = []

  def write(self, text):
    self._parts.append(text)

  def flush(self):
    pass

  def text(self):
    return ''.join(self._parts)


if __name__ == '__main__':
  tf.test.main()
