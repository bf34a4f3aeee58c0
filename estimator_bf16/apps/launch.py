r"""Runs one command as a local multi-worker job: one process per task.

    python -m estimator_bf16.apps.launch --workers=2 -- \
        estimator-bf16-train --model=mnist_mlp --precision=bfloat16 \
        --distribute=multi_worker --model_dir=runs/mw

starts the command once per task (a chief and `--workers - 1` workers, plus
an evaluator with `--evaluator`) with its own TF_CONFIG, on free ports of
127.0.0.1. Every output line is prefixed with its task (`[worker:1] ...`).
When one process fails, the others are stopped and the launcher exits with
the failed task's status, naming it: the others first get `--grace_secs` to stop on their own (a
training task notices a lost peer within about a second, or within its
collective timeout if the peer hangs, and exits naming it), then SIGTERM,
then SIGKILL 5 s later. Success is status 0 once every process has exited
with 0. A SIGTERM to the launcher (a preemption notice, `kill`) goes to the
chief first, which stops after its step and saves a checkpoint
(`estimator_bf16.safety.preemption`), then, once the chief has exited (at most
`--grace_secs`), to the others, with SIGKILL 5 s later. The launcher then
exits with 143. A Ctrl-C does the same and exits with 130; a second Ctrl-C
stops every task at once.

On several hosts, start the command on each host yourself with a TF_CONFIG
listing every host (docs/distribute.md); this launcher is for trying it on
one machine.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import app
from absl import flags

from estimator_bf16.distribute import cluster as cluster_lib
from estimator_bf16.platform import quiet

_HOST = '127.0.0.1'
_KILL_AFTER_SECS = 5.0


def define_flags(flag_values=flags.FLAGS):
  """Defines the launcher's flags on `flag_values` (call once)."""
  flags.DEFINE_integer('workers', 2, 'Training processes: the chief and '
                       'workers - 1 workers.', lower_bound=1,
                       flag_values=flag_values)
  # Read before TensorFlow loads (estimator_bf16.platform.quiet); the tasks inherit
  # the setting through the environment.
  flags.DEFINE_bool('verbose', False, quiet.VERBOSE_HELP,
                    flag_values=flag_values)
  flags.DEFINE_bool('evaluator', False, 'Also start an evaluator task, '
                    'which evaluates each new checkpoint.',
                    flag_values=flag_values)
  flags.DEFINE_float('grace_secs', 10.0, 'After a failure, how long the '
                     'other processes get to stop on their own before '
                     'SIGTERM (SIGKILL follows 5 s later); after a SIGTERM '
                     'to the launcher, how long the chief gets to save and '
                     'stop before the others are stopped.', lower_bound=0.0,
                     flag_values=flag_values)


def free_ports(count, host=_HOST):
  """Returns `count` distinct ports that were free on `host` just now.

  The sockets are held until all ports are chosen, so the ports differ;
  they are released before the tasks bind them (a small race that a busy
  machine could lose; the task then fails naming its address).
  """
  sockets = []
  try:
    for _ in range(count):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind((host, 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def cluster_jobs(workers, evaluator=False, host=_HOST):
  """{job: ['host:port', ...]} for a chief, workers - 1 workers [, evaluator].

  Raises:
    ValueError: workers < 1.
  """
  if workers < 1:
    raise ValueError('workers must be >= 1, got %r.' % (workers,))
  ports = free_ports(workers + int(evaluator), host)
  addresses = ['%s:%d' % (host, port) for port in ports]
  jobs = {'chief': addresses[:1]}
  if workers > 1:
    jobs['worker'] = addresses[1:workers]
  if evaluator:
    jobs[cluster_lib.EVALUATOR] = addresses[workers:]
  return jobs


def _tasks(jobs):
  for job in ('chief', 'worker', cluster_lib.EVALUATOR):
    for index in range(len(jobs.get(job, ()))):
      yield job, index


def _stream(process, prefix, out, lock):
  for line in iter(process.stdout.readline, b''):
    with lock:
      out.write('[%s] %s' % (prefix, line.decode('utf-8', 'replace')))
      out.flush()
  process.stdout.close()


class _StopRequest(object):
  """The first SIGTERM or Ctrl-C (SIGINT) the launcher got, if any."""

  def __init__(self):
    self.signum = None

  def is_set(self):
    return self.signum is not None

  def handle(self, signum, frame):
    del frame
    if self.signum is None:
      self.signum = signum
    elif signum == signal.SIGINT:
      # A second Ctrl-C: stop at once (the KeyboardInterrupt path).
      raise KeyboardInterrupt()


@contextlib.contextmanager
def _stop_flag():
  """Yields a `_StopRequest` that SIGTERM and SIGINT set while the block runs.

  The tasks run in sessions of their own (a Ctrl-C in the terminal reaches
  the launcher only), so a launcher that is terminated or interrupted must
  pass the stop on or leave them running. The first signal only sets the
  request: it can arrive between any two statements of the main thread,
  where raising could abandon the tasks half stopped. Only the main thread
  may set handlers (elsewhere the request is never set); the previous ones
  are restored on exit.
  """
  request = _StopRequest()
  if threading.current_thread() is not threading.main_thread():
    yield request
    return
  previous = {signum: signal.signal(signum, request.handle)
              for signum in (signal.SIGTERM, signal.SIGINT)}
  try:
    yield request
  finally:
    for signum, handler in previous.items():
      # None: a handler installed outside Python; the default is the nearest.
      signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _exit_status(returncode):
  # A process killed by signal N reports -N; shells report 128 + N.
  return 128 - returncode if returncode < 0 else returncode


def _describe(returncode):
  if returncode < 0:
    try:
      return 'was killed by %s' % signal.Signals(-returncode).name
    except ValueError:
      return 'was killed by signal %d' % -returncode
  return 'exited with status %d' % returncode


def _start_task(command, jobs, job, index, env, out, lock):
  """Starts one task of the cluster; returns (process, its output thread).

  The process gets a session of its own, so that a signal reaches its whole
  group. The thread that streams its output is not started yet.
  """
  task_env = dict(os.environ if env is None else env)
  task_env['TF_CONFIG'] = cluster_lib.tf_config(jobs, job, index)
  task_env['PYTHONUNBUFFERED'] = '1'
  process = subprocess.Popen(command, env=task_env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
  thread = threading.Thread(
      target=_stream, args=(process, '%s:%d' % (job, index), out, lock),
      daemon=True)
  return process, thread


def run(command, workers, evaluator=False, grace_secs=10.0, out=None,
        env=None):
  """Runs `command` once per task of a local cluster; returns the status.

  Args:
    command: list of strings, the program and its arguments.
    workers: training processes (a chief plus workers - 1 workers).
    evaluator: also run an evaluator task.
    grace_secs: after a failure, seconds the others get to exit on their
      own before SIGTERM (SIGKILL follows `_KILL_AFTER_SECS` later); after
      a SIGTERM to the launcher, seconds the chief gets to save and exit
      (see `_pass_sigterm_on`).
    out: where the prefixed output goes (default sys.stdout).
    env: base environment (default os.environ); TF_CONFIG is set per task.

  Returns:
    0 if every process exited with 0; else the exit status of the first
    process that failed (128 + N for a signal N).
  """
  out = out or sys.stdout
  jobs = cluster_jobs(workers, evaluator)
  lock = threading.Lock()
  processes = {}
  threads = {}

  def say(message):
    with lock:
      out.write('[launch] %s\n' % message)
      out.flush()

  status = 0
  failed = None
  with _stop_flag() as terminated:
    for job, index in _tasks(jobs):
      name = '%s:%d' % (job, index)
      processes[name], threads[name] = _start_task(
          command, jobs, job, index, env, out, lock)
      say('started %s (pid %d) at %s' % (name, processes[name].pid,
                                         jobs[job][index]))
      threads[name].start()
    try:
      while any(p.poll() is None for p in processes.values()):
        if terminated.is_set():
          say('got %s; passing SIGTERM to chief:0, then to the other '
              'tasks once it has stopped (at most %g s).' % (
                  signal.Signals(terminated.signum).name, grace_secs))
          _pass_sigterm_on(processes, threads, grace_secs)
          failed, status = 'launch', 128 + terminated.signum
          break
        for name, process in processes.items():
          code = process.poll()
          if code not in (None, 0) and failed is None:
            failed = name
            status = _exit_status(code)
            say('%s %s; stopping the other tasks.' % (name, _describe(code)))
            _stop(processes, grace_secs)
        time.sleep(0.05)
    except KeyboardInterrupt:
      say('interrupted; stopping every task.')
      _stop(processes, grace_secs)
      status = 130
  for thread in threads.values():
    thread.join(timeout=5)
  if failed is None and status == 0:
    for name, process in processes.items():
      if process.returncode:
        failed, status = name, _exit_status(process.returncode)
        say('%s %s.' % (name, _describe(process.returncode)))
        break
  if failed is None and status == 0:
    say('all %d tasks finished.' % len(processes))
  return status


def _signal_group(process, sig):
  try:
    os.killpg(process.pid, sig)
  except (ProcessLookupError, PermissionError):
    pass


def _wait_all(processes, timeout):
  deadline = time.monotonic() + timeout
  for process in processes:
    try:
      process.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      pass


def _stop(processes, grace_secs):
  """Stops the running tasks: grace, SIGTERM, then SIGKILL."""
  running = [p for p in processes.values() if p.poll() is None]
  _wait_all(running, grace_secs)
  _terminate(running, _KILL_AFTER_SECS)


def _terminate(processes, kill_after_secs):
  """SIGTERM to each running process now, SIGKILL to those left after."""
  running = [p for p in processes if p.poll() is None]
  for process in running:
    _signal_group(process, signal.SIGTERM)
  _wait_all(running, kill_after_secs)
  for process in running:
    if process.poll() is None:
      _signal_group(process, signal.SIGKILL)
      process.wait()


def _pass_sigterm_on(processes, threads, grace_secs):
  """SIGTERM to the chief, and once it has exited, to the other tasks.

  Each task stops after the step it is in, but a multi-worker step needs
  every task: tasks signalled together can stop one step apart, and the one
  ahead then waits in a step its peers never join, and is killed. The chief
  alone writes checkpoints, so it goes first: its peers finish its last
  step with it, it saves, and the others' next step then fails at once.
  """
  chief = processes.get('chief:0')
  if chief is not None:
    _terminate([chief], grace_secs)
    # The chief's last lines (its save) are printed before the others hear
    # of the stop: its output ends when it has exited.
    threads['chief:0'].join(timeout=5)
  _terminate(processes.values(), _KILL_AFTER_SECS)


def main(argv):
  command = argv[1:]
  if command and command[0] == '--':
    command = command[1:]
  if not command:
    raise app.UsageError('Give the command after --, e.g. python -m '
                         'estimator_bf16.apps.launch --workers=2 -- '
                         'estimator-bf16-train --distribute=multi_worker ...')
  sys.exit(run(command, flags.FLAGS.workers, evaluator=flags.FLAGS.evaluator,
               grace_secs=flags.FLAGS.grace_secs))


if __name__ == '__main__':
  define_flags()
  app.run(main)
