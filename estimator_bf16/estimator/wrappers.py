"""Wrappers that put an unmodified model_fn / input_fn / network in bfloat16."""

import functools

from absl import logging
import tensorflow as tf

from estimator_bf16.autocast import contexts as autocast_lib
from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.compat import calling
from estimator_bf16.estimator import options as options_lib
from estimator_bf16.levers import apply
from estimator_bf16.platform import slim_repair
from estimator_bf16.precision import casting
from estimator_bf16.precision import float32_spec
from estimator_bf16.precision import policy
from estimator_bf16.precision import rounding
from estimator_bf16.precision import scope as scope_lib
from estimator_bf16.safety import audit as audit_lib


def wrap_model_fn(model_fn, precision, options=None):
  """Wraps a legacy model_fn so it computes in `precision`.

  Under `'bfloat16'`, the returned model_fn casts floating features to
  bfloat16 and runs `model_fn` under autocast (`estimator_bf16.autocast`:
  matmul/conv ops in bfloat16 whatever style built them, the float32 list --
  softmax, cross-entropy, reductions, statistics, summaries -- in float32,
  float32 master weights) inside `bfloat16_scope`. The returned spec's loss,
  predictions, export outputs and eval_metrics / host_call tensors are
  float32, with the float32 values of softmax outputs rather than their
  bfloat16 roundings. In TRAIN mode it then audits the graph with
  `check_graph`, requiring `audit.MIN_BFLOAT16_SHARE` of the matmul/conv
  FLOPs in bfloat16.

  Args:
    model_fn: `(features, labels, mode[, params][, config])` returning an
      `EstimatorSpec` or `TPUEstimatorSpec`; left unmodified.
    precision: `'float32'` or `'bfloat16'`.
    options: an `eb.WrapOptions` (the audit mode, feature keys never cast,
      gradient accumulation, recomputation, the CPU kernel choice), or None
      for its defaults. With gradient accumulation the input_fn's batch is
      the micro-batch here; `make_tpu_estimator` divides `train_batch_size`
      for you.

  Returns:
    A model_fn `(features, labels, mode, params, config)`. For `'float32'`
    without levers this is `model_fn` itself: nothing changes (once tf_slim
    is imported, a pass-through that repairs it while `model_fn` runs).

  Raises:
    ValueError: a bad `precision`, or a model_fn signature an Estimator
      cannot call.
    TypeError: `options` is not a `WrapOptions`.
  """
  precision = policy.parse_precision(precision)
  options = options_lib.checked(options, options_lib.WrapOptions)
  audit, kernels = options.audit, options.kernels
  # Inside the precision: the levers' gradients are those of the bfloat16
  # network, and the audit sees the graph they leave.
  model_fn = apply.levers_model_fn(
      model_fn, options.gradient_accumulation_steps, options.recompute)
  accepted = calling.model_fn_arg_names(model_fn)
  # tf_slim.batch_norm is broken on TensorFlow 2.15+ (see platform/slim_repair.py).
  # The repair swaps attributes of tf-slim and TensorFlow modules, so it is
  # scoped to the graph build: in force only while the model_fn runs, in
  # either precision, undone when the last build exits. Without tf_slim
  # imported there is nothing to repair and float32 keeps `model_fn` itself.
  if not precision.bfloat16:
    return slim_repair.with_tf_slim_repaired(model_fn)

  @functools.wraps(model_fn)
  def bfloat16_model_fn(features, labels=None, mode=None, params=None,
                        config=None):
    kwargs = calling.model_fn_kwargs(accepted, labels, mode, params, config)
    with slim_repair.tf_slim_repaired(), autocast_lib.autocast(precision), \
        cpu_kernels.kernels(kernels):
      features = casting.cast_features(features, precision, options.exclude)
      with scope_lib.bfloat16_scope(precision):
        spec = model_fn(features=features, **kwargs)
    # The loss as computed: a float32 loss that TensorFlow's loss code cast
    # back to bfloat16 counts as the float32 loss it is.
    raw_loss = getattr(spec, 'loss', None)
    original = rounding.float32_original(raw_loss)
    if original is not None:
      raw_loss = original
    spec = float32_spec.float32_spec(spec)
    if mode == calling.TRAIN and audit != 'off':
      _audit_train_graph(raw_loss, strict=(audit == 'strict'))
    return spec

  # Estimators read argument names to decide what to pass: show ours (all
  # five), not the wrapped function's.
  del bfloat16_model_fn.__wrapped__
  return bfloat16_model_fn


def _audit_train_graph(loss, strict):
  report = audit_lib.check_graph(
      strict=strict, loss=loss,
      min_bfloat16_share=audit_lib.MIN_BFLOAT16_SHARE)
  for problem in report.problems:
    logging.warning('check_graph: %s', problem)
  logging.info('check_graph: %s', report.summary())


def _is_tensor_like(value):
  return isinstance(value, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor,
                            tf.Variable))


def _has_tensor(structure):
  return any(_is_tensor_like(leaf) for leaf in tf.nest.flatten(structure))


def _cast_input_result(result, precision, exclude):
  """Casts the features of what an input_fn returned; labels are kept."""
  if isinstance(result, tf.data.Dataset):
    spec = result.element_spec
    if isinstance(spec, tuple) and len(spec) == 2:
      return result.map(
          lambda features, labels: (
              casting.cast_features(features, precision, exclude), labels),
          num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return result.map(
        lambda *features: casting.cast_features(
            features[0] if len(features) == 1 else features, precision,
            exclude),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  if isinstance(result, tuple) and len(result) == 2 and _has_tensor(result[0]):
    features, labels = result
    return casting.cast_features(features, precision, exclude), labels
  if _is_tensor_like(result) or (
      isinstance(result, dict) and result and _has_tensor(result)):
    return casting.cast_features(result, precision, exclude)
  raise TypeError(
      'input_fn must return a tf.data.Dataset (of features or of (features, '
      'labels)), a (features, labels) tuple of tensors, or a features tensor '
      'or dict of tensors; got %s. Build the data with tf.data, e.g. '
      'tf.data.Dataset.from_tensor_slices(...).batch(batch_size).' %
      type(result).__name__)


def wrap_input_fn(input_fn, precision, exclude=()):
  """Wraps an input_fn so its floating features arrive in `precision`.

  Args:
    input_fn: called as TPUEstimator calls it (`input_fn(params)`,
      `input_fn()`, or with `mode`/`config`); any callable form (a
      function, `functools.partial`, bound method, callable object). The
      wrapper's signature is `calling.offered_signature(input_fn)`, so
      either backend's Estimator passes it what it would pass `input_fn`.
    precision: `'float32'` or `'bfloat16'`.
    exclude: feature keys that stay as they are.

  Returns:
    An input_fn. Under `'bfloat16'`, a returned `tf.data.Dataset` gets a
    `map` that casts the features (the dataset-parser cast: the infeed
    carries half the bytes); returned tensors are cast directly. Labels are
    never cast. For `'float32'` this is `input_fn` itself, or, once the
    program has imported tf_slim, `input_fn` with tf-slim's repair
    (`platform.slim_repair`) in force while it runs.

  Raises:
    ValueError: bad `precision`.
    TypeError: `input_fn` is not callable, or (when called) returns something
      that is neither a Dataset nor tensors.
  """
  precision = policy.parse_precision(precision)
  signature = calling.offered_signature(input_fn, 'input_fn')
  # tf-slim's data decoders are broken on TensorFlow 2.15+ as its
  # batch_norm is (platform/slim_repair.py): repaired while the input_fn
  # builds, in either precision. Without tf_slim imported, float32 keeps
  # `input_fn` itself.
  if not precision.bfloat16:
    return slim_repair.with_tf_slim_repaired(input_fn, signature)

  @functools.wraps(input_fn)
  def bfloat16_input_fn(*args, **kwargs):
    with slim_repair.tf_slim_repaired():
      result = input_fn(*args, **kwargs)
    return _cast_input_result(result, precision, exclude)

  bfloat16_input_fn.__signature__ = signature
  return bfloat16_input_fn


def build_network(network_fn=None, precision='bfloat16', exclude=()):
  """Runs a network the tensorflow/tpu way: bfloat16 inside, float32 out.

  Usable directly, `logits = eb.build_network(net, 'bfloat16')(images)`, or
  as a decorator, `@eb.build_network(precision='bfloat16')`.

  Args:
    network_fn: a function of tensors building the network; its floating
      arguments (any nesting) are cast to the compute dtype.
    precision: `'float32'` or `'bfloat16'`.
    exclude: dict keys of arguments that are not cast.

  Returns:
    A function with `network_fn`'s arguments whose floating outputs are
    float32; the network itself was built under autocast in
    `bfloat16_scope`. Without `network_fn`, a decorator.
  """
  precision = policy.parse_precision(precision)
  if network_fn is None:
    return functools.partial(build_network, precision=precision,
                             exclude=exclude)
  calling.signature(network_fn, 'network_fn')

  @functools.wraps(network_fn)
  def network_in_precision(*args, **kwargs):
    if not precision.bfloat16:
      return network_fn(*args, **kwargs)
    args = casting.cast_features(args, precision, exclude)
    kwargs = casting.cast_features(kwargs, precision, exclude)
    with autocast_lib.autocast(precision), scope_lib.bfloat16_scope(precision):
      outputs = network_fn(*args, **kwargs)
    return casting.to_float32(outputs)

  return network_in_precision
