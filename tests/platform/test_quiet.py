"""The package's commands print what matters, not TensorFlow's noise."""

import os
import re
import subprocess
import sys
import textwrap
import threading
import types
from unittest import mock

from absl.testing import parameterized
import pytest
import tensorflow as tf

from estimator_bf16.platform import quiet
from tests.support import paths

_REPO = paths.REPO
# A TensorFlow C++ log line: '... port.cc:113] ...', and the notice C++
# absl writes before it is initialized (TensorFlow 2.16+, at import).
_CPP_LINE = re.compile(r'^(.*\.cc:\d+\] .*|WARNING: All log messages before '
                       r'absl::InitializeLog\(\) .*)$', re.M)


def _noise(stderr):
  return _CPP_LINE.findall(stderr)

_PROGRAM = '''
from absl import app
import numpy as np
import tensorflow as tf
from tensorflow.compat.v1 import estimator as tf_estimator

tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)

def input_fn():
  x = np.ones([8, 3], np.float32)
  return tf.data.Dataset.from_tensor_slices(
      ({'x': x}, np.zeros([8], np.int32))).repeat().batch(4)

def model_fn(features, labels, mode):
  w = tf.compat.v1.get_variable('w', [3, 2])
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, tf.matmul(features['x'], w))
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf_estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

def main(argv):
  tf_estimator.Estimator(model_fn, model_dir=argv[1]).train(
      input_fn, max_steps=3)
  tf.compat.v1.logging.info('the program trained')

app.run(main)
'''


@pytest.mark.slow
class QuietCommandsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('run', ['python', '-m', 'estimator_bf16', 'run', 'p.py'], '3'),
      ('train', ['python', '-m', 'estimator_bf16.apps.train_cli'], '3'),
      ('script', ['/venv/bin/estimator-bf16-train', '--model=x'], '3'),
      # What sys.orig_argv holds when the script's shebang starts Python.
      ('script_via_python', ['/venv/bin/python3.11',
                             '/venv/bin/estimator-bf16-train', '--model=x'],
       '3'),
      ('a_program_named_like_a_flag', ['python', 'x.py', 'tpu-submit'],
       None),
      ('verbose', ['python', '-m', 'estimator_bf16.apps.launch', '--verbose'],
       '0'),
      ('a_users_program', ['python', 'train.py'], None),
      ('another_module', ['python', '-m', 'estimator_bf16x'], None))
  def test_level_is_set_for_our_commands_only(self, argv, level):
    environ = {}
    quiet.quiet_commands(argv, environ)
    self.assertEqual(environ.get('TF_CPP_MIN_LOG_LEVEL'), level)

  def test_a_level_the_user_set_wins(self):
    environ = {'TF_CPP_MIN_LOG_LEVEL': '1'}
    self.assertFalse(quiet.quiet_commands(
        ['python', '-m', 'estimator_bf16', 'run', 'p.py'], environ))
    self.assertEqual(environ, {'TF_CPP_MIN_LOG_LEVEL': '1'})

  def _run(self, *options):
    folder = self.create_tempdir().full_path
    program = os.path.join(folder, 'program.py')
    with open(program, 'w') as f:
      f.write(textwrap.dedent(_PROGRAM))
    env = {k: v for k, v in os.environ.items()
           if k != 'TF_CPP_MIN_LOG_LEVEL'}
    return subprocess.run(
        [sys.executable, '-m', 'estimator_bf16', 'run', *options, program,
         os.path.join(folder, 'model')], cwd=_REPO, env=env,
        capture_output=True, text=True, timeout=300, check=False)

  def test_run_prints_no_cpp_lines_and_each_log_line_once(self):
    done = self._run()
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertEqual(_noise(done.stderr), [])
    self.assertEqual(done.stderr.count('the program trained'), 1,
                     done.stderr)
    # The Estimator API is deprecated; the program's user knows.
    self.assertNotIn('Instructions for updating', done.stderr)

  def test_verbose_keeps_tensorflows_own_lines(self):
    done = self._run('--verbose')
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertNotEmpty(_noise(done.stderr), done.stderr[:3000])
    self.assertIn('Instructions for updating', done.stderr)


@pytest.mark.slow
class DescriptorFilterTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # One child for the two uses that end normally (each child pays a
    # TensorFlow import through the package): the order of what is kept,
    # then, in a second filter, more than a pipe holds. The abort has a
    # child of its own below.
    code = textwrap.dedent('''
        import os, sys
        from estimator_bf16.platform import quiet
        os.write(2, b'before\\n')
        with quiet.descriptor_filtered(quiet.LOAD_NOISE.pattern):
          os.write(2, b'WARNING: All log messages before '
                      b'absl::InitializeLog() is called are written to STDERR\\n')
          os.write(2, b'I0000 00:00:1795755151.294464   29524 port.cc:153] '
                      b'oneDNN custom operations are on.\\n')
          os.write(2, b'kept C++ line\\n')
          print('python line', file=sys.stderr)
          os.write(2, b'F0000 00:00:1.2   7 main.cc:1] a fatal line stays\\n')
        os.write(2, b'after\\n')
        with quiet.descriptor_filtered(quiet.LOAD_NOISE.pattern):
          for i in range(4000):
            os.write(2, b'%05d ' % i + b'x' * 60 + b'\\n')
        os.write(2, b'end\\n')
        ''')
    # Quiet TensorFlow's own import (the package imports it), which is not
    # what is tested here.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    cls.done = subprocess.run([sys.executable, '-c', code], cwd=_REPO,
                              env=env, capture_output=True, text=True,
                              timeout=300, check=False)

  def test_only_the_dropped_lines_vanish_and_order_is_kept(self):
    done = self.done
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    lines = done.stderr.splitlines()
    self.assertEqual(lines[lines.index('before'):lines.index('after') + 1], [
        'before', 'kept C++ line', 'python line',
        'F0000 00:00:1.2   7 main.cc:1] a fatal line stays', 'after'])

  def test_more_than_a_pipe_holds_passes(self):
    done = self.done
    self.assertEqual(done.returncode, 0, done.stderr[-500:])
    lines = done.stderr.splitlines()
    # All of them, in order, and all before what followed the filter.
    self.assertEqual(lines[lines.index('after') + 1:],
                     ['%05d ' % i + 'x' * 60 for i in range(4000)] + ['end'])

  def test_lines_written_before_an_abort_still_arrive(self):
    # A library that logs a fatal line and aborts the process while it
    # loads: the filter, a process of its own, passes the line on.
    code = textwrap.dedent('''
        import os
        from estimator_bf16.platform import quiet
        with quiet.descriptor_filtered(quiet.LOAD_NOISE.pattern):
          os.write(2, b'F0000 00:00:1.2   7 main.cc:1] Check failed\\n')
          os.abort()
        ''')
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    done = subprocess.run([sys.executable, '-c', code], cwd=_REPO, env=env,
                          capture_output=True, timeout=120, check=False)
    self.assertNotEqual(done.returncode, 0)
    self.assertIn(b'main.cc:1] Check failed', done.stderr)


# A child that compiles a tiny graph with XLA inside compile_noise_hidden,
# as a command of the package would (argv[1:] stands for its command line).
_COMPILE = textwrap.dedent('''
    import sys
    import tensorflow as tf
    from estimator_bf16.platform import quiet
    tf.compat.v1.disable_eager_execution()
    x = tf.compat.v1.placeholder(tf.float32, [4])
    (y,) = tf.compat.v1.xla.experimental.compile(lambda v: [v * 2.0 + 1.0],
                                                 [x])
    with tf.compat.v1.Session() as session, quiet.compile_noise_hidden(
        ['python'] + sys.argv[1:]):
      print(session.run(y, {x: [1.0, 2.0, 3.0, 4.0]}).tolist(), flush=True)
    ''')


@pytest.mark.slow
class CompileNoiseTest(tf.test.TestCase, parameterized.TestCase):

  def test_xlas_first_compile_lines_go_in_a_command(self):
    # TensorFlow's own log level is quiet, as in a command of the package;
    # XLA's lines ignore it (with --verbose, or outside a command, TensorFlow
    # 2.15 prints "Compiled cluster using XLA!" here).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    done = subprocess.run(
        [sys.executable, '-c', _COMPILE, '-m', 'estimator_bf16', 'check',
         '--xla'], cwd=_REPO, env=env, capture_output=True, text=True,
        timeout=300, check=False)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertEqual(done.stdout.strip(), '[3.0, 5.0, 7.0, 9.0]')
    self.assertNotIn('Compiled cluster using XLA', done.stderr)
    # (TensorFlow 2.16+ prints its loading lines here too: the child's own
    # import is no command's.)
    self.assertNotIn('device_compiler', done.stderr)

  @parameterized.named_parameters(
      ('command', ['python', '-m', 'estimator_bf16', 'check'], True),
      ('verbose', ['python', '-m', 'estimator_bf16', 'check', '--verbose'],
       False),
      ('a_program', ['python', 'train.py'], False))
  def test_filtered_only_in_a_command_without_verbose(self, argv, filtered):
    with mock.patch.object(quiet, 'descriptor_filtered') as filtered_fd:
      with quiet.compile_noise_hidden(argv):
        pass
    self.assertEqual(filtered_fd.called, filtered)


class DeprecationNoticesTest(tf.test.TestCase):

  def _printing(self):
    from tensorflow.python.util import deprecation  # pylint: disable=g-import-not-at-top
    return deprecation._PRINT_DEPRECATION_WARNINGS  # pylint: disable=protected-access

  def test_hidden_for_our_commands_and_put_back_after_a_raise(self):
    before = self._printing()
    with self.assertRaises(KeyError):
      with quiet.deprecation_notices_hidden(
          ['python', '-m', 'estimator_bf16', 'run', 'p.py']):
        self.assertFalse(self._printing())
        raise KeyError('boom')
    self.assertEqual(self._printing(), before)

  def test_the_api_modules_renamed_names_are_hidden_too(self):
    # TensorFlow's API modules print "The name tf.X is deprecated. Please
    # use tf.compat.v1.X instead." once per module, by a switch of their
    # own (e.g. tf.estimator.tpu.TPUConfig, read by make_tpu_estimator on
    # TensorFlow 2.15). Each module below is fresh, so each could print its
    # notice; tf.Session has a rename on every TensorFlow version.
    from tensorflow.python.util import module_wrapper  # pylint: disable=g-import-not-at-top

    def fresh_module():
      module = types.ModuleType('tensorflow')
      module.Session = type('Session', (), {})
      return module_wrapper.TFModuleWrapper(module, '')

    def notices(argv):
      with mock.patch.object(module_wrapper.logging, 'warning') as warning:
        with quiet.deprecation_notices_hidden(argv):
          fresh_module().Session  # pylint: disable=expression-not-assigned
      return [call.args[2] for call in warning.call_args_list]

    self.assertEqual(notices(['python', 'train.py']), ['tf.Session'])
    self.assertEqual(
        notices(['python', '-m', 'estimator_bf16', 'run', 'p.py']), [])
    self.assertEqual(notices(['python', 'train.py']), ['tf.Session'])

  def test_kept_for_other_programs_and_with_verbose(self):
    before = self._printing()
    for argv in (['python', 'train.py'],
                 ['python', '-m', 'estimator_bf16', 'run', '--verbose',
                  'p.py']):
      with quiet.deprecation_notices_hidden(argv):
        self.assertEqual(self._printing(), before)

  def test_overlapping_uses_on_two_threads_put_back_what_was_there(self):
    from tensorflow.python.util import deprecation  # pylint: disable=g-import-not-at-top
    # pylint: disable=protected-access
    before = deprecation._PRINT_DEPRECATION_WARNINGS
    stand_in = object()  # Whatever someone set before: it comes back.
    argv = ['python', '-m', 'estimator_bf16', 'run', 'p.py']
    entered, leave, left = (threading.Event() for _ in range(3))

    def first_user():
      with quiet.deprecation_notices_hidden(argv):
        entered.set()
        leave.wait(30)
      left.set()

    deprecation._PRINT_DEPRECATION_WARNINGS = stand_in
    thread = threading.Thread(target=first_user)
    try:
      thread.start()
      self.assertTrue(entered.wait(30))
      with quiet.deprecation_notices_hidden(argv):
        leave.set()  # The first user leaves while this one is inside.
        self.assertTrue(left.wait(30))
        self.assertIs(self._printing(), False)
      self.assertIs(self._printing(), stand_in)
    finally:
      leave.set()
      thread.join(30)
      deprecation._PRINT_DEPRECATION_WARNINGS = before


if __name__ == '__main__':
  tf.test.main()
