"""Building the training step the memory planner plans, without running it.

The planner needs the graph one training step runs (forward, gradients and
optimizer update) at a given batch size. This module builds it from a
model_fn, or from a network function with a cross-entropy loss and a named
optimizer, on placeholders of that batch; counts the bytes of its variables
by role (parameters, optimizer slots, model state); and hands the graph to
TensorFlow's graph optimizer (grappler, with the options a default session
uses), because that rewritten graph is what a session really runs: it folds
constants, prunes what the fetches do not need (e.g. the gradients of
constant factors that the optimizer's gating kept alive), turns `pow(x, 3)`
into multiplies and fuses matmul + bias. Planned as built, BERT's step came
out 16-26% above the measured peak; as optimized, within 8%.
"""

import collections
import dataclasses
import re
from typing import Tuple

from absl import logging
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.grappler import tf_optimizer

from estimator_bf16.autocast import contexts as autocast_lib
from estimator_bf16.compat import calling
from estimator_bf16.estimator import options as options_lib
from estimator_bf16.estimator import wrappers
from estimator_bf16.levers import batch_dim
from estimator_bf16.memory import plan_simulate
from estimator_bf16.optimizers import registry as optimizers
from estimator_bf16.precision import casting
from estimator_bf16.precision import policy
from estimator_bf16.precision import op_lists

# Any rate will do: it plays no part in memory.
_PLAN_LEARNING_RATE = 1e-3
_GRADIENT_SCOPE = re.compile(r'(^|/)gradients(_\d+)?/')


@dataclasses.dataclass
class Build:
  """One training step, built at one batch size.

  Attributes:
    graph: the `tf.Graph` of the step (as grappler rewrote it, if it could).
    fetches: the `tf.Operation`s a session would run: loss and train op.
    parameter_bytes: bytes of the trainable variables.
    state_bytes: bytes of the other model variables.
    slot_bytes: bytes of the optimizer's variables.
  """
  graph: tf.Graph
  fetches: Tuple[tf.Operation, ...]
  parameter_bytes: int
  state_bytes: int
  slot_bytes: int


class _Spec(collections.namedtuple('_Spec', ['loss', 'train_op',
                                            'training_hooks'])):
  """The parts of an EstimatorSpec a planned TRAIN graph has."""


def variable_bytes(graph=None, tile=None):
  """Splits the bytes of a training graph's variables by role.

  Variables made after the gradients (the optimizer's `apply_gradients`
  runs after `compute_gradients`) are the optimizer's state; trainable
  variables are parameters; the rest (batch-norm moving statistics, the
  global step) are model state.

  Args:
    graph: a `tf.Graph` holding a training step; the default graph if None.
    tile: None, or the (rows, lanes) a TPU pads each variable's two minor
      dimensions to (`plan_simulate.tensor_bytes`).

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
    sizes[role] += plan_simulate.tensor_bytes(variable, tile)
  return sizes


def step_inputs(build):
  """The tensors a built step is fed: its placeholders' outputs."""
  return [op.outputs[0] for op in build.graph.get_operations()
          if op.type in (op_lists.OP.Placeholder, op_lists.OP.PlaceholderV2)]


def network_model_fn(network_fn, optimizer):
  """A TRAIN-only model_fn around a network: cross-entropy and `optimizer`.

  Args:
    network_fn: `network_fn(features, is_training) -> logits`, already in
      its precision.
    optimizer: a name from `optimizers.OPTIMIZERS`, or a function returning
      a `tf.compat.v1.train.Optimizer`.

  Returns:
    `model_fn(features, labels, mode)`; labels are int class ids.

  Raises:
    ValueError: an unknown optimizer.
  """
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


def model_fn_step_builder(model_fn, precision, params, steps, recompute,
                          wrap_precision=True):
  """Returns `build(features, labels) -> (loss, train_op)` for a model_fn.

  The model_fn gets the levers, and `precision` unless `wrap_precision` is
  False (a network already in its precision).
  """
  # The plan is of the bfloat16 graph a TPU runs, not of this CPU's
  # float32 stand-ins for slow kernels (autocast.cpu_kernels).
  wrapped = wrappers.wrap_model_fn(
      model_fn, precision if wrap_precision else 'float32',
      options_lib.WrapOptions(audit='off', gradient_accumulation_steps=steps,
                              recompute=recompute, kernels='bfloat16'))
  accepted = calling.model_fn_arg_names(wrapped)

  def build(features, labels, batch_size):
    run_params = dict(params or {}, batch_size=batch_size,
                      precision=precision, use_tpu=False)
    # Estimators create the global step before calling model_fn, and model
    # code reads it (learning-rate schedules, host_call summaries).
    tf.compat.v1.train.get_or_create_global_step()
    spec = calling.call_model_fn(wrapped, features, labels, calling.TRAIN,
                                 run_params, config=None, accepted=accepted)
    if getattr(spec, 'train_op', None) is None:
      raise ValueError('model_fn returned no train_op in TRAIN mode.')
    return spec.loss, spec.train_op

  return build


def _placeholders(specs, batch_size, dtype):
  """Placeholders of a batch of `batch_size` for a nest of example specs.

  The batch goes where the input pipeline has it: dimension 0 for a
  `tf.TensorSpec`, `batch_axis` for a `batch_dim.ExampleSpec`.
  """
  def make(spec):
    example = batch_dim.as_example_spec(spec)
    spec_dtype = example.dtype
    # The input pipeline casts floating features (eb.wrap_input_fn), so
    # they arrive in the compute dtype.
    if spec_dtype in casting.FLOATING_DTYPES:
      spec_dtype = dtype
    return tf.compat.v1.placeholder(spec_dtype,
                                    example.batched_shape(batch_size))
  return tf.nest.map_structure(make, specs)


def build_step(builder, features, labels, precision, batch_size, tile=None):
  """Builds one training graph at `batch_size` and optimizes it.

  Args:
    builder: `builder(features, labels, batch_size) -> (loss, train_op)`,
      from `model_fn_step_builder`.
    features: nest of `tf.TensorSpec` or `batch_dim.ExampleSpec` of one
      example.
    labels: the same for one example's labels, or None.
    precision: 'float32' or 'bfloat16'.
    batch_size: int, the batch dimension of the placeholders.
    tile: None, or the TPU tile its variables are padded to.

  Returns:
    A `Build`.
  """
  graph = tf.Graph()
  with graph.as_default():
    dtype = policy.compute_dtype(precision)
    feature_tensors = _placeholders(features, batch_size, dtype)
    label_tensors = (None if labels is None else
                     _placeholders(labels, batch_size, dtype))
    # Built at a small batch to stand for large ones: the weight recast is
    # decided as for a large batch in every build (autocast.weights).
    with autocast_lib.recast_weights_at_any_batch():
      loss, train_op = builder(feature_tensors, label_tensors, batch_size)
  fetches = tuple(t.op if isinstance(t, tf.Tensor) else t
                  for t in (loss, train_op))
  build = Build(graph, fetches, **variable_bytes(graph, tile))
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
