"""Memory planner: which batch fits a TPU v2 or v3 core, before running.

    plan = eb.memory_plan(model_fn, features={'image': tf.TensorSpec(
        [224, 224, 3], tf.float32)}, precision='bfloat16')
    plan.max_batch_per_core()   # {'v2': ..., 'v3': ...} examples per core
    plan.step_bytes(64)         # bytes one training step needs at batch 64

`memory_plan` builds the training graph (forward, gradients and optimizer
update) at two small batch sizes and never runs it. It then:

* counts the persistent bytes from the variables themselves: the trainable
  parameters (float32 master weights in either precision), other model
  variables (batch-norm moving statistics) and the optimizer's slots, which
  are whatever variables the optimizer created (Adam: 2 x parameters;
  Adafactor: rows + columns of each matrix);
* hands the graph to TensorFlow's graph optimizer (grappler, with the
  options a default session uses), which is what a session runs: it folds
  constants, prunes what the fetches do not need (e.g. the gradients of
  constant factors that the optimizer's gating kept alive), turns `pow(x,
  3)` into multiplies and fuses matmul + bias. Planned as built, BERT's
  step came out 16-26% above the measured peak; as optimized, within 8%;
* simulates one step of the optimized graph in its op order, as a dataflow
  executor running one op at a time does: each op's outputs are allocated
  when it runs and freed after their last consumer ran; reshapes and reads
  share their input's buffer, and elementwise ops reuse an input buffer that
  dies there, as TensorFlow's kernels do. Every tensor's size is `fixed +
  per_example * batch` (solved from the two builds), so the simulation
  yields, for each moment of the step, one line in the batch size; the
  step's transient peak at batch `b` is the highest of those lines at `b`.

Activations therefore count in the dtype the graph really computes in, with
whatever the model keeps in float32 (softmax, layer-norm statistics) and the
bfloat16 copies of the weights that the scope's casts make.

On request (`upcast=True` in `step_bytes` / `max_batch`) it also counts
what TensorFlow's CPU kernels add on CPUs without bfloat16 arithmetic
(no AVX512-BF16 or AMX): a bfloat16 matmul there runs on float32 copies of
its operands and result. That is how the benchmark checks the planner
against a CPU measurement; TPUs need no such copies.

What it does not model: allocator rounding and fragmentation, other kernel
scratch space, the executor's order when several ops run at once, and the
compiler's own choices on a TPU (XLA fuses elementwise ops, which lowers the
peak, and pads small dimensions to the 128-lane tiles, which raises it; the
runtime also reserves some memory). Leave headroom. `docs/benchmarks.md`
states the planner's error against the measured CPU peak.
"""

import collections
import dataclasses
import heapq
import inspect
import re
from typing import Tuple

from absl import logging
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.grappler import tf_optimizer

from estimator_bf16 import autocasting
from estimator_bf16 import casting
from estimator_bf16 import levers
from estimator_bf16 import op_lists
from estimator_bf16 import optimizers
from estimator_bf16 import precision as precision_lib
from estimator_bf16 import quiet
from estimator_bf16 import recompute as recompute_lib
from estimator_bf16 import wrappers

GiB = 2**30
# High-bandwidth memory of one TPU core: 8 GiB on v2, 16 GiB on v3. A v2-8
# or v3-8 board has 8 cores, so the global batch is 8 x the per-core batch.
TPU_CORE_BYTES = (('v2', 8 * GiB), ('v3', 16 * GiB))
# Any rate will do: it plays no part in memory.
_PLAN_LEARNING_RATE = 1e-3


# Outputs that share the buffer of the input with the same index: no bytes
# of their own, but they keep that buffer alive.
_ALIAS_OPS = frozenset([
    'Bitcast', 'Identity', 'IdentityN', 'Reshape', 'Squeeze', 'ExpandDims',
    'StopGradient', 'Snapshot', 'PreventGradient', 'EnsureShape',
    'CheckNumerics', 'ReadVariableOp', 'Enter', 'Exit', 'NextIteration',
])
# Elementwise kernels that write into an input buffer of the output's size
# when this op is that buffer's last user (TensorFlow's
# `forward_input_or_allocate_output`).
_FORWARDING_OPS = frozenset([
    'Abs', 'Add', 'AddN', 'AddV2', 'BiasAdd', 'ClipByValue', 'Div',
    'DivNoNan', 'Elu', 'EluGrad', 'Erf', 'Exp', 'Floor', 'Gelu', 'GeluGrad',
    'LeakyRelu', 'LeakyReluGrad', 'Log', 'Log1p', 'Maximum', 'Minimum',
    'Mul', 'MulNoNan', 'Neg', 'Pow', 'RealDiv', 'Reciprocal', 'Relu',
    'Relu6', 'Relu6Grad', 'ReluGrad', 'Rsqrt', 'RsqrtGrad', 'Select',
    'SelectV2', 'Selu', 'SeluGrad', 'Sigmoid', 'SigmoidGrad', 'Sign',
    'Softplus', 'SoftplusGrad', 'Sqrt', 'SqrtGrad', 'Square',
    'SquaredDifference', 'Sub', 'Tanh', 'TanhGrad',
])
# With grappler's fusions: matmul + bias (+ activation) is one op. Einsum
# runs on the same kernels.
_MATMUL_OPS = op_lists.MATMUL_OPS | op_lists.EINSUM_OPS
# Outputs that exist before the step (or outside it) and are never freed.
_PERSISTENT_OPS = frozenset(['Const', 'VarHandleOp', 'VariableV2',
                             'Variable', 'HostConst'])
_GRADIENT_SCOPE = re.compile(r'(^|/)gradients(_\d+)?/')


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
  """Bytes of one training step on one device, as a function of the batch.

  Attributes:
    precision: 'float32' or 'bfloat16'.
    optimizer: the optimizer's name, or 'model_fn' when the model_fn chose.
    parameter_bytes: trainable variables; float32 master weights in either
      precision.
    state_bytes: other model variables (batch-norm moving statistics, the
      global step).
    slot_bytes: the optimizer's variables (Adam: 2 x `parameter_bytes`).
    fixed_bytes: batch-independent transient bytes at the peak: gradients
      and bfloat16 copies of the weights, for instance.
    bytes_per_example: activation (and activation-gradient) bytes per
      example at the peak, in the dtypes the graph computes in.
    lines: every (fixed, per_example) pair that is the step's peak for some
      batch size; the transient peak at batch b is the largest
      `fixed + per_example * b`. `fixed_bytes` and `bytes_per_example` are
      the pair that wins for large batches.
    upcast_lines: the same for a CPU whose TensorFlow kernels compute
      bfloat16 matmuls in float32 (CPUs without AVX512-BF16 or AMX): each
      such matmul also holds float32 copies of its operands and result
      while it runs. Equal to `lines` in float32.
    batch_sizes: the two (micro-)batch sizes the graph was built at.
    gradient_accumulation_steps: K; with K > 1 the graph was built for a
      micro-batch, every batch this plan takes or returns is the effective
      batch of an update (K micro-batches), and the accumulators count as
      slots.
    recompute: whether the graph recomputes activations in backprop.
  """
  precision: str
  optimizer: str
  parameter_bytes: int
  state_bytes: int
  slot_bytes: int
  fixed_bytes: float
  bytes_per_example: float
  lines: Tuple[Tuple[float, float], ...]
  upcast_lines: Tuple[Tuple[float, float], ...]
  batch_sizes: Tuple[int, int]
  gradient_accumulation_steps: int = 1
  recompute: bool = False

  @property
  def persistent_bytes(self):
    """Parameters, model state and optimizer slots: there at every step."""
    return self.parameter_bytes + self.state_bytes + self.slot_bytes

  def _lines(self, upcast):
    return self.upcast_lines if upcast else self.lines

  def step_bytes(self, batch_size, upcast=False):
    """Estimated peak bytes of a training step at `batch_size` (int).

    Args:
      batch_size: examples per step (per update) on this device; with
        accumulation, K micro-batches of `batch_size / K`.
      upcast: model a CPU that computes bfloat16 matmuls in float32 (see
        `upcast_lines`); False for TPUs.
    """
    micro_batch = batch_size / float(self.gradient_accumulation_steps)
    transient = max(a + c * micro_batch for a, c in self._lines(upcast))
    return int(round(self.persistent_bytes + transient))

  def max_batch(self, budget_bytes, multiple_of=1, upcast=False):
    """Largest batch whose step fits in `budget_bytes`, 0 if none.

    Args:
      budget_bytes: memory of the device, in bytes.
      multiple_of: round the answer down to a multiple of this (TPUs like
        multiples of 8 per core).
      upcast: see `step_bytes`.

    Returns:
      int, the batch size per device (per update: with accumulation, K
      times the largest micro-batch that fits).
    """
    room = budget_bytes - self.persistent_bytes
    best = float('inf')
    for fixed, per_example in self._lines(upcast):
      if per_example <= 0:
        if fixed > room:
          return 0
      else:
        best = min(best, (room - fixed) / per_example)
    if best == float('inf'):
      raise ValueError('No line of this plan grows with the batch; the '
                       'graph does not depend on the batch size.')
    batch = max(0, int(best)) * self.gradient_accumulation_steps
    return batch - batch % multiple_of

  def max_batch_per_core(self, multiple_of=1):
    """{'v2': batch, 'v3': batch}: largest batch per TPU core."""
    return {name: self.max_batch(size, multiple_of)
            for name, size in TPU_CORE_BYTES}

  def summary(self):
    """One line for logs and tables."""
    cores = ', '.join('%s core %d' % item for item in
                      sorted(self.max_batch_per_core().items()))
    return ('%s/%s: params %.1f MiB, slots %.1f MiB, state %.1f MiB, fixed '
            '%.1f MiB, %.2f MiB per example; max batch %s' % (
                self.precision, self.optimizer, self.parameter_bytes / 2**20,
                self.slot_bytes / 2**20, self.state_bytes / 2**20,
                self.fixed_bytes / 2**20, self.bytes_per_example / 2**20,
                cores))


def input_specs(input_fn, params=None):
  """Returns (features, labels) specs of one example from an input_fn.

  Args:
    input_fn: `input_fn(params)` returning a batched `tf.data.Dataset` of
      (features, labels).
    params: dict given to input_fn; `batch_size` defaults to 2.

  Returns:
    (features, labels) nests of `tf.TensorSpec` without the batch dimension.
  """
  params = dict({'batch_size': 2}, **(params or {}))
  with tf.Graph().as_default():
    spec = input_fn(params).element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2):
    raise TypeError('input_fn must return a Dataset of (features, labels); '
                    'its elements are %s.' % (spec,))
  drop_batch = lambda s: tf.TensorSpec(s.shape[1:], s.dtype)
  return tuple(tf.nest.map_structure(drop_batch, part) for part in spec)


def memory_plan(model_fn=None, *, network_fn=None, features,
                labels=tf.TensorSpec([], tf.int32), precision='float32',
                optimizer=None, params=None, batch_sizes=(8, 16),
                gradient_accumulation_steps=1, recompute=False):
  """Estimates the memory of one training step on one device.

  Give either `model_fn` (a legacy Estimator/TPUEstimator model_fn; it
  builds its own loss and optimizer, and is wrapped with `eb.wrap_model_fn`)
  or `network_fn(features, is_training) -> logits` (run through
  `eb.build_network`; the planner adds a sparse softmax cross-entropy loss
  on int labels and `optimizer`).

  Args:
    model_fn: `(features, labels, mode[, params][, config])`.
    network_fn: a network function, instead of `model_fn`.
    features: nest of `tf.TensorSpec` of ONE example (no batch dimension);
      floating features enter the graph in the compute dtype, as when the
      input pipeline casts them (`eb.wrap_input_fn`). `input_specs` reads
      them from an input_fn.
    labels: `tf.TensorSpec` of one example's labels, or None.
    precision: 'float32' or 'bfloat16'.
    optimizer: with `network_fn`, one of `optimizers.OPTIMIZERS` or a function
      returning a `tf.compat.v1.train.Optimizer` (default 'adam'); must be
      None with `model_fn`, which creates its own.
    params: extra params for model_fn; `batch_size`, `precision` and
      `use_tpu` (False) are set by the planner.
    batch_sizes: two different batch sizes to build the graph at; small
      ones build fastest. Any code that bakes the batch into shapes (TPU
      code usually does) is fine. With accumulation these are micro-batches.
    gradient_accumulation_steps: K, micro-batches per update (see
      `MemoryPlan`).
    recompute: plan the graph that recomputes activations in backprop.

  Returns:
    A `MemoryPlan`.

  Raises:
    ValueError: bad precision, batch sizes or optimizer, both or neither of
      model_fn and network_fn, or a graph without gradients.
  """
  precision_lib.check_precision(precision)
  levers.check_levers(gradient_accumulation_steps, recompute)
  if (model_fn is None) == (network_fn is None):
    raise ValueError('Pass exactly one of model_fn and network_fn.')
  if len(batch_sizes) != 2 or batch_sizes[0] == batch_sizes[1] or min(
      batch_sizes) < 1:
    raise ValueError('batch_sizes must be two different positive sizes, got '
                     '%r.' % (batch_sizes,))
  if model_fn is not None and optimizer is not None:
    raise ValueError('model_fn creates its own optimizer; pass optimizer '
                     'only with network_fn.')
  if network_fn is not None:
    optimizer = optimizer or 'adam'
    # The network is put in the precision by build_network: the model_fn
    # around it gets only the levers.
    model_fn = _network_model_fn(
        wrappers.build_network(network_fn, precision), optimizer)
    optimizer_name = optimizer if isinstance(optimizer, str) else getattr(
        optimizer, '__name__', 'custom')
  else:
    optimizer_name = 'model_fn'
  builder = _model_fn_step_builder(
      model_fn, precision, params, gradient_accumulation_steps, recompute,
      wrap_precision=network_fn is None)

  builds = []
  # One segmentation for both builds, so that their tensors correspond.
  with recompute_lib.same_cuts() as next_build, \
      quiet.tensorflow_info_hidden():
    for batch in batch_sizes:
      next_build()
      builds.append(_build(builder, features, labels, precision, batch))
  (b1, build1), (b2, build2) = zip(batch_sizes, builds)
  sizes = _linear_sizes(build1, build2, b1, b2)
  if sizes is None:
    # The two graphs differ beyond their shapes (batch-dependent Python
    # code): fall back to a line through the two simulated peaks.
    peaks = [_simulate(build, lambda t: (float(_tensor_bytes(t)), 0.0))
             for build in builds]
    envelopes = []
    for kind in (0, 1):
      first, second = peaks[0][kind][0][0], peaks[1][kind][0][0]
      per_example = (second - first) / (b2 - b1)
      envelopes.append([(first - per_example * b1, per_example)])
  else:
    envelopes = _simulate(build1, sizes)
  lines, upcast_lines = envelopes
  fixed, per_example = max(lines, key=lambda line: (line[1], line[0]))
  return MemoryPlan(
      precision=precision, optimizer=optimizer_name,
      parameter_bytes=build1.parameter_bytes, state_bytes=build1.state_bytes,
      slot_bytes=build1.slot_bytes, fixed_bytes=fixed,
      bytes_per_example=per_example, lines=tuple(lines),
      upcast_lines=tuple(upcast_lines), batch_sizes=tuple(batch_sizes),
      gradient_accumulation_steps=gradient_accumulation_steps,
      recompute=recompute)


def variable_bytes(graph=None):
  """Splits the bytes of a training graph's variables by role.

  Variables made after the gradients (the optimizer's `apply_gradients`
  runs after `compute_gradients`) are the optimizer's state; trainable
  variables are parameters; the rest (batch-norm moving statistics, the
  global step) are model state.

  Args:
    graph: a `tf.Graph` holding a training step; the default graph if None.

  Returns:
    dict with int 'parameter_bytes', 'slot_bytes', 'state_bytes'.

  Raises:
    ValueError: if the graph has no gradients.
  """
  graph = graph or tf.compat.v1.get_default_graph()
  operations = graph.get_operations()
  order = {op.name: index for index, op in enumerate(operations)}
  first_gradient = next((order[op.name] for op in operations
                         if _GRADIENT_SCOPE.search(op.name)), None)
  if first_gradient is None:
    raise ValueError('The training graph has no gradients (no op under a '
                     '"gradients" name scope).')
  trainable = {id(v) for v in graph.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
  sizes = {'parameter_bytes': 0, 'slot_bytes': 0, 'state_bytes': 0}
  for variable in (graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                   + graph.get_collection(
                       tf.compat.v1.GraphKeys.LOCAL_VARIABLES)):
    if id(variable) in trainable:
      role = 'parameter_bytes'
    elif order[variable.op.name] > first_gradient:
      role = 'slot_bytes'
    else:
      role = 'state_bytes'
    sizes[role] += (variable.shape.num_elements() *
                    variable.dtype.base_dtype.size)
  return sizes


@dataclasses.dataclass
class _Build:
  graph: tf.Graph
  fetches: Tuple[tf.Operation, ...]
  parameter_bytes: int
  state_bytes: int
  slot_bytes: int


class _Spec(collections.namedtuple('_Spec', ['loss', 'train_op',
                                            'training_hooks'])):
  """The parts of an EstimatorSpec a planned TRAIN graph has."""


def _network_model_fn(network_fn, optimizer):
  """A TRAIN-only model_fn around a network: cross-entropy and `optimizer`."""
  if not (callable(optimizer) or optimizer in optimizers.OPTIMIZERS):
    raise ValueError('optimizer must be one of %s or a function returning '
                     'an optimizer, got %r.' %
                     (', '.join(optimizers.OPTIMIZERS), optimizer))

  def model_fn(features, labels, mode):
    del mode
    logits = network_fn(features, is_training=True)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
        tf.reshape(labels, [-1]), logits)
    opt = (optimizers.create_optimizer(optimizer, _PLAN_LEARNING_RATE)
           if isinstance(optimizer, str)
           else optimizer())
    step = tf.compat.v1.train.get_or_create_global_step()
    # Batch-norm moving averages update with the step, as in real training.
    with tf.control_dependencies(tf.compat.v1.get_collection(
        tf.compat.v1.GraphKeys.UPDATE_OPS)):
      train_op = opt.minimize(loss, global_step=step)
    return _Spec(loss, train_op, ())

  return model_fn


def _model_fn_step_builder(model_fn, precision, params, steps, recompute,
                           wrap_precision=True):
  """Returns `build(features, labels) -> (loss, train_op)` for a model_fn.

  The model_fn gets the levers, and `precision` unless `wrap_precision` is
  False (a network already in its precision).
  """
  wrapped = wrappers.wrap_model_fn(
      model_fn, precision if wrap_precision else 'float32', audit='off',
      gradient_accumulation_steps=steps, recompute=recompute)
  accepted = set(inspect.signature(wrapped).parameters)

  def build(features, labels, batch_size):
    run_params = dict(params or {}, batch_size=batch_size,
                      precision=precision, use_tpu=False)
    # Estimators create the global step before calling model_fn, and model
    # code reads it (learning-rate schedules, host_call summaries).
    tf.compat.v1.train.get_or_create_global_step()
    # 'train' is ModeKeys.TRAIN; the string keeps tf.estimator out of here.
    kwargs = {'labels': labels, 'mode': 'train',
              'params': run_params, 'config': None}
    spec = wrapped(features, **{k: v for k, v in kwargs.items()
                                if k in accepted})
    if getattr(spec, 'train_op', None) is None:
      raise ValueError('model_fn returned no train_op in TRAIN mode.')
    return spec.loss, spec.train_op

  return build


def _placeholders(specs, batch_size, dtype):
  def make(spec):
    spec_dtype = spec.dtype
    # The input pipeline casts floating features (eb.wrap_input_fn), so
    # they arrive in the compute dtype.
    if spec_dtype in casting.FLOATING_DTYPES:
      spec_dtype = dtype
    return tf.compat.v1.placeholder(spec_dtype, [batch_size] +
                                    spec.shape.as_list())
  return tf.nest.map_structure(make, specs)


def _build(builder, features, labels, precision, batch_size):
  """Builds one training graph; returns a `_Build`."""
  graph = tf.Graph()
  with graph.as_default():
    dtype = precision_lib.compute_dtype(precision)
    feature_tensors = _placeholders(features, batch_size, dtype)
    label_tensors = (None if labels is None else
                     _placeholders(labels, batch_size, dtype))
    # Built at a small batch to stand for large ones: the weight recast is
    # decided as for a large batch in every build (autocasting).
    with autocasting.recast_weights_at_any_batch():
      loss, train_op = builder(feature_tensors, label_tensors, batch_size)
  fetches = tuple(t.op if isinstance(t, tf.Tensor) else t
                  for t in (loss, train_op))
  build = _Build(graph, fetches, **variable_bytes(graph))
  return _optimized(build)


def _optimized(build):
  """`build` with its graph as grappler rewrites it for a session.

  The variable byte counts stay those of the graph as built. Grappler's
  remapper (the pass that fuses matmul + bias) fails outright on some
  graphs when run offline, as here, without a session's devices (seen on
  BERT-base with recompute's copies); the graph is then optimized without
  that pass, which counts each unfused bias add's output separately. If
  grappler still fails, the graph as built is planned, which overestimates
  (see the module docstring). A warning says which.
  """
  meta_graph = meta_graph_pb2.MetaGraphDef()
  meta_graph.graph_def.CopyFrom(build.graph.as_graph_def())
  # Grappler keeps what the fetches need, named in this collection.
  meta_graph.collection_def['train_op'].node_list.value.extend(
      op.name for op in build.fetches)
  config = config_pb2.ConfigProto()
  for attempt in ('all passes', 'without the remapper'):
    if attempt == 'without the remapper':
      config.graph_options.rewrite_options.remapping = (
          rewriter_config_pb2.RewriterConfig.OFF)
    try:
      graph_def = tf_optimizer.OptimizeGraph(config, meta_graph,
                                             verbose=False)
      graph = tf.Graph()
      with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name='')
      fetches = tuple(graph.get_operation_by_name(op.name)
                      for op in build.fetches)
    except (tf.errors.OpError, ValueError, KeyError, RuntimeError) as e:
      failure = e
      continue
    if attempt != 'all passes':
      logging.warning('Memory planner: TensorFlow\'s graph optimizer failed '
                      'with all passes (%s); planned %s.', failure, attempt)
    return dataclasses.replace(build, graph=graph, fetches=fetches)
  logging.warning('Memory planner: TensorFlow\'s graph optimizer failed '
                  '(%s); planning the graph as built, which overestimates '
                  'the peak.', failure)
  return build


def _tensor_bytes(tensor):
  """Bytes of a tensor with a static shape; 0 for resources and unknowns."""
  dtype = tensor.dtype.base_dtype
  if dtype in (tf.resource, tf.variant, tf.string):
    return 0
  elements = tensor.shape.num_elements()
  return 0 if elements is None else elements * dtype.size


def _linear_sizes(build1, build2, b1, b2):
  """Returns `size(tensor) -> (fixed, per_example)` from two builds.

  None if the graphs do not have the same op names and output counts.
  """
  ops2 = {op.name: op for op in build2.graph.get_operations()}
  ops1 = build1.graph.get_operations()
  if len(ops1) != len(ops2):
    return None
  table = {}
  for op in ops1:
    other = ops2.get(op.name)
    if other is None or len(other.outputs) != len(op.outputs):
      return None
    for t1, t2 in zip(op.outputs, other.outputs):
      s1, s2 = _tensor_bytes(t1), _tensor_bytes(t2)
      per_example = (s2 - s1) / float(b2 - b1)
      table[t1.name] = (s1 - per_example * b1, per_example)
  return lambda tensor: table[tensor.name]


def _needed_ops(fetches):
  """Ops the fetches depend on (data and control inputs)."""
  needed, stack = set(), list(fetches)
  while stack:
    op = stack.pop()
    if op in needed:
      continue
    needed.add(op)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return needed


def _simulate(build, size_of):
  """Runs one step on paper; returns the upper envelope of live bytes.

  Args:
    build: a `_Build`.
    size_of: `size_of(tensor) -> (fixed, per_example)` bytes.

  Returns:
    Two lists of (fixed, per_example) lines: live transient bytes at each
    moment of the step, reduced to those that can be the maximum; the
    second adds the float32 copies a CPU makes for bfloat16 matmuls.
  """
  needed = _needed_ops(build.fetches)
  order = {op: i for i, op in enumerate(build.graph.get_operations())}
  consumers = {}
  for op in needed:
    for tensor in op.inputs:
      consumers[tensor] = consumers.get(tensor, 0) + 1

  buffers = {}  # tensor -> buffer id (aliases share one)
  remaining = {}  # buffer id -> uses left
  buffer_size = {}  # buffer id -> (fixed, per_example)
  live = [0.0, 0.0]
  points, upcast_points = [], []

  def allocate(tensor, size, buffer_id=None):
    if buffer_id is None:
      buffer_id = id(tensor)
      buffer_size[buffer_id] = size
      remaining[buffer_id] = 0
      live[0] += size[0]
      live[1] += size[1]
    buffers[tensor] = buffer_id
    remaining[buffer_id] += consumers.get(tensor, 0)

  def release(buffer_id):
    if remaining[buffer_id] == 0 and buffer_id in buffer_size:
      size = buffer_size.pop(buffer_id)
      live[0] -= size[0]
      live[1] -= size[1]

  pending = {op: len(set(t.op for t in op.inputs) | set(op.control_inputs))
             for op in needed}
  users = {}
  for op in needed:
    for source in set(t.op for t in op.inputs) | set(op.control_inputs):
      users.setdefault(source, []).append(op)
  ready = [(order[op], op.name, op) for op, count in pending.items()
           if count == 0]
  heapq.heapify(ready)
  while ready:
    _, _, op = heapq.heappop(ready)
    _run_op(op, buffers, remaining, buffer_size, size_of, allocate)
    points.append(tuple(live))
    scratch = _upcast_scratch(op, size_of)
    upcast_points.append((live[0] + scratch[0], live[1] + scratch[1]))
    for tensor in op.inputs:
      buffer_id = buffers.get(tensor)
      if buffer_id is not None:
        remaining[buffer_id] -= 1
        release(buffer_id)
    for tensor in op.outputs:
      release(buffers[tensor])
    for user in users.get(op, ()):
      pending[user] -= 1
      if pending[user] == 0:
        heapq.heappush(ready, (order[user], user.name, user))
  return _upper_envelope(points), _upper_envelope(upcast_points)


def _upcast_scratch(op, size_of):
  """Bytes of float32 copies a non-bfloat16 CPU makes for a bfloat16 matmul.

  TensorFlow's CPU matmul kernels without bfloat16 hardware convert the
  operands to float32, multiply, and convert the result back: while the op
  runs, float32 copies (twice the bfloat16 bytes) of every bfloat16 operand
  and of the result are live.
  """
  if op.type not in _MATMUL_OPS or op.outputs[0].dtype != tf.bfloat16:
    return (0.0, 0.0)
  tensors = [t for t in op.inputs if t.dtype == tf.bfloat16]
  tensors.append(op.outputs[0])
  sizes = [size_of(t) for t in tensors]
  return (2.0 * sum(a for a, _ in sizes), 2.0 * sum(c for _, c in sizes))


def _run_op(op, buffers, remaining, buffer_size, size_of, allocate):
  """Allocates (or aliases) the outputs of `op`."""
  if op.type in _PERSISTENT_OPS:
    for tensor in op.outputs:
      allocate(tensor, (0.0, 0.0))
    return
  for index, tensor in enumerate(op.outputs):
    size = size_of(tensor)
    if op.type in _ALIAS_OPS and index < len(op.inputs) and (
        op.inputs[index] in buffers):
      allocate(tensor, size, buffers[op.inputs[index]])
      continue
    if op.type in _FORWARDING_OPS and index == 0:
      reused = _dying_input_of_size(op, size, buffers, remaining,
                                    buffer_size)
      if reused is not None:
        # Take over the buffer: it stays allocated for the new tensor.
        allocate(tensor, size, reused)
        continue
    allocate(tensor, size)


def _dying_input_of_size(op, size, buffers, remaining, buffer_size):
  for tensor in op.inputs:
    buffer_id = buffers.get(tensor)
    if (buffer_id is not None and buffer_id in buffer_size and
        remaining[buffer_id] == 1 and buffer_size[buffer_id] == size and
        size != (0.0, 0.0)):
      return buffer_id
  return None


def _upper_envelope(points, min_batch=1.0):
  """Keeps the (fixed, per_example) lines that are the max for some b >= 1."""
  best = {}
  for fixed, per_example in points:
    best[per_example] = max(best.get(per_example, float('-inf')), fixed)
  lines = sorted(best.items())  # by per_example, ascending
  hull = []
  for per_example, fixed in lines:
    while hull:
      last_c, last_a = hull[-1]
      # The new, steeper line overtakes the last one at this batch size.
      crossing = (last_a - fixed) / (per_example - last_c)
      if crossing <= min_batch:
        hull.pop()
        continue
      if len(hull) >= 2:
        prev_c, prev_a = hull[-2]
        if crossing <= (prev_a - last_a) / (last_c - prev_c):
          hull.pop()
          continue
      break
    hull.append((per_example, fixed))
  return [(fixed, per_example) for per_example, fixed in hull]
