"""TensorFlow-internal estimator module paths, for programs that import them.

Programs written for TensorFlow 1.x and 2.x up to 2.15 sometimes import the
Estimator from where it was implemented rather than from `tf.estimator`:

    from tensorflow.python.estimator import estimator
    step = estimator._load_global_step_from_checkpoint_dir(FLAGS.model_dir)
    from tensorflow_estimator.python.estimator.tpu import tpu_config

tensorflow/tpu's resnet, mnasnet, efficientnet, dcgan and deeplab programs
do the former; its mask_rcnn export the latter. Both paths left TensorFlow
with tf.estimator (2.16), so those programs stop at their imports there.
This module builds stand-ins for those modules holding their *public*
contents (what `tf.estimator` also exports) plus the one private function
such programs call; any other name raises an AttributeError that says the
name is not provided, rather than a bare "has no attribute".

`stand_ins()` returns them by dotted name; `_install` registers them in
`sys.modules` only where TensorFlow has no such module (never over the real
ones of TensorFlow 2.15).
"""

import importlib.machinery
import importlib.util
import types

import tensorflow as tf

from estimator_bf16.compat import checkpoints
from estimator_bf16.compat import config as config_lib
from estimator_bf16.compat import estimator as estimator_lib
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import tpu_estimator as compat_tpu

# The package roots the stand-ins live under: TensorFlow's own (up to 2.15
# a re-export of tensorflow_estimator) and tensorflow_estimator's.
ROOTS = ('tensorflow.python.estimator', 'tensorflow_estimator.python.estimator')


class _PrivateModule(types.ModuleType):
  """A module whose missing names say what the stand-in is."""

  def __getattr__(self, name):
    if name.startswith('__'):
      raise AttributeError(name)
    public = sorted(n for n in vars(self) if not n.startswith('__'))
    raise AttributeError(
        '%s.%s: this TensorFlow-internal name left TensorFlow with '
        'tf.estimator (2.16), and estimator_bf16.compat provides only %s '
        'here. Use the public tf.compat.v1.estimator name instead.' %
        (self.__name__, name, ', '.join(public) or 'submodules'))


def _load_global_step_from_checkpoint_dir(checkpoint_dir):
  """The global step of the newest checkpoint in `checkpoint_dir`, else 0.

  What tensorflow_estimator's private function of this name returns: 0 for
  a folder with no checkpoint (or none at all).
  """
  try:
    return checkpoints.checkpoint_step(checkpoint_dir)
  except (ValueError, OSError, KeyError, tf.errors.OpError):
    return 0


def _contents():
  """{module path under a root: {name: value}} of the stand-ins."""
  return {
      '': {},
      'estimator': {
          'Estimator': estimator_lib.Estimator,
          '_load_global_step_from_checkpoint_dir':
              _load_global_step_from_checkpoint_dir,
      },
      'model_fn': {
          'EstimatorSpec': spec_lib.EstimatorSpec,
          'ModeKeys': spec_lib.ModeKeys,
      },
      'mode_keys': {'ModeKeys': spec_lib.ModeKeys},
      'run_config': {'RunConfig': config_lib.RunConfig},
      'tpu': {},
      'tpu.tpu_config': {
          'RunConfig': config_lib.TPURunConfig,
          'TPUConfig': config_lib.TPUConfig,
          'InputPipelineConfig': config_lib.InputPipelineConfig,
      },
      'tpu.tpu_estimator': {
          'TPUEstimator': compat_tpu.TPUEstimator,
          'TPUEstimatorSpec': spec_lib.TPUEstimatorSpec,
      },
  }


def _packages_above(path):
  """'a.b.c' -> ['a', 'a.b']."""
  parts = path.split('.')
  return ['.'.join(parts[:i]) for i in range(1, len(parts))]


def _exists(path):
  """Whether `path` is a real module (the stand-ins have no loader)."""
  try:
    spec = importlib.util.find_spec(path)
  except (ImportError, ValueError):
    return False
  return spec is not None and spec.loader is not None


def tensorflow_estimator_present():
  """Whether the real tensorflow_estimator is installed (TensorFlow <= 2.15)."""
  return _exists('tensorflow_estimator')


def stand_ins(roots=None):
  """The stand-ins to register where TensorFlow has no such modules.

  Args:
    roots: iterable of str, a subset of `ROOTS`; default: those this
      TensorFlow installation lacks (none on TensorFlow 2.15).

  Returns:
    (new, attached): `new` is a list of (dotted name, module) for
    `sys.modules`, parents before children; `attached` is a list of
    (existing module name, attribute, module) for stand-ins whose parent is
    a real module (`tensorflow.python`), so `tensorflow.python.estimator`
    also resolves as an attribute.
  """
  if roots is None:
    roots = [root for root in ROOTS if not _exists(root)]
  built = {}
  for root in roots:
    for suffix, names in _contents().items():
      path = root + '.' + suffix if suffix else root
      for name in _packages_above(path) + [path]:
        if name not in built and (name.startswith(root) or not _exists(name)):
          built[name] = _PrivateModule(
              name, 'A stand-in from estimator_bf16.compat (see '
              'estimator_bf16/compat/private_paths.py).')
          # A package: its submodules are found in sys.modules. A spec
          # without a loader, so find_spec() answers for it (and `_exists`
          # tells it from a real module).
          built[name].__path__ = []
          built[name].__spec__ = importlib.machinery.ModuleSpec(
              name, None, is_package=True)
      for key, value in names.items():
        setattr(built[path], key, value)
  attached = []
  for name in sorted(built):
    parent, _, child = name.rpartition('.')
    if parent in built:
      setattr(built[parent], child, built[name])
    elif parent:
      attached.append((parent, child, built[name]))
  return sorted(built.items()), attached
