"""Autocast: unmodified model code computes in bfloat16 while it is built.

In graph mode every op that Python code creates goes through one TensorFlow
function, `op_def_library._apply_op_helper` (generated op wrappers call it
by module attribute, on TensorFlow 2.15 and 2.16+ alike), and every tensor
conversion through `tensor_conversion_registry.convert`. While a thread is
inside `autocast('bfloat16')`, the ops *that thread* creates are adjusted
just before they are created, by op type (`estimator_bf16.op_lists`):

* matmul/conv ops run in bfloat16 when an input is bfloat16 or reads a
  trainable variable; `tf.matmul(bfloat16, float32)`, which TensorFlow would
  turn into a float32 `SparseMatMul`, becomes a bfloat16 `MatMul`;
* the float32 list (softmax, cross-entropy, reductions, statistics,
  summaries) computes in float32;
* any other op whose float inputs mix float32 and bfloat16 computes in
  bfloat16 instead of failing with "Input 'y' of 'AddV2' Op has type float32
  that does not match type bfloat16" (an assignment keeps its variable's
  dtype), and a conversion of a float32 tensor to bfloat16 or back (as
  `tf.nn.bias_add` makes of its bias) is a cast;
* trainable variables requested in bfloat16 outside a variable scope (Keras
  layers without v2 dtype behaviour, `tf.Variable(..., dtype=bfloat16)`) are
  stored float32, under the same name;
* the last multiply of a GELU (BERT's feed-forward activation, tanh or erf
  form) gets a gradient that reads only the GELU's input and its tanh/erf
  (`gelu_gradient`): the chain's other intermediates are freed in the
  forward pass instead of being kept for the backward one.

Casts are made once per tensor and reused; a float32 copy of a bfloat16
tensor is never cast back, the bfloat16 original is used. The gradients of
float32-list ops read bfloat16 tensors, not float32 copies
(`autocast_gradients`).

Scope of the change: the two functions are replaced while any thread is
inside an autocast context and put back when the last one leaves, but the
rules read thread-local state: a thread that did not enter a context, e.g.
one building its own graph at the same time, gets TensorFlow's behaviour
unchanged.
"""

import contextlib
import math
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import op_def_registry
from tensorflow.python.framework import tensor_conversion_registry

from estimator_bf16 import autocast_gradients
from estimator_bf16 import casting
from estimator_bf16 import gelu_gradient
from estimator_bf16 import op_lists
from estimator_bf16 import patching
from estimator_bf16 import precision as precision_lib

# Mode names, weakest first. 'float32_list' applies the float32 list (and
# unifies the mixed inputs that its float32 results cause); 'bfloat16' applies
# every rule; 'off' (keep_float32) suspends both.
_RANK = {'float32_list': 1, 'bfloat16': 2}
_FLOATS = frozenset([tf.bfloat16, tf.float32])
# Ops through which a tensor is still "a read of this variable".
_READ_THROUGH = frozenset(['ReadVariableOp', 'Identity', 'Enter',
                           'TPUReplicatedInput'])
_VARIABLE_OPS = frozenset(['VarHandleOp', 'VariableV2', 'Variable'])
_ORIGINAL_APPLY_OP = op_def_library._apply_op_helper  # pylint: disable=protected-access
_ORIGINAL_CONVERT = tensor_conversion_registry.convert


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


class _ThreadState(threading.local):
  """What autocast knows on one thread; other threads see a fresh one."""

  def __init__(self):
    super().__init__()
    self.modes = []      # the stack of entered contexts, innermost last
    self.busy = False    # True while autocast makes its own ops
    self.casts = {}      # (tensor ref, dtype, context id) -> cast tensor
    self.trainable = (None, -1, frozenset())  # graph, count, variable op names
    self.recast_min_rows = RECAST_MIN_ROWS  # see recast_weights_at_any_batch

  def mode(self):
    """The rules in force: the strongest mode since the innermost 'off'."""
    best = None
    for mode in reversed(self.modes):
      if mode == 'off':
        break
      if best is None or _RANK[mode] > _RANK[best]:
        best = mode
    return best


_STATE = _ThreadState()


def _install():
  # The two entry points every graph op and every tensor conversion pass
  # through; both are looked up by module attribute at call time.
  op_def_library._apply_op_helper = _apply_op_with_autocast  # pylint: disable=protected-access
  tensor_conversion_registry.convert = _convert_with_autocast
  return [(op_def_library, '_apply_op_helper', _ORIGINAL_APPLY_OP),
          (tensor_conversion_registry, 'convert', _ORIGINAL_CONVERT)]


_PATCHER = patching.Patcher(_install)


@contextlib.contextmanager
def _entered(mode):
  with _PATCHER.active():
    _STATE.modes.append(mode)
    try:
      yield
    finally:
      _STATE.modes.pop()
      if not _STATE.modes:
        _STATE.casts = {}
        _STATE.trainable = (None, -1, frozenset())


@contextlib.contextmanager
def autocast(precision):
  """Context manager: ops built on this thread compute in `precision`.

  Args:
    precision: `'bfloat16'` applies every autocast rule (see the module
      docstring); `'float32'` changes nothing.

  Yields:
    None.

  Raises:
    ValueError: if `precision` is not one of `PRECISIONS`.
  """
  precision_lib.check_precision(precision)
  if precision == 'float32':
    yield
    return
  with _entered('bfloat16'), tf.compat.v1.variable_creator_scope(
      _float32_trainable_storage):
    yield


@contextlib.contextmanager
def recast_weights_at_any_batch():
  """Context manager: the weight recast ignores `RECAST_MIN_ROWS` here.

  For graphs built at a stand-in batch: the memory planner builds its
  graphs at small batches and extrapolates to large ones, so every build
  must make the recast decisions of a large batch, not some the one way
  and some the other (a 4x4 stage meets 128 rows at batch 8 and 256 at
  16). Only this thread's builds are affected, and only inside the block.
  """
  previous = _STATE.recast_min_rows
  _STATE.recast_min_rows = 0
  try:
    yield
  finally:
    _STATE.recast_min_rows = previous


@contextlib.contextmanager
def float32_ops():
  """Context manager: only the float32 list is in force on this thread.

  Softmax and log-softmax compute in float32 and return their input's dtype;
  cross-entropy, reductions, statistics and summaries compute in float32.
  Nested uses are cheap; inside `autocast('bfloat16')` it changes nothing.
  """
  with _entered('float32_list'):
    yield


@contextlib.contextmanager
def keep_float32():
  """Context manager: ops built inside are left as TensorFlow builds them.

  The escape hatch for a block that must stay float32 inside a bfloat16
  model_fn (e.g. a matmul whose inputs are read from trainable variables).
  """
  with _entered('off'):
    yield


def _float32_trainable_storage(next_creator, **kwargs):
  """Variable creator: a trainable bfloat16 variable is stored float32.

  Keras layers with v1 dtype behaviour take their dtype from a bfloat16
  input and create bfloat16 weights, which the optimizer would then update
  in bfloat16 and checkpoints would store in bfloat16. The variable keeps its
  name; reads of it are cast where a bfloat16 op needs them. Non-trainable
  bfloat16 variables are left alone (their assignments carry bfloat16
  values), and the audit reports them.
  """
  dtype = kwargs.get('dtype')
  initial_value = kwargs.get('initial_value')
  if dtype is None and isinstance(initial_value, tf.Tensor):
    dtype = initial_value.dtype
  if (dtype is None or tf.as_dtype(dtype).base_dtype != tf.bfloat16 or
      kwargs.get('variable_def') is not None or
      kwargs.get('trainable') is False):
    return next_creator(**kwargs)
  kwargs['dtype'] = tf.float32
  if callable(initial_value):
    kwargs['initial_value'] = lambda: tf.cast(initial_value(), tf.float32)
  elif initial_value is not None:
    kwargs['initial_value'] = tf.cast(initial_value, tf.float32)
  return next_creator(**kwargs)


def _apply_op_with_autocast(op_type_name, name=None, **keywords):
  """Stands in for `_apply_op_helper` while any thread uses autocast."""
  mode = _STATE.mode() if not _STATE.busy else None
  if mode is None:
    return _ORIGINAL_APPLY_OP(op_type_name, name=name, **keywords)
  op_def = op_def_registry.get(op_type_name)
  if op_def is None:
    return _ORIGINAL_APPLY_OP(op_type_name, name=name, **keywords)
  _STATE.busy = True
  try:
    return _autocast_op(mode, op_def, op_type_name, name, keywords)
  finally:
    _STATE.busy = False


def _convert_with_autocast(value, dtype=None, name=None, as_ref=False,
                           *args, **kwargs):
  """Stands in for `tensor_conversion_registry.convert`.

  Python wrappers often convert one input to another's dtype before any op
  exists (`tf.nn.bias_add` converts the bias to the value's dtype, a
  variable's `assign` converts the value to the variable's); between float32
  and bfloat16 that conversion becomes a cast instead of a ValueError.
  """
  if (dtype is not None and not as_ref and not _STATE.busy and
      _STATE.mode() is not None):
    have = _dtype(value)
    want = tf.as_dtype(dtype).base_dtype
    if have in _FLOATS and want in _FLOATS and have != want:
      _STATE.busy = True
      try:
        return _cast(value, want)
      finally:
        _STATE.busy = False
  return _ORIGINAL_CONVERT(value, dtype, name, as_ref, *args, **kwargs)


def _autocast_op(mode, op_def, op_type, name, keywords):
  """Adjusts one op's inputs (and, for softmax, outputs) by the rules."""
  if op_type in op_lists.FLOAT32_KEEP_DTYPE_OPS:
    return _float32_keep_dtype(op_def, op_type, name, keywords)
  if op_type in op_lists.FLOAT32_OPS:
    _cast_half_inputs(op_def, keywords, tf.float32)
    result = _ORIGINAL_APPLY_OP(op_type, name=name, **keywords)
    op = result[2]
    if any(autocast_gradients.bfloat16_source(t) is not None
           for t in op.inputs):
      autocast_gradients.read_bfloat16_inputs_in_gradient(op)
    return result
  if op_type == 'Cast':
    return _remember_rounding(op_type, name, keywords)
  if op_type in op_lists.FLOAT32_RANDOM_OPS:
    return _float32_random(op_type, name, keywords)
  if op_type in op_lists.COMPARISON_OPS:
    _compare_float32_originals(op_def, keywords)
    return _ORIGINAL_APPLY_OP(op_type, name=name, **keywords)
  if mode == 'bfloat16' and op_type in op_lists.ZERO_SELECT_OPS:
    masked = _zero_select_as_multiply(op_type, name, keywords)
    if masked is not None:
      return masked
  # A bfloat16 tensor fed to an argument whose type is fixed to float32 (e.g.
  # in_top_k's predictions) can only be meant as float32.
  _cast_fixed_type_args(op_def, keywords)
  if (mode == 'bfloat16' and op_type in op_lists.BFLOAT16_OPS and
      _wants_bfloat16(op_def, keywords)):
    _cast_float32_inputs(op_def, keywords)
    if op_type == 'SparseMatMul':
      op_type, keywords = 'MatMul', _matmul_keywords(keywords)
    result = _ORIGINAL_APPLY_OP(op_type, name=name, **keywords)
    _recast_weights_late(result[2])
    return result
  elif mode == 'bfloat16' and op_type in op_lists.FOLLOW_BFLOAT16_OPS:
    source = autocast_gradients.bfloat16_source(keywords.get('x'))
    if source is not None:
      keywords['x'] = source
  else:
    # Also under the float32 list alone: its float32 results meet the
    # bfloat16 tensors they came from in the very next op.
    _unify_mixed_inputs(op_def, keywords)
  result = _ORIGINAL_APPLY_OP(op_type, name=name, **keywords)
  if mode == 'bfloat16' and op_type == 'Mul':
    gelu_gradient.mark(result[2])
  return result


# ---------------------------------------------------------------------------
# Inputs, grouped by the type attribute they share.


def _slots(op_def, keywords):
  """{type attr: [(arg, index or None)]} for the op's type-attr inputs.

  Lists (`number_attr` inputs such as AddN's or ConcatV2's) are made
  mutable lists in `keywords`, one slot per element.
  """
  groups = {}
  for arg in op_def.input_arg:
    if not arg.type_attr or arg.name not in keywords:
      continue
    value = keywords[arg.name]
    if arg.number_attr and isinstance(value, (list, tuple)):
      keywords[arg.name] = list(value)
      slots = [(arg, i) for i in range(len(value))]
    else:
      slots = [(arg, None)]
    groups.setdefault(arg.type_attr, []).extend(slots)
  return groups


def _get(keywords, slot):
  arg, index = slot
  value = keywords[arg.name]
  return value if index is None else value[index]


def _set(keywords, slot, value):
  arg, index = slot
  if index is None:
    keywords[arg.name] = value
  else:
    keywords[arg.name][index] = value


def _dtype(value):
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return value.dtype.base_dtype
  return None


def _is_number(value):
  if isinstance(value, bool):
    return False
  if isinstance(value, (int, float, np.floating, np.integer)):
    return True
  return isinstance(value, np.ndarray) and value.dtype.kind in 'fiu'


def _cast(value, dtype):
  """`value` in `dtype`, reusing a cast already made for the same tensor."""
  if dtype == tf.float32:
    original = casting.float32_original(value)
    if original is not None:
      return original
  elif dtype == tf.bfloat16:
    source = autocast_gradients.bfloat16_source(value)
    if source is not None:
      return source  # bfloat16 -> float32 -> bfloat16 is exact: skip both.
  graph = tf.compat.v1.get_default_graph()
  # pylint: disable=protected-access
  context = graph._get_control_flow_context()
  key = (value.ref(), dtype, id(context))
  cached = _STATE.casts.get(key)
  if cached is not None and cached.graph is graph:
    return cached
  cast = None
  if dtype == tf.bfloat16:
    cast = _rearranged_bfloat16_source(value)
  if cast is None:
    cast = tf.cast(value, dtype, name='autocast_' + dtype.name)
  # A cast made under control dependencies carries them; reusing it
  # elsewhere could order ops in a cycle, so only plain casts are kept.
  if not graph._control_dependencies_stack:
    _STATE.casts[key] = cast
  # pylint: enable=protected-access
  return cast


def _rearranged_bfloat16_source(value, depth=4):
  """A rearranged float32 copy of a bfloat16 tensor, rebuilt in bfloat16.

  Keras layers cast their bfloat16 inputs to float32 and `Flatten` then
  reshapes the copy; a matmul that wants bfloat16 gets the same reshape of
  the bfloat16 original instead of a rounding of the float32 copy (same
  values), and the float32 copy, read by nothing else, never runs.

  Returns:
    The bfloat16 tensor, or None if `value` is not such a copy.
  """
  if depth == 0 or not isinstance(value, tf.Tensor):
    return None
  rebuild = casting.REARRANGING.get(value.op.type)
  if rebuild is None:
    return None
  inner = value.op.inputs[0]
  source = autocast_gradients.bfloat16_source(inner)
  if source is None:
    source = _rearranged_bfloat16_source(inner, depth - 1)
  return None if source is None else rebuild(value.op, source)


def _cast_half_inputs(op_def, keywords, dtype):
  """Casts every bfloat16/float16 type-attr input to `dtype` (float32)."""
  for slots in _slots(op_def, keywords).values():
    for slot in slots:
      value = _get(keywords, slot)
      if _dtype(value) in casting.HALF_DTYPES:
        _set(keywords, slot, _cast(value, dtype))


def _cast_float32_inputs(op_def, keywords):
  for slots in _slots(op_def, keywords).values():
    for slot in slots:
      value = _get(keywords, slot)
      if _dtype(value) == tf.float32:
        _set(keywords, slot, _cast(value, tf.bfloat16))


def _cast_fixed_type_args(op_def, keywords):
  for arg in op_def.input_arg:
    if arg.type_attr or arg.type_list_attr or arg.name not in keywords:
      continue
    fixed = tf.as_dtype(arg.type)
    if not fixed.is_floating or arg.is_ref:
      continue
    value = keywords[arg.name]
    if _dtype(value) in casting.HALF_DTYPES and _dtype(value) != fixed:
      keywords[arg.name] = _cast(value, fixed)


def _unify_mixed_inputs(op_def, keywords):
  """Gives each type group that mixes float32 and bfloat16 one dtype."""
  for slots in _slots(op_def, keywords).values():
    values = [(slot, _get(keywords, slot)) for slot in slots]
    dtypes = {_dtype(v) for _, v in values} - {None}
    if tf.bfloat16 not in dtypes or not dtypes <= _FLOATS:
      continue
    if any(arg.is_ref for arg, _ in slots):
      target = _ref_dtype(keywords, slots)
    elif tf.float32 in dtypes:
      target = _mixed_target(values)
    elif any(_is_number(v) for _, v in values):
      target = tf.bfloat16  # A number first would otherwise fix float32.
    else:
      continue
    for slot, value in values:
      if _dtype(value) is not None:
        if _dtype(value) != target:
          _set(keywords, slot, _cast(value, target))
      elif _is_number(value):
        try:
          _set(keywords, slot, tf.convert_to_tensor(value, dtype=target))
        except (TypeError, ValueError):
          pass  # Left for TensorFlow to convert, or to reject, as usual.


def _ref_dtype(keywords, slots):
  for slot in slots:
    arg, _ = slot
    if arg.is_ref:
      return _dtype(_get(keywords, slot))
  return tf.float32


def _mixed_target(values):
  """bfloat16, unless no bfloat16 input is a real bfloat16 activation.

  Roundings of float32 values (softmax outputs, weight reads) and constants
  are not: BERT's loss multiplies float32 one-hot labels by log-softmax
  output, and tf-slim's weight decay multiplies a float32 `L2Loss` by a
  bfloat16 constant; both products are computed in float32 (from the
  float32 originals), so the loss carries no bfloat16 rounding.
  """
  for _, value in values:
    if (_dtype(value) == tf.bfloat16 and
        casting.float32_original(value) is None and
        not (isinstance(value, tf.Tensor) and value.op.type == 'Const')):
      return tf.bfloat16
  return tf.float32


# ---------------------------------------------------------------------------
# matmul/conv: when does an op count as part of the bfloat16 network?


def _wants_bfloat16(op_def, keywords):
  """True for a matmul/conv of the bfloat16 network.

  That is one with a bfloat16 input, or one reading a trainable variable in
  the forward pass. While TensorFlow builds a gradient it marks the graph
  with the forward op (`_default_original_op`); there only bfloat16 inputs
  count, so the gradient of a float32 matmul (e.g. one built under
  `keep_float32`) stays float32.
  """
  in_gradient = getattr(tf.compat.v1.get_default_graph(),
                        '_default_original_op', None) is not None
  for slots in _slots(op_def, keywords).values():
    for slot in slots:
      value = _get(keywords, slot)
      if _dtype(value) == tf.bfloat16:
        return True
      if not in_gradient and _reads_trainable_variable(value):
        return True
  return False


def _matmul_keywords(sparse_keywords):
  """MatMul's arguments for what was asked of SparseMatMul."""
  keywords = {'a': sparse_keywords['a'], 'b': sparse_keywords['b'],
              'transpose_a': sparse_keywords.get('transpose_a', False),
              'transpose_b': sparse_keywords.get('transpose_b', False)}
  # Newer TensorFlow gives MatMul more boolean attrs (grad_a, grad_b) that
  # its Python wrapper always passes; pass their neutral value too.
  for attr in op_def_registry.get('MatMul').attr:
    if attr.type == 'bool' and attr.name not in keywords:
      keywords[attr.name] = False
  return keywords


def _trainable_variable_ops(graph):
  """Names of the graph's trainable variable ops, cached per thread."""
  trainable = graph.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
  cached_graph, count, names = _STATE.trainable
  if cached_graph is not graph or count != len(trainable):
    names = frozenset(v.op.name for v in trainable)
    _STATE.trainable = (graph, len(trainable), names)
  return names


def _reads_trainable_variable(value):
  """True if `value` is (a read of) a trainable variable."""
  if isinstance(value, tf.Variable):
    return bool(value.trainable)
  if not isinstance(value, tf.Tensor):
    return False
  for _ in range(4):
    op = value.op
    if op.type in _VARIABLE_OPS:
      return op.name in _trainable_variable_ops(op.graph)
    if op.type not in _READ_THROUGH or not op.inputs:
      return False
    value = op.inputs[0]
  return False


def _in_tf1_control_flow():
  """True while ops are built inside a TF1 control-flow context.

  That is a v1 while loop or cond, or TPU replication. A gradient built
  there cannot read a forward tensor other than its op's own inputs and
  outputs directly, so the gradients that re-make such a tensor late (the
  weight recast, the mask recast) are not used there; on a TPU XLA plans
  memory and fuses elementwise ops itself. TensorFlow 2's functional cond
  and while_loop build their bodies as functions, outside any such context,
  and their gradients read forward tensors as captures.
  """
  graph = tf.compat.v1.get_default_graph()
  return graph._get_control_flow_context() is not None  # pylint: disable=protected-access


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
  if op.type == 'Einsum':
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
  elif op.type in ('MatMul', 'BatchMatMul', 'BatchMatMulV2') and (
      weight_index == 0):
    # weights @ x: each weight element meets the output's columns.
    channel_axis = -2
  else:
    channel_axis = -1
  return shape.num_elements() // max(dims[channel_axis], 1)


def _recast_weights_late(op):
  """Makes a matmul/conv reading bfloat16 weights cast them again in backprop.

  Not inside a TF1 control-flow context (`_in_tf1_control_flow`), and not
  where the weights meet fewer than `RECAST_MIN_ROWS` rows (statically
  known), where the cast would cost more than the copy it frees is worth
  (unless `recast_weights_at_any_batch` is in force).
  """
  if _in_tf1_control_flow():
    return
  weights = [i for i, t in enumerate(op.inputs)
             if autocast_gradients.variable_read_source(t) is not None]
  if not weights:
    return
  rows = _rows_per_weight(op, weights[0])
  if rows is not None and rows < _STATE.recast_min_rows:
    return
  autocast_gradients.recast_weights_in_gradient(op)


# ---------------------------------------------------------------------------
# Random numbers and comparisons: drawn and compared in float32.


def _float32_random(op_type, name, keywords):
  """A bfloat16 uniform draw made in float32 and rounded (see op_lists).

  The rounding is remembered as such: a comparison reading it (dropout's
  `uniform >= rate`) compares the float32 draw, and the rounding itself,
  then read by nothing, never runs.
  """
  half = keywords.get('dtype')
  if half is None or tf.as_dtype(half) not in casting.HALF_DTYPES:
    return _ORIGINAL_APPLY_OP(op_type, name=name, **keywords)
  keywords['dtype'] = tf.float32
  structure, stateful, op, outputs = _ORIGINAL_APPLY_OP(
      op_type, name=name, **keywords)
  rounded = tf.cast(outputs[0], half, name=op.name.split('/')[-1] + '_' +
                    tf.as_dtype(half).name)
  casting.remember_float32_original(rounded, outputs[0])
  return structure, stateful, op, [rounded]


def _compare_float32_originals(op_def, keywords):
  """Makes a comparison of a remembered rounding compare in float32.

  The rounding is replaced by its float32 original, other 16-bit inputs
  are cast to float32 (exactly), and Python numbers are left to become
  float32 constants, unrounded. Comparisons without such an input are left
  as they are.
  """
  for slots in _slots(op_def, keywords).values():
    values = [(slot, _get(keywords, slot)) for slot in slots]
    originals = [casting.float32_original(value) for _, value in values]
    if all(original is None for original in originals):
      continue
    for (slot, value), original in zip(values, originals):
      if original is not None:
        _set(keywords, slot, original)
      elif _dtype(value) in casting.HALF_DTYPES:
        _set(keywords, slot, _cast(value, tf.float32))


# ---------------------------------------------------------------------------
# select(mask, x, 0): a multiply by the mask.


def _positive_zero(number):
  """True if `number` (a Python or NumPy value) is +0 in every element."""
  values = np.asarray(number).reshape(-1)
  try:
    values = values.astype(np.float64)  # bfloat16 included
  except (TypeError, ValueError):
    return False
  return not values.any() and not np.signbit(values).any()


def _fits(shape, into):
  """True if broadcasting `shape` against `into` cannot widen `into`."""
  if shape.rank is None:
    return False
  if shape.rank == 0:
    return True
  if into.rank is None or shape.rank > into.rank:
    return False
  return all(dim == 1 or (dim is not None and dim == other)
             for dim, other in zip(reversed(shape.as_list()),
                                   reversed(into.as_list())))


def _zero_branch(zero, value):
  """True if `zero` is +0 everywhere and no wider than `value`.

  Recognised without evaluating anything large: a Python or NumPy number,
  a `Const`, a `Fill` of a constant, or `ZerosLike`.
  """
  if _is_number(zero):
    return _positive_zero(zero) and _fits(tf.TensorShape(np.shape(zero)),
                                          value.shape)
  if not isinstance(zero, tf.Tensor):
    return False
  op = zero.op
  if op.type == 'ZerosLike':
    return op.inputs[0] is value or _fits(zero.shape, value.shape)
  number = op.inputs[1] if op.type == 'Fill' else zero
  if number.op.type != 'Const':
    return False
  return (_positive_zero(tf.get_static_value(number)) and
          _fits(zero.shape, value.shape))


def _zero_select_as_multiply(op_type, name, keywords):
  """`select(mask, x, 0)` on bfloat16 `x` as `multiply_no_nan(x, mask)`.

  Dropout ends with `where(keep, x * scale, 0)`, and its gradient is another
  such select. TensorFlow's CPU select kernel is slow for 16-bit types (a
  BERT-base hidden state of 3.1M elements: 2.8 ms, against 1.0 ms for the
  cast and multiply on a 2-core AVX512-BF16 EPYC). `multiply_no_nan(x, m)`
  is 0 where m is 0, even for an inf or NaN x, and x * 1 = x otherwise, so
  the result is the select's, bit for bit. Its gradient casts the mask
  again in the backward pass (`autocast_gradients`), so what the step keeps
  for it is still the boolean mask, 1 byte an element.

  Left as selects: other dtypes, non-constant or non-zero (or -0) other
  branches, a zero that could widen the result, v1 `Select` unless its mask
  has the value's known shape (a vector mask picks whole rows), and ops
  inside a TF1 control-flow context (`_in_tf1_control_flow`).

  Returns:
    `_apply_op_helper`'s 4-tuple for the multiply, or None to leave the
    select as it is.
  """
  condition = keywords.get('condition')
  if (not isinstance(condition, tf.Tensor) or condition.dtype != tf.bool or
      _in_tf1_control_flow()):
    return None
  for value, zero, keep in ((keywords.get('t'), keywords.get('e'), True),
                            (keywords.get('e'), keywords.get('t'), False)):
    if _dtype(value) == tf.bfloat16 and _zero_branch(zero, value):
      break
  else:
    return None
  # v1 `Select` does not broadcast (a vector mask picks rows): only equal,
  # known shapes, where the multiply's broadcasting cannot differ.
  if op_type == 'Select' and not (condition.shape.is_fully_defined() and
                                  condition.shape == value.shape):
    return None
  if not keep:
    condition = tf.math.logical_not(condition)
  mask = tf.cast(condition, value.dtype)
  result = _ORIGINAL_APPLY_OP('MulNoNan', name=name or op_type, x=value,
                              y=mask)
  autocast_gradients.recast_mask_in_gradient(result[2])
  return result


# ---------------------------------------------------------------------------
# softmax / log-softmax: float32 inside, the input's dtype outside.

# Ops between a float32-list op and the cast that rounds its result in
# TensorFlow's own loss code: rearrangements and the final division of a mean.
_PASS_THROUGH = frozenset(casting.REARRANGING) | frozenset(
    ['DivNoNan', 'RealDiv', 'Neg', 'Mul'])


def _float32_list_result(value, depth=4):
  """True if float32 `value` comes from a float32-list op within `depth` ops."""
  if value.dtype.base_dtype != tf.float32:
    return False
  op = value.op
  if (op.type in op_lists.FLOAT32_OPS or
      op.type in op_lists.FLOAT32_KEEP_DTYPE_OPS):
    return True
  if depth == 0 or op.type not in _PASS_THROUGH:
    return False
  return any(_float32_list_result(t, depth - 1) for t in op.inputs)


def _remember_rounding(op_type, name, keywords):
  """A cast of a float32-list result to 16 bits is remembered as a rounding.

  TensorFlow's own loss code (`softmax_cross_entropy_with_logits`,
  `tf.compat.v1.losses.*`) computes in float32 and casts the result back to
  its input's dtype; a loss reduced from it, or returned by the model_fn,
  then uses the float32 value instead of its rounding.

  Model code written for bfloat16 by hand does the same with attention:
  `tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32)), tf.bfloat16)` (the
  tensorflow/tpu pattern). That softmax then gets the gradient autocast
  gives its own float32 softmax, which reads the rounding, so the float32
  probabilities are freed once cast instead of held for the backward pass.
  """
  result = _ORIGINAL_APPLY_OP(op_type, name=name, **keywords)
  source = keywords.get('x')
  outputs = result[3]
  if (isinstance(source, tf.Tensor) and outputs and
      outputs[0].dtype.base_dtype in casting.HALF_DTYPES and
      _float32_list_result(source)):
    casting.remember_float32_original(outputs[0], source)
    if source.op.type == 'Softmax':
      autocast_gradients.round_softmax_gradient(source.op)
  return result


def _float32_keep_dtype(op_def, op_type, name, keywords):
  dtypes = [_dtype(_get(keywords, slot))
            for slots in _slots(op_def, keywords).values() for slot in slots]
  half = next((d for d in dtypes if d in casting.HALF_DTYPES), None)
  if half is None:
    return _ORIGINAL_APPLY_OP(op_type, name=name, **keywords)
  _cast_half_inputs(op_def, keywords, tf.float32)
  structure, stateful, op, outputs = _ORIGINAL_APPLY_OP(
      op_type, name=name, **keywords)
  if op_type == 'Softmax':
    autocast_gradients.round_softmax_gradient(op)
  rounded = []
  for output in outputs:
    if output.dtype == tf.float32:
      value = tf.cast(output, half, name=op.name.split('/')[-1] + '_' +
                      half.name)
      casting.remember_float32_original(value, output)
      output = value
    rounded.append(output)
  return structure, stateful, op, rounded
