"""Every shell block of the README and docs/ runs as written.

A newcomer copies the commands of the README and of docs/ into a shell in a
fresh clone after `make demo`. Each ```sh block is run here the same way:
with bash, from a folder that holds the repository's files (links to them)
and a `runs/` of its own, so the commands' relative paths (`.venv/bin/python`,
`models/`, `runs/...`) resolve as they do for that user. Blocks that cannot
run here, take longer than the promise below, or repeat the command another
test runs, are listed in `_NOT_RUN` with the reason and where they are
tested instead; transcripts and synopses are fenced `console` / `text`.
"""

import glob
import os
import re
import resource
import subprocess
import sys
import time

from absl.testing import parameterized
import pytest
import tensorflow as tf

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DOCS = ['README.md', 'models/README.md'] + sorted(
    os.path.relpath(p, _REPO) for p in glob.glob(os.path.join(_REPO, 'docs',
                                                              '*.md')))
_BLOCK = re.compile(r'^```sh\n(.*?)^```', re.S | re.M)
# (document, the block's first word(s)): why it is not run here.
_NOT_RUN = {
    ('README.md', 'make demo'):
        'the README\'s two commands: CI runs `make test`, and '
        'tests/apps/test_demo.py the demo program',
    ('docs/benchmarks.md', '.venv/bin/python scripts/benchmark.py'):
        '15 minutes to hours of benchmarking; tests/test_benchmark.py runs '
        'the same code at small sizes',
    ('docs/development.md', '.venv/bin/python -m pytest'):
        'subsets of the suite that `make test` runs',
    ('docs/corpus.md', '.venv/bin/python scripts/corpus.py'):
        'needs a copy of tensorflow/tpu and an hour; tests/test_corpus.py '
        'runs the same script on a repository the test makes',
    ('docs/corpus.md', 'mkdir -p ../corpus'):
        'clones nine repositories (the network) and runs for an hour; '
        'tests/test_corpus.py runs --source on a repository the test makes',
    ('docs/compat.md', 'scripts/test_matrix.sh'):
        'the suite itself: `make test` runs it',
    ('docs/tpu.md', 'gcloud'):
        'needs a Google Cloud project; tests/apps/test_tpu_submit.py runs '
        'tpu-submit against a stand-in gcloud',
    ('docs/tpu.md', 'tpu-submit vertex'):
        'needs a Google Cloud project; tests/apps/test_tpu_submit.py runs '
        'tpu-submit against a stand-in gcloud',
    ('docs/cpu.md', 'TF_ENABLE_ONEDNN_OPTS=1 .venv/bin/python -m '
                    'benchmarks.kernel_table'):
        'a benchmark: two whole kernel tables, each op timed in 5 '
        'alternating windows (over 2 minutes where bfloat16 is emulated, '
        'as on an AVX2-only CPU); KernelTableTest below runs the same '
        'measurement on two ops at one window',
    ('docs/levers.md', '.venv/bin/python -m estimator_bf16 check --xla'):
        'XLA compiles the BERT-style step and the planner builds it: 34 s '
        'of CPU on a native CPU at speed factor 2.1 (72 s on the AVX2-only '
        'machine of the budgets), over the 40 s a block may take on a '
        'native CPU at any of the program\'s sizes; '
        'tests/memory/test_xla_step.py '
        '(CheckXlaCommandTest) runs the same command, `check --xla '
        '--accumulate=2`, on a small TF 1.x program',
    ('docs/levers.md', '.venv/bin/python -m benchmarks.check_time'):
        'a benchmark: 20 s or more of planning and XLA compiling at 224 px '
        '(over a minute on an AVX2-only CPU); tests/test_benchmark.py checks '
        'the command it times and its timing of a child, and '
        'tests/memory/test_xla_step.py runs `check --xla` itself',
    ('docs/runner.md', '.venv/bin/python -m estimator_bf16 check --xla'):
        'over the block budget, as the check --xla of docs/levers.md; '
        'tests/memory/test_xla_step.py runs `check --xla --accumulate=2` on '
        'a small TF 1.x program (CheckXlaCommandTest) and recompute '
        'compiled by XLA (RecomputeOnXlaTest)',
    ('models/README.md', '.venv/bin/python -m estimator_bf16.apps.digits_cli'):
        'the same two commands as the README\'s "Zero code changes" block '
        '(another --model_dir), which runs here',
}
# The promise: every documented block finishes in 2 minutes, on a CPU with
# native bfloat16 or one that emulates it (an AVX2-only CPU, 2 to 3 times
# slower than a 2-core AMD EPYC with AVX512-BF16 by the speed factor of
# docs/development.md; the blocks take at most about 25 s each there).
# Longer commands are listed in _NOT_RUN.
_BLOCK_SECONDS = 120
# What a fresh clone holds that the commands read (the venv `make demo`
# made, the programs, the package).
_LINKED = ('.venv', 'estimator_bf16', 'models', 'tests', 'scripts',
           'benchmarks', 'setup.py')


def _blocks():
  """(document, line, block text) of every ```sh block."""
  found = []
  for doc in _DOCS:
    with open(os.path.join(_REPO, doc)) as f:
      text = f.read()
    for match in _BLOCK.finditer(text):
      line = text[:match.start()].count('\n') + 1
      found.append((doc, line, match.group(1)))
  return found


def _reason_not_run(doc, block):
  for (where, start), reason in _NOT_RUN.items():
    if where == doc and block.lstrip().startswith(start):
      return reason
  return None


def _children_cpu_seconds():
  """User + system CPU seconds of this process's finished subprocesses."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


_CASES = [dict(testcase_name='%s_%d' % (re.sub(r'\W', '_', doc), line),
               doc=doc, block=block) for doc, line, block in _blocks()]


@pytest.mark.slow
class DocsCommandsTest(tf.test.TestCase, parameterized.TestCase):

  def test_the_docs_have_shell_blocks(self):
    self.assertGreaterEqual(len(_CASES), 8)
    # Every exception still names a block that exists.
    for doc, start in _NOT_RUN:
      self.assertTrue(any(d == doc and b.lstrip().startswith(start)
                          for d, _, b in _blocks()), (doc, start))

  @parameterized.named_parameters(*_CASES)
  def test_block_runs_as_written(self, doc, block):
    reason = _reason_not_run(doc, block)
    if reason:
      self.skipTest(reason)
    if not os.path.exists(os.path.join(_REPO, '.venv', 'bin', 'python')):
      self.skipTest('no .venv: the documented commands need `make demo` '
                    'first')
    if os.path.realpath(sys.prefix) != os.path.realpath(
        os.path.join(_REPO, '.venv')):
      self.skipTest('the documented commands name .venv (TensorFlow 2.15); '
                    'run in that suite')
    home = self.create_tempdir().full_path
    for name in _LINKED:
      os.symlink(os.path.join(_REPO, name), os.path.join(home, name))
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'TF_CPP_MIN_LOG_LEVEL')}
    start = time.monotonic()
    cpu_start = _children_cpu_seconds()
    try:
      done = subprocess.run(['bash', '-euo', 'pipefail', '-c', block],
                            cwd=home, env=env, capture_output=True,
                            text=True, timeout=_BLOCK_SECONDS, check=False)
    except subprocess.TimeoutExpired:
      self.fail('%s:\n%s\ntook over %d s: a documented command must finish '
                'in 2 minutes on any CPU (pass the program a smaller step '
                'count)' % (doc, block, _BLOCK_SECONDS))
    seconds = time.monotonic() - start
    # Shown with `pytest -rP` (or -s): what each block costs, to keep the
    # docs within the promise as they grow. The CPU seconds of the block's
    # processes tell a slow block from a busy machine.
    print('%s: block ran in %.1f s (%.1f s of CPU)' % (
        doc, seconds, _children_cpu_seconds() - cpu_start))
    self.assertEqual(done.returncode, 0, '%s\n(%.1f s)\n--- stderr:\n%s' % (
        block, seconds, done.stderr[-4000:]))


class KernelTableTest(tf.test.TestCase):
  """docs/cpu.md's kernel table (a benchmark, not run above) at one window
  of two ops: a conv gradient (slow in bfloat16 where it is emulated) and
  an elementwise op."""

  def test_measures_each_form_of_each_op(self):
    from benchmarks import kernel_table  # pylint: disable=g-import-not-at-top
    rows = kernel_table.measure(names=('Conv2DBackpropInput', 'Relu'),
                                runs=1, rounds=1)
    self.assertEqual([row['case'] for row in rows],
                     ['Conv2DBackpropInput', 'Relu'])
    for row in rows:
      for variant in kernel_table.VARIANTS:
        self.assertGreater(row[variant + '_ms'], 0, row)
      self.assertAllClose(row['ratio'],
                          row['bfloat16_ms'] / row['float32_ms'])
      self.assertEqual(row['slow'], row['bfloat16_ms'] >
                       kernel_table.SLOW_RATIO * row['substituted_ms'])


if __name__ == '__main__':
  tf.test.main()
