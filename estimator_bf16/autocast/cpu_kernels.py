"""bfloat16 ops whose CPU kernel is slow, computed in float32 on a CPU.

TensorFlow's CPU kernels for some bfloat16 ops are much slower than their
float32 twins: without AVX512-BF16/AMX every bfloat16 kernel goes through
Eigen, which converts element by element (the conv gradients 10-15x, an
einsum 25x slower than float32), and with them a few elementwise kernels
still are. `op_lists.CPU_SLOW_BFLOAT16_OPS` lists them per CPU kind, from
a measured table. While autocast builds a bfloat16 graph that will run on
this CPU, such an op is built in float32 between a cast of its bfloat16
inputs and a rounding of its result: the numerics of a TPU's matrix unit
and of oneDNN's bfloat16 kernels (bfloat16 inputs, float32 arithmetic,
bfloat16 result), and storage stays bfloat16. A substituted op that reads
another's result reads its float32 value, with no rounding in between.

What a TPU would run is judged, not this CPU's graph: every op built here
carries `SUBSTITUTED_ATTR`, which the audit, the FLOP share and the report
read as bfloat16; the memory planner builds with `kernels('bfloat16')`.
Nothing is substituted inside a TPU or XLA computation, when a GPU is
visible, or under `kernels('bfloat16')` (`--kernels=bfloat16`).
"""

import contextlib
import functools
import weakref

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.framework import ops as tf_ops

from estimator_bf16.autocast import casts
from estimator_bf16.autocast import gradients as autocast_gradients
from estimator_bf16.autocast import graph_queries
from estimator_bf16.autocast import op_inputs
from estimator_bf16.autocast import state
from estimator_bf16.platform import cpu_bfloat16
from estimator_bf16.platform import xla_context
from estimator_bf16.precision import op_lists
from estimator_bf16.precision import rounding

# What `kernels` accepts: 'auto' substitutes the slow kernels of this CPU
# kind, 'bfloat16' runs TensorFlow's own bfloat16 kernels everywhere.
KERNEL_CHOICES = ('auto', 'bfloat16')
# The op attribute that marks what substitution built (a leading underscore:
# kernels and grappler ignore it); its value is the CPU kind.
SUBSTITUTED_ATTR = '_estimator_bf16_cpu_float32'
_GRADIENT = 'EstimatorBf16CpuFloat32'
_CAST_GRADIENT = 'EstimatorBf16CpuCast'

# Graph -> {bfloat16 rounding ref: float32 result of a substituted op}.
_FLOAT32_RESULTS = weakref.WeakKeyDictionary()


def parse_kernels(value):
  """`value` if it is one of `KERNEL_CHOICES`; else a ValueError naming them."""
  if value not in KERNEL_CHOICES:
    raise ValueError('kernels must be one of %s, got %r.' % (
        ', '.join(repr(c) for c in KERNEL_CHOICES), value))
  return value


@contextlib.contextmanager
def kernels(choice):
  """Context manager: this thread's bfloat16 builds use `choice` of kernels.

  An outer `kernels('bfloat16')` wins over an inner 'auto': the memory
  planner asks for the bfloat16 graph of a model_fn that `wrap_model_fn`
  (default 'auto') builds inside it.

  Args:
    choice: 'auto' (substitute this CPU's slow bfloat16 kernels) or
      'bfloat16' (never substitute).

  Raises:
    ValueError: `choice` is not one of `KERNEL_CHOICES`.
  """
  choice = parse_kernels(choice)
  previous = state.STATE.kernels
  state.STATE.kernels = 'bfloat16' if previous == 'bfloat16' else choice
  try:
    yield
  finally:
    state.STATE.kernels = previous


@functools.lru_cache(maxsize=None)
def cpu_kind():
  """'native', 'emulated' or None (unknown CPU: nothing is substituted)."""
  native = cpu_bfloat16.bfloat16_support().native
  if native is None:
    return None
  return 'native' if native else 'emulated'


@functools.lru_cache(maxsize=None)
def _gpu_visible():
  return bool(tf.config.list_physical_devices('GPU'))


def slow_ops(kind=None):
  """The op types substituted on CPU kind `kind` (default: this one's)."""
  kind = kind or cpu_kind()
  return op_lists.CPU_SLOW_BFLOAT16_OPS.get(kind, frozenset())


def substitutes(op_type):
  """True if an `op_type` op with bfloat16 inputs is built in float32 here."""
  if state.STATE.kernels != 'auto' or op_type not in slow_ops():
    return False
  if xla_context.in_xla_computation():
    return False  # a TPU or XLA computation: XLA picks its own kernels
  return not _gpu_visible()


def _half_type_attrs(op_def, keywords):
  """The type attributes that bfloat16 inputs of the op set."""
  groups = op_inputs.typed_inputs(op_def, keywords)
  return {attr for attr, group in groups.items()
          if any(op_inputs.dtype_of(op_inputs.get(keywords, place)) ==
                 tf.bfloat16 for place in group)}


def has_bfloat16_input(op_def, keywords):
  """True if a type-attr input of the op is bfloat16."""
  return bool(_half_type_attrs(op_def, keywords))


def _mark(op, kind):
  op._set_attr(SUBSTITUTED_ATTR, attr_value_pb2.AttrValue(  # pylint: disable=protected-access
      s=kind.encode()))


def _mark_cast(op, kind):
  """Marks a cast substitution made; its gradient's cast is marked too."""
  _mark(op, kind)
  autocast_gradients.set_gradient(op, _CAST_GRADIENT)


@tf.RegisterGradient('EstimatorBf16CpuCast')
def _cast_gradient(op, grad):
  """A substitution cast's gradient: the cast back, marked like the cast."""
  if grad is None:
    return None
  back = tf.cast(grad, op.inputs[0].dtype)
  if back.op.type == op_lists.OP.Cast:
    _mark(back.op, op.get_attr(SUBSTITUTED_ATTR).decode())
  return back


def _float32_input(value, wait_for):
  """A float32 version of bfloat16 `value` for a substituted op.

  The float32 result of a substituted op (or of the float32 list) that
  `value` rounds, or else a new cast that waits for `wait_for`, the ops of
  the substituted op's other inputs: a conv's filter gradient reads an
  activation of the forward pass, whose cast would otherwise run in the
  forward pass and keep a float32 copy of it until backprop.
  """
  table = _FLOAT32_RESULTS.get(value.graph)
  original = table.get(value.ref()) if table else None
  if original is None:
    original = rounding.float32_original(value)
  if original is not None:
    return original
  if graph_queries.in_tf1_control_flow():
    # Control inputs cannot cross a TF1 while/cond context: the shared cast.
    made = casts.cast(value, tf.float32)
  else:
    with tf.control_dependencies(wait_for):
      made = tf.cast(value, tf.float32, name='cpu_float32')
  if made.op.type == op_lists.OP.Cast:
    _mark_cast(made.op, cpu_kind())
  return made


def _input_ops(keywords):
  """The ops that make the tensors among an op's keyword arguments."""
  ops = []
  for value in tf.nest.flatten(list(keywords.values())):
    if isinstance(value, tf.Tensor) and value.op.type != op_lists.OP.Const:
      if value.op not in ops:
        ops.append(value.op)
  return ops


def build_substituted(op_def, op_type, name, keywords):
  """Builds a slow bfloat16 op in float32, its result rounded to bfloat16.

  Args:
    op_def: the op's `OpDef` proto; its outputs are single tensors.
    op_type: an op type of `slow_ops()`.
    name: the op name asked for, or None.
    keywords: the op's keyword arguments, with bfloat16 inputs; changed in
      place.

  Returns:
    `_apply_op_helper`'s 4-tuple: the float32 op, and its outputs where the
    bfloat16 op has bfloat16 outputs rounded to bfloat16.
  """
  kind = cpu_kind()
  half_attrs = _half_type_attrs(op_def, keywords)
  input_ops = _input_ops(keywords)
  for attr in half_attrs:
    for place in op_inputs.typed_inputs(op_def, keywords)[attr]:
      value = op_inputs.get(keywords, place)
      if op_inputs.dtype_of(value) == tf.bfloat16:
        others = [op for op in input_ops if op is not value.op]
        op_inputs.put(keywords, place, _float32_input(value, others))
  structure, stateful, op, outputs = state.original_apply_op(
      op_type, name=name, **keywords)
  _mark(op, kind)
  if not graph_queries.in_tf1_control_flow():
    # Its gradient reads bfloat16 copies, not the float32 ones (which would
    # live until backprop), and is itself float32 and marked.
    autocast_gradients.set_gradient(op, _GRADIENT)
  rounded = []
  for arg, output in zip(op_def.output_arg, outputs):
    if arg.type_attr in half_attrs and output.dtype == tf.float32:
      value = tf.cast(output, tf.bfloat16, name=op.name.split('/')[-1] +
                      '_bfloat16')
      _mark_cast(value.op, kind)
      _FLOAT32_RESULTS.setdefault(value.graph, {})[value.ref()] = output
      output = value
    rounded.append(output)
  return structure, stateful, op, rounded


def _late_float32(value, grads):
  """A float32 copy of `value` (an input or output of a substituted op).

  Made from its bfloat16 tensor once `grads` exist, so that the float32
  copy is not kept from the forward pass; `value` itself if it has none.
  """
  source = graph_queries.bfloat16_source(value)
  if source is None:
    source = next((c.outputs[0] for c in value.consumers()
                   if c.type == op_lists.OP.Cast and
                   c.outputs[0].dtype.base_dtype == tf.bfloat16), None)
  if source is None or value.dtype.base_dtype != tf.float32:
    return value
  read = graph_queries.variable_read_source(source)
  with autocast_gradients.after_gradients(grads):
    if read is not None:  # a weight: cast the variable's snapshot again
      source = tf.cast(read, tf.bfloat16)
    return tf.cast(source, tf.float32)


@tf.RegisterGradient(_GRADIENT)
def _substituted_gradient(op, *grads):
  """The op's own gradient, in float32, reading bfloat16 copies late.

  The ops it builds are marked as substituted: on a TPU they would be the
  bfloat16 gradient of a bfloat16 op.
  """
  graph = op.graph
  # Op ids count up as ops are made; the newest op's id is version + 1.
  first_new = graph.version + 2
  inputs = [_late_float32(t, grads) for t in op.inputs]
  outputs = [_late_float32(t, grads) for t in op.outputs]
  grads = [tf.cast(g, tf.float32)
           if isinstance(g, tf.Tensor) and g.dtype == tf.bfloat16 else g
           for g in grads]
  gradient_fn = tf_ops.gradient_registry.lookup(op.type)
  result = gradient_fn(
      autocast_gradients.WithTensors(op, inputs, outputs), *grads)
  kind = op.get_attr(SUBSTITUTED_ATTR).decode()
  by_id = graph._nodes_by_id  # pylint: disable=protected-access
  for op_id in range(first_new, graph.version + 2):
    if op_id in by_id:
      _mark(by_id[op_id], kind)
  return result


def is_substituted(op):
  """True if `op` was built by substitution (its attr is set)."""
  try:
    op.get_attr(SUBSTITUTED_ATTR)
    return True
  except ValueError:
    return False

