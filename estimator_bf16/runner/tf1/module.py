"""`tensorflow` as TF 1.x code sees it, and TF 1.x tensor shapes for it.

`Tf1Module` is what `import tensorflow as tf` gives a TF 1.x program under
`estimator_bf16 run`: `tf.compat.v1` (whose names are the TF 1.x API:
`tf.flags`, `tf.logging`, `tf.gfile`, `tf.train.Optimizer`, ...), plus
`tf.contrib` mapped to its successors (`estimator_bf16.runner.tf1.contrib`).
Anything `tf.compat.v1` lacks falls through to the real module.

TF 1.x shapes: `tensor.shape[-1]` was a `Dimension` (`.value`), where TF 2
gives an int. TensorFlow decides this per process
(`disable_v2_tensorshape`), which would change it for tf-slim, this package
and every library too. `v1_shapes_for(builtins)` decides it per caller
instead: `TensorShape._v2_behavior`, the one property its indexing,
iteration and printing consult, answers False only when the code that
indexed the shape runs in a TF 1.x module.
"""

import contextlib
import sys
import threading
import types

import tensorflow as tf
from tensorflow.python.framework import tensor_shape

from estimator_bf16.platform import patching
from estimator_bf16.runner.tf1 import contrib as contrib_lib


class Tf1Module(types.ModuleType):
  """The `tensorflow` module of TF 1.x code: compat.v1 plus contrib."""

  def __init__(self):
    super().__init__('tensorflow', 'TensorFlow 1.x API (tf.compat.v1 and '
                     'a mapped tf.contrib), from estimator_bf16.')
    self.contrib = contrib_lib.contrib()

  def __getattr__(self, name):
    try:
      return getattr(tf.compat.v1, name)
    except AttributeError:
      return getattr(tf, name)

  def __dir__(self):
    return sorted(set(dir(tf.compat.v1)) | {'contrib'})


# The builtins dicts of TF 1.x modules in force (one per active scope): a
# frame runs TF 1.x code exactly when its builtins are one of them. A tuple,
# replaced under the lock, so the getter reads it without one.
_TF1_BUILTINS = ()
_LOCK = threading.Lock()
_ORIGINAL = tensor_shape.TensorShape.__dict__['_v2_behavior']


def _v2_behavior(shape):
  # Frame 0 is this getter, 1 the TensorShape method that asked
  # (__getitem__, __iter__, __str__, __repr__), 2 the code that called it.
  caller = sys._getframe(2)  # pylint: disable=protected-access
  for builtins in _TF1_BUILTINS:
    if caller.f_builtins is builtins:
      return False
  return _ORIGINAL.fget(shape)


def _swap():
  setattr(tensor_shape.TensorShape, '_v2_behavior', property(_v2_behavior))
  return [(tensor_shape.TensorShape, '_v2_behavior', _ORIGINAL)]


_PATCHER = patching.Patcher(_swap)


@contextlib.contextmanager
def v1_shapes_for(builtins):
  """Inside, code whose frames run on `builtins` sees TF 1.x shapes.

  Args:
    builtins: the `__builtins__` dict of the TF 1.x modules. Everything
      else keeps TensorFlow's own shape behaviour.

  Yields:
    None. The property is put back when the last user leaves.
  """
  global _TF1_BUILTINS
  with _LOCK:
    _TF1_BUILTINS += (builtins,)
  try:
    with _PATCHER.active():
      yield
  finally:
    with _LOCK:
      # By identity: two scopes' builtins dicts are equal as values.
      index = [b is builtins for b in _TF1_BUILTINS].index(True)
      _TF1_BUILTINS = _TF1_BUILTINS[:index] + _TF1_BUILTINS[index + 1:]
