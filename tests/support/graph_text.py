"""The suite's `graph.pbtxt`, written by protobuf's C text encoder.

Every `Estimator.train` writes the step's graph as text into its model_dir
(`CheckpointSaverHook.after_create_session` calls
`training_util.write_graph`), and TensorFlow formats it with
`google.protobuf.text_format`, which is pure Python: 4.6 s in 77 calls of
88 s of training tests (test_styles, test_estimator, test_accumulation,
timed without a profiler). With the upb protobuf backend (the one
TensorFlow 2.15 and later install), `str(graph_def)` gives the same text
format from C, about 10x faster. The
two texts parse back to equal GraphDefs; only the order of the `attr` map
entries differs. No test reads that order, and tests that read the file
parse it (tests/runner/test_runner.py).

Used by tests/conftest.py for the test processes only; the commands a test
runs in a child process, and users' programs, keep TensorFlow's writer.
"""

import contextlib
import functools
import os
import sys

from google.protobuf.internal import api_implementation

from estimator_bf16.platform import patching


def _fast_write_graph(original):
  """`write_graph` with the same arguments, results and files as `original`
  (kept as its `__wrapped__`)."""

  @functools.wraps(original)
  def write_graph(graph_or_graph_def, logdir, name, as_text=True):
    # TensorFlow byte-swaps tensor contents on big-endian hosts first; that
    # and the binary form stay its own.
    if not as_text or sys.byteorder == 'big':
      return original(graph_or_graph_def, logdir, name, as_text)
    # pylint: disable=g-import-not-at-top
    import tensorflow as tf
    from tensorflow.python.lib.io import file_io
    # pylint: enable=g-import-not-at-top
    graph_def = graph_or_graph_def
    if isinstance(graph_def, tf.Graph):
      graph_def = graph_def.as_graph_def()
    if not logdir.startswith('gs:'):
      file_io.recursive_create_dir(logdir)
    path = os.path.join(logdir, name)
    file_io.atomic_write_string_to_file(path, str(graph_def))
    return path

  return write_graph


def _swap():
  # pylint: disable=g-import-not-at-top
  from tensorflow.python.framework import graph_io
  from tensorflow.python.training import training_util
  # pylint: enable=g-import-not-at-top
  undo = []
  # The hooks call it through training_util, which bound graph_io's
  # function at import; both names get the replacement.
  for module in (graph_io, training_util):
    original = module.write_graph
    undo.append((module, 'write_graph', original))
    module.write_graph = _fast_write_graph(original)
  return undo


_PATCHER = patching.Patcher(_swap)


@contextlib.contextmanager
def c_encoded_graph_text():
  """Inside, `graph.pbtxt` files are formatted by upb's C text encoder.

  Does nothing when protobuf runs another backend (its `str()` is Python
  there too).
  """
  if api_implementation.Type() != 'upb':
    yield
    return
  with _PATCHER.active():
    yield
