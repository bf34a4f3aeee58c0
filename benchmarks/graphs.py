"""Training-step graphs of the reference models, built the way users build them.

Each benchmark needs the same thing: one model's training step in one
precision and batch size, in its own `tf.Graph` and `tf.compat.v1.Session`,
so the two precisions can live side by side in one process. The step is the
real thing: the unmodified model_fn of `estimator_bf16/models/head.py` around the network
from `estimator_bf16/models/`, wrapped by `eb.wrap_model_fn`, fed by an input_fn wrapped by
`eb.wrap_input_fn` (the bfloat16 cast happens in the input pipeline).

The data are synthetic: the (wrapped) input_fn's first batch is stored in
local variables once, at initialisation, and every step reads it from
there, as a TPU step reads its batch from the infeed buffer in device
memory. So the measured step holds exactly one input batch, in the dtype
the input pipeline produced (bfloat16 images under the wrapper), and neither
the step time nor the allocator peak includes the host-side pipeline, whose
buffering (prefetch, parallel map) is a host concern that differs between
pipelines.
"""

import dataclasses
import importlib
from typing import Any, Callable, Optional

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

import estimator_bf16 as eb
from estimator_bf16.levers import accumulation
from estimator_bf16.models import head
from benchmarks import throughput

_SEED = 1


@dataclasses.dataclass
class TrainStep:
  """A built training step.

  Attributes:
    graph: the `tf.Graph` holding it.
    train_op: the op one training step runs.
    loss: float32 scalar loss.
    batch_size: examples per step (per update, with accumulation).
    report: the `eb.GraphReport` of the graph (ops, casts, bfloat16 FLOPs).
    first_micro_step, micro_step: with gradient accumulation, the ops of
      the first micro-step of an update and of the next K - 2
      (`train_op` is the K-th and the update); None without.
    micro_steps: K, micro-batches per update (1 without accumulation).
  """
  graph: tf.Graph
  train_op: Any
  loss: tf.Tensor
  batch_size: int
  report: Any
  first_micro_step: Any = None
  micro_step: Any = None
  micro_steps: int = 1


def run_update(session, step, **run_kwargs):
  """Runs one update of `step`: its micro-steps, then `train_op`.

  `run_kwargs` (trace options) go to the `train_op` run, the one that
  holds the step's peak: the last micro-batch's activations and the update.
  """
  if step.micro_steps > 1:
    session.run(step.first_micro_step)
  for _ in range(step.micro_steps - 2):
    session.run(step.micro_step)
  return session.run(step.train_op, **run_kwargs)


def _resnet(spec):
  from estimator_bf16.models import resnet  # pylint: disable=g-import-not-at-top
  config = resnet.ResNetConfig(depth=spec.resnet_depth,
                               num_classes=spec.num_classes,
                               image_size=spec.image_size)
  return lambda params: resnet.resnet_v1(config)


def _bert(spec):
  from estimator_bf16.models import bert  # pylint: disable=g-import-not-at-top
  config = bert.BertConfig.preset(spec.bert_preset, vocab_size=spec.vocab_size)
  # BERT requests its variables in an explicit dtype, read from params.
  return lambda params: bert.bert_classifier(
      config, spec.num_classes,
      eb.compute_dtype(params.get('precision', 'float32')))


def _mnist_mlp(spec):
  from estimator_bf16.models import mnist  # pylint: disable=g-import-not-at-top
  config = mnist.MnistConfig(image_size=spec.image_size,
                             num_classes=spec.num_classes)
  return lambda params: mnist.mnist_mlp(config)


def _bert_style(spec):
  """google-research/bert-style code (dtype-less get_variable), BERT-mini."""
  from estimator_bf16.models.styles import bert_style  # pylint: disable=g-import-not-at-top
  config = bert_style.BertStyleConfig(
      vocab_size=spec.vocab_size, hidden_size=256, num_layers=4, num_heads=4,
      intermediate_size=1024, max_positions=spec.seq_length)
  return lambda params: bert_style.classifier_network(config,
                                                      spec.num_classes)


def _mnist_tpu_style(spec):
  """tensorflow/tpu's mnist_tpu.py network, as its model_fn writes it.

  `tf.compat.v1.layers` objects: two 5x5 convolutions of 32 filters with
  2x2 max-pooling, a 1024-wide dense layer, dropout of 0.4 and the logits.
  """
  del spec  # the program's sizes are fixed: 28x28x1 images, 10 classes
  layers = tf.compat.v1.layers

  def network_fn(images, is_training):
    net = images
    for _ in range(2):
      net = layers.Conv2D(filters=32, kernel_size=5, padding='same',
                          activation='relu')(net)
      net = layers.MaxPooling2D(pool_size=(2, 2), strides=(2, 2),
                                padding='same')(net)
    net = layers.Flatten()(net)
    net = layers.Dense(1024, activation='relu')(net)
    net = layers.Dropout(0.4)(net, training=is_training)
    return layers.Dense(10)(net)

  return lambda params: network_fn


def _image_style(module_name):
  """Keras-layers or tf-slim conv nets of estimator_bf16/models/styles, unmodified."""

  def builder(spec):
    del spec  # the style nets size themselves from their input
    module = importlib.import_module('estimator_bf16.models.styles.' + module_name)
    return lambda params: module.network

  return builder


@dataclasses.dataclass(frozen=True)
class Family:
  """One style of model code the benchmark can train.

  Attributes:
    network_builder: `network_builder(spec) -> builder(params) ->
      network_fn(inputs, is_training) -> float logits [batch, classes]`,
      where `inputs` is the image batch, or the features dict of token ids
      for `inputs='tokens'`. The network is written as its users write it:
      the wrapper, not the network, decides the precision.
    inputs: 'image' (float32 [batch, size, size, channels] under the
      feature key 'image') or 'tokens' ('input_ids', 'input_mask',
      'segment_ids', int32 [batch, seq_length], as BERT's run_classifier).
    channels: image channels.
    clip_norm: global gradient-norm clipping of the training step, if any.
  """
  network_builder: Callable
  inputs: str = 'image'
  channels: int = 3
  clip_norm: Optional[float] = None


# `ModelSpec.family` names one of these. A new style of model code is one
# builder function and one entry here, then rows in `configs.py`.
FAMILIES = {
    'resnet': Family(_resnet, inputs='image', channels=3),
    'bert': Family(_bert, inputs='tokens', clip_norm=1.0),
    'mnist_mlp': Family(_mnist_mlp, inputs='image', channels=1),
    'mnist_tpu_style': Family(_mnist_tpu_style, inputs='image', channels=1),
    # Code styles users bring, left as their authors wrote them.
    'bert_style': Family(_bert_style, inputs='tokens', clip_norm=1.0),
    'keras_style': Family(_image_style('keras_style'), inputs='image',
                          channels=3),
    'slim_style': Family(_image_style('slim_style'), inputs='image',
                         channels=3),
}


def family_of(spec):
  """The `Family` of `spec`; a ValueError names the known ones."""
  if spec.family not in FAMILIES:
    raise ValueError('Unknown model family %r; known: %s.' % (
        spec.family, ', '.join(sorted(FAMILIES))))
  return FAMILIES[spec.family]


def network_fn_builder(spec):
  """Returns `builder(params) -> network_fn(inputs, is_training) -> logits`.

  Args:
    spec: a `configs.ModelSpec`.
  """
  return family_of(spec).network_builder(spec)


def model_fn(spec, optimizer=None, network_builder=None):
  """Returns the unmodified legacy model_fn of `spec`.

  Args:
    spec: a `configs.ModelSpec`.
    optimizer: overrides `spec.optimizer` (e.g. 'adafactor').
    network_builder: overrides `network_fn_builder(spec)`; the overhead
      benchmark passes a hand-written bfloat16 network here.
  """
  optimizer = optimizer or spec.optimizer
  family = family_of(spec)
  return head.classifier_model_fn_builder(
      network_builder or network_fn_builder(spec),
      num_classes=spec.num_classes, optimizer=optimizer,
      learning_rate=spec.learning_rate,
      feature_key=None if family.inputs == 'tokens' else 'image',
      clip_norm=family.clip_norm)


def feature_specs(spec, dtype=tf.float32):
  """Returns (features, labels) `tf.TensorSpec`s of one example, no batch.

  Args:
    spec: a `configs.ModelSpec`.
    dtype: dtype of floating features (images).
  """
  labels = tf.TensorSpec([], tf.int32)
  family = family_of(spec)
  if family.inputs == 'tokens':
    ids = tf.TensorSpec([spec.seq_length], tf.int32)
    return {'input_ids': ids, 'input_mask': ids, 'segment_ids': ids}, labels
  return {'image': tf.TensorSpec(
      [spec.image_size, spec.image_size, family.channels], dtype)}, labels


def synthetic_input_fn(spec):
  """Returns `input_fn(params)`: a dataset repeating one random batch.

  Images are float32 as a parser would decode them; the wrapper casts them.
  BERT ids are int32 below the vocabulary size, with real-length masks.
  """

  def input_fn(params):
    batch = params['batch_size']
    feature_spec, _ = feature_specs(spec)

    def make(_):
      labels = tf.random.stateless_uniform(
          [batch], [_SEED, 0], maxval=spec.num_classes, dtype=tf.int32)
      if family_of(spec).inputs == 'tokens':
        shape = [batch, spec.seq_length]
        ids = tf.random.stateless_uniform(shape, [_SEED, 1], minval=1,
                                          maxval=spec.vocab_size,
                                          dtype=tf.int32)
        lengths = tf.random.stateless_uniform(
            [batch, 1], [_SEED, 2], minval=spec.seq_length // 4,
            maxval=spec.seq_length + 1, dtype=tf.int32)
        mask = tf.cast(tf.range(spec.seq_length)[None] < lengths, tf.int32)
        segments = tf.cast(
            tf.range(spec.seq_length)[None] >= lengths // 2, tf.int32) * mask
        return {'input_ids': ids * mask, 'input_mask': mask,
                'segment_ids': segments}, labels
      shape = [batch] + feature_spec['image'].shape.as_list()
      return {'image': tf.random.stateless_uniform(shape, [_SEED, 3])}, labels

    return tf.data.Dataset.range(1).map(make).repeat()

  return input_fn


def _resident(tensor):
  """Stores a batch tensor in a local variable; returns its per-step read."""
  # A bfloat16 batch is kept as its 16-bit pattern: `check_graph` rightly
  # flags bfloat16 variables as misplaced master weights, and this one is
  # data. Bitcast shares the buffer, so it costs neither time nor memory.
  half = tensor.dtype == tf.bfloat16
  variable = tf.compat.v1.Variable(
      tf.bitcast(tensor, tf.uint16) if half else tensor, trainable=False,
      use_resource=True, collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
      name='resident_batch')
  value = variable.read_value()
  return tf.bitcast(value, tf.bfloat16) if half else value


def build_train_step(spec, precision, batch_size, *, optimizer=None,
                     model_fn_override: Optional[Callable] = None,
                     wrap_model=True, wrap_input=True,
                     gradient_accumulation_steps=1, recompute=False):
  """Builds one training step of `spec` in a new graph.

  Args:
    spec: a `configs.ModelSpec`.
    precision: 'float32' or 'bfloat16'.
    batch_size: examples per step.
    optimizer: overrides `spec.optimizer`.
    model_fn_override: a model_fn used instead of `model_fn(spec, ...)`.
    wrap_model: wrap the model_fn with `eb.wrap_model_fn`; False runs it
      as it is (the hand-written reference of the overhead benchmark does
      its own casts).
    wrap_input: wrap the input_fn with `eb.wrap_input_fn`, so bfloat16
      images leave the input pipeline; False feeds float32 images.
    gradient_accumulation_steps: K; the step is one update of `batch_size`
      examples in K micro-batches of `batch_size / K` (needs wrap_model).
    recompute: recompute activations in backprop (needs wrap_model).

  Returns:
    A `TrainStep`.
  """
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(_SEED)
    fn = model_fn_override or model_fn(spec, optimizer)
    input_fn = synthetic_input_fn(spec)
    if wrap_model:
      fn = eb.wrap_model_fn(
          fn, precision,
          eb.WrapOptions(
              gradient_accumulation_steps=gradient_accumulation_steps,
              recompute=recompute))
    if wrap_input:
      input_fn = eb.wrap_input_fn(input_fn, precision)
    micro_batch = accumulation.micro_batch_size(batch_size,
                                                gradient_accumulation_steps)
    params = {'batch_size': micro_batch, 'precision': precision,
              'use_tpu': False}
    batch = input_fn(params).take(1).get_single_element()
    features, labels = tf.nest.map_structure(_resident, batch)
    estimator_spec = fn(features, labels, tf.estimator.ModeKeys.TRAIN,
                        params, None)
    report = eb.check_graph(graph, strict=False, loss=estimator_spec.loss)
    first = graph.get_collection(accumulation.FIRST_MICRO_STEP_COLLECTION)
    rest = graph.get_collection(accumulation.MICRO_STEP_COLLECTION)
  return TrainStep(graph=graph, train_op=estimator_spec.train_op,
                   loss=estimator_spec.loss, batch_size=batch_size,
                   report=report,
                   first_micro_step=first[0] if first else None,
                   micro_step=rest[0] if rest else None,
                   micro_steps=gradient_accumulation_steps)


def memory_session_config():
  """A session config whose step memory is the step's alone.

  TensorFlow's constant folding (grappler's and the classic graph
  optimizer's) turns the zeros that initialise optimizer slots into
  constants that the session keeps for its lifetime, and the first update
  then copies each slot out of that constant: one extra copy of every
  zero-initialised variable stays allocated on the CPU. That is an artifact
  of initialising in a graph-mode session, not part of a training step (and
  not what a TPU core holds), so memory is measured with folding off. The
  throughput sessions keep TensorFlow's defaults.

  The traced step itself runs one op at a time, on the calling thread
  (`memory.peak.traced_run_options`): with several ops in flight the
  executor's order, and with it which tensors are alive together, changes
  with the machine's load (on a 64x64 conv net, 50 to 64 MiB for one
  graph).
  """
  config = tf.compat.v1.ConfigProto()
  config.graph_options.optimizer_options.opt_level = (
      tf.compat.v1.OptimizerOptions.L0)
  config.graph_options.optimizer_options.do_constant_folding = False
  config.graph_options.rewrite_options.constant_folding = (
      rewriter_config_pb2.RewriterConfig.OFF)
  return config


def onednn_rewrite_config(config=None):
  """`config` (or a new ConfigProto) with TensorFlow's bfloat16 rewrite on.

  The peer a user can switch on without code: grappler's
  `auto_mixed_precision_onednn_bfloat16` pass rewrites the float32 graph
  at run time (matmuls and convolutions to bfloat16, softmax and
  reductions following their inputs, variables float32).
  """
  proto = tf.compat.v1.ConfigProto()
  if config is not None:
    proto.CopyFrom(config)
  proto.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 = (
      rewriter_config_pb2.RewriterConfig.ON)
  return proto


def start_session(step, config=None):
  """Returns a session on `step.graph` with every variable initialised."""
  session = tf.compat.v1.Session(graph=step.graph, config=config)
  with step.graph.as_default():
    session.run([tf.compat.v1.global_variables_initializer(),
                 tf.compat.v1.local_variables_initializer()])
  return session


def time_train_steps(steps, *, session_configs=None, warmup_steps,
                     window_steps, windows):
  """Times training steps in sessions of their own, in alternating windows.

  Args:
    steps: dict {name: `TrainStep`}, two or more, in window order;
      two names may share a step (each gets its own session).
    session_configs: dict {name: ConfigProto} for the sessions that need
      one (e.g. `onednn_rewrite_config()`); others get defaults.
    warmup_steps, window_steps, windows: see
      `throughput.alternating_windows`.

  Returns:
    What `throughput.alternating_windows` returns, the sessions closed.
  """
  session_configs = session_configs or {}
  sessions = {}
  try:
    for name, step in steps.items():
      sessions[name] = start_session(step, session_configs.get(name))
    variants = {
        name: (lambda s=sessions[name], t=step: run_update(s, t),
               step.batch_size)
        for name, step in steps.items()}
    return throughput.alternating_windows(
        variants, warmup_steps=warmup_steps, window_steps=window_steps,
        windows=windows)
  finally:
    for session in sessions.values():
      session.close()
