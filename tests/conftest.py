"""Process-wide test set-up that must happen before TensorFlow is imported."""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

# The CPU allocator keeps the statistics that memory tests read only when the
# process starts with this set (see estimator_bf16/memory/peak.py).
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
# Quieter logs: TensorFlow's C++ info lines drown test output.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
# XLA reads its flags at its first compile, and any test may be the first in
# a worker: the XLA-step tests need its buffer-assignment dump, so every
# compile of the test process is dumped, into a folder removed at exit
# (`estimator_bf16.memory.xla_dump.enable` then uses it). Each process gets
# its own folder: pytest-xdist's workers inherit the environment of the
# process that loaded this file first, and a shared folder would show one
# worker's compiles to another.
_MARK = 'ESTIMATOR_BF16_TEST_XLA_DUMP'
_flags = os.environ.get('XLA_FLAGS', '').split()
if os.environ.get(_MARK):
  _flags = [f for f in _flags if f != '--xla_dump_to=' + os.environ[_MARK]]
if not any(f.startswith('--xla_dump_to=') for f in _flags):
  _XLA_DUMP = tempfile.mkdtemp(prefix='estimator_bf16_test_xla_')
  atexit.register(shutil.rmtree, _XLA_DUMP, True)
  os.environ[_MARK] = _XLA_DUMP
  _flags += ['--xla_dump_to=' + _XLA_DUMP]
  if '--xla_dump_hlo_as_text' not in _flags:
    _flags.append('--xla_dump_hlo_as_text')
  os.environ['XLA_FLAGS'] = ' '.join(_flags)


def pytest_configure(config):
  """absl flags (e.g. absltest's --test_tmpdir) are read in tests, not parsed
  by pytest: mark them parsed so they fall back to their defaults."""
  del config
  from absl import flags  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def pytest_collection_finish(session):
  """Fewer full garbage collections in a test process, each over less.

  A test process lives through hundreds of tests, and the graphs they build
  and cache make a heap of over a million objects. Python's collector
  scans all of them at each full collection (about 0.65 s each, 21 of them
  in one process running tests/runner, tests/models and tests/memory: 15.5
  s of its 353 s in the collector). Freezing what collection imported
  (TensorFlow, the package, the test modules: never garbage) takes it out
  of every scan, and larger thresholds collect the young generations less
  often: the same tests then spent 5.2 s in the collector. Garbage is
  still collected, later: over tests/memory and tests/levers the process's
  peak resident memory went from 1508 to 1546 MB (and 12.5 s in the
  collector to 4.4 s). The memory figures the tests assert are TensorFlow's
  allocator's, which this does not move.
  """
  del session
  gc.collect()
  gc.freeze()
  gc.set_threshold(10000, 50, 20)


# Modules whose classes run on one pytest-xdist worker, one after another,
# under `make test`'s `--dist loadscope` (which otherwise sends each class
# to any worker): each of their tests starts jobs of two or three
# TensorFlow processes, and two such jobs side by side on two cores slow
# each other and the rest of the suite (the multi-worker classes took 64,
# 23 and 21 s side by side, against 30, 17 and 14 s alone).
_ONE_WORKER_MODULES = frozenset(['tests/distribute/test_multi_worker.py'])


def pytest_xdist_make_scheduler(config, log):
  """`--dist loadscope`, with each of _ONE_WORKER_MODULES one scope."""
  if config.getoption('dist', None) != 'loadscope':
    return None
  from xdist.scheduler import LoadScopeScheduling  # pylint: disable=g-import-not-at-top

  class _Scheduling(LoadScopeScheduling):

    def _split_scope(self, nodeid):
      module = nodeid.split('::', 1)[0]
      if module in _ONE_WORKER_MODULES:
        return module
      return super()._split_scope(nodeid)

  return _Scheduling(config, log)


@pytest.fixture(scope='session', autouse=True)
def _graph_text_in_c():
  """Each test process writes graph.pbtxt with protobuf's C text encoder
  (tests/support/graph_text.py): the same graph, a tenth of the time."""
  from tests.support import graph_text  # pylint: disable=g-import-not-at-top
  with graph_text.c_encoded_graph_text():
    yield
