"""Whether the graph being built is compiled by XLA (a TPU or xla.compile).

TPU computations and `xla.compile` mark their ops with an XLA control-flow
context. With control flow v2 a loop body inside them (TPUEstimator's
training loop, for one) is a function graph of its own, without that
context; the context is on a graph it is nested in.
"""

import tensorflow as tf
from tensorflow.python.ops import control_flow_util


def in_xla_computation(graph=None):
  """True if ops built now in `graph` (default: the default graph) are XLA's.

  Args:
    graph: a tf.Graph or function graph, or None for the default graph.

  Returns:
    bool.
  """
  graph = graph or tf.compat.v1.get_default_graph()
  while graph is not None:
    context = graph._get_control_flow_context()  # pylint: disable=protected-access
    if control_flow_util.GetContainingXLAContext(context) is not None:
      return True
    graph = getattr(graph, 'outer_graph', None)
  return False
