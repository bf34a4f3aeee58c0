"""estimator_bf16: train unmodified TPUEstimator code in bfloat16.

    import estimator_bf16 as eb
    estimator = eb.make_tpu_estimator(model_fn, precision='bfloat16', ...)
    estimator.train(eb.wrap_input_fn(input_fn, 'bfloat16'), max_steps=1000)

On TensorFlow 2.15 the estimator is the real TPUEstimator; on 2.16+ (no
tf.estimator) it is `estimator_bf16.compat.TPUEstimator` (CPU/GPU only).
Legacy code that names `tf.estimator` itself needs `eb.compat.install()`.
"""

# Before TensorFlow loads: the package's own commands start quiet.
from estimator_bf16 import quiet as _quiet
_quiet.quiet_commands()

# pylint: disable=g-import-not-at-top,wrong-import-position
from estimator_bf16._tf_check import check_tensorflow as _check_tensorflow

BACKEND = _check_tensorflow()

# pylint: disable=g-import-not-at-top,wrong-import-position
from estimator_bf16.adafactor import AdafactorOptimizer
from estimator_bf16.audit import check_graph
from estimator_bf16.audit import GraphReport
from estimator_bf16.audit import MIN_BFLOAT16_SHARE
from estimator_bf16.audit import PrecisionError
from estimator_bf16.autocasting import autocast
from estimator_bf16.autocasting import float32_ops
from estimator_bf16.autocasting import keep_float32
from estimator_bf16.casting import cast_features
from estimator_bf16.casting import to_float32
from estimator_bf16.cpu import native_bfloat16
from estimator_bf16.estimator import make_tpu_estimator
from estimator_bf16.fit import choose_levers
from estimator_bf16.guards import guard_model_fn
from estimator_bf16.guards import NumericGuardError
from estimator_bf16.memory_planner import memory_plan
from estimator_bf16.memory_planner import MemoryPlan
from estimator_bf16.memory_planner import TPU_CORE_BYTES
from estimator_bf16.precision import compute_dtype
from estimator_bf16.precision import PRECISIONS
from estimator_bf16.scope import bfloat16_scope
from estimator_bf16.strategies import make_strategy
from estimator_bf16.wrappers import build_network
from estimator_bf16.wrappers import wrap_input_fn
from estimator_bf16.wrappers import wrap_model_fn
# The compat backend imports nothing from the core above: make_tpu_estimator
# puts the same precision wrappers around either backend's TPUEstimator.
from estimator_bf16 import compat

__version__ = '0.1.0'

__all__ = [
    'AdafactorOptimizer',
    'BACKEND',
    'GraphReport',
    'MIN_BFLOAT16_SHARE',
    'MemoryPlan',
    'NumericGuardError',
    'PRECISIONS',
    'PrecisionError',
    'TPU_CORE_BYTES',
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
