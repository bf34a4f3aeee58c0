"""`tf.cond` (control flow v2) returns float32 where its branches computed it.

A loss from `tf.compat.v1.losses` is computed in float32 and cast back to
the logits' dtype by TensorFlow's own code; autocast remembers that cast as
a rounding (`precision.rounding`), and whatever reads it in the same graph
reads the float32 value instead. A branch of a v2 `tf.cond` is a graph of
its own, so its output was the rounding itself: the cond's result, the
loss of a model_fn that picks its loss with a cond, was bfloat16 (and a
cond whose other branch computed float32 by hand failed with "true_fn and
false_fn arguments to tf.cond must have the same ... type").

While autocast is on, each branch's outputs that are such roundings are
returned as their float32 originals. The true branch is traced first; where
it returned float32 (such an original, or a loss computed whole in float32,
`composites`), the false branch's output at that place is returned in
float32 too (its original, or a cast), and where it returned bfloat16, a
float32 output of the false branch is rounded to it, so that both branches
agree. Control flow v1 (TF 1.x programs) builds its branches in the outer
graph, where the rounding is found anyway.
"""

import tensorflow as tf

from estimator_bf16.autocast import state
from estimator_bf16.precision import rounding


def _exact(value):
  """`value`'s float32 original if it is a remembered rounding, else None."""
  if isinstance(value, tf.Tensor) and value.dtype in rounding.HALF_DTYPES:
    return rounding.exact_float32(value)
  return None


def _in_float32(value):
  """`value` in float32: its float32 original, or a cast of a 16-bit tensor."""
  exact = _exact(value)
  if exact is not None:
    return exact
  if isinstance(value, tf.Tensor) and value.dtype in rounding.HALF_DTYPES:
    return tf.cast(value, tf.float32)
  return value


def _like(value, true_dtype):
  """The false branch's `value` in the dtype the true branch returned.

  Where the true branch returned float32, a 16-bit value is returned in
  float32 (its original, or a cast). Where it returned 16 bits, a float32
  value (a loss `composites` computed whole in float32) is rounded to them
  and remembered as that rounding, as TensorFlow's own loss code rounds
  it. Anything else is left for cond_v2 to check.
  """
  if not isinstance(value, tf.Tensor) or true_dtype is None:
    return value
  if true_dtype == tf.float32:
    return _in_float32(value)
  if true_dtype in rounding.HALF_DTYPES and value.dtype == tf.float32:
    rounded = tf.cast(value, true_dtype)
    rounding.remember_float32_original(rounded, value)
    return rounded
  return value


def cond_v2_with_autocast(pred, true_fn=None, false_fn=None, name='cond'):
  """Stands in for `cond_v2.cond_v2` while any thread uses autocast."""
  original = state.original_cond_v2
  if (state.STATE.mode() is None or state.STATE.busy or true_fn is None or
      false_fn is None):
    return original(pred, true_fn, false_fn, name)
  # Per flat output of the true branch: its dtype as returned (a rounding
  # returned as its float32 original is float32).
  true_dtypes = []

  def true_branch():
    outputs = true_fn()
    flat = tf.nest.flatten(outputs)
    exact = [_exact(value) for value in flat]
    returned = [e if e is not None else v for v, e in zip(flat, exact)]
    true_dtypes[:] = [getattr(v, 'dtype', None) for v in returned]
    return tf.nest.pack_sequence_as(outputs, returned)

  def false_branch():
    outputs = false_fn()
    flat = tf.nest.flatten(outputs)
    if len(flat) != len(true_dtypes):
      return outputs  # cond_v2 names the mismatch itself.
    return tf.nest.pack_sequence_as(outputs, [
        _like(value, dtype) for value, dtype in zip(flat, true_dtypes)])

  return original(pred, true_branch, false_branch, name)
