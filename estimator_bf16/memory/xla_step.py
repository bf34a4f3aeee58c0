"""The TRAIN step compiled with XLA on this machine: a TPU compile's stand-in.

On a TPU, TPUEstimator builds the model_fn inside a loop of
`iterations_per_loop` steps and XLA compiles that loop whole; each step
takes one batch from the infeed. `train_loop_on_xla` lays the step out the
same way on the CPU: the input_fn's next `iterations_per_loop` batches are
stacked into the loop's arguments, the model_fn (in the precision, with
the levers) is built inside a `tf.compat.v1.while_loop` whose body takes
batch `i`, and `xla.compile` compiles the loop into one XLA computation.
The loop's trip count is fed at each run, as TPUEstimator's loop reads
`iterations_per_loop` from a variable, so XLA compiles a loop (not one
inlined step) and a run of no step compiles it. It runs a few loops, or
none, and reads XLA's buffer assignment of the compiled loop (`xla_dump`).

What it shows that the ordinary CPU run does not: that the step compiles
inside a device loop (an op XLA cannot compile is named with the line of
the program that made it), and how much memory XLA itself allocates for
the step after its fusion, scheduling and buffer reuse.

The figure, `XlaStep.step_bytes`, is the buffer assignment's `Total bytes
used` less two things this CPU layout adds and a TPU's does not:

  * the variables passed in (weights, optimizer slots): XLA here writes
    their new values into result buffers of their own, which may also hold
    temporaries during the step; a TPU program updates its variables where
    they are, so it holds them once. The result buffers stay counted, the
    parameters are left out (a parameter buffer is never shared);
  * all but one of the stacked input batches: a TPU dequeues one batch per
    step from the infeed, while here the loop gets all of its batches as
    arguments.

`XlaStep.total_bytes` keeps the unadjusted figure.

Nothing here runs on a TPU; what XLA's TPU backend adds (its 128-lane tile
padding, its own scheduler) is not in these figures.
"""

import contextlib
import dataclasses
import re
import threading
import time
from typing import Optional

import numpy as np
import tensorflow as tf
from tensorflow.python.compiler.xla import xla
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu.ops import tpu_ops

from estimator_bf16.compat import calling
from estimator_bf16.estimator import options as options_lib
from estimator_bf16.estimator import wrappers
from estimator_bf16.memory import xla_dump
from estimator_bf16.platform import interrupts
from estimator_bf16.platform import patching
from estimator_bf16.platform import quiet
from estimator_bf16.safety import audit as audit_lib

# XLA's element type names (as in a buffer assignment's shapes).
_XLA_TYPES = {
    tf.float32: 'f32', tf.bfloat16: 'bf16', tf.float16: 'f16',
    tf.float64: 'f64', tf.int32: 's32', tf.int64: 's64', tf.uint8: 'u8',
    tf.int8: 's8', tf.int16: 's16', tf.bool: 'pred', tf.uint32: 'u32',
}

# How TensorFlow names an op XLA could not compile.
_UNSUPPORTED = re.compile(
    r'Detected unsupported operations.*?:\s*(\w+)\s*\(.*?\{\{node ([^}]+)\}\}',
    re.S)
_NODE = re.compile(r'\{\{node ([^}]+)\}\}')


class _Local(threading.local):
  """Whether this thread is building the one-core XLA loop."""

  def __init__(self):
    super().__init__()
    self.one_core = 0


_LOCAL = _Local()


def _swap_collectives():
  """Makes `cross_replica_sum` an identity on the thread building the loop.

  The stand-in is one TPU core, where a sum over the replicas is the value
  itself; XLA's CPU backend has no kernel for the collective
  (`CrossShardOptimizer` calls it on every gradient). Other threads get
  the original.
  """
  original = tpu_ops.cross_replica_sum

  def cross_replica_sum(x, group_assignment=None, name=None):
    if _LOCAL.one_core:
      return tf.identity(x, name=name)
    return original(x, group_assignment, name)

  undo = [(tpu_ops, 'cross_replica_sum', original)]
  tpu_ops.cross_replica_sum = cross_replica_sum
  public = tf.compat.v1.tpu
  undo.append((public, 'cross_replica_sum', public.cross_replica_sum))
  public.cross_replica_sum = cross_replica_sum
  return undo


_PATCHER = patching.Patcher(_swap_collectives)


@contextlib.contextmanager
def _one_core():
  """Inside, the model_fn is built as on one TPU core (one shard)."""
  with _PATCHER.active(), tpu_function.tpu_shard_context(1):
    _LOCAL.one_core += 1
    try:
      yield
    finally:
      _LOCAL.one_core -= 1


class XlaCompileError(ValueError):
  """XLA cannot compile the TRAIN step; the message is one line."""


@dataclasses.dataclass
class XlaStep:
  """One XLA-compiled training loop and what XLA allocated for it.

  Attributes:
    step_bytes: int, XLA's bytes for one step as a TPU would hold them (see
      the module docstring): variables, optimizer slots, one step's input
      and the step's buffers.
    total_bytes: int, the buffer assignment's `Total bytes used` as
      compiled here (all stacked inputs, variables and their new values).
    variable_bytes: int, the variables passed in (weights, slots, the
      global step), left out of `step_bytes`: the step's results hold their
      new values, which a TPU writes over them.
    input_bytes: int, bytes of the stacked input batches passed in.
    iterations_per_loop: int, steps per compiled loop (input batches
      stacked into the loop's arguments).
    loops: int, loops run, the compiling one included.
    steps: int, training steps run in all the loops; 0 when the loop was
      only compiled.
    loss: float, the loss of the last step run; None when no step ran.
    global_step: int, the global step after the last loop.
    seconds_per_step: float, wall time of a step in the loops after the
      first (which compiles); None with a single loop.
    assignment_path: str, the buffer-assignment file read.
    variables: with `return_variables`, {name: numpy value} of the global
      variables after the last loop; else None.
    product_dtypes: {HLO type: count} of the compiled matmuls and
      convolutions by result type (`xla_dump.product_dtypes`), or None.
  """
  step_bytes: int
  total_bytes: int
  variable_bytes: int
  input_bytes: int
  iterations_per_loop: int
  loops: int
  steps: int
  loss: Optional[float]
  global_step: int
  seconds_per_step: Optional[float]
  assignment_path: str
  variables: Optional[dict] = None
  product_dtypes: Optional[dict] = None


def _xla_shape(tensor):
  dims = ','.join(str(d) for d in tensor.shape.as_list())
  return '%s[%s]' % (_XLA_TYPES.get(tensor.dtype.base_dtype, '?'), dims)


def _step_assignment(assignments, input_shapes):
  """The compiled loop's buffer assignment among those dumped meanwhile.

  The dump folder may be shared (a folder the user named in XLA_FLAGS,
  other processes, other threads compiling), so the largest new file is
  not necessarily this loop's: the loop's module is the one whose entry
  parameters include the stacked input batches.

  Args:
    assignments: list of `xla_dump.BufferAssignment`, largest first.
    input_shapes: list of str, the stacked inputs' XLA shapes.

  Returns:
    A `xla_dump.BufferAssignment`.

  Raises:
    RuntimeError: none of them takes the inputs.
  """
  for assignment in assignments:
    if assignment.takes(input_shapes):
      return assignment
  raise RuntimeError(
      'XLA dumped %d buffer assignment(s) during the step, none with the '
      'loop\'s inputs (%s) as parameters.' % (len(assignments),
                                             ', '.join(input_shapes)))


def _dataset_of(result):
  """The input_fn's result as a Dataset of (features, labels) elements."""
  if isinstance(result, tf.data.Dataset):
    return result
  # Tensors: the same batch for every step of the loop.
  return tf.data.Dataset.from_tensors(result).repeat()


def _split(element):
  if isinstance(element, tuple) and len(element) == 2:
    return element
  return element, None


def _stacked_batches(input_fn, params, config, iterations):
  """The next `iterations` batches, each leaf stacked on a new axis 0.

  Returns:
    (initializer op, features nest, labels nest or None), the nests of
    `[iterations, ...]` tensors.
  """
  kwargs = calling.input_fn_kwargs(input_fn, params=params,
                                   mode=calling.TRAIN, config=config)
  dataset = _dataset_of(input_fn(**kwargs))
  iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
  batches = []
  for _ in range(iterations):
    # One after the other: the executor would otherwise run the reads in
    # any order, and the loop's steps would see the batches shuffled.
    previous = [t for t in tf.nest.flatten(batches[-1]) if t is not None
               ] if batches else []
    with tf.control_dependencies(previous):
      batches.append(_split(iterator.get_next()))
  for features, _ in batches:
    for tensor in tf.nest.flatten(features):
      if not tensor.shape.is_fully_defined():
        raise XlaCompileError(
            'the input_fn gives features of shape %s: a TPU (and this XLA '
            'build) needs static shapes; batch with drop_remainder=True.' %
            tensor.shape)

  def stack(*tensors):
    return tf.stack(tensors)

  features = tf.nest.map_structure(stack, *[f for f, _ in batches])
  labels = (None if batches[0][1] is None else
            tf.nest.map_structure(stack, *[l for _, l in batches]))
  return iterator.initializer, features, labels


def _loop(model_fn, params, config, count, features, labels):
  """The computation XLA compiles: `count` steps over the stacked batches.

  `count` is an int32 scalar tensor fed at each run, not a constant: as
  TPUEstimator's loop reads its `iterations_per_loop` from a variable, the
  compiled loop does not depend on it. One compile serves every run, and a
  run of 0 steps compiles the loop (and gets its buffer assignment) without
  training: on a CPU, XLA's steps of a large model can take many minutes.
  """
  # tf.nest keeps None as a leaf: labels-free input passes features alone.
  structure = features if labels is None else (features, labels)
  flat = tf.nest.flatten(structure)

  def computation(steps, *args):
    packed = tf.nest.pack_sequence_as(structure, list(args))
    stacked_features, stacked_labels = ((packed, None) if labels is None
                                        else packed)

    def body(i, unused_loss):
      step_features = tf.nest.map_structure(lambda t: tf.gather(t, i), stacked_features)
      step_labels = (None if stacked_labels is None else
                     tf.nest.map_structure(lambda t: tf.gather(t, i),
                                           stacked_labels))
      # Resource variables, as a TPU computation makes them: XLA cannot
      # compile reference variables.
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       use_resource=True):
        spec = calling.call_model_fn(model_fn, step_features, step_labels,
                                     calling.TRAIN, params, config)
      if getattr(spec, 'train_op', None) is None:
        raise ValueError('model_fn returned no train_op in TRAIN mode.')
      with tf.control_dependencies([spec.train_op]):
        return i + 1, tf.identity(tf.cast(spec.loss, tf.float32))

    _, loss = tf.compat.v1.while_loop(
        lambda i, unused_loss: i < steps, body,
        [tf.constant(0), tf.constant(0.0)], parallel_iterations=1)
    return loss

  return xla.compile(computation, inputs=[count] + flat)


def all_ops(graph):
  """The ops of `graph` and of the function graphs of its loops and conds."""
  found = []
  stack = [graph]
  while stack:
    current = stack.pop()
    for op in current.get_operations():
      found.append(op)
      # Where while_v2 and cond_v2 keep their bodies' graphs.
      for name in ('_body_graph', '_cond_graph', '_true_graph',
                   '_false_graph'):
        inner = getattr(op, name, None)
        if inner is not None:
          stack.append(inner)
  return found


def _one_line_failure(error, graph):
  """An `XlaCompileError` naming the op XLA could not compile."""
  message = getattr(error, 'message', str(error))
  match = _UNSUPPORTED.search(message)
  op_type = match.group(1) if match else None
  node = match.group(2) if match else None
  if node is None:
    found = _NODE.search(message)
    node = found.group(1) if found else None
  where = ''
  if node is not None:
    try:
      op = graph.get_operation_by_name(node)
    except (KeyError, ValueError):
      op = None
    if op is None and op_type is not None:
      # Inside the loop the op is in a function graph (the loop body's,
      # with control flow v2), named as that graph names it.
      op = next((o for o in all_ops(graph) if o.type == op_type and
                 (o.name == node or o.name.endswith('/' + node))), None)
    if op is not None:
      node = op.name
      op_type = op_type or op.type
      made = audit_lib.where_made(op)
      where = ' made at %s' % made if made else ''
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  useful = [line for line in lines if not line.startswith(
      ('Graph execution error', 'Detected at node'))]
  first = (useful or lines or [repr(error)])[0]
  if op_type is None:
    return XlaCompileError('XLA could not compile the TRAIN step: %s' %
                           first[:300])
  return XlaCompileError(
      'XLA cannot compile %s (op %r%s) inside the TPU training loop: %s' % (
          op_type, node, where, first[:200]))


class CompiledLoop:
  """The TRAIN loop built as on a TPU and compiled by XLA, its session open.

  Building runs the first loop, which compiles, and reads XLA's buffer
  assignment of the compiled loop; `run` runs (and times) one more loop.
  With `first_steps=0` the first loop only compiles: no step runs.
  `train_loop_on_xla` uses one for a few loops. Two kept open at once can
  be run turn about, so that their step times are measured side by side
  under the same load (the benchmark's paired step times). Close it (or
  use it in a `with` block) to free the session.

  Args (keyword-only after `input_fn`): as `train_loop_on_xla`'s, less
  `loops`, `steps` and `return_variables`, and:
    first_steps: int, steps the compiling loop runs, 0 to
      `iterations_per_loop`; None runs a whole loop.

  Raises:
    as `train_loop_on_xla`.
  """

  def __init__(self, model_fn, input_fn, *, batch_size, params=None,
               config=None, iterations_per_loop=2, precision='bfloat16',
               gradient_accumulation_steps=1, recompute=False,
               first_steps=None):
    if iterations_per_loop < 1:
      raise ValueError('iterations_per_loop must be >= 1, got %r.' %
                       iterations_per_loop)
    self.iterations_per_loop = iterations_per_loop
    self._run_steps = []  # Steps of each loop run, in order.
    folder = xla_dump.enable()
    before = xla_dump.assignment_files(folder)
    options = options_lib.WrapOptions(
        audit='off', gradient_accumulation_steps=gradient_accumulation_steps,
        recompute=recompute)
    wrapped = wrappers.wrap_model_fn(model_fn, precision, options)
    run_params = dict(params or {})
    # As the package's estimators and the runner pass them: model code that
    # builds its network through `eb.build_network` reads the precision.
    run_params.update(batch_size=batch_size, use_tpu=True,
                      precision=precision)
    self._graph = graph = tf.Graph()
    with graph.as_default():
      seed = getattr(config, 'tf_random_seed', None)
      if seed is not None:
        # As an Estimator does: the same seed draws the same initial weights.
        tf.compat.v1.set_random_seed(seed)
      # A resource variable, as TPUEstimator makes it: XLA cannot compile a
      # reference variable's update (a program may have disabled resource
      # variables with `disable_v2_behavior()`).
      self._global_step = tf.compat.v1.get_variable(
          tf.compat.v1.GraphKeys.GLOBAL_STEP, shape=[], dtype=tf.int64,
          initializer=tf.compat.v1.zeros_initializer(), trainable=False,
          use_resource=True,
          collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                       tf.compat.v1.GraphKeys.GLOBAL_STEP])
      initializer, features, labels = _stacked_batches(
          wrappers.wrap_input_fn(input_fn, precision), run_params, config,
          iterations_per_loop)
      self._count = tf.compat.v1.placeholder(tf.int32, [], name='steps')
      with _one_core():
        self._loss = _loop(wrapped, run_params, config, self._count,
                           features, labels)
      input_tensors = [t for t in tf.nest.flatten((features, labels))
                       if t is not None]
      init = [tf.compat.v1.global_variables_initializer(),
              tf.compat.v1.local_variables_initializer(),
              tf.compat.v1.tables_initializer(), initializer]
    self._session = tf.compat.v1.Session(graph=graph)
    self._values = None
    # Set when the latest loop run's thread is done (see
    # `interrupts.run_interruptibly`); None before the first.
    self._busy = None
    try:
      self._session.run(init)
      with quiet.compile_noise_hidden():
        self.first_seconds = self.run(first_steps)
    except BaseException:
      self.close()
      raise
    self._shapes = [_xla_shape(t) for t in input_tensors]
    self._assignment = _step_assignment(
        xla_dump.new_assignments(folder, before), self._shapes)

  def run(self, steps=None):
    """Runs one loop; returns its seconds.

    Args:
      steps: int, the loop's steps, 0 to `iterations_per_loop` (each takes
        the next of the loop's stacked batches); None runs them all.
    """
    steps = self.iterations_per_loop if steps is None else steps
    if not 0 <= steps <= self.iterations_per_loop:
      raise ValueError('a loop runs 0 to %d steps, not %r.' % (
          self.iterations_per_loop, steps))
    start = time.perf_counter()
    try:
      self._busy = threading.Event()
      values = interrupts.run_interruptibly(
          lambda: self._session.run(self._loss, {self._count: steps}),
          self._busy)
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
            tf.errors.NotFoundError) as e:
      raise _one_line_failure(e, self._graph) from None
    seconds = time.perf_counter() - start
    self._run_steps.append(steps)
    if steps:
      self._values = values
    return seconds

  def step(self, times, return_variables=False):
    """The `XlaStep` of this loop, given the seconds of the loops run.

    Args:
      times: list of float, every loop's seconds, the compiling one first.
      return_variables: also read the variables' values now.
    """
    assignment = self._assignment
    shapes = list(self._shapes)
    input_bytes = variable_bytes = 0
    for _, shape, size in assignment.parameters():
      if shape in shapes:
        shapes.remove(shape)
        input_bytes += size
      else:
        variable_bytes += size
    iterations = self.iterations_per_loop
    extra_inputs = input_bytes * (iterations - 1) // iterations
    variables = None
    if return_variables:
      with self._graph.as_default():
        found = tf.compat.v1.global_variables()
      variables = dict(zip([v.op.name for v in found],
                           self._session.run(found)))
    values = self._values
    loss_value = values[0] if isinstance(values, (list, tuple)) else values
    loss = None if values is None else float(np.asarray(loss_value))
    return XlaStep(
        step_bytes=assignment.total_bytes - variable_bytes - extra_inputs,
        total_bytes=assignment.total_bytes, variable_bytes=variable_bytes,
        input_bytes=input_bytes, iterations_per_loop=iterations,
        loops=len(times), steps=sum(self._run_steps), loss=loss,
        global_step=int(self._session.run(self._global_step)),
        seconds_per_step=self._seconds_per_step(times),
        assignment_path=assignment.path, variables=variables,
        product_dtypes=xla_dump.product_dtypes(assignment.path))

  def _seconds_per_step(self, times):
    """Median seconds per step of the loops after the compiling one."""
    later = [seconds / steps for seconds, steps in
             zip(times[1:], self._run_steps[1:]) if steps]
    return float(np.median(later)) if later else None

  def close(self):
    if self._busy is not None and not self._busy.is_set():
      # Ctrl-C left XLA running in its thread; closing the session would
      # wait for it. The process is on its way out: leave it to exit.
      return
    self._session.close()

  def __enter__(self):
    return self

  def __exit__(self, *unused_exc_info):
    self.close()


def train_loop_on_xla(model_fn, input_fn, *, batch_size, params=None,
                      config=None, iterations_per_loop=2, loops=2,
                      precision='bfloat16', gradient_accumulation_steps=1,
                      recompute=False, return_variables=False,
                      steps=None):
  """Compiles and runs the TRAIN loop with XLA on this machine.

  Args:
    model_fn: the program's model_fn, unmodified; built with
      `params['use_tpu'] = True`, as on a TPU, and `params['precision']`,
      as `eb.make_tpu_estimator` and the runner give it.
    input_fn: its input_fn, unmodified (its floating features are cast to
      the precision); called with `params['batch_size'] = batch_size`.
    batch_size: int, the batch of one step on one core (the effective batch
      with gradient accumulation: the model_fn sees batch_size / K).
    params: dict of the program's params (its own keys).
    config: the RunConfig passed on to model_fn and input_fn (its
      `tf_random_seed` seeds the graph, as an Estimator's does), or None.
    iterations_per_loop: int >= 1, steps per compiled loop.
    loops: int >= 1, loops run (the first compiles), each of
      `iterations_per_loop` steps.
    precision: 'float32' or 'bfloat16'.
    gradient_accumulation_steps: int >= 1 (`levers`).
    recompute: bool (`levers`).
    return_variables: also return the variables' values after training.
    steps: int >= 0, or None: run this many steps instead of `loops`
      whole loops, in loops of up to `iterations_per_loop` (the first
      compiles); 0 compiles the loop and runs no step.

  Returns:
    An `XlaStep`.

  Raises:
    XlaCompileError: XLA cannot compile the step (one line naming the op
      and where the program made it), or the input has dynamic shapes.
    RuntimeError: XLA's flags were read before the dump was asked for
      (`xla_dump.enable`).
  """
  if iterations_per_loop < 1 or loops < 1:
    raise ValueError('iterations_per_loop and loops must be >= 1, got %r '
                     'and %r.' % (iterations_per_loop, loops))
  if steps is None:
    per_loop = [iterations_per_loop] * loops
  elif steps < 0:
    raise ValueError('steps must be >= 0, got %r.' % steps)
  else:
    whole, rest = divmod(steps, iterations_per_loop)
    per_loop = [iterations_per_loop] * whole + ([rest] if rest else [])
    per_loop = per_loop or [0]
  with CompiledLoop(
      model_fn, input_fn, batch_size=batch_size, params=params,
      config=config, iterations_per_loop=iterations_per_loop,
      precision=precision,
      gradient_accumulation_steps=gradient_accumulation_steps,
      recompute=recompute, first_steps=per_loop[0]) as loop:
    times = [loop.first_seconds] + [loop.run(n) for n in per_loop[1:]]
    return loop.step(times, return_variables)
