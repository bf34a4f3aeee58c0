"""estimator_bf16: train unmodified TPUEstimator code in bfloat16.

    import estimator_bf16 as eb
    estimator = eb.make_tpu_estimator(model_fn, precision='bfloat16', ...)
    estimator.train(eb.wrap_input_fn(input_fn, 'bfloat16'), max_steps=1000)

On TensorFlow 2.15 the estimator is the real TPUEstimator; on 2.16+ (no
tf.estimator) it is `estimator_bf16.compat.TPUEstimator` (CPU/GPU only).
Legacy code that names `tf.estimator` itself needs `eb.compat.install()`.
"""

# Before TensorFlow loads: the package's own commands start quiet.
from estimator_bf16.platform import quiet as _quiet
_quiet.quiet_commands()
with _quiet.loading_noise_hidden():
  import tensorflow as _tensorflow  # pylint: disable=g-import-not-at-top,unused-import

# pylint: disable=g-import-not-at-top,wrong-import-position
from estimator_bf16.platform.backend import check_tensorflow as _check_tensorflow

BACKEND = _check_tensorflow()

# pylint: disable=g-import-not-at-top,wrong-import-position
from estimator_bf16.autocast.contexts import autocast
from estimator_bf16.autocast.contexts import float32_ops
from estimator_bf16.autocast.contexts import keep_float32
from estimator_bf16.distribute.strategies import make_strategy
from estimator_bf16.estimator.make import make_tpu_estimator
from estimator_bf16.estimator.options import EstimatorOptions
from estimator_bf16.estimator.options import WrapOptions
from estimator_bf16.platform.tpu import TPU_CORE_BYTES
from estimator_bf16.estimator.wrappers import build_network
from estimator_bf16.estimator.wrappers import wrap_input_fn
from estimator_bf16.estimator.wrappers import wrap_model_fn
from estimator_bf16.memory.fit import choose_levers
from estimator_bf16.memory.planner import memory_plan
from estimator_bf16.memory.planner import MemoryPlan
from estimator_bf16.optimizers.adafactor import AdafactorOptimizer
from estimator_bf16.platform.cpu_bfloat16 import native_bfloat16
from estimator_bf16.safety.audit import check_graph
from estimator_bf16.safety.audit import GraphReport
from estimator_bf16.safety.audit import MIN_BFLOAT16_SHARE
from estimator_bf16.safety.audit import PrecisionError
from estimator_bf16.precision.casting import cast_features
from estimator_bf16.precision.casting import to_float32
from estimator_bf16.precision.policy import compute_dtype
from estimator_bf16.precision.policy import PRECISIONS
from estimator_bf16.precision.scope import bfloat16_scope
from estimator_bf16.safety.guards import guard_model_fn
from estimator_bf16.safety.guards import NumericGuardError
# The compat backend imports nothing from the core above: make_tpu_estimator
# puts the same precision wrappers around either backend's TPUEstimator.
from estimator_bf16 import compat

__version__ = '0.1.0'

__all__ = [
    'AdafactorOptimizer',
    'BACKEND',
    'EstimatorOptions',
    'GraphReport',
    'MIN_BFLOAT16_SHARE',
    'MemoryPlan',
    'NumericGuardError',
    'PRECISIONS',
    'PrecisionError',
    'TPU_CORE_BYTES',
    'WrapOptions',
    'autocast',
    'bfloat16_scope',
    'build_network',
    'cast_features',
    'check_graph',
    'choose_levers',
    'compat',
    'compute_dtype',
    'float32_ops',
    'guard_model_fn',
    'keep_float32',
    'make_strategy',
    'make_tpu_estimator',
    'memory_plan',
    'native_bfloat16',
    'to_float32',
    'wrap_input_fn',
    'wrap_model_fn',
]
