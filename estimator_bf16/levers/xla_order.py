"""Holding an XLA computation's work until other values exist.

XLA keeps no control dependencies: it orders a compiled computation by its
data alone, so "run this after that" written as a TensorFlow control
dependency means nothing once XLA compiles the step (a TPU's, or
`xla.compile`'s). `zero_after` makes the order a data dependency XLA
cannot remove.
"""

import tensorflow as tf


def zero_after(tensors):
  """A float32 scalar 0 that XLA can compute only once all `tensors` exist.

  Zero times one element of each tensor: a float multiply by zero is not
  simplified away (for NaN's sake), so anything adding this waits for
  every tensor, and reading one element costs nothing next to computing
  them.

  Args:
    tensors: non-empty list of numeric tf.Tensors with at least one
      element each.

  Returns:
    A float32 scalar tf.Tensor.
  """
  return tf.add_n([tf.cast(tf.reshape(t, [-1])[0], tf.float32)
                   for t in tensors]) * 0
