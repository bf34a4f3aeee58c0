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

The repair changes modules the package does not own, so it is scoped, not
permanent: `tf_slim_repaired()` applies it (through a `patching.Patcher`)
only while a model_fn builds its graph and only when the program has
imported tf_slim, and the last user's exit puts every swapped attribute
back. Code outside a wrapped model_fn sees TensorFlow and tf-slim as they
are. Nothing is changed where nothing is broken.
"""

import contextlib
import functools
import importlib
import inspect
import sys
import types

from absl import logging
import tensorflow as tf

from estimator_bf16.platform import patching

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
  """Points the broken lazy module at a real one; returns the undo entries."""
  # pylint: disable=g-import-not-at-top
  from tensorflow.python.layers import normalization
  # pylint: enable=g-import-not-at-top
  lazy = normalization.__dict__.get('normalization')
  if lazy is None or type(lazy).__name__ != 'LazyLoader':
    return []  # Already resolved.
  if _importable(_BROKEN_PATH) is not None:
    return []
  for name in (_layers_module(),) + _CANDIDATES:
    module = _importable(name) if name else None
    if module is not None and hasattr(module, 'BatchNormalization'):
      normalization.normalization = module
      logging.debug('tf_slim.batch_norm: using %s (%s does not exist).',
                    name, _BROKEN_PATH)
      return [(normalization, 'normalization', lazy)]
  return []


def _repair_ops_tensor():
  """Gives tf-slim's `ops` users a view with `Tensor`; returns undo entries."""
  undo = []
  for module_name, attribute in _SLIM_OPS_USERS:
    module = sys.modules.get(module_name)
    ops = getattr(module, attribute, None)
    if ops is None or hasattr(ops, 'Tensor'):
      continue
    view = types.ModuleType(ops.__name__, ops.__doc__)
    view.__dict__.update(vars(ops))
    view.Tensor = tf.Tensor
    undo.append((module, attribute, ops))
    setattr(module, attribute, view)
  return undo


def _swap():
  """Applies both repairs; returns the undo list for the Patcher.

  The swaps exist because tf-slim's batch_norm cannot build on TensorFlow
  2.15+ without them (see the module doc); they are undone when the last
  `tf_slim_repaired()` exits.
  """
  for module_name, _ in _SLIM_OPS_USERS:
    _importable(module_name)
  undo = []
  try:
    undo.extend(_repair_normalization())
    undo.extend(_repair_ops_tensor())
  except Exception:
    patching.restore(undo)
    raise
  return undo


_PATCHER = patching.Patcher(_swap)


def tf_slim_loaded():
  """True once the program has imported tf_slim (nothing to repair before)."""
  return 'tf_slim' in sys.modules


@contextlib.contextmanager
def tf_slim_repaired():
  """Inside, `tf_slim.batch_norm` (fused and unfused) works; undone on exit.

  Does nothing unless tf_slim is already imported: a program that never
  imports it has nothing to repair, and this never imports it for them.
  Reentrant and thread-safe: nested and concurrent builds share one set of
  swaps, put back when the last of them exits.
  """
  if not tf_slim_loaded():
    yield
    return
  with _PATCHER.active():
    yield


def with_tf_slim_repaired(fn):
  """`fn`, with the tf-slim repair in force while each call runs.

  Args:
    fn: a model_fn (any callable).

  Returns:
    `fn` itself when tf_slim is not imported; else a function taking the
    same arguments (it shows `fn`'s signature, which Estimators read to
    decide what to pass) that calls `fn` inside `tf_slim_repaired()`.
  """
  if not tf_slim_loaded():
    return fn

  @functools.wraps(fn)
  def repaired(*args, **kwargs):
    with tf_slim_repaired():
      return fn(*args, **kwargs)

  repaired.__signature__ = inspect.signature(fn)
  return repaired
