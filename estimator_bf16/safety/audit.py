"""Graph audit: find precision mistakes on a laptop, not on the TPU.

`check_graph` reads a built graph and reports what the field keeps tripping
over (see the package README): variables stored in 16 bits, ops that mix
bfloat16 and float32 (a `tf.matmul(bfloat16, float32)` silently becomes a
float32 `SparseMatMul`), a loss that is not float32, and how much of the
matmul/conv arithmetic actually runs in bfloat16 -- a "bfloat16" build in
which most of it runs in float32 is not one.
"""

import dataclasses
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.precision import op_lists
from estimator_bf16.platform import shown_paths
from estimator_bf16.precision.casting import FLOATING_DTYPES
from estimator_bf16.precision.casting import HALF_DTYPES

# What a caller may ask of the audit of a TRAIN graph: raise on a problem,
# log it, or skip the audit.
AUDIT_MODES = ('strict', 'warn', 'off')
_FLOATS = frozenset(FLOATING_DTYPES)
_ALWAYS_MIXED = frozenset([op_lists.SPARSE_MATMUL_OP])
# The share of matmul/conv FLOPs that a bfloat16 model_fn must run in
# bfloat16 to pass the strict audit of `wrap_model_fn`. Autocast puts every
# matmul/conv of the network in bfloat16 (over 0.95 for the reference and
# style models), so a share below one half means most of the arithmetic
# escaped it, e.g. under `keep_float32` or in ops built outside the model_fn.
MIN_BFLOAT16_SHARE = 0.5
# How many float32 matmul/conv ops a low-share problem names.
_LARGEST_SHOWN = 5
# Code in these packages is not where a user's op "was made".
_LIBRARY_DIRS = ('tensorflow', 'tensorflow_estimator', 'keras', 'tf_keras',
                 'tf_slim', 'estimator_bf16')


class PrecisionError(TypeError):
  """A graph breaks the bfloat16 recipe; the message names what and where."""


@dataclasses.dataclass
class GraphReport:
  """What `check_graph` found.

  Attributes:
    half_precision_variables: (name, dtype name) of each variable stored in
      bfloat16 or float16 (master weights must be float32).
    mixed_precision_ops: (op name, op type, input dtypes) of each op mixing
      float dtypes, `SparseMatMul` included.
    loss_dtype: dtype name of the checked loss, or None if none was given.
    flops_by_dtype: {dtype name: estimated FLOPs} over matmul/conv ops,
      forward and backward; unknown dimensions count as 1.
    bfloat16_flop_share: share of those FLOPs in bfloat16 (0.0 if none).
    num_ops: ops in the graph; num_casts: `Cast` ops among them.
    largest_float32_ops: (op name, op type, FLOPs, where it was made) of the
      biggest float32 matmul/conv ops, largest first; "where" is the
      innermost `file:line (function)` outside TensorFlow and its layer
      libraries, or '' if unknown.
    problems: one sentence for each finding that breaks the recipe.
    cpu_substituted_ops: {op type: count} of the ops autocast built in
      float32 because this CPU's bfloat16 kernel is slow
      (`autocast.cpu_kernels`), casts and constants left out; counted as
      bfloat16 everywhere above.
  """
  half_precision_variables: List[Tuple[str, str]]
  mixed_precision_ops: List[Tuple[str, str, Tuple[str, ...]]]
  loss_dtype: Optional[str]
  flops_by_dtype: Dict[str, float]
  bfloat16_flop_share: float
  num_ops: int
  num_casts: int
  problems: List[str]
  largest_float32_ops: List[Tuple[str, str, float, str]] = dataclasses.field(
      default_factory=list)
  cpu_substituted_ops: Dict[str, int] = dataclasses.field(
      default_factory=dict)

  @property
  def ok(self):
    return not self.problems

  def summary(self):
    """One line for logs."""
    return ('%d ops (%d casts), %.1f%% of matmul/conv FLOPs in bfloat16, '
            'loss %s, %d problem(s)' % (
                self.num_ops, self.num_casts, 100 * self.bfloat16_flop_share,
                self.loss_dtype, len(self.problems)))


def _dims(shape):
  """Static dims of a TensorShape with unknown entries (or rank) as 1."""
  if shape.rank is None:
    return []
  return [1 if d is None else int(d) for d in shape.as_list()]


def _matmul_flops(op):
  a, b = _dims(op.inputs[0].shape), _dims(op.inputs[1].shape)
  if len(a) < 2 or len(b) < 2:
    return 0.0
  transpose_a = _attr(op, 'transpose_a') or _attr(op, 'adj_x')
  transpose_b = _attr(op, 'transpose_b') or _attr(op, 'adj_y')
  m, k = (a[-1], a[-2]) if transpose_a else (a[-2], a[-1])
  n = b[-2] if transpose_b else b[-1]
  batch = np.prod(_dims(op.outputs[0].shape)[:-2] or [1])
  return 2.0 * float(batch) * m * k * n


def _kernel_and_output(op):
  """(filter dims, forward output dims) of a convolution or its gradient."""
  if 'BackpropFilter' in op.type:
    return _dims(op.outputs[0].shape), _dims(op.inputs[2].shape)
  if 'BackpropInput' in op.type:
    return _dims(op.inputs[1].shape), _dims(op.inputs[2].shape)
  return _dims(op.inputs[1].shape), _dims(op.outputs[0].shape)


def _conv_flops(op):
  """2 * output elements * (kernel window * input channels), 2-D or 3-D."""
  kernel, out = _kernel_and_output(op)
  if len(kernel) not in (4, 5) or not out:
    return 0.0
  return 2.0 * float(np.prod(out)) * float(np.prod(kernel[:-1]))


def _depthwise_flops(op):
  """2 * output elements * kernel window: each output reads one channel."""
  kernel, out = _kernel_and_output(op)
  if len(kernel) != 4 or not out:
    return 0.0
  return 2.0 * float(np.prod(out)) * kernel[0] * kernel[1]


def _einsum_flops(op):
  """2 * the product of every index's size (each is summed or kept once)."""
  equation = _attr(op, 'equation')
  if not equation:
    return 0.0
  inputs = equation.decode() if isinstance(equation, bytes) else equation
  inputs = inputs.split('->')[0].split(',')
  sizes = {}
  for spec, tensor in zip(inputs, op.inputs):
    dims = _dims(tensor.shape)
    if '...' in spec:
      # The broadcast dims get names of their own, right-aligned.
      head, tail = spec.split('...')
      extra = max(len(dims) - len(head) - len(tail), 0)
      labels = list(head) + ['...%d' % i for i in range(extra)] + list(tail)
    else:
      labels = list(spec)
    if len(labels) != len(dims):
      return 0.0
    for label, dim in zip(labels, dims):
      sizes[label] = max(sizes.get(label, 1), dim)
  return 2.0 * float(np.prod(list(sizes.values()) or [0]))


_FLOP_COUNTERS = {}
for _types, _counter in ((op_lists.MATMUL_OPS, _matmul_flops),
                         (op_lists.CONV_OPS, _conv_flops),
                         (op_lists.DEPTHWISE_CONV_OPS, _depthwise_flops),
                         (op_lists.EINSUM_OPS, _einsum_flops)):
  _FLOP_COUNTERS.update(dict.fromkeys(_types, _counter))


def _attr(op, name):
  try:
    return op.get_attr(name)
  except ValueError:
    return None


def _float_input_dtypes(op):
  dtypes = set()
  for tensor in op.inputs:
    dtype = tensor.dtype.base_dtype
    if dtype in _FLOATS:
      dtypes.add(dtype)
  return dtypes


def compute_dtype(op):
  """The dtype an op's arithmetic runs in: SparseMatMul always float32.

  An op that autocast built in float32 only because this CPU's bfloat16
  kernel is slow (`cpu_kernels`) counts as the bfloat16 op a TPU runs.
  """
  if op.type == op_lists.SPARSE_MATMUL_OP:
    return tf.float32
  if cpu_kernels.is_substituted(op):
    return tf.bfloat16
  for tensor in op.inputs:  # Conv2DBackpropInput starts with int32 sizes.
    if tensor.dtype.base_dtype in _FLOATS:
      return tensor.dtype.base_dtype
  return op.outputs[0].dtype.base_dtype


def where_made(op):
  """`file:line (function)` of the innermost user frame that made `op`."""
  try:
    frames = list(op.traceback)
  except (AttributeError, TypeError, ValueError):
    return ''
  for frame in reversed(frames):
    filename = getattr(frame, 'filename', None) or frame[0]
    parts = os.path.normpath(filename).split(os.sep)
    if any(part in _LIBRARY_DIRS for part in parts) or '<frozen' in filename:
      continue
    lineno = getattr(frame, 'lineno', None) or frame[1]
    name = getattr(frame, 'name', None) or frame[2]
    return '%s (%s)' % (shown_paths.shown_location(filename, lineno), name)
  return ''


def _made_at(op):
  """' (made at file:line (function))' for a problem message, or ''."""
  where = where_made(op)
  return ' (made at %s)' % where if where else ''


def _dtype_names(op):
  return tuple(t.dtype.base_dtype.name for t in op.inputs)


@dataclasses.dataclass
class _Scan:
  """What one pass over a graph's ops found (see `_scan`).

  Attributes:
    half_vars: (variable op name, dtype name) of 16-bit variables.
    mixed_ops: (op name, op type, input dtype names) of ops that mix float
      dtypes where they should not.
    made_at: op name -> ' (made at file:line (function))' or '', for the
      ops of the two lists above.
    flops: dtype name -> matmul/conv FLOPs computed in it.
    float32_ops: (FLOPs, op) of the matmul/conv ops computing in float32.
    num_casts: Cast ops the graph holds (CPU substitutions' aside).
    substituted: op type -> ops computed in float32 by `cpu_kernels`.
    num_ops: ops in the graph.
  """
  half_vars: List[Tuple[str, str]] = dataclasses.field(default_factory=list)
  mixed_ops: List[Tuple[str, str, List[str]]] = dataclasses.field(
      default_factory=list)
  made_at: Dict[str, str] = dataclasses.field(default_factory=dict)
  flops: Dict[str, float] = dataclasses.field(default_factory=dict)
  float32_ops: List[Tuple[float, tf.Operation]] = dataclasses.field(
      default_factory=list)
  num_casts: int = 0
  substituted: Dict[str, int] = dataclasses.field(default_factory=dict)
  num_ops: int = 0


def _scan(operations):
  """One pass over `operations`: the `_Scan` of what the audit reads."""
  found = _Scan(num_ops=len(operations))
  for op in operations:
    if cpu_kernels.is_substituted(op):
      if op.type not in (op_lists.OP.Cast, op_lists.OP.Const):
        found.substituted[op.type] = found.substituted.get(op.type, 0) + 1
    elif op.type == op_lists.OP.Cast:
      found.num_casts += 1
    if op.type in op_lists.VARIABLE_OPS:
      dtype = tf.as_dtype(op.get_attr('dtype')).base_dtype
      if dtype in HALF_DTYPES:
        found.half_vars.append((op.name, dtype.name))
        found.made_at[op.name] = _made_at(op)
      continue
    dtypes = _float_input_dtypes(op)
    if op.type in _ALWAYS_MIXED or (
        len(dtypes) > 1 and op.type not in op_lists.MIXED_DTYPE_OPS):
      found.mixed_ops.append((op.name, op.type, _dtype_names(op)))
      found.made_at[op.name] = _made_at(op)
    counter = _FLOP_COUNTERS.get(op.type)
    if counter is not None:
      dtype = compute_dtype(op)
      count = counter(op)
      found.flops[dtype.name] = found.flops.get(dtype.name, 0.0) + count
      if dtype == tf.float32:
        found.float32_ops.append((count, op))
  return found


def _variable_problems(found, trainable):
  """A problem line per 16-bit variable; `trainable`: their op names."""
  problems = []
  for name, dtype in found.half_vars:
    if name in trainable:
      why = ('It was probably made by a Keras layer (which ignores the '
             'bfloat16 scope) or by an explicit dtype; build it with '
             'tf.compat.v1.get_variable / tf.compat.v1.layers inside '
             'eb.bfloat16_scope instead.')
    else:
      why = ('It is a state variable (not trainable), which keeps the dtype '
             'it was made with; make it float32 and cast where it is read.')
    problems.append(
        'variable %r%s is stored as %s: master weights must be float32. %s'
        % (name, found.made_at[name], dtype, why))
  return problems


def _mixed_op_problems(found):
  """A problem line per op that mixes float dtypes."""
  problems = []
  for name, op_type, in_dtypes in found.mixed_ops:
    if op_type == op_lists.SPARSE_MATMUL_OP:
      problems.append(
          'op %r%s is a SparseMatMul with inputs %s: it computes in float32. '
          'tf.matmul makes one when bfloat16 meets float32 (or for a_is_sparse'
          '/b_is_sparse); build the model under eb.wrap_model_fn, whose '
          'autocast makes it a bfloat16 MatMul, or cast both inputs.'
          % (name, found.made_at[name], ' x '.join(in_dtypes)))
      continue
    problems.append(
        'op %r (%s)%s mixes dtypes %s: a float32 tensor meets bfloat16 '
        'activations. Build it under eb.wrap_model_fn (autocast unifies '
        'them) or cast it with tf.cast.' % (name, op_type,
                                           found.made_at[name],
                                           ', '.join(in_dtypes)))
  return problems


def _loss_problems(loss):
  """The problem line of a loss that is not float32, if it is not."""
  if loss is None or loss.dtype.base_dtype == tf.float32:
    return []
  return [
      'the loss %r%s is %s: TPU training loops need a float32 loss, and a '
      'loss reduced in 16 bits loses accuracy. Use tf.compat.v1.losses '
      '(computed in float32 by the wrapper) or cast the logits with '
      'tf.cast(logits, tf.float32) before the loss.'
      % (loss.name, _made_at(loss.op), loss.dtype.base_dtype.name)]


def _largest_float32(found):
  """(name, type, FLOPs, where made) of the largest float32 matmul/convs."""
  largest = sorted(found.float32_ops, key=lambda pair: -pair[0])
  return [(op.name, op.type, count, where_made(op))
          for count, op in largest[:_LARGEST_SHOWN]]


def _share_problems(share, min_bfloat16_share, largest):
  """The problem line of a bfloat16 FLOP share below the minimum."""
  if min_bfloat16_share is None or share >= min_bfloat16_share:
    return []
  return [
      'only %.1f%% of matmul/conv FLOPs run in bfloat16 (at least %.0f%% '
      'expected under precision bfloat16). The largest float32 ones:\n  %s'
      % (100 * share, 100 * min_bfloat16_share, '\n  '.join(
          '%s (%s, %.3g FLOPs)%s' % (name, op_type, count,
                                     ' made at ' + where if where else '')
          for name, op_type, count, where in largest))]


def check_graph(graph=None, strict=True, loss=None, min_bfloat16_share=None):
  """Audits a built graph for bfloat16 mistakes.

  Args:
    graph: the `tf.Graph` to read; the default graph if None.
    strict: if True, raise `PrecisionError` when anything is found.
    loss: optional loss tensor; it must be float32.
    min_bfloat16_share: if set (e.g. `MIN_BFLOAT16_SHARE`), a graph with
      matmul/conv ops of which less than this share of FLOPs runs in
      bfloat16 is a problem, naming the largest float32 ones.

  Returns:
    A `GraphReport`.

  Raises:
    PrecisionError: if `strict` and the report has problems; the message
      lists each offending variable / op and what to do.
  """
  graph = graph or tf.compat.v1.get_default_graph()
  found = _scan(graph.get_operations())
  trainable = {v.op.name for v in graph.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
  total = sum(found.flops.values())
  share = (found.flops.get('bfloat16', 0.0) / total) if total else 0.0
  largest = _largest_float32(found)
  problems = (_variable_problems(found, trainable) +
              _mixed_op_problems(found) + _loss_problems(loss) +
              (_share_problems(share, min_bfloat16_share, largest)
               if total else []))
  report = GraphReport(
      half_precision_variables=found.half_vars,
      mixed_precision_ops=found.mixed_ops,
      loss_dtype=None if loss is None else loss.dtype.base_dtype.name,
      flops_by_dtype=found.flops, bfloat16_flop_share=share,
      num_ops=found.num_ops, num_casts=found.num_casts, problems=problems,
      largest_float32_ops=largest, cpu_substituted_ops=found.substituted)
  if strict and problems:
    raise PrecisionError('check_graph found %d problem(s):\n- %s' % (
        len(problems), '\n- '.join(problems)))
  return report
