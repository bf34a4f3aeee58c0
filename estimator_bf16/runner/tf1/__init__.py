"""TF 1.x programs (`import tensorflow as tf`, `tf.contrib`) under `run`.

`detect` decides from the source whether a program is TF 1.x code;
`Tf1Scope` gives its modules, and only them, the TF 1.x `tensorflow`
(`tf.compat.v1`, TF 1.x shapes, and `tf.contrib` mapped to its successors
by the table in `contrib.CONTRIB`).
"""

from estimator_bf16.runner.tf1.contrib import CONTRIB
from estimator_bf16.runner.tf1.contrib import coverage_markdown
from estimator_bf16.runner.tf1.contrib import UnmappedContribError
from estimator_bf16.runner.tf1.detect import detect
from estimator_bf16.runner.tf1.detect import Detection
from estimator_bf16.runner.tf1.scope import Tf1Scope

__all__ = [
    'CONTRIB',
    'Detection',
    'Tf1Scope',
    'UnmappedContribError',
    'coverage_markdown',
    'detect',
]
