"""matmul/conv ops of the bfloat16 network, and their weights in backprop.

Decides when a matmul/conv counts as part of the bfloat16 network (a
bfloat16 input, or a read of a trainable variable in the forward pass),
rebuilds the float32 `SparseMatMul` that `tf.matmul` makes of mixed inputs
as a bfloat16 `MatMul`, and marks ops whose gradients should cast their
weights again in the backward pass rather than keep the forward copy.
"""

import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from estimator_bf16.autocast import gradients as autocast_gradients
from estimator_bf16.autocast import graph_queries
from estimator_bf16.autocast import op_inputs
from estimator_bf16.autocast import state
from estimator_bf16.precision import op_lists

# Fewest rows of activations a weight element must meet for the weight
# recast (see autocast_gradients). The recast passes over the weights once
# more (4 bytes read, 2 written an element); the backward matmul reading the
# copy does one multiply-add per weight element and row. A dense layer on a
# batch of 64 spends about as long on the cast as on that matmul (on the
# 64x64 conv nets of the benchmark, 2% of the step); BERT-base's encoder
# meets 4096 rows (batch x tokens) and ResNet-50's convolutions 1568 or more
# (batch x positions), where the cast costs under 1% and frees 162 and 49
# MiB. Their few-row layers (pooler, classifier, final dense) keep the
# forward copy without raising the step's peak, which is elsewhere.
RECAST_MIN_ROWS = 256


def wants_bfloat16(op_def, keywords):
  """True for a matmul/conv of the bfloat16 network.

  That is one with a bfloat16 input, or one reading a trainable variable in
  the forward pass. While TensorFlow builds a gradient it marks the graph
  with the forward op (`_default_original_op`); there only bfloat16 inputs
  count, so the gradient of a float32 matmul (e.g. one built under
  `keep_float32`) stays float32.

  Args:
    op_def: the op's `OpDef` proto.
    keywords: the op's keyword arguments.
  """
  in_gradient = getattr(tf.compat.v1.get_default_graph(),
                        '_default_original_op', None) is not None
  for group in op_inputs.typed_inputs(op_def, keywords).values():
    for place in group:
      value = op_inputs.get(keywords, place)
      if op_inputs.dtype_of(value) == tf.bfloat16:
        return True
      if not in_gradient and _reads_trainable_variable(value):
        return True
  return False


def matmul_keywords(sparse_keywords):
  """MatMul's arguments for what was asked of SparseMatMul."""
  keywords = {'a': sparse_keywords['a'], 'b': sparse_keywords['b'],
              'transpose_a': sparse_keywords.get('transpose_a', False),
              'transpose_b': sparse_keywords.get('transpose_b', False)}
  # Newer TensorFlow gives MatMul more boolean attrs (grad_a, grad_b) that
  # its Python wrapper always passes; pass their neutral value too.
  for attr in op_def_registry.get(op_lists.MATMUL_OP).attr:
    if attr.type == 'bool' and attr.name not in keywords:
      keywords[attr.name] = False
  return keywords


def _trainable_variable_ops(graph):
  """Names of the graph's trainable variable ops, cached per thread."""
  trainable = graph.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
  cached_graph, count, names = state.STATE.trainable
  if cached_graph is not graph or count != len(trainable):
    names = frozenset(v.op.name for v in trainable)
    state.STATE.trainable = (graph, len(trainable), names)
  return names


def _reads_trainable_variable(value):
  """True if `value` is (a read of) a trainable variable."""
  if isinstance(value, tf.Variable):
    return bool(value.trainable)
  if not isinstance(value, tf.Tensor):
    return False
  for _ in range(8):
    op = value.op
    if op.type in op_lists.VARIABLE_OPS:
      return op.name in _trainable_variable_ops(op.graph)
    if op.type == op_lists.OP.Placeholder:
      # Inside a loop body with control flow v2 the variable's handle is a
      # capture: follow it out to the variable.
      value = graph_queries.captured_source(value)
      if value is None:
        return False
      continue
    if op.type not in op_lists.READ_THROUGH_OPS or not op.inputs:
      return False
    value = op.inputs[0]
  return False


def _rows_per_weight(op, weight_index):
  """How many activation rows each weight element of `op` meets, or None.

  The output elements per output channel: the batch of a dense layer (its
  input rows), batch x output positions of a convolution; for an einsum,
  the output dimensions the weights' subscripts do not name. None when the
  output's shape is not fully known (a dynamic batch), or for an einsum
  with an ellipsis.
  """
  shape = op.outputs[0].shape
  if not shape.is_fully_defined() or shape.rank < 2:
    return None
  dims = shape.as_list()  # ints, also under TF1 behaviour (Dimensions)
  if op.type in op_lists.EINSUM_OPS:
    inputs, output = op.get_attr('equation').decode().split('->')
    if '.' in inputs + output:
      return None
    weight_labels = inputs.split(',')[weight_index]
    rows = 1
    for label, size in zip(output, dims):
      if label not in weight_labels:
        rows *= size
    return rows
  try:
    channels_first = op.get_attr('data_format').decode().startswith('NC')
  except ValueError:  # matmuls have no data_format
    channels_first = False
  if channels_first:
    channel_axis = 1
  elif op.type in op_lists.MATMUL_OPS and weight_index == 0:
    # weights @ x: each weight element meets the output's columns.
    channel_axis = -2
  else:
    channel_axis = -1
  return shape.num_elements() // max(dims[channel_axis], 1)


def recast_weights_late(op):
  """Makes a matmul/conv reading bfloat16 weights cast them again in backprop.

  Not inside a TF1 control-flow context (`in_tf1_control_flow`), and not
  where the weights meet fewer than `RECAST_MIN_ROWS` rows (statically
  known), where the cast would cost more than the copy it frees is worth
  (unless `recast_weights_at_any_batch` is in force).

  Args:
    op: the matmul/conv `tf.Operation` just built.
  """
  if graph_queries.in_tf1_control_flow():
    return
  weights = [i for i, t in enumerate(op.inputs)
             if graph_queries.variable_read_source(t) is not None]
  if not weights:
    return
  min_rows = 0 if state.STATE.recast_at_any_batch else RECAST_MIN_ROWS
  rows = _rows_per_weight(op, weights[0])
  if rows is not None and rows < min_rows:
    return
  autocast_gradients.recast_weights_in_gradient(op)
