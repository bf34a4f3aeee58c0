"""A tf.estimator for TensorFlow 2.16+, where tf.estimator was removed.

    from estimator_bf16 import compat
    compat.install()  # explicit opt-in: tf.estimator now resolves here
    from tensorflow.compat.v1 import estimator as tf_estimator

The classes below have tf.estimator's names, fields and behaviour for local
(CPU/GPU) runs, including `TPUEstimator(use_tpu=False)`. Nothing is
installed implicitly: importing this package changes no TensorFlow module.
"""

from estimator_bf16.compat._install import install
from estimator_bf16.compat._install import installed
from estimator_bf16.compat._install import uninstall
from estimator_bf16.compat.config import InputPipelineConfig
from estimator_bf16.compat.config import RunConfig
from estimator_bf16.compat.config import TPUConfig
from estimator_bf16.compat.config import TPURunConfig
from estimator_bf16.compat.estimator import Estimator
from estimator_bf16.compat.estimator_spec import EstimatorSpec
from estimator_bf16.compat.estimator_spec import ModeKeys
from estimator_bf16.compat.estimator_spec import TPUEstimatorSpec
from estimator_bf16.compat.export import ClassificationOutput
from estimator_bf16.compat.export import ExportOutput
from estimator_bf16.compat.export import PredictOutput
from estimator_bf16.compat.export import RegressionOutput
from estimator_bf16.compat.export import ServingInputReceiver
from estimator_bf16.compat.export import TensorServingInputReceiver
from estimator_bf16.compat.tpu_estimator import TPUEstimator

__all__ = [
    'ClassificationOutput',
    'Estimator',
    'EstimatorSpec',
    'ExportOutput',
    'InputPipelineConfig',
    'ModeKeys',
    'PredictOutput',
    'RegressionOutput',
    'RunConfig',
    'ServingInputReceiver',
    'TPUConfig',
    'TPUEstimator',
    'TPUEstimatorSpec',
    'TPURunConfig',
    'TensorServingInputReceiver',
    'install',
    'installed',
    'uninstall',
]
