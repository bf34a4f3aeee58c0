"""The options of a wrapped model_fn and of the estimator around it, as values.

`WrapOptions` is the one declaration of the graph audit and the memory
levers: `wrap_model_fn`, `make_tpu_estimator`, `run_program` and the
programs' flags (`run`, `check`, the training CLI) all take it or read their
defaults from it. `EstimatorOptions` holds what `make_tpu_estimator` passes
on to `RunConfig`, `TPUConfig` and the estimator itself. Both check their
fields when they are made, so a bad value fails where it was written:

    options = eb.WrapOptions(audit='warn', gradient_accumulation_steps=4)
    estimator = eb.make_tpu_estimator(
        model_fn, model_dir=..., precision='bfloat16', train_batch_size=1024,
        options=options,
        estimator_options=eb.EstimatorOptions(save_checkpoints_steps=500))
"""

import dataclasses
from typing import Any, Optional, Tuple

from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.compat import config as config_lib
from estimator_bf16.levers import apply
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.precision import casting
from estimator_bf16.safety import audit as audit_lib


def _check_audit(audit):
  if audit not in audit_lib.AUDIT_MODES:
    raise ValueError('audit must be one of %s, got %r.' %
                     (', '.join(repr(a) for a in audit_lib.AUDIT_MODES), audit))


def _exclude_keys(exclude):
  """`exclude` as a tuple of feature keys, as `cast_features` reads it.

  None is no key and a lone string is one key; anything else but strings
  is refused.
  """
  keys = casting.as_keys(exclude)
  if not all(isinstance(key, str) for key in keys):
    raise ValueError('exclude must be a list of feature keys, got %r.' %
                     (exclude,))
  return keys


@dataclasses.dataclass(frozen=True)
class WrapOptions:
  """How a model_fn is wrapped: the audit of its graph and the levers.

  Attributes:
    audit: `'strict'` raises `PrecisionError` on a precision mistake found in
      the TRAIN graph (16-bit variables, a non-float32 loss, mixed-dtype ops,
      less than `audit.MIN_BFLOAT16_SHARE` of matmul/conv FLOPs in
      bfloat16); `'warn'` logs it; `'off'` skips the audit.
    exclude: feature keys that stay as they are (see `cast_features`),
      stored as a tuple of str (a list, one key or None are taken).
    gradient_accumulation_steps: K >= 1. Each update applies the mean
      gradient of K micro-batches (`estimator_bf16.levers`); `global_step`,
      `max_steps` and schedules count updates. Under `wrap_model_fn` alone
      the input_fn's batch is the micro-batch. `make_tpu_estimator` keeps
      `train_batch_size` the update's batch: off a TPU input_fn and
      model_fn see the micro-batch `train_batch_size / K`; with `use_tpu`
      input_fn gets the update's batch per core, and each step of the
      device loop runs the K micro-batches itself
      (`estimator_bf16.levers.device_accumulation`).
    recompute: recompute activations during backprop, segment by segment,
      instead of keeping them (`estimator_bf16.levers.recompute`): a lower
      peak for about one more forward pass.
    kernels: `'auto'` builds the ops whose bfloat16 CPU kernel is slow on
      this CPU kind in float32 from bfloat16 inputs, rounding their results
      (`autocast.cpu_kernels`; never for a TPU, XLA or GPU); `'bfloat16'`
      keeps TensorFlow's own bfloat16 kernels. The audit judges the
      bfloat16 graph either way.

  Raises:
    ValueError: on construction, for a bad value of any field.
  """
  audit: str = audit_lib.AUDIT_MODES[0]
  exclude: Tuple[str, ...] = ()
  gradient_accumulation_steps: int = 1
  recompute: bool = False
  kernels: str = cpu_kernels.KERNEL_CHOICES[0]

  def __post_init__(self):
    _check_audit(self.audit)
    # Frozen: the one normalisation goes through object.__setattr__.
    object.__setattr__(self, 'exclude', _exclude_keys(self.exclude))
    apply.check_levers(self.gradient_accumulation_steps, self.recompute)
    cpu_kernels.parse_kernels(self.kernels)


# The defaults, for flags that must show the same ones.
WRAP_DEFAULTS = WrapOptions()


@dataclasses.dataclass(frozen=True)
class EstimatorOptions:
  """What `make_tpu_estimator` passes on to the estimator and its config.

  Attributes:
    iterations_per_loop: training steps per TPU loop (and per host call).
    num_shards: TPU cores; if None on a TPU, one v2-8/v3-8 board's 8
      (`platform/tpu.py`).
    num_cores_per_replica: cores per model replica (model parallelism).
    tpu_zone, gcp_project: where the TPU is, if not discoverable.
    eval_on_tpu: evaluate on the TPU (True) or on the host CPU.
    export_to_tpu: also export a TPU serving graph.
    save_checkpoints_steps, save_checkpoints_secs, keep_checkpoint_max,
    save_summary_steps, log_step_count_steps, tf_random_seed,
    session_config: as in `RunConfig` (with neither checkpoint interval
      set, a checkpoint every 600 s, as `RunConfig` does).
    backend: `'auto'` (the real TPUEstimator on TensorFlow 2.15, the compat
      one on 2.16+ and under a strategy), `'tf_estimator'` or `'compat'`
      (which also runs on 2.15, e.g. to compare the two).
    numeric_guard: stop training when the loss or a gradient is NaN/Inf,
      before that step's update is applied (`estimator_bf16.safety.guards`);
      `train` then raises `eb.NumericGuardError` naming the step and the
      tensors (TensorFlow's `InvalidArgumentError` is its `__cause__`).

  Raises:
    ValueError: on construction, for an `iterations_per_loop`,
      `num_shards` or `num_cores_per_replica` that is not a positive
      integer. An unknown backend is refused by `make_tpu_estimator`,
      which knows the TensorFlow and strategy it runs with; the other
      fields are checked by `RunConfig`.
  """
  iterations_per_loop: int = 100
  num_shards: Optional[int] = None
  num_cores_per_replica: Optional[int] = None
  tpu_zone: Optional[str] = None
  gcp_project: Optional[str] = None
  eval_on_tpu: bool = True
  export_to_tpu: bool = False
  save_checkpoints_steps: Optional[int] = None
  save_checkpoints_secs: Optional[int] = None
  keep_checkpoint_max: int = 5
  save_summary_steps: int = 100
  log_step_count_steps: int = 100
  tf_random_seed: Optional[int] = None
  session_config: Any = None  # a tf.compat.v1.ConfigProto
  backend: str = backend_lib.AUTO_BACKEND
  numeric_guard: bool = False

  def __post_init__(self):
    config_lib.check_positive('iterations_per_loop',
                              self.iterations_per_loop, allow_none=False)
    config_lib.check_positive('num_shards', self.num_shards)
    config_lib.check_positive('num_cores_per_replica',
                              self.num_cores_per_replica)


# The defaults, for flags that must show the same ones.
ESTIMATOR_DEFAULTS = EstimatorOptions()


# The argument that takes each kind of options, for errors.
_ARGUMENT = {WrapOptions: 'options', EstimatorOptions: 'estimator_options'}


def checked(value, cls):
  """`value` if it is a `cls`, `cls()`'s defaults for None.

  Args:
    value: a `WrapOptions` / `EstimatorOptions`, or None.
    cls: `WrapOptions` or `EstimatorOptions`.

  Raises:
    TypeError: `value` is of another type (a dict, say), naming the
      argument that takes it.
  """
  if value is None:
    return cls()
  if not isinstance(value, cls):
    raise TypeError('%s must be an eb.%s, got %r.' %
                    (_ARGUMENT[cls], cls.__name__, value))
  return value
