"""A bfloat16 variable scope that keeps float32 master weights.

Inside `bfloat16_scope('bfloat16')`, a `get_variable(..., dtype=tf.bfloat16)`
request (which is what `tf.compat.v1.layers` make when their input is
bfloat16) creates a float32 variable and hands back a bfloat16 `Cast` of it.
The optimizer therefore updates float32 weights, the gradient flows back
through the cast, and the checkpoint holds float32 values.

Unlike TensorFlow's own `tf.compat.v1.tpu.bfloat16_scope(name)`, this scope
re-enters the *current* variable scope instead of opening a new one, so a
variable gets exactly the name it gets in a float32 build. That is what lets
a checkpoint move between precisions in both directions.
"""

import contextlib

import numpy as np
import tensorflow as tf

from estimator_bf16.precision import rounding
from estimator_bf16.precision import policy


def _is_bfloat16_constant(initializer):
  if isinstance(initializer, tf.Tensor):
    return initializer.dtype == tf.bfloat16
  return (isinstance(initializer, np.ndarray) and
          initializer.dtype.name == 'bfloat16')


def _as_float32_initializer(initializer):
  """Makes a bfloat16 constant initializer usable for a float32 variable."""
  if isinstance(initializer, tf.Tensor) and initializer.dtype == tf.bfloat16:
    return tf.cast(initializer, tf.float32)
  if _is_bfloat16_constant(initializer):
    return initializer.astype(np.float32)
  return initializer


def _float32_storage_getter(getter, name, *args, **kwargs):
  """Custom getter: store bfloat16 requests as float32, read them as bfloat16.

  Autocast's variable creator
  (`estimator_bf16.autocast.master_weights.float32_trainable_storage`)
  stores bfloat16 requests float32 too, for variables made outside this
  scope, but is kept apart: a getter may return a tensor, so this one hands
  back the bfloat16 read itself (and records it as a rounding), where a
  creator must return the float32 variable; this one converts a
  get_variable `initializer` (an initializer called with a shape and dtype,
  or a constant), the creator an `initial_value`; and this one also takes
  non-trainable requests. Under both, the request reaches the creator
  already float32 and passes through it.

  Args:
    getter: the next getter.
    name: the variable's name.
    *args: further positional arguments of `get_variable`.
    **kwargs: further keyword arguments of `get_variable`.

  Returns:
    A bfloat16 `tf.Tensor` (a cast of the float32 variable) for a bfloat16
    request; otherwise what `getter` returns.
  """
  requested = kwargs.get('dtype')
  initializer = kwargs.get('initializer')
  if _is_bfloat16_constant(initializer):
    # A bfloat16 constant initializer decides the dtype of the variable,
    # whatever dtype default the caller left in place.
    requested = tf.bfloat16
  if requested is None or tf.as_dtype(requested) != tf.bfloat16:
    # float32 (or integer) requests pass through untouched, so code that asks
    # for float32 keeps float32 reads; `check_graph` reports such reads that
    # later meet bfloat16 activations.
    return getter(name, *args, **kwargs)
  kwargs['dtype'] = tf.float32
  if 'initializer' in kwargs:
    kwargs['initializer'] = _as_float32_initializer(kwargs['initializer'])
  variable = getter(name, *args, **kwargs)
  # The cast is a Tensor, not a Variable: code that assigns to what the getter
  # returns (batch-norm moving averages) must request float32, as
  # tf.compat.v1.layers.batch_normalization does.
  read = tf.cast(variable, tf.bfloat16)
  # Float32 math on the weight (an L2 penalty, a norm) uses the float32
  # value it rounds, not the rounding.
  rounding.remember_float32_original(read, read.op.inputs[0])
  return read


@contextlib.contextmanager
def bfloat16_scope(precision='bfloat16'):
  """Context manager: bfloat16 variable requests are stored float32.

  Args:
    precision: `'bfloat16'` installs the custom getter; `'float32'` changes
      nothing (the body runs exactly as without the scope).

  Yields:
    The current `tf.compat.v1.VariableScope` (re-entered, not renamed).

  Raises:
    ValueError: if `precision` is not one of `PRECISIONS`.
  """
  precision = policy.parse_precision(precision)
  current = tf.compat.v1.get_variable_scope()
  if not precision.bfloat16:
    yield current
    return
  # Re-entering the scope object keeps names and reuse settings; an outer
  # custom getter, if any, is composed with ours by TensorFlow.
  with tf.compat.v1.variable_scope(
      current, custom_getter=_float32_storage_getter,
      auxiliary_name_scope=False) as scope:
    yield scope
