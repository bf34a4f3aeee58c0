"""Memory planner: which batch fits a TPU v2 or v3 core, before running.

    plan = eb.memory_plan(model_fn, features={'image': tf.TensorSpec(
        [224, 224, 3], tf.float32)}, precision='bfloat16')
    plan.max_batch_per_core()   # {'v2': ..., 'v3': ...} examples per core
    plan.step_bytes(64)         # bytes one training step needs at batch 64

This module holds the public `memory_plan` and its result, `MemoryPlan`,
and the extrapolation from two small batches to any batch. `memory_plan`
builds the training graph (forward, gradients and optimizer update) at two
small batch sizes and never runs it (`plan_build`). It then:

* counts the persistent bytes from the variables themselves: the trainable
  parameters (float32 master weights in either precision), other model
  variables (batch-norm moving statistics) and the optimizer's slots, which
  are whatever variables the optimizer created (Adam: 2 x parameters;
  Adafactor: rows + columns of each matrix);
* plans the graph as TensorFlow's graph optimizer (grappler) rewrites it
  for a session, since that is what a session runs (`plan_build`);
* simulates one step of the optimized graph in its op order, as a dataflow
  executor running one op at a time does (`plan_simulate`). Every tensor's
  size is `fixed + per_example * batch` (solved here from the two builds),
  so the simulation yields, for each moment of the step, one line in the
  batch size; the step's transient peak at batch `b` is the highest of
  those lines at `b`.

Activations therefore count in the dtype the graph really computes in, with
whatever the model keeps in float32 (softmax, layer-norm statistics) and the
bfloat16 copies of the weights that the scope's casts make.

On request (`upcast=True` in `step_bytes` / `max_batch`) it also counts
what TensorFlow's CPU kernels add on CPUs without bfloat16 arithmetic
(no AVX512-BF16 or AMX): a bfloat16 matmul there runs on float32 copies of
its operands and result. That is how the benchmark checks the planner
against a CPU measurement; TPUs need no such copies.

With `compiled=True` it plans the step as XLA compiles it for a TPU
instead of as TensorFlow's executor runs it: elementwise chains fused into
the op that reads them and the variable updates after the backprop, where
XLA's schedule puts them (`plan_simulate`), and gradient accumulation
inside the device loop (`levers.device_accumulation`), which holds the
whole update's input, not one micro-batch's, and micro-batch 0's gradients
through the loop. With `tile` it pads every tensor to the TPU's tiles.
`check --fit --device=tpu-*` plans with both.

What it does not model: allocator rounding and fragmentation, other kernel
scratch space, the executor's order when several ops run at once, and the
compiler's other choices (XLA's own schedule, its copies into a loop's
state; the TPU runtime also reserves some memory). Leave headroom.
`docs/benchmarks.md` states the planner's error against the measured CPU
peak, docs/levers.md against XLA's buffer assignment.
"""

import dataclasses
from typing import Tuple

import tensorflow as tf

from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.estimator import wrappers
from estimator_bf16.levers import batch_dim
from estimator_bf16.levers import apply
from estimator_bf16.memory import plan_build
from estimator_bf16.memory import plan_simulate
from estimator_bf16.levers import recompute as recompute_lib
from estimator_bf16.platform import quiet
from estimator_bf16.precision import policy



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
    compiled: planned as XLA compiles the step (`memory_plan`): fused
      elementwise chains, variable updates after the backprop and, with
      accumulation, the device loop's (the whole update's input, and
      micro-batch 0's gradients held through the loop).
    input_bytes_per_example: bytes of one example's features and labels as
      the step receives them (in the compute dtype).
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
  compiled: bool = False
  input_bytes_per_example: float = 0.0

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
    loop_fixed, loop_per_example = self._device_loop()
    return int(round(self.persistent_bytes + transient + loop_fixed +
                     loop_per_example * micro_batch))

  def with_accumulation(self, steps):
    """This plan of one micro-batch (K = 1) as an update of `steps` of them.

    The returned plan's batches are updates of `steps` micro-batches, and
    one float32 accumulator per trainable variable counts as a slot, as in
    a plan built with `gradient_accumulation_steps=steps`; compiled, it
    also counts what the device loop holds (`compiled`).

    Args:
      steps: int >= 1, micro-batches per update.

    Raises:
      ValueError: this plan already has accumulation.
    """
    if self.gradient_accumulation_steps != 1:
      raise ValueError('with_accumulation plans from a plan without '
                       'accumulation; this one has K = %d.' %
                       self.gradient_accumulation_steps)
    if steps == 1:
      return self
    return dataclasses.replace(
        self, slot_bytes=self.slot_bytes + self.parameter_bytes,
        gradient_accumulation_steps=steps)

  def _device_loop(self):
    """What accumulation inside the device loop holds beyond the host's.

    Micro-batch 0's gradients (the loop over the other micro-batches starts
    once they exist, `levers.device_accumulation`, and they are added to
    the loop's sums after it), and the input of the other micro-batches
    (the host feeds one per step).

    Returns:
      (fixed, per micro-batch example) bytes; (0, 0) unless `compiled`
      and K > 1.
    """
    steps = self.gradient_accumulation_steps
    if not self.compiled or steps == 1:
      return 0.0, 0.0
    return (float(self.parameter_bytes),
            (steps - 1) * self.input_bytes_per_example)

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
    loop_fixed, loop_per_example = self._device_loop()
    room = budget_bytes - self.persistent_bytes - loop_fixed
    best = float('inf')
    for fixed, per_example in self._lines(upcast):
      per_example += loop_per_example
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
            for name, size in tpu_facts.TPU_CORE_BYTES}

  def summary(self):
    """One line for logs and tables."""
    cores = ', '.join('%s core %d' % item for item in
                      sorted(self.max_batch_per_core().items()))
    return ('%s/%s: params %.1f MiB, slots %.1f MiB, state %.1f MiB, fixed '
            '%.1f MiB, %.2f MiB per example; max batch %s' % (
                self.precision, self.optimizer,
                self.parameter_bytes / tpu_facts.MiB,
                self.slot_bytes / tpu_facts.MiB,
                self.state_bytes / tpu_facts.MiB,
                self.fixed_bytes / tpu_facts.MiB,
                self.bytes_per_example / tpu_facts.MiB, cores))


def input_specs(input_fn, params=None):
  """Returns (features, labels) specs of one example from an input_fn.

  The batch dimension of each feature and label is found from the shapes
  the input_fn yields at `params['batch_size']` (`batch_dim.example_specs`):
  batch-last images (`[H, W, C, N]`, also flattened), and time-major
  sequences (`[T, N]`) keep their layout in the planned graph.

  Args:
    input_fn: `input_fn(params)` returning a batched `tf.data.Dataset` of
      (features, labels).
    params: dict given to input_fn; `batch_size` defaults to 2.

  Returns:
    (features, labels) nests of `batch_dim.ExampleSpec`: one example's
    shape and dtype, and where its batch dimension was.
  """
  params = dict({'batch_size': 2}, **(params or {}))
  with tf.Graph().as_default():
    spec = input_fn(params).element_spec
  if not (isinstance(spec, tuple) and len(spec) == 2):
    raise TypeError('input_fn must return a Dataset of (features, labels); '
                    'its elements are %s.' % (spec,))
  # Together: a flattened batch is recognised by the other part's batch.
  return batch_dim.example_specs(spec, params['batch_size'])


def memory_plan(model_fn=None, *, network_fn=None, features,
                labels=tf.TensorSpec([], tf.int32), precision='float32',
                optimizer=None, params=None, batch_sizes=(8, 16),
                gradient_accumulation_steps=1, recompute=False, tile=None,
                compiled=False):
  """Estimates the memory of one training step on one device.

  Give either `model_fn` (a legacy Estimator/TPUEstimator model_fn; it
  builds its own loss and optimizer, and is wrapped with `eb.wrap_model_fn`)
  or `network_fn(features, is_training) -> logits` (run through
  `eb.build_network`; the planner adds a sparse softmax cross-entropy loss
  on int labels and `optimizer`).

  Args:
    model_fn: `(features, labels, mode[, params][, config])`.
    network_fn: a network function, instead of `model_fn`.
    features: nest of specs of ONE example (no batch dimension): a
      `tf.TensorSpec` gets the batch as dimension 0, a
      `batch_dim.ExampleSpec` at its `batch_axis`. Floating features enter
      the graph in the compute dtype, as when the input pipeline casts them
      (`eb.wrap_input_fn`). `input_specs` reads them from an input_fn.
    labels: spec of one example's labels, as `features`; or None.
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
    tile: None, or (rows, lanes): every tensor and variable is counted
      with its two minor dimensions padded up to multiples of these, as XLA
      lays them out on a TPU (`platform.tpu.TPU_TILE`; `--fit
      --device=tpu-*` plans so). Keep `batch_sizes` multiples of `rows`.
    compiled: plan the step as XLA compiles it on a TPU, not as
      TensorFlow's executor runs it: elementwise chains fused into their
      reader, variable updates last, and accumulation inside the device
      loop. `--fit --device=tpu-*` plans so.

  Returns:
    A `MemoryPlan`.

  Raises:
    ValueError: bad precision, batch sizes or optimizer, both or neither of
      model_fn and network_fn, or a graph without gradients.
  """
  precision = policy.parse_precision(precision)
  _check_arguments(model_fn, network_fn, optimizer, batch_sizes,
                   gradient_accumulation_steps, recompute)
  builder, optimizer_name = _step_builder(
      model_fn, network_fn, optimizer, precision, params,
      gradient_accumulation_steps, recompute)
  builds = _build_twice(builder, features, labels, precision, batch_sizes,
                        tile)
  (lines, upcast_lines), input_bytes = _transient_lines(
      builds, batch_sizes, tile, compiled=compiled)
  fixed, per_example = max(lines, key=lambda line: (line[1], line[0]))
  build1 = builds[0]
  return MemoryPlan(
      precision=precision, optimizer=optimizer_name,
      parameter_bytes=build1.parameter_bytes, state_bytes=build1.state_bytes,
      slot_bytes=build1.slot_bytes, fixed_bytes=fixed,
      bytes_per_example=per_example, lines=tuple(lines),
      upcast_lines=tuple(upcast_lines), batch_sizes=tuple(batch_sizes),
      gradient_accumulation_steps=gradient_accumulation_steps,
      recompute=recompute, compiled=bool(compiled),
      input_bytes_per_example=input_bytes)


def _check_arguments(model_fn, network_fn, optimizer, batch_sizes,
                     gradient_accumulation_steps, recompute):
  """Raises ValueError for the bad combinations `memory_plan` documents."""
  apply.check_levers(gradient_accumulation_steps, recompute)
  if (model_fn is None) == (network_fn is None):
    raise ValueError('Pass exactly one of model_fn and network_fn.')
  if len(batch_sizes) != 2 or batch_sizes[0] == batch_sizes[1] or min(
      batch_sizes) < 1:
    raise ValueError('batch_sizes must be two different positive sizes, got '
                     '%r.' % (batch_sizes,))
  if model_fn is not None and optimizer is not None:
    raise ValueError('model_fn creates its own optimizer; pass optimizer '
                     'only with network_fn.')


def _step_builder(model_fn, network_fn, optimizer, precision, params,
                  gradient_accumulation_steps, recompute):
  """Returns (step builder, optimizer name) for `memory_plan`'s arguments.

  The builder is `plan_build.model_fn_step_builder`'s; the name is the
  optimizer's, or 'model_fn' when the model_fn chooses its own.
  """
  if network_fn is not None:
    optimizer = optimizer or 'adam'
    # The network is put in the precision by build_network: the model_fn
    # around it gets only the levers.
    model_fn = plan_build.network_model_fn(
        wrappers.build_network(network_fn, precision), optimizer)
    optimizer_name = optimizer if isinstance(optimizer, str) else getattr(
        optimizer, '__name__', 'custom')
  else:
    optimizer_name = 'model_fn'
  builder = plan_build.model_fn_step_builder(
      model_fn, precision, params, gradient_accumulation_steps, recompute,
      wrap_precision=network_fn is None)
  return builder, optimizer_name


def _build_twice(builder, features, labels, precision, batch_sizes,
                 tile=None):
  """Returns a `plan_build.Build` for each of the two batch sizes."""
  builds = []
  # One segmentation for both builds, so that their tensors correspond.
  # kernels('bfloat16'): plan the bfloat16 graph a TPU runs, also for a
  # network put in bfloat16 by build_network (autocast.cpu_kernels).
  with recompute_lib.same_cuts() as next_build, \
      quiet.tensorflow_info_hidden(), cpu_kernels.kernels('bfloat16'):
    for batch in batch_sizes:
      next_build()
      builds.append(plan_build.build_step(builder, features, labels,
                                          precision, batch, tile))
  return builds


def _transient_lines(builds, batch_sizes, tile=None, compiled=False):
  """The step's transient bytes as lines in the batch, from two builds.

  Args:
    builds: two `plan_build.Build`s, at `batch_sizes`.
    batch_sizes: the two int batch sizes.
    tile: None, or the TPU tile tensors are padded to.
    compiled: plan the step as XLA compiles it (`plan_simulate`).

  Returns:
    ((lines, upcast_lines), input bytes per example): lists of (fixed,
    per_example) pairs, as in `MemoryPlan`, and the float bytes per example
    of the step's inputs (its placeholders).
  """
  (b1, build1), (b2, build2) = zip(batch_sizes, builds)
  inputs = [sum(plan_simulate.tensor_bytes(t, tile)
                for t in plan_build.step_inputs(build)) for build in builds]
  input_bytes = (inputs[1] - inputs[0]) / float(b2 - b1)
  sizes = _linear_sizes(build1, build2, b1, b2, tile)
  if sizes is not None:
    return plan_simulate.simulate(build1, sizes, compiled), input_bytes
  # The two graphs differ beyond their shapes (batch-dependent Python
  # code): fall back to a line through the two simulated peaks.
  static_size = lambda t: (float(plan_simulate.tensor_bytes(t, tile)), 0.0)
  peaks = [plan_simulate.simulate(build, static_size, compiled)
           for build in builds]
  envelopes = []
  for kind in (0, 1):
    first, second = peaks[0][kind][0][0], peaks[1][kind][0][0]
    per_example = (second - first) / (b2 - b1)
    envelopes.append([(first - per_example * b1, per_example)])
  return tuple(envelopes), input_bytes


def _linear_sizes(build1, build2, b1, b2, tile=None):
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
      s1 = plan_simulate.tensor_bytes(t1, tile)
      s2 = plan_simulate.tensor_bytes(t2, tile)
      per_example = (s2 - s1) / float(b2 - b1)
      table[t1.name] = (s1 - per_example * b1, per_example)
  return lambda tensor: table[tensor.name]
