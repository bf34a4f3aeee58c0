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
from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.compat import tpu_estimator as compat_tpu
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.estimator import wrappers
from estimator_bf16.levers import accumulation
from estimator_bf16.levers import apply
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import cpu_bfloat16
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


def _positive_int(name, value, allow_none=False):
  if value is None and allow_none:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError('%s must be a positive integer, got %r.' % (name, value))


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


def _micro_batch(train_batch_size, steps, use_tpu, distribute,
                 tpu_replicas=1):
  """The input_fn's global batch: the update's, split over K steps.

  On a TPU the input_fn keeps the update's batch: each step of the
  device's loop splits its core's share into the K micro-batches
  (`levers.device_accumulation`).
  """
  if steps == 1:
    return train_batch_size
  if use_tpu:
    accumulation.micro_batch_size(train_batch_size, steps, tpu_replicas,
                                  'TPU replicas')
    return train_batch_size
  replicas = 1 if distribute is None else distribute.num_replicas_in_sync
  return accumulation.micro_batch_size(train_batch_size, steps, replicas,
                                       'replicas of the strategy')


def make_tpu_estimator(model_fn, *, model_dir, precision, train_batch_size,
                       use_tpu=False, tpu=None, tpu_zone=None,
                       gcp_project=None, eval_batch_size=None,
                       predict_batch_size=None, iterations_per_loop=100,
                       num_shards=None, num_cores_per_replica=None,
                       params=None, export_to_tpu=False,
                       save_checkpoints_steps=None, save_checkpoints_secs=None,
                       keep_checkpoint_max=5, save_summary_steps=100,
                       log_step_count_steps=100, tf_random_seed=None,
                       audit='strict', exclude=(), session_config=None,
                       eval_on_tpu=True, backend=backend_lib.AUTO_BACKEND,
                       numeric_guard=False, distribute=None,
                       gradient_accumulation_steps=1, recompute=False,
                       kernels='auto'):
  """Builds a `TPUEstimator` that runs `model_fn` in `precision`.

  Args:
    model_fn: a legacy model_fn, left unmodified (see `wrap_model_fn`).
    model_dir: checkpoints and summaries go here (a `gs://` path on TPUs).
    precision: `'float32'` or `'bfloat16'`; also given to model_fn and
      input_fn as `params['precision']`.
    train_batch_size: global training batch (all cores, or all replicas of
      `distribute`, together). model_fn and input_fn get the per-core (TPU)
      or per-replica (`distribute`) share as `params['batch_size']`.
    use_tpu: False runs locally on the CPU, with the same model_fn.
    tpu: TPU name or gRPC address (or 'local' on a TPU VM); needed with
      `use_tpu`. The cluster resolver is only created when `use_tpu`.
    tpu_zone, gcp_project: where the TPU is, if not discoverable.
    eval_batch_size, predict_batch_size: global batches for those modes.
    iterations_per_loop: training steps per TPU loop (and per host call).
    num_shards: TPU cores; if None on a TPU, one v2-8/v3-8 board's 8
      (`platform/tpu.py`).
    num_cores_per_replica: cores per model replica (model parallelism).
    params: extra hyperparameters for model_fn/input_fn; the keys
      'batch_size', 'use_tpu' and 'context' are TPUEstimator's own.
    export_to_tpu: also export a TPU serving graph.
    save_checkpoints_steps, save_checkpoints_secs, keep_checkpoint_max,
    save_summary_steps, log_step_count_steps, tf_random_seed,
    session_config: as in `RunConfig`.
    audit: `'strict'`, `'warn'` or `'off'` (see `wrap_model_fn`).
    exclude: feature keys that are never cast.
    eval_on_tpu: evaluate on the TPU (True) or on the host CPU.
    backend: `'auto'` (the real TPUEstimator on TensorFlow 2.15, the compat
      one on 2.16+), `'tf_estimator'` or `'compat'` (which also runs on
      2.15, e.g. to compare the two).
    numeric_guard: stop training when the loss or a gradient is NaN/Inf,
      before that step's update is applied (see `estimator_bf16.safety.guards`).
      `train` then raises `eb.NumericGuardError` naming the step and the
      tensors (TensorFlow's `InvalidArgumentError` is its `__cause__`).
    distribute: None, or a `tf.distribute.MirroredStrategy` (local GPUs or
      logical CPUs) or `MultiWorkerMirroredStrategy` (hosts, TF_CONFIG),
      e.g. from `eb.make_strategy`; needs `use_tpu=False`. Training is then
      data parallel: input_fn runs once per worker (it may take an
      `input_context` argument to shard by worker), model_fn once per
      replica in `precision`, gradients are all-reduced in float32, and
      only the chief writes checkpoints and summaries. Evaluation uses a
      MirroredStrategy too (eval batch per replica likewise); with a
      multi-worker strategy it runs on one device. Predict and export run
      on one device. Uses the compat backend on every TensorFlow version.
    gradient_accumulation_steps: K >= 1. Each optimizer update applies the
      mean gradient of K micro-batches of `train_batch_size / K`, which is
      what input_fn and model_fn see (per core or replica, as
      `params['batch_size']`); `train_batch_size` stays the effective
      batch, and `global_step`, `max_steps` and schedules count updates.
      With `use_tpu` the input_fn gets the update's batch per core, and
      each step of the device loop runs the K micro-batches itself
      (`estimator_bf16.levers.device_accumulation`).
    recompute: recompute activations during backprop, segment by segment,
      instead of keeping them (`estimator_bf16.levers.recompute`): a lower peak
      for about one more forward pass.
    kernels: `'auto'` or `'bfloat16'` (see `wrap_model_fn`): whether ops
      with slow bfloat16 CPU kernels compute in float32 off the TPU.

  Returns:
    A `tf.compat.v1.estimator.tpu.TPUEstimator`, or an
    `estimator_bf16.compat.TPUEstimator` with the same methods.

  Raises:
    ValueError: bad precision, audit, batch sizes, reserved params, a
      missing `tpu` with `use_tpu`, batches not divisible by the replicas,
      an unknown backend, or `use_tpu` with the compat backend (TPUs run
      TensorFlow 2.15), a strategy with `use_tpu` or with
      `backend='tf_estimator'`, or batches not divisible by its replicas;
      a bad `kernels`, K or recompute, or a `train_batch_size` not
      divisible by K x replicas (TPU replicas with `use_tpu`).
  """
  precision = policy.parse_precision(precision)
  apply.check_levers(gradient_accumulation_steps, recompute)
  cpu_kernels.parse_kernels(kernels)
  distribute = compat_distribute.check_strategy(distribute, 'distribute')
  if distribute is not None and use_tpu:
    raise ValueError('distribute=... is for CPUs and GPUs; a TPU runs data '
                     'parallel through TPUEstimator itself (use_tpu=True, '
                     'num_shards), without a strategy.')
  backend, tpu_lib = _tpu_module(backend, distribute)
  _positive_int('train_batch_size', train_batch_size)
  _positive_int('eval_batch_size', eval_batch_size, allow_none=True)
  _positive_int('predict_batch_size', predict_batch_size, allow_none=True)
  _positive_int('iterations_per_loop', iterations_per_loop)
  _positive_int('num_shards', num_shards, allow_none=True)
  _positive_int('num_cores_per_replica', num_cores_per_replica,
                allow_none=True)
  if not model_dir:
    raise ValueError('model_dir is required: checkpoints and summaries go '
                     'there.')
  params = _model_fn_params(params, precision)
  if use_tpu and not tpu:
    raise ValueError("use_tpu=True needs tpu: the TPU's name, address, or "
                     "'local' on a TPU VM.")
  if use_tpu and num_shards is None:
    num_shards = tpu_facts.TPU_CORES_PER_BOARD
  _check_batches(use_tpu, num_shards, num_cores_per_replica, {
      'train_batch_size': train_batch_size,
      'eval_batch_size': eval_batch_size,
      'predict_batch_size': predict_batch_size})
  eval_distribute = _eval_distribute(distribute, train_batch_size,
                                     eval_batch_size)
  micro_batch = _micro_batch(
      train_batch_size, gradient_accumulation_steps, use_tpu, distribute,
      tpu_facts.tpu_replicas(num_shards, num_cores_per_replica))
  if use_tpu and backend == backend_lib.COMPAT_BACKEND:
    # After the argument checks (they hold whatever runs the job), before
    # any TPU resolver is built: fail with the way out.
    raise ValueError(compat_tpu.USE_TPU_MESSAGE % tf.__version__)

  if save_checkpoints_steps is None and save_checkpoints_secs is None:
    # RunConfig's own default; passing both as None would switch
    # checkpointing off entirely, final checkpoint included.
    save_checkpoints_secs = 600
  cluster = None
  if use_tpu:
    cluster = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu, zone=tpu_zone, project=gcp_project)
  tpu_config = tpu_lib.TPUConfig(
      iterations_per_loop=iterations_per_loop,
      num_shards=num_shards,
      num_cores_per_replica=num_cores_per_replica,
      per_host_input_for_training=(
          tpu_lib.InputPipelineConfig.PER_HOST_V2 if use_tpu
          else tpu_lib.InputPipelineConfig.PER_HOST_V1))
  distribute_args = {}
  if distribute is not None:
    distribute_args = dict(train_distribute=distribute,
                           eval_distribute=eval_distribute)
  config = tpu_lib.RunConfig(
      cluster=cluster, **distribute_args,
      model_dir=model_dir,
      save_checkpoints_steps=save_checkpoints_steps,
      save_checkpoints_secs=save_checkpoints_secs,
      keep_checkpoint_max=keep_checkpoint_max,
      save_summary_steps=save_summary_steps,
      log_step_count_steps=log_step_count_steps,
      tf_random_seed=tf_random_seed,
      session_config=session_config,
      tpu_config=tpu_config)
  if not use_tpu and precision.bfloat16:
    cpu_bfloat16.warn_if_emulated(kernels=kernels)  # Once per process.
  if numeric_guard:
    model_fn = guards.guard_model_fn(model_fn)
  estimator = tpu_lib.TPUEstimator(
      model_fn=wrappers.wrap_model_fn(
          model_fn, precision, audit=audit, exclude=exclude,
          gradient_accumulation_steps=gradient_accumulation_steps,
          recompute=recompute, kernels=kernels),
      config=config,
      use_tpu=use_tpu,
      train_batch_size=micro_batch,
      eval_batch_size=eval_batch_size,
      predict_batch_size=predict_batch_size,
      params=params,
      export_to_tpu=export_to_tpu,
      # Without a TPU there is nothing to choose, and TPUEstimator warns
      # that it ignores eval_on_tpu=True.
      eval_on_tpu=eval_on_tpu and use_tpu)
  if numeric_guard:
    guards.raise_guard_errors(estimator)
  return estimator
