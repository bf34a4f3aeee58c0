"""Loss functions TensorFlow writes as several ops, computed whole in float32.

`tf.nn.sigmoid_cross_entropy_with_logits`, `weighted_cross_entropy_with_logits`,
`reduce_logsumexp` and `tf.compat.v1.losses`' `sigmoid_cross_entropy` and
`softmax_cross_entropy` are Python functions over elementwise ops. Op by op,
autocast would compute their elementwise terms in bfloat16 and their
`log1p` or `log` in float32: a rounding to bfloat16 inside the loss, between
float32 ops. Under autocast, each call casts its 16-bit tensor arguments to
float32 and builds the function with the rules suspended, so the loss is
computed in float32 and is float32, as the float32 list's ops are
(`float32_list`). The gradient reaches the bfloat16 logits through the
casts.

The functions are swapped where TensorFlow's modules hold them (their own
module, `tensorflow.python.ops.nn`, the public `tf.nn`, `tf.math`, ...),
together with autocast's other swaps (`contexts`), and put back with them.
A call on a thread outside autocast builds TensorFlow's function as it is.
"""

import functools
import sys

import tensorflow as tf
from tensorflow.python.ops import math_ops
from tensorflow.python.ops import nn_impl
from tensorflow.python.ops.losses import losses_impl

from estimator_bf16.autocast import state
from estimator_bf16.precision import rounding

# The functions computed whole in float32, by their owner and name. The v2
# sigmoid and v1 weighted cross-entropies and v1 reduce_logsumexp call
# these through their module's globals, so the swap covers them too.
# `tf.compat.v1.losses`' sigmoid and softmax cross-entropies are whole too:
# they cast the labels to the logits' dtype and smooth them there
# (`label_smoothing`), which in bfloat16 rounds the smoothed labels.
_COMPOSITES = ((nn_impl, 'sigmoid_cross_entropy_with_logits'),
               (nn_impl, 'weighted_cross_entropy_with_logits_v2'),
               (math_ops, 'reduce_logsumexp'),
               (losses_impl, 'sigmoid_cross_entropy'),
               (losses_impl, 'softmax_cross_entropy'))
# The names TensorFlow's modules hold them under (the public API exports
# the v2 weighted cross-entropy without its suffix).
_EXPORTED_NAMES = ('sigmoid_cross_entropy_with_logits',
                   'weighted_cross_entropy_with_logits',
                   'weighted_cross_entropy_with_logits_v2',
                   'reduce_logsumexp', 'sigmoid_cross_entropy',
                   'softmax_cross_entropy')


def _as_float32(value):
  """A 16-bit floating tensor cast to float32; anything else as it is."""
  if (isinstance(value, (tf.Tensor, tf.Variable)) and
      value.dtype.base_dtype in rounding.HALF_DTYPES):
    return tf.cast(value, tf.float32)
  return value


def _in_float32(original):
  """`original`, built in float32 while autocast is in force on this thread."""

  @functools.wraps(original)
  def in_float32(*args, **kwargs):
    if state.STATE.busy or state.STATE.mode() is None:
      return original(*args, **kwargs)
    args, kwargs = tf.nest.map_structure(_as_float32, (args, kwargs))
    # 'off' suspends the rules for the function's own ops: all of them get
    # float32 inputs and stay float32.
    state.STATE.modes.append('off')
    try:
      return original(*args, **kwargs)
    finally:
      state.STATE.modes.pop()

  return in_float32


def swap():
  """Swaps every TensorFlow module's reference; returns the undo entries.

  Called by `contexts` when autocast's swap is applied: a list of
  `(owner, name, original)` for `patching.restore`.
  """
  originals = {}
  for owner, name in _COMPOSITES:
    original = getattr(owner, name)
    originals[id(original)] = (original, _in_float32(original))
  undo = []
  # TensorFlow's modules, the lazily loaded public ones included, as they
  # are now: a module imported later in the build is not swapped (its
  # functions still reach the swapped globals above).
  for module_name, module in list(sys.modules.items()):
    if not module_name.startswith('tensorflow') or module is None:
      continue
    names = getattr(module, '__dict__', {})
    for name in _EXPORTED_NAMES:
      value = names.get(name)
      if value is not None and id(value) in originals:
        original, replacement = originals[id(value)]
        undo.append((module, name, original))
        setattr(module, name, replacement)
  return undo
