"""install() / uninstall(): make `tf.estimator` resolve to this backend.

Only an explicit `install()` changes anything. It sets an `estimator`
attribute on TensorFlow's API modules (`tf`, `tf.compat.v1`, `tf.compat.v2`
and the nested `compat` copies), registers `tensorflow.estimator` /
`tensorflow.compat.v1.estimator` (and their `tpu`, `export` submodules) in
`sys.modules` so `import` statements find them, and on TensorFlow 2.16+
points `tf.compat.v1.layers` at tf-keras' legacy layers (TensorFlow routes it
to Keras 3, which has none) and registers stand-ins for the
TensorFlow-internal estimator modules some programs import
(`private_paths`). Every change is recorded with what was there before,
and `uninstall()` puts exactly that back: the changes are a
`patching.Patcher`'s swaps, which `install()` starts and `uninstall()` stops.

TensorFlow's `compat.v1` modules are `TFModuleWrapper`s that keep the value
in three places (the wrapped module, the wrapper's `__dict__`, and a fast
lookup cache), so their undo entries restore all three.
"""

import importlib
import sys
import threading
import types

import tensorflow as tf

from estimator_bf16.compat import config as config_lib
from estimator_bf16.compat import estimator as estimator_lib
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import export as export_lib
from estimator_bf16.compat import keras_estimator
from estimator_bf16.compat import private_paths
from estimator_bf16.compat import tpu_estimator as compat_tpu
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import patching

_LEGACY_LAYERS = 'tf_keras.api._v1.keras.__internal__.legacy.layers'
_TF_KERAS_HINT = (
    'tf.compat.v1.layers needs legacy Keras on TensorFlow 2.16+ (TensorFlow '
    '%s routes it to Keras 3, which has no tf.layers). Install the tf-keras '
    'release matching TensorFlow, e.g. `pip install "tf-keras~=%s.0"` (or '
    '`pip install "estimator_bf16[tf-latest]"`), then call install() again. '
    'Model code written with tf.compat.v1.get_variable needs no tf-keras.')
_HOOKS = ('SessionRunHook', 'SessionRunArgs', 'SessionRunContext',
          'SessionRunValues', 'LoggingTensorHook', 'StopAtStepHook',
          'CheckpointSaverHook', 'CheckpointSaverListener', 'StepCounterHook',
          'SummarySaverHook', 'NanTensorHook', 'NanLossDuringTrainingError',
          'FinalOpsHook', 'FeedFnHook', 'GlobalStepWaiterHook',
          'ProfilerHook', 'SecondOrStepTimer')


def _module(name, doc, **attributes):
  module = types.ModuleType(name, doc)
  for key, value in attributes.items():
    setattr(module, key, value)
  return module


def _build_namespace():
  """The module objects that stand in for tf.estimator and its submodules."""
  export = _module(
      'tensorflow.estimator.export',
      'tf.estimator.export, from estimator_bf16.compat.',
      ExportOutput=export_lib.ExportOutput,
      ClassificationOutput=export_lib.ClassificationOutput,
      RegressionOutput=export_lib.RegressionOutput,
      PredictOutput=export_lib.PredictOutput,
      ServingInputReceiver=export_lib.ServingInputReceiver,
      TensorServingInputReceiver=export_lib.TensorServingInputReceiver,
      build_raw_serving_input_receiver_fn=(
          export_lib.build_raw_serving_input_receiver_fn))
  tpu = _module(
      'tensorflow.estimator.tpu',
      'tf.compat.v1.estimator.tpu, from estimator_bf16.compat.',
      TPUEstimator=compat_tpu.TPUEstimator,
      TPUEstimatorSpec=spec_lib.TPUEstimatorSpec,
      RunConfig=config_lib.TPURunConfig,
      TPUConfig=config_lib.TPUConfig,
      InputPipelineConfig=config_lib.InputPipelineConfig)
  estimator = _module(
      'tensorflow.estimator',
      'tf.estimator for TensorFlow 2.16+, from estimator_bf16.compat.',
      Estimator=estimator_lib.Estimator,
      EstimatorSpec=spec_lib.EstimatorSpec,
      ModeKeys=spec_lib.ModeKeys,
      RunConfig=config_lib.RunConfig,
      export=export, tpu=tpu)
  for name in _HOOKS:
    if hasattr(tf.compat.v1.train, name):
      setattr(estimator, name, getattr(tf.compat.v1.train, name))
  return estimator


class _MissingTfKeras(types.ModuleType):
  """Stands in for tf.compat.v1.layers when tf-keras is not installed."""

  def __getattr__(self, name):
    if name.startswith('__'):
      raise AttributeError(name)
    version = '.'.join(tf.__version__.split('.')[:2])
    raise ImportError(_TF_KERAS_HINT % (tf.__version__, version))


def _legacy_layers():
  try:
    return importlib.import_module(_LEGACY_LAYERS)
  except ImportError:
    return _MissingTfKeras('tensorflow.compat.v1.layers')


def _keras_estimator_modules():
  """The `tf.keras.estimator` modules to give `model_to_estimator`.

  Only where tensorflow_estimator is gone (TensorFlow 2.16+) and tf.keras
  is legacy Keras (tf-keras, TF_USE_LEGACY_KERAS=1): there the module
  exists and its function only raises. Keras 3 has no such module.
  """
  if private_paths.tensorflow_estimator_present():
    return []
  found = []
  for api in (tf.keras, tf.compat.v1.keras):
    try:
      module = getattr(api, 'estimator', None)
    except ImportError:
      module = None
    if isinstance(module, types.ModuleType) and module not in found:
      found.append(module)
  return found


def _api_modules():
  """(module, 'v1' or 'v2') for each TensorFlow API module to patch."""
  found = {}

  def add(module, flavour):
    if module is not None:
      found.setdefault(id(module), (module, flavour))

  add(tf, 'v2')
  for outer in ('v1', 'v2'):
    outer_module = getattr(tf.compat, outer, None)
    add(outer_module, outer)
    for inner in ('v1', 'v2'):
      add(getattr(getattr(outer_module, 'compat', None), inner, None), inner)
  for name, module in list(sys.modules.items()):
    if name.startswith('tensorflow') and name.endswith(('compat.v1',
                                                        'compat.v2')):
      add(module, name[-2:])
  return list(found.values())


def _is_wrapper(module):
  return '_tfmw_wrapped_module' in vars(module)


def _set_attr(module, name, value, undo):
  """Sets `module.name`, first appending how to undo it to `undo`."""
  if _is_wrapper(module):
    undo.append(_wrapper_undo(module, name))
  else:
    undo.append((module, name, vars(module).get(name, patching.MISSING)))
  setattr(module, name, value)


def _wrapper_undo(wrapper, name):
  """Undoes `setattr(wrapper, name, ...)` on a `TFModuleWrapper`.

  `setattr` alone cannot: the wrapper keeps the value in three places, and
  its `__setattr__` also appends new names to its `__all__` list.
  """
  inner = vars(wrapper)['_tfmw_wrapped_module']
  inner_old = vars(inner).get(name, patching.MISSING)
  outer_old = vars(wrapper).get(name, patching.MISSING)
  # pylint: disable=protected-access
  cached = wrapper._fastdict_key_in(name)
  cached_old = wrapper._fastdict_get(name) if cached else patching.MISSING
  # pylint: enable=protected-access
  exported_list = getattr(wrapper, '__all__', None)
  exported = list(exported_list) if isinstance(exported_list, list) else None

  def undo():
    for namespace, old in ((vars(inner), inner_old),
                           (vars(wrapper), outer_old)):
      if old is patching.MISSING:
        namespace.pop(name, None)
      else:
        namespace[name] = old
    # pylint: disable=protected-access
    if cached_old is not patching.MISSING:
      wrapper._fastdict_insert(name, cached_old)
    elif wrapper._fastdict_key_in(name):
      wrapper._fastdict_pop(name)
    # pylint: enable=protected-access
    if exported is not None:
      exported_list[:] = exported
  return undo


def _set_module(name, module, undo):
  """Sets `sys.modules[name]`, first appending how to undo it to `undo`."""
  old = sys.modules.get(name, patching.MISSING)

  def restore():
    if old is patching.MISSING:
      sys.modules.pop(name, None)
    else:
      sys.modules[name] = old
  undo.append(restore)
  sys.modules[name] = module


def _namespace():
  """The stand-in `tf.estimator` module, built once and reused."""
  if _STATE['namespace'] is None:
    _STATE['namespace'] = _build_namespace()
  return _STATE['namespace']


def _swap():
  """Routes TensorFlow's API modules to this backend; the Patcher's apply.

  The swaps exist so that unmodified programs' `tf.estimator` (and, on
  TensorFlow 2.16+, `tf.compat.v1.layers`) resolve; they are undone when
  the Patcher's last user stops (`uninstall()`).

  Returns:
    The undo list (see `patching.restore`).
  """
  namespace = _namespace()
  undo = []
  try:
    layers = (_legacy_layers() if backend_lib.tf_version(tf) >= (2, 16)
              else None)
    for module, flavour in _api_modules():
      _set_attr(module, 'estimator', namespace, undo)
      if layers is not None and flavour == 'v1':
        _set_attr(module, 'layers', layers, undo)
    for prefix in ('tensorflow', 'tensorflow.compat.v1',
                   'tensorflow.compat.v2'):
      _set_module(prefix + '.estimator', namespace, undo)
      _set_module(prefix + '.estimator.tpu', namespace.tpu, undo)
      _set_module(prefix + '.estimator.export', namespace.export, undo)
    # Keras' road to an Estimator, where TensorFlow's only raises.
    for keras_estimator_module in _keras_estimator_modules():
      _set_attr(keras_estimator_module, 'model_to_estimator',
                keras_estimator.model_to_estimator, undo)
    # TensorFlow-internal paths some programs import the Estimator from;
    # only where this TensorFlow has none (2.16+), never over real ones.
    new, attached = private_paths.stand_ins()
    for name, module in new:
      _set_module(name, module, undo)
    for parent, child, module in attached:
      _set_attr(sys.modules[parent], child, module, undo)
  except Exception:
    patching.restore(undo)
    raise
  return undo


_PATCHER = patching.Patcher(_swap)
# `install()` / `uninstall()` are one user of the Patcher, started at most
# once: calling install() again does nothing, and one uninstall() undoes it.
_LOCK = threading.Lock()
_STATE = {'installed': False, 'namespace': None}


def install():
  """Makes `tf.estimator` and `tf.compat.v1.estimator` this backend.

  After it, `from tensorflow.compat.v1 import estimator as tf_estimator`,
  `tf.estimator.tpu.TPUEstimator`, `tf.estimator.export.PredictOutput` and
  the like resolve to `estimator_bf16.compat`. On TensorFlow 2.16+ it also
  points `tf.compat.v1.layers` at tf-keras' legacy layers (or, without
  tf-keras, at a stand-in whose every use raises an ImportError that says
  what to install). Calling it again does nothing.

  Call it before importing modules that bind `tf.estimator` at import
  time. It works on TensorFlow 2.15 too (replacing the real tf.estimator),
  which is how the tests run both backends in one process.

  Returns:
    The module that `tf.estimator` now is.
  """
  with _LOCK:
    if not _STATE['installed']:
      _PATCHER.start()
      _STATE['installed'] = True
    return _namespace()


def uninstall():
  """Undoes `install()`: every module attribute and sys.modules entry it
  changed is as it was before. Does nothing if not installed."""
  with _LOCK:
    if _STATE['installed']:
      _STATE['installed'] = False
      _PATCHER.stop()


def installed():
  """True between `install()` and `uninstall()`."""
  return _STATE['installed']
