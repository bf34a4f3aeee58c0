"""The suite's own set-up changes nothing a test reads.

tests/conftest.py has every test process write `graph.pbtxt` with
protobuf's C text encoder (tests/support/graph_text.py). The file must
hold the graph TensorFlow's own writer writes, for every kind of content
a training graph has.
"""

import os

from google.protobuf import text_format
from google.protobuf.internal import api_implementation
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import graph_io
from tensorflow.python.training import training_util

from estimator_bf16.platform import patching
from tests.support import graph_text


def _training_graph():
  """A graph with what model_dirs hold: big constants (tensor_content),
  strings, non-finite and tiny floats, a function library, shapes."""
  graph = tf.Graph()
  with graph.as_default():
    images = tf.compat.v1.placeholder(tf.float32, [None, 8], name='images')
    table = tf.constant(np.linspace(-1, 1, 64).reshape(8, 8), tf.float32)
    weights = tf.compat.v1.get_variable(
        'w', initializer=tf.cast(table, tf.bfloat16))
    logits = tf.matmul(tf.cast(images, tf.bfloat16), weights)
    loss = tf.reduce_mean(tf.cast(logits, tf.float32)) * 1.5e-42
    loss = tf.where(tf.math.is_finite(loss), loss, float('nan'))
    loss += tf.constant(float('-inf')) * 0.0
    tf.compat.v1.summary.text('note', tf.constant('gradient \u2207 "q"\n'))

    @tf.function
    def scaled(x):
      return x * 0.1

    tf.identity(scaled(loss), name='scaled')
    tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
  return graph.as_graph_def(add_shapes=True)


def _parse(text):
  graph_def = tf.compat.v1.GraphDef()
  text_format.Parse(text, graph_def)
  return graph_def


def _bytes(graph_def):
  return graph_def.SerializeToString(deterministic=True)


class GraphTextTest(tf.test.TestCase):

  def test_the_file_parses_to_the_graph_tensorflows_writer_writes(self):
    if api_implementation.Type() != 'upb':
      self.skipTest('protobuf backend %s: the writer is left alone' %
                    api_implementation.Type())
    graph_def = _training_graph()
    folder = self.create_tempdir().full_path
    with graph_text.c_encoded_graph_text():
      # TensorFlow's own writer, which the replacement keeps.
      with open(training_util.write_graph.__wrapped__(
          graph_def, folder, 'theirs.pbtxt')) as f:
        theirs = f.read()
      ours = training_util.write_graph(graph_def, os.path.join(folder, 'new'),
                                       'graph.pbtxt')
      binary = graph_io.write_graph(graph_def, folder, 'graph.pb',
                                    as_text=False)
    self.assertEqual(ours, os.path.join(folder, 'new', 'graph.pbtxt'))
    with open(ours) as f:
      text = f.read()
    self.assertNotEqual(text, theirs)  # the attr maps' order
    # Compared serialized (maps sorted): a NaN constant is not == itself.
    self.assertEqual(_bytes(_parse(text)), _bytes(_parse(theirs)))
    self.assertEqual(_bytes(_parse(text)), _bytes(graph_def))
    with open(binary, 'rb') as f:
      self.assertEqual(f.read(), _bytes(graph_def))

  def test_the_swap_is_undone(self):
    before = graph_io.write_graph, training_util.write_graph
    undo = graph_text._swap()  # pylint: disable=protected-access
    try:
      self.assertNotIn(training_util.write_graph, before)
      self.assertNotIn(graph_io.write_graph, before)
    finally:
      patching.restore(undo)
    self.assertEqual((graph_io.write_graph, training_util.write_graph),
                     before)


if __name__ == '__main__':
  tf.test.main()
