"""Casting nested feature and output structures between precisions.

Only floating tensors are cast. Integer ids, labels, booleans and strings are
never touched: a token id cast to bfloat16 loses every value above 256, and
TPUs need int32 ids as they are. A bfloat16 tensor that autocast rounded
from a float32 one (`estimator_bf16.precision.rounding`) is given back as
that float32 tensor when cast to float32.
"""

import collections.abc

import tensorflow as tf

from estimator_bf16.precision import rounding
from estimator_bf16.precision import policy

FLOATING_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
# The 16-bit floating dtypes (defined with autocast's rounding records, whose
# roundings have them).
HALF_DTYPES = rounding.HALF_DTYPES


def _is_namedtuple(value):
  return isinstance(value, tuple) and hasattr(value, '_fields')


def _cast_leaf(value, dtype, sources):
  """Casts one tensor-like leaf to `dtype` if its dtype is in `sources`."""
  if isinstance(value, tf.SparseTensor):
    if value.values.dtype in sources and value.values.dtype != dtype:
      return tf.SparseTensor(value.indices, tf.cast(value.values, dtype),
                             value.dense_shape)
    return value
  if isinstance(value, tf.RaggedTensor):
    if value.dtype in sources and value.dtype != dtype:
      return value.with_flat_values(tf.cast(value.flat_values, dtype))
    return value
  if isinstance(value, (tf.Tensor, tf.Variable)):
    if value.dtype.base_dtype in sources and value.dtype.base_dtype != dtype:
      original = (rounding.exact_float32(value) if dtype == tf.float32
                  else None)
      return original if original is not None else tf.cast(value, dtype)
    return value
  # Python numbers, numpy arrays and other objects are left alone: they are
  # not graph tensors, and converting them here would change their meaning.
  return value


def map_floating(structure, dtype, exclude=frozenset(),
                 sources=FLOATING_DTYPES):
  """Rebuilds `structure` with the leaves whose dtype is in `sources` cast.

  Args:
    structure: a tensor-like leaf or any nesting of Mapping / list / tuple /
      namedtuple; container types are kept.
    dtype: the target `tf.DType`.
    exclude: Mapping keys (at any depth) whose values are kept as they are.
    sources: the dtypes that are cast; others are kept.

  Returns:
    The rebuilt structure.
  """
  if isinstance(structure, collections.abc.Mapping):
    items = [(key, value if key in exclude else
              map_floating(value, dtype, exclude, sources))
             for key, value in structure.items()]
    try:
      return type(structure)(items)
    except TypeError:  # Mappings without a pairs constructor.
      return dict(items)
  if _is_namedtuple(structure):
    return type(structure)(*[map_floating(v, dtype, exclude, sources)
                             for v in structure])
  if isinstance(structure, (list, tuple)):
    return type(structure)(map_floating(v, dtype, exclude, sources)
                           for v in structure)
  return _cast_leaf(structure, dtype, sources)


def cast_features(features, precision, exclude=()):
  """Casts the floating tensors of a feature structure to the compute dtype.

  Args:
    features: a `tf.Tensor`, `tf.SparseTensor`, `tf.RaggedTensor`, or any
      nesting of dict / list / tuple / namedtuple of them. Floating tensors
      (float16, bfloat16, float32, float64) of any shape are cast.
    precision: `'float32'` or `'bfloat16'`.
    exclude: dict keys (at any depth) whose values are returned as they are,
      e.g. a float feature that must stay float32.

  Returns:
    A structure of the same type and nesting. Integer, bool and string tensors
    are the very same objects as in the input.

  Raises:
    ValueError: if `precision` is not one of `PRECISIONS`.
  """
  dtype = policy.compute_dtype(precision)
  exclude = frozenset(as_keys(exclude))
  with tf.name_scope('cast_features'):
    return map_floating(features, dtype, exclude)


def to_float32(structure):
  """Casts every floating tensor in a nested structure to float32.

  Args:
    structure: a tensor or any nesting of dict / list / tuple / namedtuple of
      tensors (sparse and ragged included); other leaves are kept.

  Returns:
    The same structure with float32 floating tensors. A bfloat16 tensor that
    autocast rounded from a float32 result (softmax, log-softmax) gives back
    that float32 result, not a float32 copy of its rounding.
  """
  return map_floating(structure, tf.float32)


def as_keys(exclude):
  """`exclude` (None, a key, or an iterable of keys) as a tuple of keys."""
  if isinstance(exclude, str):
    # A lone string would otherwise be taken as a set of one-letter keys.
    return (exclude,)
  return tuple(exclude or ())
