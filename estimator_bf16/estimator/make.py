"""make_tpu_estimator: a TPUEstimator around a wrapped model_fn.

Two backends build it. On TensorFlow 2.15, `'tf_estimator'`: the real
`tf.compat.v1.estimator.tpu.TPUEstimator` (the one module that builds it
for the library; `platform/backend.py` only checks that it is there, and
the runner patches the program's own Estimators). On 2.16+, `'compat'`:
`estimator_bf16.compat.TPUEstimator`, the same API on the CPU/GPU. The
precision logic (wrappers) is the same for both.

With `distribute=STRATEGY` (data parallel on GPUs, logical CPUs or hosts)
both TensorFlow versions use the compat backend: TensorFlow 2.15's own
Estimator fails with MirroredStrategy and MultiWorkerMirroredStrategy
(tensorflow#26207, #46556), while the compat backend runs them in graph mode
on 2.15 and on 2.16+ alike (docs/distribute.md).
"""

import types

import tensorflow as tf

from estimator_bf16 import compat
from estimator_bf16.compat import config as config_lib
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.compat import tpu_estimator as compat_tpu
from estimator_bf16.estimator import options as options_lib
from estimator_bf16.estimator import wrappers
from estimator_bf16.levers import accumulation
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import cpu_bfloat16
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.precision import policy
from estimator_bf16.safety import guards

_RESERVED_PARAMS = ('batch_size', 'use_tpu', 'context')
_DEFAULT_BACKEND = backend_lib.check_tensorflow()
# tf.estimator's TPU module, read now: `compat.install()` (which can only run
# after this import) may later make `tf.compat.v1.estimator` point elsewhere.
_TF_ESTIMATOR_TPU = (tf.compat.v1.estimator.tpu
                     if _DEFAULT_BACKEND == backend_lib.ESTIMATOR_BACKEND
                     else None)
# The compat backend's classes, under the names tf.estimator's tpu module
# uses, so both backends are built by the same code below.
_COMPAT_TPU = types.SimpleNamespace(
    TPUEstimator=compat.TPUEstimator, RunConfig=compat.TPURunConfig,
    TPUConfig=compat.TPUConfig, InputPipelineConfig=compat.InputPipelineConfig)


def _tpu_module(backend, distribute=None):
  """The module holding TPUEstimator, RunConfig, TPUConfig for `backend`."""
  if backend == backend_lib.AUTO_BACKEND:
    # Strategies run on the compat backend on every TensorFlow version.
    backend = (backend_lib.COMPAT_BACKEND if distribute is not None
               else _DEFAULT_BACKEND)
  if backend not in backend_lib.BACKENDS:
    raise ValueError('backend must be one of %s, got %r.' % (
        ', '.join(repr(b) for b in (backend_lib.AUTO_BACKEND,) +
                  backend_lib.BACKENDS), backend))
  if backend == backend_lib.ESTIMATOR_BACKEND:
    if _TF_ESTIMATOR_TPU is None:
      raise ValueError(
          "backend='tf_estimator' needs TensorFlow 2.15 (found %s): "
          'tf.estimator was removed in 2.16. Use the default backend.' %
          tf.__version__)
    if distribute is not None:
      raise ValueError(
          "distribute=... needs backend='auto' or 'compat': TensorFlow "
          "2.15's Estimator fails with MirroredStrategy and "
          'MultiWorkerMirroredStrategy (tensorflow#26207, #46556); the '
          'compat backend runs them on TensorFlow 2.15 too.')
    return backend, _TF_ESTIMATOR_TPU
  return backend, _COMPAT_TPU


def _check_batches(use_tpu, num_shards, num_cores_per_replica, batches):
  if not use_tpu:
    return
  for name, batch in batches.items():
    error = None if batch is None else tpu_facts.tpu_batch_error(
        batch, num_shards, num_cores_per_replica)
    if error:
      raise ValueError('%s=%d %s' % (name, batch, error))


def _model_fn_params(params, precision):
  """The model_fn's `params`: the caller's, plus the parsed precision."""
  params = dict(params or {})
  reserved = sorted(set(params) & set(_RESERVED_PARAMS))
  if reserved:
    raise ValueError('params must not set %s: TPUEstimator fills them in.' %
                     ', '.join(reserved))
  params['precision'] = precision
  return params


def _eval_distribute(distribute, train_batch_size, eval_batch_size):
  """The strategy evaluation runs under (None for multi-worker ones).

  Also checks that the batches split evenly over the strategy's replicas.
  """
  if distribute is None:
    return None
  compat_distribute.per_replica_batch(train_batch_size, distribute,
                                      'train_batch_size')
  if compat_distribute.is_multi_worker(distribute):
    return None
  compat_distribute.per_replica_batch(eval_batch_size, distribute,
                                      'eval_batch_size')
  return distribute


def _micro_batch(train_batch_size, steps, use_tpu, distribute, tpu_cores):
  """The input_fn's global batch: the update's, split over K steps.

  On a TPU the input_fn keeps the update's batch: each step of the
  device's loop splits its core's share into the K micro-batches
  (`levers.device_accumulation`). `tpu_cores` is (num_shards,
  num_cores_per_replica).
  """
  if steps == 1:
    return train_batch_size
  if use_tpu:
    accumulation.micro_batch_size(train_batch_size, steps,
                                  tpu_facts.tpu_replicas(*tpu_cores),
                                  'TPU replicas')
    return train_batch_size
  replicas = 1 if distribute is None else distribute.num_replicas_in_sync
  return accumulation.micro_batch_size(train_batch_size, steps, replicas,
                                       'replicas of the strategy')


def _run_config(tpu_lib, model_dir, use_tpu, tpu, distribute,
                eval_distribute, num_shards, estimator_options):
  """The estimator's `RunConfig`, with its `TPUConfig`, for `tpu_lib`.

  `estimator_options` is the `EstimatorOptions` of the estimator.
  """
  save_checkpoints_secs = estimator_options.save_checkpoints_secs
  if (estimator_options.save_checkpoints_steps is None and
      save_checkpoints_secs is None):
    # RunConfig's own default; passing both as None would switch
    # checkpointing off entirely, final checkpoint included.
    save_checkpoints_secs = 600
  cluster = None
  if use_tpu:
    cluster = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu, zone=estimator_options.tpu_zone,
        project=estimator_options.gcp_project)
  tpu_config = tpu_lib.TPUConfig(
      iterations_per_loop=estimator_options.iterations_per_loop,
      num_shards=num_shards,
      num_cores_per_replica=estimator_options.num_cores_per_replica,
      per_host_input_for_training=(
          tpu_lib.InputPipelineConfig.PER_HOST_V2 if use_tpu
          else tpu_lib.InputPipelineConfig.PER_HOST_V1))
  distribute_args = {}
  if distribute is not None:
    distribute_args = dict(train_distribute=distribute,
                           eval_distribute=eval_distribute)
  return tpu_lib.RunConfig(
      cluster=cluster, **distribute_args,
      model_dir=model_dir,
      save_checkpoints_steps=estimator_options.save_checkpoints_steps,
      save_checkpoints_secs=save_checkpoints_secs,
      keep_checkpoint_max=estimator_options.keep_checkpoint_max,
      save_summary_steps=estimator_options.save_summary_steps,
      log_step_count_steps=estimator_options.log_step_count_steps,
      tf_random_seed=estimator_options.tf_random_seed,
      session_config=estimator_options.session_config,
      tpu_config=tpu_config)


def _check_strategy(use_tpu, distribute):
  """`distribute` checked (None, or a strategy for CPUs and GPUs)."""
  distribute = compat_distribute.check_strategy(distribute, 'distribute')
  if distribute is not None and use_tpu:
    raise ValueError('distribute=... is for CPUs and GPUs; a TPU runs data '
                     'parallel through TPUEstimator itself (use_tpu=True, '
                     'num_shards), without a strategy.')
  return distribute


def _check_sizes_and_dir(batches, model_dir):
  """Checks the global batch sizes ({argument name: size}), then model_dir."""
  for name, batch in batches.items():
    config_lib.check_positive(name, batch,
                              allow_none=name != 'train_batch_size')
  if not model_dir:
    raise ValueError('model_dir is required: checkpoints and summaries go '
                     'there.')


def _tpu_shards(use_tpu, tpu, estimator_options, batches):
  """The TPU cores the batches are split over, checked.

  Args:
    use_tpu, tpu: as `make_tpu_estimator` got them.
    estimator_options: the `EstimatorOptions` (num_shards and
      num_cores_per_replica).
    batches: {argument name: global batch size or None}.

  Returns:
    `num_shards`, or one board's cores on a TPU when it is None.
  """
  if use_tpu and not tpu:
    raise ValueError("use_tpu=True needs tpu: the TPU's name, address, or "
                     "'local' on a TPU VM.")
  num_shards = estimator_options.num_shards
  if use_tpu and num_shards is None:
    num_shards = tpu_facts.TPU_CORES_PER_BOARD
  _check_batches(use_tpu, num_shards,
                 estimator_options.num_cores_per_replica, batches)
  return num_shards


def make_tpu_estimator(model_fn, *, model_dir, precision, train_batch_size,
                       eval_batch_size=None, predict_batch_size=None,
                       params=None, use_tpu=False, tpu=None, distribute=None,
                       options=None, estimator_options=None):
  """Builds a `TPUEstimator` that runs `model_fn` in `precision`.

  Args:
    model_fn: a legacy model_fn, left unmodified (see `wrap_model_fn`).
    model_dir: checkpoints and summaries go here (a `gs://` path on TPUs).
    precision: `'float32'` or `'bfloat16'`; also given to model_fn and
      input_fn as `params['precision']`.
    train_batch_size: global training batch (all cores, or all replicas of
      `distribute`, together). model_fn and input_fn get the per-core (TPU)
      or per-replica (`distribute`) share as `params['batch_size']`.
      With gradient accumulation it stays the update's (see `WrapOptions`).
    eval_batch_size, predict_batch_size: global batches for those modes.
    params: extra hyperparameters for model_fn/input_fn; the keys
      'batch_size', 'use_tpu' and 'context' are TPUEstimator's own.
    use_tpu: False runs locally on the CPU, with the same model_fn.
    tpu: TPU name or gRPC address (or 'local' on a TPU VM), for `use_tpu`,
      which alone creates the cluster resolver.
    distribute: None, or a `tf.distribute` strategy from `eb.make_strategy`
      (mirrored over local GPUs or logical CPUs, or multi-worker over hosts
      by TF_CONFIG), for `use_tpu=False`: data parallel on the compat
      backend, gradients all-reduced in float32 (docs/distribute.md).
    options: an `eb.WrapOptions` (audit, exclude, levers, kernels), or
      None for its defaults.
    estimator_options: an `eb.EstimatorOptions` (TPU loop, checkpoints,
      seed, backend, numeric guard, ...), or None for its defaults.

  Returns:
    A `tf.compat.v1.estimator.tpu.TPUEstimator` or, same methods, an
    `estimator_bf16.compat.TPUEstimator`.

  Raises:
    ValueError: a bad precision, batch size or backend; reserved params; a
      missing `tpu` or `model_dir`; batches not divisible by the TPU's or
      the strategy's replicas (x K for training); `use_tpu` with a strategy
      or with the compat backend (TPUs run TensorFlow 2.15).
    TypeError: `options` or `estimator_options` of another type.
  """
  precision = policy.parse_precision(precision)
  options = options_lib.checked(options, options_lib.WrapOptions)
  estimator_options = options_lib.checked(estimator_options,
                                          options_lib.EstimatorOptions)
  distribute = _check_strategy(use_tpu, distribute)
  backend, tpu_lib = _tpu_module(estimator_options.backend, distribute)
  batches = {'train_batch_size': train_batch_size,
             'eval_batch_size': eval_batch_size,
             'predict_batch_size': predict_batch_size}
  _check_sizes_and_dir(batches, model_dir)
  params = _model_fn_params(params, precision)
  num_shards = _tpu_shards(use_tpu, tpu, estimator_options, batches)
  eval_distribute = _eval_distribute(distribute, train_batch_size,
                                     eval_batch_size)
  micro_batch = _micro_batch(
      train_batch_size, options.gradient_accumulation_steps, use_tpu,
      distribute, (num_shards, estimator_options.num_cores_per_replica))
  if use_tpu and backend == backend_lib.COMPAT_BACKEND:
    # After the argument checks (they hold whatever runs the job), before
    # any TPU resolver is built: fail with the way out.
    raise ValueError(compat_tpu.USE_TPU_MESSAGE % tf.__version__)
  config = _run_config(tpu_lib, model_dir, use_tpu, tpu, distribute,
                       eval_distribute, num_shards, estimator_options)
  if not use_tpu and precision.bfloat16:
    cpu_bfloat16.warn_if_emulated(kernels=options.kernels)  # Once a process.
  if estimator_options.numeric_guard:
    model_fn = guards.guard_model_fn(model_fn)
  estimator = tpu_lib.TPUEstimator(
      model_fn=wrappers.wrap_model_fn(model_fn, precision, options),
      config=config, use_tpu=use_tpu, train_batch_size=micro_batch,
      eval_batch_size=eval_batch_size,
      predict_batch_size=predict_batch_size, params=params,
      export_to_tpu=estimator_options.export_to_tpu,
      # Without a TPU there is nothing to choose, and TPUEstimator warns
      # that it ignores eval_on_tpu=True.
      eval_on_tpu=estimator_options.eval_on_tpu and use_tpu)
  if estimator_options.numeric_guard:
    guards.raise_guard_errors(estimator)
  return estimator
