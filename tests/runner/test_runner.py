"""Tests for `python -m estimator_bf16 run|check` (estimator_bf16.runner.program).

The acceptance program, tests/support/legacy_tpu_main.py (absl flags, app.run,
TPUEstimator, --use_tpu, a resolver built from an empty --tpu, train +
evaluate + predict + export), runs through the real command line in a
subprocess in both precisions; its graph.pbtxt, checkpoint and results are
read back. Small programs written by the tests run in-process to pin down
exit codes, error paths, and that everything patched is put back.
"""

import contextlib
import importlib.metadata
import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from unittest import mock

from absl.testing import parameterized
from google.protobuf import text_format
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python import tf2

import estimator_bf16 as eb
from estimator_bf16.apps import cli
from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.models import digits
from estimator_bf16.platform import shown_paths
from estimator_bf16.precision import policy
from estimator_bf16.runner import estimator_patches
from estimator_bf16.runner import fit_run
from estimator_bf16.runner import program as runner
from estimator_bf16.runner import report as run_report
from estimator_bf16.runner import tpu_resolver
from tests.support import waiting
from tests.support import paths
from tests.support import scratch

_REPO = paths.REPO
_PROGRAM = os.path.join('tests', 'support', 'legacy_tpu_main.py')
_PLANTED = os.path.join('tests', 'support', 'legacy_tpu_main_planted.py')
# Stated tolerances, bfloat16 vs float32 after the program's 60 steps on its
# 256 eval examples. Accuracy: measured 0.9805 in every run on TensorFlow
# 2.15.1 and 2.21.0; 0.03 is 8 examples. One class holds most labels of
# this synthetic task, so the eval loss is the sharper check: measured
# 0.106-0.132 over eight runs (both precisions, both TensorFlows; the
# runs are not bit-reproducible), largest bfloat16/float32 gap 0.021.
_ACCURACY_TOLERANCE = 0.03
_LOSS_TOLERANCE = 0.05
_SCRATCH = scratch.ModuleScratch()


def setUpModule():
  _SCRATCH.start()


def tearDownModule():
  _SCRATCH.stop()


def _cli_env(repo_on_path=True):
  """The environment of a command run from the repository root."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
  env.pop('PYTHONPATH', None)
  if repo_on_path:
    env['PYTHONPATH'] = os.pathsep.join(
        [_REPO] + os.environ.get('PYTHONPATH', '').split(os.pathsep))
  return env


def _cli(*args, repo_on_path=True):
  """Runs `python -m estimator_bf16 ARGS` from the repository root.

  With `repo_on_path=False` nothing is on PYTHONPATH, as in the shell of a
  user who copies a command from docs/runner.md.
  """
  return subprocess.run([sys.executable, '-m', 'estimator_bf16', *args],
                        cwd=_REPO, env=_cli_env(repo_on_path),
                        capture_output=True, text=True, timeout=600,
                        check=False)


class _Records(logging.Handler):
  """Keeps the messages of the log records it is given."""

  def __init__(self):
    super().__init__(logging.INFO)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@contextlib.contextmanager
def _cli_in_this_process():
  """Yields a call `main(*args) -> (exit code, stdout, stderr, log lines)`.

  `estimator_bf16.apps.cli.main` with the arguments of `_cli`, run here from
  the repository root: the command line, its exit code and its report as a
  subprocess has them, without a second TensorFlow import, where the
  process itself is not what a test is about. TensorFlow's INFO log lines
  (a subprocess prints them on stderr) are collected from its logger.
  """
  tf_logger = logging.getLogger('tensorflow')
  records, level = _Records(), tf_logger.level
  cwd = os.getcwd()
  os.chdir(_REPO)
  tf_logger.addHandler(records)
  tf_logger.setLevel(logging.INFO)

  def main(*args):
    out, err = io.StringIO(), io.StringIO()
    del records.messages[:]
    v2_behavior = tf2.enabled()
    with mock.patch.dict(os.environ), contextlib.redirect_stdout(out), \
        contextlib.redirect_stderr(err):
      code = cli.main(list(args))
    # A TF 1.x program may call tf.disable_v2_behavior() (mnist_tpu.py
    # does): harmless in its own process, it leaves this one with graph
    # mode, reference variables and v1 control flow for every later test
    # (Keras then names its accuracy 'acc'), and eager execution cannot be
    # turned back on once a graph was made. Such a program needs `_cli`.
    if v2_behavior and not tf2.enabled():
      raise AssertionError('%s disabled TF2 behaviour in the test process; '
                           'run it with _cli, in a process of its own.' %
                           ' '.join(args))
    return code, out.getvalue(), err.getvalue(), main.logs()

  # What TensorFlow logged since the last call of `main`, for code that
  # calls the runner itself.
  main.logs = lambda: '\n'.join(records.messages)
  try:
    yield main
  finally:
    tf_logger.removeHandler(records)
    tf_logger.setLevel(level)
    os.chdir(cwd)


def _cli_here(*args):
  """`_cli`'s command in this process (`_cli_in_this_process`), where the
  process is not what a test is about: a `subprocess.CompletedProcess`
  with the command's stdout and stderr (TensorFlow's log lines, which the
  command hides, are not in it)."""
  with _cli_in_this_process() as main:
    code, out, err, _ = main(*args)
  return subprocess.CompletedProcess(['estimator_bf16'] + list(args), code,
                                     out, err)


@_SCRATCH.cached
def _run_legacy_program(precision):
  """Runs the acceptance program once per precision; returns (proc, dirs)."""
  model_dir = os.path.join(_SCRATCH.root, precision)
  results = os.path.join(_SCRATCH.root, precision + '.json')
  proc = _cli('run', '--precision=' + precision, '--memory', _PROGRAM,
              '--use_tpu=false',
              '--model_dir=' + model_dir, '--results=' + results)
  return proc, model_dir, results


def _op_dtypes(model_dir, op_types):
  """{op type: set of T attrs} of the graph the Estimator wrote."""
  graph_def = tf.compat.v1.GraphDef()
  with open(os.path.join(model_dir, 'graph.pbtxt')) as f:
    text_format.Parse(f.read(), graph_def)
  found = {}
  for node in graph_def.node:
    if node.op in op_types:
      # An op computed in float32 for a slow bfloat16 CPU kernel is the
      # bfloat16 op of the TPU graph (autocast.cpu_kernels).
      substituted = cpu_kernels.SUBSTITUTED_ATTR in node.attr
      found.setdefault(node.op, set()).add(
          'bfloat16' if substituted else tf.as_dtype(node.attr['T'].type).name)
  return found


def assert_trained_in_precision(test, stderr, model_dir, precision, ops,
                                steps):
  """Checks a `run --memory` report, the graph's op dtypes, the checkpoint.

  Args:
    test: the `tf.test.TestCase`.
    stderr: what the command printed there.
    model_dir: the program's model_dir.
    precision: the run's precision.
    ops: matmul/conv op types that must all compute in `precision`.
    steps: the global step the checkpoint must hold.

  Returns:
    {variable name: dtype} of the checkpoint.
  """
  share = '100.0%' if precision == 'bfloat16' else '0.0%'
  test.assertIn('bfloat16 share of matmul/conv FLOPs: %s' % share, stderr)
  test.assertIn('audit: no problems', stderr)
  test.assertRegex(stderr, r'peak training-step memory \(CPU '
                   r'allocator, measured\): [0-9.]+ MiB\npeak training-step '
                   r'tensors \(measured: .*\): [0-9.]+ MiB\nexit code: 0\n$')
  # Matmuls and convolutions (forward and gradients) in the precision.
  test.assertEqual(_op_dtypes(model_dir, ops), {op: {precision} for op in ops})
  # The checkpoint is float32 in both precisions.
  reader = tf.train.load_checkpoint(model_dir)
  stored = reader.get_variable_to_dtype_map()
  for name, dtype in stored.items():
    if name != 'global_step':
      test.assertEqual(dtype, tf.float32, name)
  test.assertEqual(reader.get_tensor('global_step'), steps)
  return stored


@pytest.mark.slow
class ExampleProgramTest(tf.test.TestCase):
  """models/mnist_tpu.py, the repository's example user program."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    data_dir = os.path.join(_SCRATCH.root, 'digits')
    digits.write_digits(data_dir)
    # What is checked is that it runs and in which dtypes, not how well it
    # learns: a few small steps (two TPU loops, a save after each).
    cls.args = ['models/mnist_tpu.py', '--use_tpu=false',
                '--data_dir=' + data_dir, '--train_steps=4',
                '--iterations=2', '--batch_size=8']

  def test_runs_in_bfloat16_through_the_runner(self):
    model_dir = os.path.join(self.get_temp_dir(), 'bf16')
    proc = _cli('run', *self.args, '--model_dir=' + model_dir)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('eval accuracy', proc.stdout)
    self.assertIn('bfloat16 share of matmul/conv FLOPs: 100.0%', proc.stderr)
    self.assertIn('audit: no problems', proc.stderr)
    self.assertEqual({'Conv2D': {'bfloat16'}, 'MatMul': {'bfloat16'}},
                     _op_dtypes(model_dir, ('Conv2D', 'MatMul')))

  def test_runs_as_it_is_with_tensorflow_alone(self):
    if eb.BACKEND == 'compat':
      self.skipTest('tf.estimator is gone from TensorFlow 2.16+: there the '
                    'program runs only through the runner')
    model_dir = os.path.join(self.get_temp_dir(), 'fp32')
    proc = subprocess.run(
        [sys.executable, *self.args, '--model_dir=' + model_dir], cwd=_REPO,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'), capture_output=True,
        text=True, timeout=600, check=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('eval accuracy', proc.stdout)
    self.assertEqual({'Conv2D': {'float32'}, 'MatMul': {'float32'}},
                     _op_dtypes(model_dir, ('Conv2D', 'MatMul')))


@pytest.mark.slow
class LegacyProgramTest(tf.test.TestCase, parameterized.TestCase):
  """The acceptance program through the real command line."""

  @parameterized.named_parameters(('bfloat16', 'bfloat16'),
                                  ('float32', 'float32'))
  def test_runs_unmodified_in_precision(self, precision):
    proc, model_dir, results = _run_legacy_program(precision)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    # The program's own output is untouched on stdout; the report is on
    # stderr, after it.
    self.assertIn('eval accuracy', proc.stdout)
    self.assertNotIn('estimator_bf16 run', proc.stdout)
    self.assertIn('precision: %s' % precision, proc.stderr)
    self.assertIn('no TPU is named and none is attached', proc.stderr)
    stored = assert_trained_in_precision(
        self, proc.stderr, model_dir, precision,
        ('Conv2D', 'MatMul', 'Conv2DBackpropFilter'), steps=60)
    self.assertIn('conv/kernel', stored)
    with open(results) as f:
      result = json.load(f)
    self.assertLen(result['classes'], 16)
    self.assertTrue(os.path.isfile(os.path.join(result['export_dir'],
                                                'saved_model.pb')))

  def test_eval_matches_float32_within_tolerance(self):
    metrics = {}
    for precision in eb.PRECISIONS:
      proc, _, results = _run_legacy_program(precision)
      self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
      with open(results) as f:
        metrics[precision] = json.load(f)
    self.assertGreater(metrics['float32']['accuracy'], 0.8)
    self.assertLessEqual(abs(metrics['bfloat16']['accuracy'] -
                             metrics['float32']['accuracy']),
                         _ACCURACY_TOLERANCE)
    self.assertLessEqual(abs(metrics['bfloat16']['loss'] -
                             metrics['float32']['loss']), _LOSS_TOLERANCE)

  def test_sigterm_mid_training_keeps_the_step_and_a_rerun_resumes(self):
    model_dir = os.path.join(_SCRATCH.root, 'preempted')
    args = [_PROGRAM, '--use_tpu=false', '--model_dir=' + model_dir]
    with tempfile.TemporaryFile('w+') as err:
      proc = subprocess.Popen(
          [sys.executable, '-m', 'estimator_bf16', 'run', *args,
           '--train_steps=1000000'], cwd=_REPO, env=_cli_env(),
          stdout=subprocess.PIPE, stderr=err, text=True)
      try:
        # The program saves every 20 steps: signal once training runs.
        deadline = time.monotonic() + 300
        while (not waiting.checkpoint_at_or_after(model_dir, 20)
               and proc.poll() is None and time.monotonic() < deadline):
          time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=300)
      finally:
        if proc.poll() is None:
          proc.kill()
      err.seek(0)
      stderr = err.read()
    self.assertEqual(proc.returncode, 143, stderr[-3000:])
    stopped = int(re.search(r'Stopping at global step (\d+) on SIGTERM',
                            stderr).group(1))
    self.assertGreaterEqual(stopped, 20)
    checkpoint = os.path.join(model_dir, 'model.ckpt-%d' % stopped)
    self.assertEqual(tf.train.latest_checkpoint(model_dir), checkpoint)
    self.assertIn('newest checkpoint: %s' % checkpoint, stderr)
    self.assertIn('exit code: 143', stderr)
    self.assertNotIn('eval accuracy', stdout)  # Ended without evaluating.
    # The same command, to a few steps further, resumes from that step (in
    # this process: the signal was the subprocess's part).
    with _cli_in_this_process() as main:
      code, stdout, stderr, logs = main(
          'run', *args, '--train_steps=%d' % (stopped + 5))
    self.assertEqual(code, 0, stderr[-3000:])
    self.assertIn('eval accuracy', stdout)
    self.assertIn('Restoring parameters from %s' % checkpoint, logs)
    self.assertIn('training steps run: 5\n', stderr)
    self.assertEqual(tf.train.load_variable(model_dir, 'global_step'),
                     stopped + 5)

  def test_check_prints_audit_and_plan_without_training(self):
    model_dir = os.path.join(_SCRATCH.root, 'check')
    # The command as docs/runner.md shows it: the program's own folder is
    # all it has on its path.
    proc = _cli('check', _PROGRAM, '--use_tpu=false',
                '--model_dir=' + model_dir, repo_on_path=False)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('audit: no problems', proc.stderr)
    self.assertIn('result: OK', proc.stderr)
    for precision in eb.PRECISIONS:
      for optimizer in ('adam', 'adafactor'):
        self.assertRegex(proc.stderr, r'\n%s +%s +[0-9.]+ +[0-9.]+ +[0-9.]+ '
                         r'+[1-9]\d* +[1-9]\d*\n' % (precision, optimizer))
    # Stopped before the first step: nothing was written.
    self.assertFalse(os.path.exists(model_dir))

  def test_check_after_run_builds_the_graph_and_leaves_model_dir_alone(self):
    # The README's sequence: `run` trains model_dir to max_steps, then
    # `check` on the same command line. Here the check mode of the runner,
    # in this process and without the memory plans: the command itself,
    # planning included, is checked above.
    proc, model_dir, _ = _run_legacy_program('bfloat16')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    before = {name: os.stat(os.path.join(model_dir, name)).st_mtime_ns
              for name in os.listdir(model_dir)}
    with _cli_in_this_process() as main:  # The folder and the logs.
      result = runner.run_program(
          _PROGRAM, ['--use_tpu=false', '--model_dir=' + model_dir],
          check=True)
      logs = main.logs()
    self.assertEqual(result.exit_code, 0, result.error)
    self.assertTrue(run_report.check_passed(result))
    self.assertIn('result: OK', run_report.format_check_report(result))
    # The TRAIN graph was built, not skipped as trained.
    self.assertIsNotNone(result.train_graph)
    # (The sigterm test reads a log line collected the same way.)
    self.assertNotIn('Skipping training', logs)
    self.assertEqual(
        {name: os.stat(os.path.join(model_dir, name)).st_mtime_ns
         for name in os.listdir(model_dir)}, before)

  def test_check_fails_on_planted_bfloat16_variable(self):
    # The exit code and report of the command, computed in this process.
    model_dir = os.path.join(_SCRATCH.root, 'planted')
    with _cli_in_this_process() as main:
      code, _, stderr, _ = main('check', _PLANTED, '--use_tpu=false',
                                '--model_dir=' + model_dir)
    self.assertEqual(code, cli.EXIT_CHECK_FAILED, stderr)
    self.assertIn("variable 'planted/bf16_scale' (made at %s:22 "
                  '(planted_model_fn)) is stored as bfloat16' % _PLANTED,
                  stderr)
    self.assertIn('result: FAILED', stderr)


# In-process runs of small programs ------------------------------------------

_ESTIMATOR_PROGRAM = '''
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow.compat.v1 import estimator as tf_estimator

seen = []

def input_fn(params):
  seen.append(('input_fn', sorted(params)))
  x = np.ones([8, 3], np.float32)
  return tf.data.Dataset.from_tensor_slices(({'x': x}, np.zeros([8], np.int32))
                                            ).repeat().batch(4)

def model_fn(features, labels, mode, params):
  seen.append((mode, features['x'].dtype.name, params.get('precision')))
  w = tf.compat.v1.get_variable('w', [3, 2], dtype=features['x'].dtype)
  logits = tf.matmul(features['x'], w)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf_estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

estimator = tf_estimator.Estimator(model_fn, model_dir=sys.argv[1],
                                   params={'lr': 0.1})
estimator.train(input_fn, max_steps=1)
estimator.evaluate(input_fn, steps=1)
with open(sys.argv[2], 'w') as f:
  json.dump(seen, f)
'''


# Trains with a hook of its own that sends this process SIGTERM after
# step 5 (a preemption notice arriving mid-training), inside an
# `except Exception` that would carry on; then evaluates and writes a file.
_PREEMPTED_PROGRAM = _ESTIMATOR_PROGRAM.replace(
    "estimator.train(input_fn, max_steps=1)", """
import os, signal, time
class Notice(tf.compat.v1.train.SessionRunHook):
  def after_run(self, run_context, run_values):
    step = run_context.session.run(tf.compat.v1.train.get_global_step())
    if step == 5:
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(0.1)  # Python runs the handler between bytecodes
try:
  estimator.train(input_fn, max_steps=1000, hooks=[Notice()])
except Exception:
  pass""")


@pytest.mark.slow
class RunProgramTest(tf.test.TestCase, parameterized.TestCase):
  """run_program in this process, on programs the tests write."""

  def _program(self, source, name='program.py'):
    folder = self.create_tempdir().full_path
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
      f.write(textwrap.dedent(source))
    return path

  def _patched_state(self):
    """What the runner patches, to compare before and after a run."""
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver
    state = {'resolver_new': vars(resolver).get('__new__'),
             'argv': list(sys.argv), 'path': list(sys.path),
             'compat_installed': eb.compat.installed(),
             'sigterm': signal.getsignal(signal.SIGTERM)}
    for base, tpu in estimator_patches.estimator_classes():
      for owner in (base, tpu):
        for name in ('__init__', 'train', 'evaluate', 'predict'):
          state[(owner, name)] = vars(owner).get(name)
    return state

  @parameterized.named_parameters(('bfloat16', 'bfloat16'),
                                  ('float32', 'float32'))
  def test_wraps_model_fn_and_input_fn_of_an_estimator(self, precision):
    program = self._program(_ESTIMATOR_PROGRAM)
    seen_file = os.path.join(self.get_temp_dir(), 'seen_%s.json' % precision)
    given = []

    def recording(wrapper):
      def wrap(fn, precision, *args, **kwargs):
        given.append((wrapper.__name__, precision))
        return wrapper(fn, precision, *args, **kwargs)
      return wrap

    # The seams where the run's precision leaves the runner: parsed once by
    # run_program, the same `Precision` reaches every wrapper and params.
    with mock.patch.object(eb, 'wrap_model_fn', recording(eb.wrap_model_fn)), \
        mock.patch.object(eb, 'wrap_input_fn', recording(eb.wrap_input_fn)), \
        mock.patch.object(policy, 'parse_precision',
                          wraps=policy.parse_precision) as parses:
      result = runner.run_program(
          program, [os.path.join(self.get_temp_dir(), precision), seen_file],
          precision=precision)
    self.assertEqual(result.exit_code, 0, result.error)
    self.assertEqual(result.estimators, 1)
    self.assertIsInstance(result.precision, policy.Precision)
    self.assertEqual(result.precision, precision)
    self.assertEqual(sorted(name for name, _ in given),
                     ['wrap_input_fn', 'wrap_input_fn', 'wrap_model_fn'])
    for _, value in given:
      self.assertIs(value, result.precision)
    # Only the first call parsed a name; the others got the value back.
    self.assertEqual(parses.call_args_list[0], mock.call(precision))
    self.assertNotIsInstance(parses.call_args_list[0].args[0], policy.Precision)
    for call in parses.call_args_list[1:]:
      self.assertIsInstance(call.args[0], policy.Precision)
    with open(seen_file) as f:
      seen = [tuple(item) for item in json.load(f)]
    modes = [item for item in seen if item[0] != 'input_fn']
    if precision == 'bfloat16':
      self.assertEqual(modes, [('train', 'bfloat16', 'bfloat16'),
                               ('eval', 'bfloat16', 'bfloat16')])
      self.assertIn(('input_fn', ['lr', 'precision']), seen)
    else:  # Untouched: float32 features, no 'precision' param.
      self.assertEqual(modes, [('train', 'float32', None),
                               ('eval', 'float32', None)])
      self.assertNotIn(('input_fn', ['lr', 'precision']), seen)
    self.assertLen(result.reports, 1)
    self.assertEqual(result.reports[0].bfloat16_flop_share,
                     1.0 if precision == 'bfloat16' else 0.0)

  @parameterized.named_parameters(('strict', 'strict', 1),
                                  ('warn', 'warn', 0))
  def test_audit_mode_decides_whether_a_mistake_stops_the_program(
      self, audit, exit_code):
    planted = _ESTIMATOR_PROGRAM.replace(
        "  logits = tf.matmul(features['x'], w)",
        "  tf.Variable(1.0, dtype=tf.bfloat16, trainable=False, name='half')\n"
        "  logits = tf.matmul(features['x'], w)")
    program = self._program(planted)
    result = runner.run_program(program, [
        os.path.join(self.get_temp_dir(), audit),
        os.path.join(self.get_temp_dir(), audit + '.json')
    ], options=eb.WrapOptions(audit=audit))
    self.assertEqual(result.exit_code, exit_code, result.error)
    self.assertLen(result.problems, 1)
    self.assertIn("variable 'half' (made at %s:18 (model_fn)) is stored as "
                  'bfloat16' % program, result.problems[0])
    if audit == 'strict':
      self.assertIn('PrecisionError', result.error)
    self.assertIn("variable 'half'", run_report.format_run_report(result))

  def test_train_and_evaluate_input_fns_are_wrapped(self):
    if eb.BACKEND == 'compat':
      self.skipTest('the compat backend has no train_and_evaluate')
    program = self._program(_ESTIMATOR_PROGRAM.replace(
        """estimator.train(input_fn, max_steps=1)
estimator.evaluate(input_fn, steps=1)""",
        """tf.estimator.train_and_evaluate(
    estimator, tf.estimator.TrainSpec(input_fn, max_steps=2),
    tf.estimator.EvalSpec(input_fn, steps=1, throttle_secs=0))"""))
    seen_file = os.path.join(self.get_temp_dir(), 'seen_tae.json')
    result = runner.run_program(
        program, [os.path.join(self.get_temp_dir(), 'tae'), seen_file])
    self.assertEqual(result.exit_code, 0, result.error)
    with open(seen_file) as f:
      modes = [tuple(item) for item in json.load(f) if item[0] != 'input_fn']
    self.assertEqual(modes, [('train', 'bfloat16', 'bfloat16'),
                             ('eval', 'bfloat16', 'bfloat16')])

  def test_everything_patched_is_restored(self):
    before = self._patched_state()
    for source, code in (('import sys; sys.exit(3)', 3),
                         ('raise RuntimeError("boom")', 1),
                         ('print("fine")', 0)):
      result = runner.run_program(self._program(source), ['--flag'])
      self.assertEqual(result.exit_code, code)
      self.assertEqual(self._patched_state(), before)

  @parameterized.named_parameters(
      ('bfloat16', 'bfloat16', signal.SIGTERM),
      ('float32', 'float32', signal.SIGTERM),
      ('ctrl_c', 'bfloat16', signal.SIGINT))
  def test_a_stop_in_train_saves_the_step_and_ends_the_program(
      self, precision, signum):
    before = self._patched_state()
    name = signal.Signals(signum).name
    model_dir = os.path.join(self.get_temp_dir(), name + precision)
    after_train = os.path.join(self.get_temp_dir(), name + precision + '.json')
    program = _PREEMPTED_PROGRAM.replace('signal.SIGTERM', 'signal.' + name)
    result = runner.run_program(self._program(program),
                                [model_dir, after_train],
                                precision=precision)
    self.assertEqual(result.exit_code, 128 + signum, result.error)
    self.assertEqual(result.stopped_by, name)
    # The step the signal came in, saved; nothing after train ran.
    self.assertEqual(result.stop_checkpoint,
                     os.path.join(model_dir, 'model.ckpt-5'))
    self.assertEqual(tf.train.latest_checkpoint(model_dir),
                     result.stop_checkpoint)
    self.assertEqual(tf.train.load_variable(model_dir, 'global_step'), 5)
    self.assertFalse(os.path.exists(after_train))
    self.assertIsNone(result.error)
    self.assertIn('stopped by %s during training, after the current '
                  'step; newest checkpoint: %s' % (name,
                                                  result.stop_checkpoint),
                  run_report.format_run_report(result))
    self.assertEqual(self._patched_state(), before)

  def test_every_problem_kind_names_the_program_line_that_made_it(self):
    planted = _ESTIMATOR_PROGRAM.replace(
        "  logits = tf.matmul(features['x'], w)\n"
        "  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, "
        "logits)\n",
        "  import estimator_bf16 as eb\n"
        "  tf.Variable(1.0, dtype=tf.bfloat16, trainable=False, name='half')\n"
        "  with eb.keep_float32():  # left as TensorFlow builds it\n"
        "    logits = tf.matmul(tf.cast(features['x'], tf.bfloat16),\n"
        "                       tf.cast(w, tf.float32))\n"
        "  loss = tf.cast(tf.compat.v1.losses.sparse_softmax_cross_entropy(\n"
        "      labels, logits), tf.bfloat16)\n")
    self.assertNotEqual(planted, _ESTIMATOR_PROGRAM)
    program = self._program(planted)
    result = runner.run_program(program, [
        os.path.join(self.get_temp_dir(), 'kinds'),
        os.path.join(self.get_temp_dir(), 'kinds.json')
    ], options=eb.WrapOptions(audit='warn'))
    problems = '\n'.join(result.problems)
    # Line 1 of the program is empty.
    for what, line in (("variable 'half'", 19),
                       ("op 'MatMul'", 21),  # a SparseMatMul
                       ('the loss', 23)):
      self.assertRegex(
          problems, '%s[^\n]*made at %s:%d \\(model_fn\\)' % (
              re.escape(what), re.escape(program), line))

  def test_argv_path_and_sibling_imports_as_python_sets_them(self):
    program = self._program('''
        import json, sys
        import helper  # a module next to the program
        with open(sys.argv[2], 'w') as f:
          json.dump({'argv': sys.argv, 'path0': sys.path[0],
                     'helper': helper.VALUE, 'name': __name__}, f)
        ''')
    with open(os.path.join(os.path.dirname(program), 'helper.py'), 'w') as f:
      f.write('VALUE = 42\n')
    out = os.path.join(self.get_temp_dir(), 'argv.json')
    for _ in range(2):  # A second run imports the sibling afresh.
      result = runner.run_program(program, ['--precision=float16', out])
      self.assertEqual(result.exit_code, 0, result.error)
    with open(out) as f:
      seen = json.load(f)
    self.assertEqual(seen, {
        'argv': [program, '--precision=float16', out],
        'path0': os.path.dirname(os.path.realpath(program)),
        'helper': 42, 'name': '__main__'})
    self.assertNotIn('helper', sys.modules)

  def test_program_exception_keeps_traceback_and_status(self):
    program = self._program('''
        def main():
          raise RuntimeError('the program failed')
        main()
        ''')
    result = runner.run_program(program)
    self.assertEqual(result.exit_code, 1)
    self.assertIn('RuntimeError: the program failed', result.error)
    self.assertIn('File "%s", line 4' % program, result.error)
    # The report ends with the reason in one line.
    self.assertTrue(run_report.format_run_report(result).endswith(
        'failed: RuntimeError: the program failed (at %s:3)\nexit code: 1\n'
        % program), run_report.format_run_report(result))
    # Only the program's frames, as Python prints them.
    self.assertNotIn('runpy', result.error)
    self.assertIn('the program stopped before an Estimator or TPUEstimator '
                  'was built', run_report.format_run_report(result))

  def test_an_error_in_converted_layer_code_names_its_last_line(self):
    # Keras converts a layer's `call` with autograph in graph mode; the
    # error's message starts 'in user code:' and ends with the error.
    program = self._program('''
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()

        def moments(x):
          raise TypeError('moments() got an unexpected keyword argument')

        class Layer(tf.compat.v1.layers.Dense):
          def call(self, inputs):
            return moments(inputs)

        Layer(3)(tf.zeros([2, 4]))
        ''')
    result = runner.run_program(program)
    self.assertEqual(result.exit_code, 1)
    self.assertIn('failed: TypeError: moments() got an unexpected keyword '
                  'argument (at %s:6)\n' % program,
                  run_report.format_run_report(result))

  def test_sys_exit_with_message(self):
    result = runner.run_program(self._program('import sys; sys.exit("bad")'))
    self.assertEqual(result.exit_code, 1)

  @parameterized.named_parameters(
      ('missing', 'missing.py', 'no such file'),
      ('directory', '.', 'is not a file'))
  def test_unrunnable_program_raises_before_anything_runs(self, path, message):
    folder = self.create_tempdir().full_path
    with self.assertRaisesRegex(runner.ProgramError, message):
      runner.run_program(os.path.join(folder, path))

  def test_unknown_precision_lists_choices(self):
    with self.assertRaisesRegex(
        ValueError, "--precision: precision must be one of 'float32', "
        "'bfloat16', got 'float16'"):
      runner.run_program(self._program('pass'), precision='float16')
    with self.assertRaisesRegex(runner.ProgramError, "'float32', 'bfloat16'"):
      runner.run_program(self._program('pass'), precision=tf.bfloat16)
    with self.assertRaisesRegex(runner.ProgramError, 'eb.WrapOptions'):
      runner.run_program(self._program('pass'), options={'audit': 'warn'})

  def test_empty_tpu_name_gets_the_stand_in_only_without_a_tpu(self):
    program = self._program('''
        import sys
        import tensorflow as tf
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            sys.argv[1] or None)
        config = tf.compat.v1.estimator.tpu.RunConfig(cluster=resolver)
        sys.exit(0 if resolver.master() == sys.argv[2] else 5)
        ''')
    result = runner.run_program(program, ['', ''])
    self.assertEqual(result.exit_code, 0, result.error)
    self.assertEqual(result.local_resolvers, 1)
    # A named TPU (here an address, which needs no network) is never
    # substituted.
    address = 'grpc://10.0.0.2:8470'
    result = runner.run_program(program, [address, address])
    self.assertEqual(result.exit_code, 0, result.error)
    self.assertEqual(result.local_resolvers, 0)

  def test_no_stand_in_on_a_host_with_a_tpu(self):
    self.assertFalse(tpu_resolver.tpu_present())
    # TensorFlow reads an empty name from $TPU_NAME; an address needs no
    # network to resolve.
    address = 'grpc://10.0.0.3:8470'
    with tf.compat.v1.test.mock.patch.dict(os.environ, {'TPU_NAME': address}):
      self.assertTrue(tpu_resolver.tpu_present())
      with tpu_resolver.substitute_empty_name():
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver('')
      self.assertIsInstance(resolver,
                            tf.distribute.cluster_resolver.TPUClusterResolver)
      self.assertEqual(resolver.master(), address)

  @parameterized.parameters('cluster=resolver',
                            'master=resolver.get_master()',
                            'master=resolver.master()', '')
  def test_use_tpu_with_the_stand_in_names_the_fix(self, config_arguments):
    program = self._program('''
        import tensorflow as tf
        from tensorflow.compat.v1 import estimator as tf_estimator
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver('')
        tf_estimator.tpu.TPUEstimator(
            model_fn=lambda features, labels, mode, params: None,
            use_tpu=True, train_batch_size=8,
            config=tf_estimator.tpu.RunConfig(%s))
        ''' % config_arguments)
    result = runner.run_program(program)
    self.assertEqual(result.exit_code, 1)
    self.assertIn('the program named no TPU', result.error)
    self.assertIn('--use_tpu=false', result.error)

  @parameterized.named_parameters(
      ('empty_input', 0, 5, [0], 'no training step ran'),
      ('two_steps', 8, 2, [2], None),
      # The same model_dir again, already at max_steps.
      ('rerun', 8, 2, [2, 0], 'train call 2 of 2 ran no step'))
  def test_the_report_counts_training_steps(self, examples, max_steps,
                                            counted, warned):
    program = self._program('''
        import sys
        import numpy as np
        import tensorflow as tf
        from tensorflow.compat.v1 import estimator as tf_estimator

        def input_fn(params):
          x = np.ones([%d, 3], np.float32)
          return tf.data.Dataset.from_tensor_slices(
              (x, np.zeros([len(x)], np.int32))).repeat().batch(4)

        def model_fn(features, labels, mode, params):
          logits = tf.compat.v1.layers.dense(features, 2)
          loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
          train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
              loss, tf.compat.v1.train.get_global_step())
          return tf_estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

        for _ in range(int(sys.argv[2])):
          tf_estimator.Estimator(model_fn, model_dir=sys.argv[1]).train(
              input_fn, max_steps=%d)
        ''' % (examples, max_steps))
    model_dir = self.create_tempdir().full_path
    result = runner.run_program(program, [model_dir, str(len(counted))],
                                memory=True)
    self.assertEqual(result.exit_code, 0, result.error)
    self.assertEqual(result.train_steps, counted)
    report = run_report.format_run_report(result)
    self.assertIn('training steps run: %d' % sum(counted), report)
    if warned:
      self.assertIn('warning: %s: the train input was empty' % warned, report)
    else:
      self.assertNotIn('warning:', report)
    # Fewer steps than the memory hook waits for: the report says why.
    self.assertIn('peak training-step memory: not measured (it measures '
                  'session run 4 of a train call, and the longest call ran '
                  '%d steps)' % max(counted), report)
    self.assertEqual(run_report.report_json(result)['train_steps'], counted)

  def test_the_report_names_the_float32_remainder(self):
    program = self._program(_ESTIMATOR_PROGRAM.replace(
        "  logits = tf.matmul(features['x'], w)\n",
        "  logits = tf.matmul(features['x'], w)\n"
        "  kept = tf.matmul(tf.cast(features['x'], tf.float32),\n"
        "                   tf.ones([3, 2]))  # float32 on purpose\n"
        "  logits += tf.cast(kept, logits.dtype)\n"))
    folder = self.create_tempdir().full_path
    result = runner.run_program(
        program, [folder, os.path.join(folder, 'seen.json')])
    self.assertEqual(result.exit_code, 0, result.error)
    report = run_report.format_run_report(result)
    self.assertRegex(report, r'float32 remainder: [1-9][0-9.]*% of those '
                     r'FLOPs; the largest:\n  \S*MatMul\S* \(MatMul, '
                     r'[0-9.]+%\) made at .*program\.py:\d+ \(model_fn\)')
    # A float32 run has nothing to name.
    result = runner.run_program(
        program, [self.create_tempdir().full_path,
                  os.path.join(folder, 'seen32.json')], precision='float32')
    self.assertNotIn('float32 remainder',
                     run_report.format_run_report(result))

  @parameterized.named_parameters(
      ('estimator_without_config', 'tf_estimator.Estimator(model_fn, '
       'model_dir=sys.argv[1])'),
      ('tpu_estimator_with_its_own_seed', 'tf_estimator.tpu.TPUEstimator('
       'model_fn, use_tpu=False, train_batch_size=4, eval_batch_size=4, '
       'config=tf_estimator.tpu.RunConfig(model_dir=sys.argv[1], '
       'tf_random_seed=99))'))
  def test_seed_makes_unseeded_random_input_repeat(self, construct):
    # The input is drawn by an unseeded op, as tensorflow/tpu's fake-data
    # modes draw it; the evaluation reports the first example's values.
    program = self._program('''
        import json, sys
        import tensorflow as tf
        from tensorflow.compat.v1 import estimator as tf_estimator

        def input_fn(params):
          data = tf.data.Dataset.from_tensors(0).repeat().map(
              lambda _: tf.random.uniform([3]))
          return data.map(lambda x: (x, 0)).batch(4)

        def model_fn(features, labels, mode, params):
          logits = tf.compat.v1.layers.dense(features, 2)
          loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
          train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
              loss, tf.compat.v1.train.get_global_step())

          def metric_fn(features):
            first = tf.cast(features[0], tf.float32)
            return {'x%%d' %% i: tf.compat.v1.metrics.mean(first[i])
                    for i in range(3)}

          if 'batch_size' in params:  # TPUEstimator
            return tf_estimator.tpu.TPUEstimatorSpec(
                mode, loss=loss, train_op=train_op,
                eval_metrics=(metric_fn, [features]))
          return tf_estimator.EstimatorSpec(
              mode, loss=loss, train_op=train_op,
              eval_metric_ops=metric_fn(features))

        estimator = %s
        estimator.train(input_fn, max_steps=1)
        result = estimator.evaluate(input_fn, steps=1)
        with open(sys.argv[2], 'w') as f:
          json.dump([float(result['x%%d' %% i]) for i in range(3)], f)
        ''' % construct)

    def first_example(precision, seed):
      folder = self.create_tempdir().full_path
      out = os.path.join(folder, 'x.json')
      result = runner.run_program(program, [folder, out],
                                  precision=precision, seed=seed)
      self.assertEqual(result.exit_code, 0, result.error)
      with open(out) as f:
        return json.load(f)

    seeded = first_example('float32', 7)
    self.assertAllEqual(first_example('float32', 7), seeded)
    # bfloat16 inputs: the same draws, rounded to bfloat16's 8 bits.
    self.assertAllClose(first_example('bfloat16', 7), seeded, rtol=2**-8,
                        atol=0)
    other = first_example('float32', 8)
    self.assertGreater(max(abs(a - b) for a, b in zip(other, seeded)), 1e-3)

  @parameterized.parameters(-1, 1.5, True)
  def test_bad_seed_is_refused_before_anything_runs(self, seed):
    program = self._program('raise SystemExit("must not run")')
    with self.assertRaisesRegex(runner.ProgramError,
                                r'--seed must be an integer >= 0'):
      runner.run_program(program, seed=seed)

  def test_levers_given_to_the_fit_are_refused_before_anything_runs(self):
    program = self._program('raise SystemExit("must not run")')
    with self.assertRaisesRegex(runner.ProgramError,
                                'chooses gradient accumulation'):
      fit_run.run_with_fit(program, budget_bytes=2 ** 30,
                           options=eb.WrapOptions(recompute=True))

  def test_check_without_train_call_fails(self):
    program = self._program('print("no training here")')
    result = runner.run_program(program, check=True)
    self.assertEqual(result.exit_code, 0)
    self.assertFalse(run_report.check_passed(result))
    self.assertIn('built no Estimator', run_report.format_check_report(result))


class CommandLineTest(tf.test.TestCase, parameterized.TestCase):
  """Argument handling of `estimator_bf16 run|check` (no program runs)."""

  @parameterized.named_parameters(
      ('precision', ['run', '--precision=float16', 'x.py'],
       "--precision must be one of 'float32', 'bfloat16', got 'float16'"),
      ('audit', ['check', '--audit=loud', 'x.py'], '--audit must be one of'),
      ('accumulate', ['run', '--accumulate=0', 'x.py'],
       '--accumulate must be an integer >= 1'),
      ('missing', ['run', 'no_such_program.py'], 'no_such_program.py: no such'),
      ('command', ['train', 'x.py'], 'invalid choice'),
      ('seed', ['run', '--seed=-1', 'x.py'], '--seed must be an integer >= 0'))
  def test_bad_command_line_exits_2(self, argv, message):
    with tf.compat.v1.test.mock.patch.object(sys, 'stderr') as stderr:
      code = cli.main(argv)
    written = ''.join(call.args[0] for call in stderr.write.call_args_list)
    self.assertEqual(code, cli.EXIT_USAGE)
    self.assertIn(message, written)

  def test_program_arguments_pass_through_verbatim(self):
    args = cli.build_parser().parse_args(
        ['run', '--precision=float32', 'prog.py', '--precision=bfloat16',
         '--memory', 'x'])
    self.assertEqual(args.precision, 'float32')
    self.assertFalse(args.memory)
    self.assertEqual(args.program, 'prog.py')
    self.assertEqual(args.program_args, ['--precision=bfloat16', '--memory',
                                         'x'])

  def test_help_lists_every_other_program_of_the_package(self):
    with contextlib.redirect_stdout(io.StringIO()) as out:
      self.assertEqual(cli.main(['--help']), 0)
    text = re.sub(r'\s+', ' ', out.getvalue())
    listed = {module for module, _, _ in cli.OTHER_PROGRAMS}
    for module, _, script in cli.OTHER_PROGRAMS:
      self.assertIn(module, text)
      if script:
        self.assertIn('(also `%s`)' % script, text)
    # Every module of apps/ that runs as a program is listed, and only those.
    apps = os.path.dirname(cli.__file__)
    programs = set()
    for entry in os.listdir(apps):
      path = os.path.join(apps, entry)
      if os.path.isfile(os.path.join(path, '__main__.py')):
        programs.add('estimator_bf16.apps.' + entry)
      elif entry.endswith('.py') and entry != 'cli.py':
        with open(path) as f:
          if "if __name__ == '__main__':" in f.read():
            programs.add('estimator_bf16.apps.' + entry[:-3])
    self.assertEqual(listed, programs)
    # The console scripts named are the installed ones.
    scripts = {entry.name: entry.value
               for entry in importlib.metadata.entry_points(
                   group='console_scripts')
               if entry.value.startswith('estimator_bf16.')}
    for module, _, script in cli.OTHER_PROGRAMS:
      if script:
        self.assertStartsWith(scripts[script], module)

  @parameterized.named_parameters(
      # absl refuses the flag the program does not define: say where it goes.
      ('ours', 'from absl import app, flags\n'
       "flags.DEFINE_integer('steps', 1, 'Its own.')\n",
       'app.run(lambda argv: 3)', ['--precision=float32'],
       'which does not define it, so it had no effect'),
      # TF 1.x's app.run tolerates unknown flags: the run trains in
      # bfloat16 and exits 0, and the option still had no effect.
      ('tolerated', 'import tensorflow as tf\n',
       'tf.compat.v1.app.run(lambda argv: 0)', ['--precision=float32'],
       'which defines no absl flags'),
      # The program has a --precision of its own (resnet_main.py does).
      ('the_programs', 'from absl import app, flags\n'
       "flags.DEFINE_string('precision', 'x', 'Its own.')\n",
       'app.run(lambda argv: 3)', ['--precision=float32'], None),
      ('none', 'from absl import app, flags\n', 'app.run(lambda argv: 3)',
       [], None))
  def test_our_options_after_the_program_are_named(
      self, head, main, extra, hinted):
    folder = self.create_tempdir().full_path
    program = os.path.join(folder, 'program.py')
    with open(program, 'w') as f:
      f.write(head + main + '\n')
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
      cli.main(['run', program] + extra)
    if hinted is None:
      self.assertNotIn('went to the program', err.getvalue())
    else:
      self.assertIn('estimator_bf16: warning: --precision went to the '
                    'program, %s' % hinted, err.getvalue())
      self.assertIn('options of `run` go before %s' % program,
                    err.getvalue())


class MetricRecordTest(tf.test.TestCase):

  def test_scalars_of_every_dtype_with_their_names(self):
    record = estimator_patches._metric_record({  # pylint: disable=protected-access
        'accuracy': np.float32(0.5),
        'loss': np.array(2, tf.bfloat16.as_numpy_dtype),
        'global_step': np.int64(7), 'per_class': np.zeros(3, np.float32),
        'name': b'text'})
    self.assertEqual(record, {'accuracy': [0.5, 'float32'],
                              'loss': [2.0, 'bfloat16'],
                              'global_step': [7, 'int64']})


class ShownPathTest(tf.test.TestCase):

  def test_program_files_are_named_relative_to_the_working_folder(self):
    root = self.create_tempdir().full_path
    outside = self.create_tempdir().full_path
    cwd = os.getcwd()
    os.chdir(root)
    try:
      self.assertEqual(shown_paths.shown_path(os.path.join(root, 'a', 'b.py')),
                       os.path.join('a', 'b.py'))
      # A bare name would read like a library's file of that name.
      self.assertEqual(shown_paths.shown_path(
          os.path.join(root, 'tpu_estimator.py')),
                       os.path.join('.', 'tpu_estimator.py'))
      self.assertEqual(shown_paths.shown_location('main.py', 7), './main.py:7')
      self.assertEqual(shown_paths.shown_path(os.path.join(outside, 'x.py')),
                       os.path.join(outside, 'x.py'))
      self.assertEqual(shown_paths.shown_path('<stdin>'), '<stdin>')
    finally:
      os.chdir(cwd)


if __name__ == '__main__':
  tf.test.main()
