"""Multi-worker training: processes on 127.0.0.1, TF_CONFIG, failures.

`python -m estimator_bf16.apps.launch --workers=2 -- python -m estimator_bf16.apps.train_cli
--distribute=multi_worker ...` trains the MNIST MLP on the digits in
bfloat16 with MultiWorkerMirroredStrategy to the accuracy of one process.
Killing a worker mid-run stops the job within a bounded time, naming the
lost task, and the same command (with a longer collective timeout) then
resumes from the chief's last checkpoint to the final step, at the accuracy
of one process.
"""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

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
# slowly enough that the two set-ups compare.
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
# The tests wait out this timeout, so it is short. It only bounds the wait
# between two collectives once training runs: a job that starts afresh
# first meets in the broadcast of the chief's initial values, which has no
# timeout (collective_all_reduce_strategy's broadcast_send/recv), so slow
# imports and graph builds are not timed; between steps the tasks only
# differ by a checkpoint save of the 400k-parameter MLP (well under a
# second here, a few seconds on a slow, loaded machine).
_WORKER_TIMEOUT_SECS = 10
# A resumed job has no such broadcast: every task restores the checkpoint,
# and its first all-reduce waits for the slowest task to import
# TensorFlow, build its graph and restore (5 s apart on this machine under
# load). The rerun, which only has to resume and finish, gets the
# library's default timeout for that.
_RESUME_TIMEOUT_SECS = 120
_REPORT_BOUND_SECS = 2 * _WORKER_TIMEOUT_SECS + 15
_BACKSTOP_BOUND_SECS = 3 * _WORKER_TIMEOUT_SECS + 15
_GRACE_SECS = 2 * _WORKER_TIMEOUT_SECS + 10
_STOP_BOUND_SECS = _GRACE_SECS + launch._KILL_AFTER_SECS + 10  # pylint: disable=protected-access
# How long a test waits for a signalled job to end before it fails: the
# backstop's bound, then the launcher's stop.
_WAIT_BOUND_SECS = _BACKSTOP_BOUND_SECS + _STOP_BOUND_SECS

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


def _launch(command, workers=2, evaluator=False, grace_secs=_GRACE_SECS):
  """Starts the launcher; returns the Popen with merged text output."""
  # Temporary files of the tasks (a non-chief's scratch directory) go
  # under the module's root, removed at the end even for killed tasks.
  env = dict(os.environ, PYTHONPATH=_REPO, TMPDIR=_CACHE.root)
  return subprocess.Popen(
      [sys.executable, '-m', 'estimator_bf16.apps.launch',
       '--workers=%d' % workers, '--evaluator=%s' % evaluator,
       '--grace_secs=%d' % grace_secs, '--'] + command,
      cwd=_REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)


def _chief_result(output, task='chief:0'):
  """The JSON a task printed at the end (lines prefixed with the task)."""
  prefix = '[%s] ' % task
  lines = [line[len(prefix):] for line in output.splitlines()
           if line.startswith(prefix)]
  start = max(i for i, line in enumerate(lines) if line == '{')
  end = start + lines[start:].index('}')
  return json.loads('\n'.join(lines[start:end + 1]))


def _read_into(process, lines, arrivals=None):
  for line in process.stdout:
    lines.append(line)
    if arrivals is not None:
      arrivals.append((time.monotonic(), line))


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
def _drained(process, arrivals=None):
  """Yields the list of the launcher's output lines, filled as they come.

  Drained all along: a full pipe would stall the launcher and the job. On
  exit, a launcher still running is killed with its tasks (they run in
  sessions of their own, so killing the launcher alone would leave them).
  """
  lines = []
  reader = threading.Thread(target=_read_into,
                            args=(process, lines, arrivals), daemon=True)
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


def _wait_until(condition, lines, process, timeout=300):
  """Polls `condition()`; fails with the job's last lines if it ends first."""
  deadline = time.monotonic() + timeout
  while not condition():
    if process.poll() is not None:
      raise AssertionError('the job ended first:\n' + ''.join(lines[-50:]))
    if time.monotonic() > deadline:
      raise AssertionError('not within %d s:\n%s' % (
          timeout, ''.join(lines[-50:])))
    time.sleep(0.05)


def _step(path):
  return int(tf.train.load_checkpoint(path).get_tensor('global_step'))


@pytest.mark.slow
class MultiWorkerTest(tf.test.TestCase):

  def _start_and_signal_worker(self, model_dir, command, sig, **launch_args):
    """Launches 2 tasks, sends `sig` to worker:0 after the first checkpoint.

    Returns:
      (launcher Popen, seconds from the signal to the launcher's exit, the
      job's output so far, {line: seconds from the signal to its arrival}
      for the lines printed after the signal).
    """
    process = _launch(command, **launch_args)
    arrivals = []
    with _drained(process, arrivals) as lines:
      _wait_until(lambda: waiting.checkpoint_at_or_after(model_dir,
                                                         _SAVE_STEPS),
                  lines, process)
      os.kill(_task_pids(lines)['worker:0'], sig)
      signalled_at = time.monotonic()
      try:
        process.wait(timeout=_WAIT_BOUND_SECS)
      except subprocess.TimeoutExpired:
        self.fail('the job was still running %d s after the signal; what '
                  'it printed after the signal:\n%s' % (
                      _WAIT_BOUND_SECS, ''.join(
                          line for at, line in arrivals
                          if at >= signalled_at)[-8000:]))
      stopped_after = time.monotonic() - signalled_at
    after = {line: at - signalled_at for at, line in arrivals
             if at >= signalled_at}
    return process, stopped_after, ''.join(lines), after

  def test_killed_worker_stops_the_job_and_rerun_reaches_one_process(self):
    # One job is killed, and its rerun (with an evaluator) is also the
    # two-worker run whose accuracy is compared with one process's: it
    # trains to the same final step.
    root = self.get_temp_dir()
    model_dir = os.path.join(root, 'killed')
    extra = ['--save_checkpoints_steps=%d' % _SAVE_STEPS]
    process, stopped_after, output, after = self._start_and_signal_worker(
        model_dir, _command(model_dir, extra=extra), signal.SIGKILL)
    tail = output[-6000:]  # what the job printed, for a failure's message
    self.assertLess(stopped_after, _STOP_BOUND_SECS, tail)
    self.assertEqual(128 + signal.SIGKILL, process.returncode, tail)
    self.assertIn('[launch] worker:0 was killed by SIGKILL; stopping the '
                  'other tasks.', output)
    # When the chief reports the lost task (it does unless stuck), it names
    # worker:0, in time (see _REPORT_BOUND_SECS).
    reports = [line for line in after
               if line.startswith('[chief:0] error: Task chief:0 stopped:')]
    for line in reports:
      self.assertIn('worker:0 did not answer', line)
    if reports:
      self.assertLess(min(after[line] for line in reports),
                      _REPORT_BOUND_SECS, tail)
    saved = _step(model_dir)
    self.assertBetween(saved, _SAVE_STEPS, _STEPS - 1)

    # The same command resumes it, with a longer collective timeout (see
    # _RESUME_TIMEOUT_SECS); an evaluator evaluates its checkpoints.
    process = _launch(_command(model_dir, timeout=_RESUME_TIMEOUT_SECS,
                               extra=extra), evaluator=True)
    with _drained(process) as lines:
      # The one-process reference trains meanwhile, here (the job's tasks
      # spend much of their time waiting for each other).
      single = training.run(training.TrainOptions(
          model='mnist_mlp', model_dir=os.path.join(root, 'one'),
          precision='bfloat16', train_steps=_STEPS, train_batch_size=_BATCH,
          export=False))['eval']
      process.wait(timeout=600)
    output = ''.join(lines)
    self.assertEqual(0, process.returncode, output[-3000:])
    self.assertIn('[launch] all 3 tasks finished.', output)
    # Each task ran in its own process with its own TF_CONFIG task.
    self.assertIn('2 replicas, task chief:0', output)
    self.assertIn('2 replicas, task worker:0', output)
    # Both tasks start from the saved step (estimator_bf16.apps.progress reads
    # the global step once the session has restored it).
    for task in ('chief:0', 'worker:0'):
      self.assertRegex(output, r'\[%s\] .*\] resuming at step %d of %d' % (
          task, saved, _STEPS))
    self.assertEqual(_STEPS, _step(model_dir))
    # The evaluator evaluated checkpoints as they came (it may skip one
    # that a newer one replaced before it looked), the last one included.
    self.assertTrue(os.path.isdir(os.path.join(model_dir, 'eval_evaluator')))
    self.assertEqual(_STEPS, _chief_result(output, 'evaluator:0')['eval'][
        'global_step'])
    two = _chief_result(output)['eval']
    self.assertEqual(_STEPS, two['global_step'])
    self.assertGreater(single['accuracy'], 0.9)
    self.assertNear(single['accuracy'], two['accuracy'], _ACCURACY_TOLERANCE)

  def test_hung_worker_stops_the_job_at_the_collective_timeout(self):
    # A stopped (not dead) process keeps its connections open: only the
    # collective timeout can tell. The chief fails first, so a short grace
    # lets the launcher stop the hung worker soon after.
    model_dir = os.path.join(self.get_temp_dir(), 'hung')
    command = _command(model_dir, extra=[
        '--save_checkpoints_steps=%d' % _SAVE_STEPS])
    grace_secs = 1
    process, stopped_after, output, after = self._start_and_signal_worker(
        model_dir, command, signal.SIGSTOP, grace_secs=grace_secs)
    tail = output[-6000:]
    self.assertEqual(1, process.returncode, tail)

    def seconds_until(text):
      found = [at for line, at in after.items() if text in line]
      self.assertTrue(found, 'no line with %r after the signal:\n%s' % (
          text, tail))
      return min(found)

    # The chief names the silent peer when the collective times out: not
    # before, and within twice the timeout (see _REPORT_BOUND_SECS); or,
    # when its step waits on regardless, its backstop does.
    timed_out = [at for line, at in after.items() if line.startswith(
        '[chief:0] error: Task chief:0 stopped: worker:0 did not answer '
        '(DeadlineExceededError')]
    if timed_out:
      named, bound = min(timed_out), _REPORT_BOUND_SECS
    else:
      named = seconds_until('[chief:0] error: Task chief:0 stopped: no '
                            'training step, hooks included, finished in')
      self.assertIn('worker:0 is hung or unreachable', tail)
      bound = _BACKSTOP_BOUND_SECS
    self.assertGreater(named, _WORKER_TIMEOUT_SECS - 1, tail)
    self.assertLess(named, bound, tail)
    # Once the chief has exited, the launcher stops the hung worker within
    # its grace plus the SIGKILL delay (a stopped process ignores SIGTERM).
    # How long the chief's own exit takes depends on the machine's load, so
    # it is bounded only by the wait above.
    chief_exited = seconds_until('[launch] chief:0 exited with status 1; '
                                 'stopping the other tasks.')
    self.assertLess(stopped_after - chief_exited,
                    grace_secs + launch._KILL_AFTER_SECS + 10, tail)

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
          lines, process)
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
    process = _launch([sys.executable, '-c', script], grace_secs=20)
    with _drained(process) as lines:
      _wait_until(lambda: sum(line.endswith('] ready\n')
                              for line in list(lines)) == 2, lines, process,
                  timeout=60)
      pids = _task_pids(lines)
      start = time.monotonic()
      process.send_signal(signum)
      process.wait(timeout=60)
      stopped_after = time.monotonic() - start
    output = ''.join(lines)
    self.assertEqual(128 + signum, process.returncode, output)
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
    kill_after = launch._KILL_AFTER_SECS  # pylint: disable=protected-access
    self.assertBetween(stopped_after, kill_after - 0.5, kill_after + 10)
    for pid in pids.values():
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
