"""The two precisions the package knows, spelled one way and parsed once.

A public entry point (`make_tpu_estimator`, `wrap_model_fn`, `autocast`,
`memory_plan`, ...) parses its `precision` argument once with
`parse_precision`; what it hands the layers below is a `Precision`, which
they use as is (parsing a `Precision` again returns it unchanged).
"""

import tensorflow as tf

PRECISIONS = ('float32', 'bfloat16')
# What a command runs a program in when no --precision is given (`run`,
# `check`, `tpu-submit ... --program`).
DEFAULT_PRECISION = PRECISIONS[1]

_DTYPES = {'float32': tf.float32, 'bfloat16': tf.bfloat16}


class Precision(str):
  """A checked precision name: `'float32'` or `'bfloat16'`.

  A `str`, so it prints, compares, hashes and serializes (JSON, flags, run
  reports) as the name users wrote; the properties answer the questions the
  package asks of it.
  """

  __slots__ = ()

  def __new__(cls, name):
    if isinstance(name, str) and name in _DTYPES:
      return super().__new__(cls, name)
    hint = ''
    if name in ('float16', 'half', tf.float16):
      hint = (' float16 is not supported: TPUs compute in bfloat16, and '
              'float16 needs loss scaling that this package does not do.')
    elif isinstance(name, tf.DType):
      hint = ' Pass the name as a string, e.g. precision=%r.' % name.name
    raise ValueError('precision must be one of %s, got %r.%s' %
                     (', '.join(repr(p) for p in PRECISIONS), name, hint))

  # A value: copies (TPUEstimator deep-copies params, which carry it) are
  # the same object, not a second parse.
  def __copy__(self):
    return self

  def __deepcopy__(self, memo):
    del memo
    return self

  @property
  def bfloat16(self):
    """bool: whether activations compute in bfloat16."""
    return str.__eq__(self, 'bfloat16')

  @property
  def compute_dtype(self):
    """`tf.float32` or `tf.bfloat16`: the dtype activations use."""
    return _DTYPES[str(self)]


def parse_precision(precision):
  """Returns `precision` as a `Precision`; one that already is one is kept.

  Args:
    precision: `'float32'`, `'bfloat16'` or a `Precision`.

  Returns:
    A `Precision`.

  Raises:
    ValueError: for any other value, including dtypes and `'float16'`; the
      message lists the choices.
  """
  if isinstance(precision, Precision):
    return precision
  return Precision(precision)


def compute_dtype(precision):
  """Returns the `tf.DType` activations use under `precision`.

  Args:
    precision: `'float32'`, `'bfloat16'` or a `Precision`.

  Returns:
    `tf.float32` or `tf.bfloat16`.

  Raises:
    ValueError: if `precision` is not one of `PRECISIONS`.
  """
  return parse_precision(precision).compute_dtype
