"""install() / uninstall(): make `tf.estimator` resolve to this backend.

Only an explicit `install()` changes anything. It sets an `estimator`
attribute on TensorFlow's API modules (`tf`, `tf.compat.v1`, `tf.compat.v2`
and the nested `compat` copies), registers `tensorflow.estimator` /
`tensorflow.compat.v1.estimator` (and their `tpu`, `export` submodules) in
`sys.modules` so `import` statements find them, and on TensorFlow 2.16+
points `tf.compat.v1.layers` at tf-keras' legacy layers (TensorFlow routes it
to Keras 3, which has none). Every change is journaled with what was there
before, and `uninstall()` puts exactly that back.

TensorFlow's `compat.v1` modules are `TFModuleWrapper`s that keep the value
in three places (the wrapped module, the wrapper's `__dict__`, and a fast
lookup cache), so the journal records and restores all three.
"""

import importlib
import sys
import threading
import types

import tensorflow as tf

from estimator_bf16 import _tf_check
from estimator_bf16.compat import config as config_lib
from estimator_bf16.compat import estimator as estimator_lib
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import export as export_lib
from estimator_bf16.compat import tpu_estimator as tpu_lib

_MISSING = object()
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
      TPUEstimator=tpu_lib.TPUEstimator,
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


class _Journal(object):
  """Remembers every attribute and sys.modules entry it changes."""

  def __init__(self):
    self._undo = []

  def set_attr(self, module, name, value):
    if _is_wrapper(module):
      self._undo.append(self._wrapper_undo(module, name))
    else:
      self._undo.append(self._plain_undo(module, name))
    setattr(module, name, value)

  @staticmethod
  def _plain_undo(module, name):
    old = vars(module).get(name, _MISSING)

    def undo():
      if old is _MISSING:
        vars(module).pop(name, None)
      else:
        setattr(module, name, old)
    return undo

  @staticmethod
  def _wrapper_undo(wrapper, name):
    inner = vars(wrapper)['_tfmw_wrapped_module']
    inner_old = vars(inner).get(name, _MISSING)
    outer_old = vars(wrapper).get(name, _MISSING)
    # pylint: disable=protected-access
    cached = wrapper._fastdict_key_in(name)
    cached_old = wrapper._fastdict_get(name) if cached else _MISSING
    # pylint: enable=protected-access
    # The wrapper's __setattr__ appends new names to its __all__ list.
    exported_list = getattr(wrapper, '__all__', None)
    exported = list(exported_list) if isinstance(exported_list, list) else None

    def undo():
      for namespace, old in ((vars(inner), inner_old),
                             (vars(wrapper), outer_old)):
        if old is _MISSING:
          namespace.pop(name, None)
        else:
          namespace[name] = old
      # pylint: disable=protected-access
      if cached_old is not _MISSING:
        wrapper._fastdict_insert(name, cached_old)
      elif wrapper._fastdict_key_in(name):
        wrapper._fastdict_pop(name)
      # pylint: enable=protected-access
      if exported is not None:
        exported_list[:] = exported
    return undo

  def set_module(self, name, module):
    old = sys.modules.get(name, _MISSING)

    def undo():
      if old is _MISSING:
        sys.modules.pop(name, None)
      else:
        sys.modules[name] = old
    self._undo.append(undo)
    sys.modules[name] = module

  def rollback(self):
    while self._undo:
      self._undo.pop()()


_LOCK = threading.Lock()
_STATE = {'journal': None, 'namespace': None}


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
    if _STATE['namespace'] is None:
      _STATE['namespace'] = _build_namespace()
    namespace = _STATE['namespace']
    if _STATE['journal'] is not None:
      return namespace
    journal = _Journal()
    try:
      layers = (_legacy_layers() if _tf_check.tf_version(tf) >= (2, 16)
                else None)
      for module, flavour in _api_modules():
        journal.set_attr(module, 'estimator', namespace)
        if layers is not None and flavour == 'v1':
          journal.set_attr(module, 'layers', layers)
      for prefix in ('tensorflow', 'tensorflow.compat.v1',
                     'tensorflow.compat.v2'):
        journal.set_module(prefix + '.estimator', namespace)
        journal.set_module(prefix + '.estimator.tpu', namespace.tpu)
        journal.set_module(prefix + '.estimator.export', namespace.export)
    except Exception:
      journal.rollback()
      raise
    _STATE['journal'] = journal
    return namespace


def uninstall():
  """Undoes `install()`: every module attribute and sys.modules entry it
  changed is as it was before. Does nothing if not installed."""
  with _LOCK:
    journal, _STATE['journal'] = _STATE['journal'], None
    if journal is not None:
      journal.rollback()


def installed():
  """True between `install()` and `uninstall()`."""
  return _STATE['journal'] is not None
