"""`tensorflow` as TF 1.x code sees it, and TF 1.x tensor shapes for it.

`Tf1Module` is what `import tensorflow as tf` gives a TF 1.x program under
`estimator_bf16 run`: `tf.compat.v1` (whose names are the TF 1.x API:
`tf.flags`, `tf.logging`, `tf.gfile`, `tf.train.Optimizer`, ...), plus
`tf.contrib` mapped to its successors (`estimator_bf16.runner.tf1.contrib`).
Anything `tf.compat.v1` lacks falls through to the real module. Its
`compat.v1` is itself, as TF 1.15's had contrib.

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
import types

import tensorflow as tf
from tensorflow.python.framework import tensor_shape

from estimator_bf16.platform import patching
from estimator_bf16.runner.tf1 import contrib as contrib_lib


class _Tf1Compat(types.ModuleType):
  """`tf.compat` of TF 1.x code: `v1` is that code's `tensorflow` again."""

  def __init__(self, tf1):
    super().__init__('tensorflow.compat', 'tf.compat, with v1 the TF 1.x '
                     'API of estimator_bf16 (tf.compat.v1 and tf.contrib).')
    # TF 1.15 code reaches contrib through `tensorflow.compat.v1`.
    self.v1 = tf1

  def __getattr__(self, name):
    return getattr(tf.compat, name)


class Tf1Module(types.ModuleType):
  """The `tensorflow` module of TF 1.x code: compat.v1 plus contrib."""

  def __init__(self):
    super().__init__('tensorflow', 'TensorFlow 1.x API (tf.compat.v1 and '
                     'a mapped tf.contrib), from estimator_bf16.')
    self.contrib = contrib_lib.contrib()
    self.compat = _Tf1Compat(self)

  def __getattr__(self, name):
    try:
      return getattr(tf.compat.v1, name)
    except AttributeError:
      return getattr(tf, name)

  def __dir__(self):
    return sorted(set(dir(tf.compat.v1)) | {'contrib', 'compat'})


def _v1_shapes_property(original):
  """`_v2_behavior` answering False for TF 1.x code, else as `original`.

  Args:
    original: what the class held when the swap is applied (TensorFlow's
      property, or a stand-in installed before), asked for everything else.
  """

  def _v2_behavior(shape):
    # Frame 0 is this getter, 1 the TensorShape method that asked
    # (__getitem__, __iter__, __str__, __repr__), 2 the code that called it.
    caller = sys._getframe(2)  # pylint: disable=protected-access
    # The builtins dicts of the TF 1.x modules in force, one per active
    # `v1_shapes_for`: a frame runs TF 1.x code exactly when its builtins
    # are one of them.
    for builtins in _PATCHER.users:
      if caller.f_builtins is builtins:
        return False
    if hasattr(original, '__get__'):
      return original.__get__(shape, type(shape))
    return original

  return property(_v2_behavior)


def _swap():
  owner = tensor_shape.TensorShape
  original = vars(owner)['_v2_behavior']
  setattr(owner, '_v2_behavior', _v1_shapes_property(original))
  return [(owner, '_v2_behavior', original)]


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
  # Matched by identity: two scopes' builtins dicts are equal as values.
  with _PATCHER.active(builtins):
    yield
