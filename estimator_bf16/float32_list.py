"""The float32 list: numerically sensitive ops that never run in bfloat16.

A legacy model_fn mixes network and head in one function, so the wrapper
cannot cast "the logits" for the user: it does not know which tensor they are.
Instead, while a wrapped model_fn runs, the functions below are swapped for
versions that compute in float32 whatever dtype the user passes, the way
autocast systems keep softmax and losses in float32:

* softmax / log-softmax compute in float32 and return the input's dtype, so a
  bfloat16 attention block stays bfloat16 after them;
* cross-entropy ops, `tf.compat.v1.losses`, `tf.compat.v1.metrics`,
  `in_top_k` (which has no bfloat16 kernel) and v1 summaries receive float32
  inputs and return float32, so losses and metrics reduce in float32.

Functions are found by identity in every loaded module, so `tf.nn.softmax`,
`tf.compat.v1.nn.softmax`, `tf.math.softmax`, TensorFlow's internal callers and
a user's `from tensorflow.nn import softmax` are all covered. The swap is
undone when the outermost `float32_ops()` exits, normally or by an exception.
"""

import contextlib
import functools
import sys

import tensorflow as tf

from estimator_bf16 import casting
from estimator_bf16 import patching

# (API module, names): each function computes in float32 and returns the dtype
# of its first argument.
_KEEP_DTYPE = (
    (tf.nn, ('softmax', 'log_softmax')),
    (tf.compat.v1.nn, ('softmax', 'log_softmax')),
)

# (API module, names or None for every public function): floating 16-bit
# inputs are cast to float32 and the result is whatever float32 inputs give.
_TO_FLOAT32 = (
    (tf.nn, ('softmax_cross_entropy_with_logits',
             'sparse_softmax_cross_entropy_with_logits',
             'sigmoid_cross_entropy_with_logits',
             'weighted_cross_entropy_with_logits', 'in_top_k')),
    (tf.compat.v1.nn, ('softmax_cross_entropy_with_logits',
                       'softmax_cross_entropy_with_logits_v2',
                       'sparse_softmax_cross_entropy_with_logits',
                       'sigmoid_cross_entropy_with_logits',
                       'weighted_cross_entropy_with_logits', 'in_top_k')),
    (tf.compat.v1.losses, ('absolute_difference', 'compute_weighted_loss',
                           'cosine_distance', 'hinge_loss', 'huber_loss',
                           'log_loss', 'mean_pairwise_squared_error',
                           'mean_squared_error', 'sigmoid_cross_entropy',
                           'softmax_cross_entropy',
                           'sparse_softmax_cross_entropy')),
    (tf.compat.v1.metrics, None),
    (tf.compat.v1.summary, ('scalar', 'histogram')),
)


def _first_arg(args, kwargs):
  if args:
    return args[0]
  for key in ('logits', 'x', 'input', 'features'):
    if key in kwargs:
      return kwargs[key]
  return None


def _keep_dtype(fn):
  @functools.wraps(fn)
  def float32_inside(*args, **kwargs):
    first = _first_arg(args, kwargs)
    dtype = getattr(first, 'dtype', None)
    if dtype is None or dtype.base_dtype not in casting.HALF_DTYPES:
      return fn(*args, **kwargs)
    args, kwargs = _upcast(args), _upcast(kwargs)
    return tf.cast(fn(*args, **kwargs), dtype.base_dtype)
  return float32_inside


def _to_float32(fn):
  @functools.wraps(fn)
  def float32_in_and_out(*args, **kwargs):
    return fn(*_upcast(args), **_upcast(kwargs))
  return float32_in_and_out


def _upcast(structure):
  return casting.map_floating(structure, tf.float32,
                              sources=casting.HALF_DTYPES)


def _public_functions(module, names):
  if names is None:
    names = [n for n in dir(module)
             if not n.startswith('_') and callable(getattr(module, n))
             and not isinstance(getattr(module, n), type)]
  return [getattr(module, name) for name in names if hasattr(module, name)]


def float32_list():
  """Returns `{original function: replacement}` for the whole float32 list."""
  table = {}
  for wrap, groups in ((_keep_dtype, _KEEP_DTYPE), (_to_float32, _TO_FLOAT32)):
    for module, names in groups:
      for fn in _public_functions(module, names):
        if fn not in table:
          table[fn] = wrap(fn)
  return table


def _swap_everywhere(table):
  """Replaces each original by identity in all module namespaces."""
  by_id = {id(fn): (fn, new) for fn, new in table.items()}
  undo = []
  for module in list(sys.modules.values()):
    namespace = getattr(module, '__dict__', None)
    if not isinstance(namespace, dict):
      continue
    for name, value in list(namespace.items()):
      hit = by_id.get(id(value))
      if hit is not None and hit[0] is value:
        # setattr, not a dict write: TensorFlow's API modules are wrappers
        # with an attribute cache that only __setattr__ keeps in step.
        setattr(module, name, hit[1])
        undo.append((module, name, value))
  return undo


_PATCHER = patching.Patcher(lambda: _swap_everywhere(float32_list()))


@contextlib.contextmanager
def float32_ops():
  """Context manager: the float32 list is in force inside it.

  Nested uses are cheap; the originals come back when the outermost exits,
  also when the body raises.
  """
  with _PATCHER.active():
    yield
