"""The package's own refusals print one line under `run` / `check` (issue 45).

A refusal of the package's own (`results.Refusal`: a missing TPU, an
unmapped `tf.contrib` symbol, a bad option) prints `Type: message` and no
traceback, unless `--verbose`; the exit code is non-zero. The program's own
errors keep their traceback, pointing at the program's lines. In process:
`estimator_bf16.apps.cli.main` as `python -m estimator_bf16` calls it.
"""

import contextlib
import io
import os
import tempfile
import textwrap

from absl.testing import parameterized
import tensorflow as tf

from estimator_bf16.apps import cli
from estimator_bf16.runner import results
from estimator_bf16.runner import tf1 as tf1_lib

_NO_TPU = '''
import tensorflow as tf

def model_fn(features, labels, mode, params):
  raise AssertionError('never built')

tf.compat.v1.estimator.tpu.TPUEstimator(
    model_fn=model_fn, config=tf.compat.v1.estimator.tpu.RunConfig(),
    use_tpu=True, train_batch_size=8)
'''
_CONTRIB = '''
import tensorflow as tf
tf.flags.DEFINE_integer('steps', 1, 'steps')
optimizer = tf.contrib.opt.LazyAdamOptimizer
'''
_OWN_ERROR = '''
def build():
  raise RuntimeError('the program itself failed')

build()
'''


class RefusalsTest(tf.test.TestCase, parameterized.TestCase):

  def _run(self, source, *options):
    folder = tempfile.mkdtemp(dir=self.get_temp_dir())
    program = os.path.join(folder, 'program.py')
    with open(program, 'w') as f:
      f.write(textwrap.dedent(source))
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
      code = cli.main(['run', '--precision=float32'] + list(options) +
                       [program])
    return code, stderr.getvalue(), program

  @parameterized.named_parameters(
      ('missing_tpu', _NO_TPU, (), 'NoTpuError: ',
       'TPUEstimator(use_tpu=True), but the program named no TPU'),
      ('unmapped_contrib', _CONTRIB, ('--tf1',), 'UnmappedContribError: ',
       'program.py:4: tf.contrib.opt has no successor'))
  def test_refusal_is_one_line(self, source, options, start, fragment):
    code, stderr, _ = self._run(source, *options)
    self.assertNotEqual(code, 0)
    self.assertNotIn('Traceback', stderr)
    self.assertNotIn('estimator_patches.py', stderr)
    # The line, then the run's report (whose `failed:` line repeats it).
    lines = [l for l in stderr.splitlines() if l.startswith(start)]
    self.assertLen(lines, 1, stderr)
    self.assertIn(fragment, lines[0])
    # The report does not say the program never tried.
    self.assertNotIn('built no Estimator', stderr)
    self.assertIn('stopped before an Estimator or TPUEstimator was built',
                  stderr)

  def test_verbose_shows_the_traceback(self):
    code, stderr, _ = self._run(_NO_TPU, '--verbose')
    self.assertNotEqual(code, 0)
    self.assertIn('Traceback', stderr)
    self.assertIn('NoTpuError: TPUEstimator(use_tpu=True)', stderr)

  def test_program_error_keeps_its_traceback(self):
    code, stderr, program = self._run(_OWN_ERROR)
    self.assertEqual(code, 1)
    self.assertIn('Traceback', stderr)
    self.assertIn('File "%s", line 3, in build' % program, stderr)
    self.assertIn('RuntimeError: the program itself failed', stderr)

  def test_refusals_share_one_type(self):
    for error in (results.ProgramError, results.NoTpuError,
                  tf1_lib.UnmappedContribError):
      self.assertTrue(issubclass(error, results.Refusal), error)


if __name__ == '__main__':
  tf.test.main()
