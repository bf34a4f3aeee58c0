"""Float32 storage for trainable variables created in bfloat16 under autocast.

A variable creator, installed by `autocast('bfloat16')` for every variable
the thread creates (Keras layers, `tf.Variable`, `get_variable` outside
`bfloat16_scope`): a trainable variable requested in bfloat16 is created
float32 under the same name, so the optimizer updates float32 weights and
checkpoints hold float32 values.
"""

import tensorflow as tf


def float32_trainable_storage(next_creator, **kwargs):
  """Variable creator: a trainable bfloat16 variable is stored float32.

  Keras layers with v1 dtype behaviour take their dtype from a bfloat16
  input and create bfloat16 weights, which the optimizer would then update
  in bfloat16 and checkpoints would store in bfloat16. The variable keeps its
  name; reads of it are cast where a bfloat16 op needs them. Non-trainable
  bfloat16 variables are left alone (their assignments carry bfloat16
  values), and the audit reports them.

  Not shared with `precision.scope`'s custom getter, which answers the same
  kind of request differently: a creator must hand back a `tf.Variable`, so
  this one returns the float32 variable itself (autocast's rules cast its
  reads), while the getter returns a bfloat16 cast of it; the creator takes
  a tensor or zero-argument callable `initial_value`, the getter an
  `initializer` called with a shape and dtype; and the getter also takes
  non-trainable requests. Inside `bfloat16_scope` the getter has already
  made the request float32 when it reaches this creator, which passes it on.

  Args:
    next_creator: the next variable creator in the chain.
    **kwargs: the variable's constructor arguments.

  Returns:
    The created `tf.Variable`.
  """
  dtype = kwargs.get('dtype')
  initial_value = kwargs.get('initial_value')
  if dtype is None and isinstance(initial_value, tf.Tensor):
    dtype = initial_value.dtype
  if (dtype is None or tf.as_dtype(dtype).base_dtype != tf.bfloat16 or
      kwargs.get('variable_def') is not None or
      kwargs.get('trainable') is False):
    return next_creator(**kwargs)
  kwargs['dtype'] = tf.float32
  if callable(initial_value):
    kwargs['initial_value'] = lambda: tf.cast(initial_value(), tf.float32)
  elif initial_value is not None:
    kwargs['initial_value'] = tf.cast(initial_value, tf.float32)
  return next_creator(**kwargs)
