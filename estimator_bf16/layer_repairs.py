"""Repairs that let tf-slim 1.1.0 layers run on TensorFlow 2.15 and later.

Two breaks stop every default `tf_slim.batch_norm` call, in float32 as in
bfloat16, so a tf-slim model could not be built at all:

1. `tf_slim.batch_norm` builds its unfused layer from
   `tensorflow.python.layers.normalization`, which TensorFlow 2.15+ loads
   lazily from `tf_keras.legacy_tf_layers.normalization`. No release has
   that module: TensorFlow 2.15 ships Keras 2 as `keras` (the layer lives in
   `keras.src.legacy_tf_layers`), and tf-keras keeps it in
   `tf_keras.src.legacy_tf_layers`. That lazy module is pointed at the one
   `tf.compat.v1.layers.BatchNormalization` comes from.
2. tf-slim's fused path (and `optimize_loss`, `learning`) tests
   `isinstance(x, ops.Tensor)`, but `tensorflow.python.framework.ops` has no
   `Tensor` since TensorFlow 2.14. Those tf-slim modules get a view of `ops`
   that has it (`tf.Tensor`); TensorFlow's own `ops` module is not touched.

`repair_tf_slim()` is idempotent and changes nothing where nothing is broken.
"""

import importlib
import sys
import types

from absl import logging
import tensorflow as tf

_BROKEN_PATH = 'tf_keras.legacy_tf_layers.normalization'
# Where Keras 2 keeps the legacy layer, by distribution.
_CANDIDATES = ('tf_keras.src.legacy_tf_layers.normalization',
               'keras.src.legacy_tf_layers.normalization')
# tf-slim modules and the global name under which each holds TensorFlow's
# `ops` module.
_SLIM_OPS_USERS = (('tf_slim.layers.utils', 'ops'),
                   ('tf_slim.layers.optimizers', 'ops'),
                   ('tf_slim.learning', 'ops'),
                   ('tf_slim.layers.rev_block_lib', 'framework_ops'))
_repaired = False


def _importable(name):
  try:
    return importlib.import_module(name)
  except ImportError:
    return None


def _layers_module():
  """The module of `tf.compat.v1.layers.BatchNormalization`, if it loads."""
  try:
    return tf.compat.v1.layers.BatchNormalization.__module__
  except (AttributeError, ImportError):  # TF 2.16+ without tf-keras.
    return None


def _repair_normalization():
  from tensorflow.python.layers import normalization  # pylint: disable=g-import-not-at-top
  lazy = normalization.__dict__.get('normalization')
  if lazy is None or type(lazy).__name__ != 'LazyLoader':
    return  # Already resolved.
  if _importable(_BROKEN_PATH) is not None:
    return
  for name in (_layers_module(),) + _CANDIDATES:
    module = _importable(name) if name else None
    if module is not None and hasattr(module, 'BatchNormalization'):
      normalization.normalization = module
      logging.debug('tf_slim.batch_norm: using %s (%s does not exist).',
                    name, _BROKEN_PATH)
      return


def _repair_ops_tensor():
  for module_name, attribute in _SLIM_OPS_USERS:
    module = sys.modules.get(module_name)
    ops = getattr(module, attribute, None)
    if ops is None or hasattr(ops, 'Tensor'):
      continue
    view = types.ModuleType(ops.__name__, ops.__doc__)
    view.__dict__.update(vars(ops))
    view.Tensor = tf.Tensor
    setattr(module, attribute, view)


def repair_tf_slim():
  """Makes `tf_slim.batch_norm` (fused and unfused) work; idempotent."""
  global _repaired
  if _repaired:
    return
  if _importable('tf_slim') is None:
    return
  for module_name, _ in _SLIM_OPS_USERS:
    _importable(module_name)
  _repair_normalization()
  _repair_ops_tensor()
  _repaired = True
