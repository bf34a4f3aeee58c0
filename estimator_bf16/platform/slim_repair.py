"""Repairs that let tf-slim 1.1.0 run on TensorFlow 2.15 and later.

Breaks in tf-slim's use of TensorFlow internals stop every default
`tf_slim.batch_norm` call, and tf-slim's data decoders, in float32 as in
bfloat16:

1. `tf_slim.batch_norm` builds its unfused layer from
   `tensorflow.python.layers.normalization`, which TensorFlow 2.15+ loads
   lazily from `tf_keras.legacy_tf_layers.normalization`. No release has
   that module: TensorFlow 2.15 ships Keras 2 as `keras` (the layer lives in
   `keras.src.legacy_tf_layers`), and tf-keras keeps it in
   `tf_keras.src.legacy_tf_layers`. That lazy module is pointed at the one
   `tf.compat.v1.layers.BatchNormalization` comes from.
2. tf-slim modules read names that TensorFlow's internal modules no longer
   have: `ops.Tensor` and `ops.IndexedSlices` (gone from
   `tensorflow.python.framework.ops` since TensorFlow 2.14; batch_norm's
   fused path, `optimize_loss`, `learning`), and `control_flow_ops.cond`,
   `.case`, `.while_loop` and `.Assert` (moved to modules of their own; the
   image decoder of `tf_slim.data.tfexample_decoder`, which tensorflow/tpu's
   detection programs parse COCO records with, `smart_cond`, streaming
   metrics). Those tf-slim modules get a view of the module that has the
   missing names (their public `tf.compat.v1` twins); TensorFlow's own
   modules are not touched.

The repair changes modules the package does not own, so it is scoped, not
permanent: `tf_slim_repaired()` applies it (through a `patching.Patcher`)
only while a model_fn or an input_fn builds its graph and only when the
program has imported tf_slim, and the last user's exit puts every swapped
attribute back. Code outside a wrapped model_fn or input_fn sees TensorFlow
and tf-slim as they are. Nothing is changed where nothing is broken.
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
# The names tf-slim reads from TensorFlow's internal modules that those
# modules lost, each with its public twin.
_FRAMEWORK_OPS_NAMES = {'Tensor': tf.Tensor,
                        'IndexedSlices': tf.IndexedSlices}
_CONTROL_FLOW_NAMES = {'cond': tf.compat.v1.cond,
                       'case': tf.compat.v1.case,
                       'while_loop': tf.compat.v1.while_loop,
                       'Assert': tf.compat.v1.Assert}
# tf-slim modules, the global name under which each holds a TensorFlow
# module, and the names to give that module's view.
_SLIM_VIEWS = (
    ('tf_slim.layers.utils', 'ops', _FRAMEWORK_OPS_NAMES),
    ('tf_slim.layers.optimizers', 'ops', _FRAMEWORK_OPS_NAMES),
    ('tf_slim.learning', 'ops', _FRAMEWORK_OPS_NAMES),
    ('tf_slim.training.training', 'ops', _FRAMEWORK_OPS_NAMES),
    ('tf_slim.layers.rev_block_lib', 'framework_ops', _FRAMEWORK_OPS_NAMES),
    ('tf_slim.layers.utils', 'control_flow_ops', _CONTROL_FLOW_NAMES),
    ('tf_slim.data.tfexample_decoder', 'control_flow_ops',
     _CONTROL_FLOW_NAMES),
    ('tf_slim.metrics.metric_ops', 'control_flow_ops', _CONTROL_FLOW_NAMES),
    ('tf_slim.metrics.histogram_ops', 'control_flow_ops',
     _CONTROL_FLOW_NAMES),
    ('tf_slim.losses.metric_learning', 'control_flow_ops',
     _CONTROL_FLOW_NAMES),
)


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


def _repair_views():
  """Gives tf-slim modules views with the names they miss; returns undo."""
  undo = []
  for module_name, attribute, names in _SLIM_VIEWS:
    module = sys.modules.get(module_name)
    held = getattr(module, attribute, None)
    if held is None:
      continue
    missing = {name: twin for name, twin in names.items()
               if not hasattr(held, name)}
    if not missing:
      continue
    view = types.ModuleType(held.__name__, held.__doc__)
    view.__dict__.update(vars(held))
    view.__dict__.update(missing)
    undo.append((module, attribute, held))
    setattr(module, attribute, view)
  return undo


def _swap():
  """Applies both repairs; returns the undo list for the Patcher.

  The swaps exist because tf-slim's batch_norm and decoders cannot build
  on TensorFlow 2.15+ without them (see the module doc); they are undone
  when the last `tf_slim_repaired()` exits.
  """
  for module_name, _, _ in _SLIM_VIEWS:
    _importable(module_name)
  undo = []
  try:
    undo.extend(_repair_normalization())
    undo.extend(_repair_views())
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


def with_tf_slim_repaired(fn, signature=None):
  """`fn`, with the tf-slim repair in force while each call runs.

  Args:
    fn: a model_fn or input_fn (any callable).
    signature: the `inspect.Signature` the result shows (Estimators read it
      to decide what to pass); default `fn`'s own.

  Returns:
    `fn` itself when tf_slim is not imported; else a function taking the
    same arguments that calls `fn` inside `tf_slim_repaired()`.
  """
  if not tf_slim_loaded():
    return fn

  @functools.wraps(fn)
  def repaired(*args, **kwargs):
    with tf_slim_repaired():
      return fn(*args, **kwargs)

  repaired.__signature__ = (inspect.signature(fn) if signature is None else
                            signature)
  return repaired
