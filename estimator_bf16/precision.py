"""The two precisions the package knows, spelled one way."""

import tensorflow as tf

PRECISIONS = ('float32', 'bfloat16')

_DTYPES = {'float32': tf.float32, 'bfloat16': tf.bfloat16}


def check_precision(precision):
  """Returns `precision` if it is one of `PRECISIONS`, else raises ValueError.

  Args:
    precision: str, expected `'float32'` or `'bfloat16'`.

  Returns:
    The same string.

  Raises:
    ValueError: for any other value, including dtypes and `'float16'`; the
      message lists the choices.
  """
  if isinstance(precision, str) and precision in _DTYPES:
    return precision
  hint = ''
  if precision in ('float16', 'half', tf.float16):
    hint = (' float16 is not supported: TPUs compute in bfloat16, and float16 '
            'needs loss scaling that this package does not do.')
  elif isinstance(precision, tf.DType):
    hint = ' Pass the name as a string, e.g. precision=%r.' % precision.name
  raise ValueError('precision must be one of %s, got %r.%s' %
                   (', '.join(repr(p) for p in PRECISIONS), precision, hint))


def compute_dtype(precision):
  """Returns the `tf.DType` activations use under `precision`.

  Args:
    precision: `'float32'` or `'bfloat16'`.

  Returns:
    `tf.float32` or `tf.bfloat16`.

  Raises:
    ValueError: if `precision` is not one of `PRECISIONS`.
  """
  return _DTYPES[check_precision(precision)]
