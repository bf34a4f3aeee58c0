"""A GELU gradient that keeps three activations where TensorFlow keeps five.

BERT's feed-forward activation is GELU written out of elementwise ops,
either the tanh approximation (google-research/bert's `gelu`,
`tf.nn.gelu(x, approximate=True)`) or the exact form (`tf.nn.gelu(x)`,
Keras' `gelu`, `0.5 * x * (1 + tf.math.erf(x / sqrt(2)))`, or with
`erfc(-x / sqrt(2))` for `1 + erf(...)` as TensorFlow 2.16+ writes it):

    y = 0.5 * x * (1 + tanh(c * (x + a * x**3)))      (tanh)
    y = 0.5 * x * (1 + erf(c * x))                    (erf, c = 1/sqrt(2))

TensorFlow differentiates it op by op, and each op's gradient keeps that
op's inputs or output: besides `x` and `y` (which the next matmul's gradient
reads), `tanh`, `1 + tanh` or `0.5 * (1 + tanh)`, `0.5 * x` in the
`(0.5 * x) * (1 + tanh)` form, and whatever the power's gradient reads live
from the forward pass to the backward one (with erf: `c * x` for erf's
gradient instead of the power's). In a traced step of the BERT-style model
that was five tensors of the feed-forward width (4 x hidden) per layer at
the step's peak, most of a transformer's saved activations (BERT-base at
batch 32: 24 MiB each, per layer, in bfloat16).

Autocast marks the chain's last multiply (`mark`); its gradient is then
computed from `x` and the chain's `tanh` (or `erf`) output `t` alone,

    dy/dx = 0.5 * (1 + t) * (1 + x * (1 - t) * (c + 3 * a * c * x**2))
    dy/dx = 0.5 * (1 + t) + x * c / sqrt(pi) * exp(-(c * x)**2)

and the chain itself gets no gradient, so its other intermediates are freed
during the forward pass: the traced step keeps three tensors a layer (`x`,
`t`, `y`). The backward pass runs about as many elementwise ops as
TensorFlow's own (ten), in the chain's dtype, with the constants the chain
was built with. What else reads the chain's intermediates keeps
TensorFlow's gradient; but asked for directly, `tf.gradients(loss, tanh)`
now finds no path through the marked multiply.
"""

import collections
import contextlib
import math
import threading

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

from estimator_bf16.autocast import gradients as autocast_gradients
from estimator_bf16.precision.op_lists import OP

_GRADIENT = 'EstimatorBf16Gelu'
_ADDS = frozenset([OP.Add, OP.AddV2])

# What the gradient needs of a matched chain: the input `x`, the `tanh`,
# `erf` or `erfc` output `t` (`kind`: 'Tanh', 'Erf' or 'Erfc', where `t` is
# `erfc(-c * x)`, which is `1 + erf(c * x)`), the constants `a` (None but
# for tanh) and `c`, which input of the final multiply carries `x` (`x_side`: 0
# or 1) and the factor `scale` that input is of `x` (`0.5` for `(0.5 * x) *
# (1 + t)`, `1` for `x * (0.5 * (1 + t))`).
Gelu = collections.namedtuple('Gelu', 'kind x t a c x_side scale')


# Scalar arithmetic that code computes its constants with (Hugging Face's
# `tf.sqrt(2.0 / pi)`), which `tf.get_static_value` does not fold.
_SCALAR_OPS = {
    OP.Sqrt: math.sqrt, OP.Neg: lambda a: -a, OP.Cast: lambda a: a,
    OP.Mul: lambda a, b: a * b, OP.RealDiv: lambda a, b: a / b,
    OP.Div: lambda a, b: a / b, OP.AddV2: lambda a, b: a + b,
    OP.Add: lambda a, b: a + b, OP.Sub: lambda a, b: a - b,
}


class _Folded(threading.local):
  """Tensors `_scalar` computed a value for, while a `mark` is matching."""

  def __init__(self):
    super().__init__()
    self.tensors = None  # a list inside `_collecting_folded`, else None


_FOLDED = _Folded()


@contextlib.contextmanager
def _collecting_folded():
  """Yields the list of tensors folded while the block runs."""
  outer = _FOLDED.tensors
  _FOLDED.tensors = []
  try:
    yield _FOLDED.tensors
  finally:
    _FOLDED.tensors = outer


def _scalar(tensor, depth=4):
  """The value of a constant scalar (rank 0) tensor, else None.

  Rank 0 only: a `[[0.5]]` factor would broadcast `y` to a higher rank than
  the multiply's input, which the gradient must not change. The value is
  rounded to the tensor's dtype, as TensorFlow computes it.
  """
  if tensor.shape.rank != 0 or not tensor.dtype.is_floating:
    return None
  value = tf.get_static_value(tensor)
  if value is None:
    operation = _SCALAR_OPS.get(tensor.op.type)
    if operation is None or depth == 0:
      return None
    inputs = [_scalar(t, depth - 1) for t in tensor.op.inputs]
    if any(v is None for v in inputs):
      return None
    try:
      value = operation(*inputs)
    except (ArithmeticError, ValueError):
      return None
    if _FOLDED.tensors is not None:
      _FOLDED.tensors.append(tensor)
  return float(np.asarray(value, tensor.dtype.as_numpy_dtype))


def _split_scale(tensor):
  """(k, t) with `tensor = k * t` for a constant scalar k; (1, tensor) else.

  Nested factors multiply: `-(x) * c` is `(-c, x)`.
  """
  scale = 1.0
  while True:
    factor, inner = _split_one_scale(tensor)
    if inner is tensor:
      return scale, tensor
    scale, tensor = scale * factor, inner


def _split_one_scale(tensor):
  """One constant factor off `tensor`: (k, t), or (1, tensor)."""
  if tensor.op.type == OP.Neg:
    return -1.0, tensor.op.inputs[0]
  if tensor.op.type == OP.Mul:
    found = _constant_operand(tensor.op)
    if found is not None:
      return found
  if tensor.op.type in (OP.RealDiv, OP.Div):
    value = _scalar(tensor.op.inputs[1])
    if value:
      return 1.0 / value, tensor.op.inputs[0]
  return 1.0, tensor


def _split_offset(tensor):
  """(b, t) with `tensor = b + t` for a constant scalar b, else None."""
  return _constant_operand(tensor.op) if tensor.op.type in _ADDS else None


def _constant_operand(op):
  """(value, other input) of a binary op with a constant scalar input."""
  first, second = op.inputs
  for constant, other in ((first, second), (second, first)):
    value = _scalar(constant)
    if value is not None:
      return value, other
  return None


def _same(first, second):
  """True if both name one tensor (graph tensors compare by identity)."""
  return first.graph is second.graph and first.name == second.name


def _is_cube_of(tensor, x):
  """True if `tensor` is `pow(x, 3)` or a product of three `x`."""
  if tensor.op.type == OP.Pow:
    base, exponent = tensor.op.inputs
    return _same(base, x) and _scalar(exponent) == 3.0
  factors, stack = [], [tensor]
  while stack and len(factors) <= 3:
    item = stack.pop()
    if item.op.type == OP.Mul and not _same(item, x):
      stack.extend(item.op.inputs)
    elif item.op.type == OP.Square and not _same(item, x):
      stack.extend([item.op.inputs[0]] * 2)
    else:
      factors.append(item)
  return not stack and len(factors) == 3 and all(_same(f, x) for f in factors)


def _tanh_argument(tanh, x):
  """(a, c) if `tanh`'s input is `c * (x + a * x**3)`, else None."""
  c, inner = _split_scale(tanh.op.inputs[0])
  if inner.op.type not in _ADDS:
    return None
  first, second = inner.op.inputs
  for linear, cubic in ((first, second), (second, first)):
    if not _same(linear, x):
      continue
    a, cube = _split_scale(cubic)
    if _is_cube_of(cube, x):
      return a, c
  return None


def _erf_argument(erf, x):
  """c if `erf`'s (or erfc's) input is `c * x` or `x / (1 / c)`, else None."""
  c, inner = _split_scale(erf.op.inputs[0])
  return c if _same(inner, x) else None


def match(op):
  """The `Gelu` that `op` completes, or None.

  Args:
    op: a `Mul` op; its inputs may be `(k1 * x, k2 * (1 + t))` in either
      order, with `k1 * k2 = 0.5` and `t = tanh(c * (x + a * x**3))` or
      `t = erf(c * x)`.

  Returns:
    A `Gelu`, or None if `op` is anything else.
  """
  if op.type != OP.Mul or not op.outputs[0].dtype.is_floating:
    return None
  for x_side in (0, 1):
    scale, x = _split_scale(op.inputs[x_side])
    factor, one_plus = _split_scale(op.inputs[1 - x_side])
    if scale * factor != 0.5:
      continue
    if one_plus.op.type == OP.Erfc:
      # erfc(-c * x) = 1 + erf(c * x): TensorFlow 2.16+'s exact gelu.
      c = _erf_argument(one_plus, x)
      if c is not None:
        return Gelu(OP.Erfc, x, one_plus, None, -c, x_side, scale)
      continue
    offset = _split_offset(one_plus)
    if offset is None or offset[0] != 1.0:
      continue
    t = offset[1]
    if t.op.type == OP.Tanh:
      constants = _tanh_argument(t, x)
      if constants is not None:
        return Gelu(OP.Tanh, x, t, constants[0], constants[1], x_side, scale)
    elif t.op.type == OP.Erf:
      c = _erf_argument(t, x)
      if c is not None:
        return Gelu(OP.Erf, x, t, None, c, x_side, scale)
  return None


def mark(op):
  """Gives `op` the three-activation gradient if it completes a GELU.

  A gradient the model chose for `op` (`gradient_override_map`) stays.

  Returns:
    True if `op` was marked.
  """
  with _collecting_folded() as folded:
    gelu = match(op)
  if gelu is None:
    return False
  # As tf.get_static_value does for what it folds: a fed value would differ
  # from the one the gradient is built with. Only for a GELU: a failed
  # match leaves the model's scalars as feedable as they were.
  for tensor in folded:
    tensor.graph.prevent_feeding(tensor)
  autocast_gradients.set_gradient(op, _GRADIENT)
  return True


@tf.RegisterGradient(_GRADIENT)
def _gelu_gradient(op, grad):
  """d(GELU)/dx from `x` and `t`; no gradient through the chain.

  Returns the gradient of the multiply's `x` side divided by that side's
  factor of `x` (TensorFlow's gradient of `k * x` multiplies it back), and
  None for the `1 + t` side, so the chain's other ops get no gradient.
  """
  gelu = match(op)
  if gelu is None:
    # Marked ops matched when made, and their inputs do not change; should
    # one not match any more, TensorFlow's own gradient is still right.
    return tf_ops.gradient_registry.lookup(OP.Mul)(op, grad)
  dtype = gelu.x.dtype.base_dtype
  constant = lambda value: tf.constant(value, dtype)
  # Built after the incoming gradient exists: otherwise these ops, which
  # read only forward tensors, would run in the forward pass and hold their
  # results until now.
  with autocast_gradients.after_gradients([grad]):
    x, t, c = gelu.x, gelu.t, gelu.c
    # Both derivatives over the x side's factor of x, 0.5 / scale.
    half = 0.5 / gelu.scale
    # 1 + t; an erfc output is that sum already.
    outer = t if gelu.kind == OP.Erfc else t + constant(1.0)
    if half != 1.0:
      outer *= constant(half)
    if gelu.kind == OP.Tanh:
      slope = x * x * constant(3.0 * gelu.a * c) + constant(c)
      derivative = outer * (x * slope * (constant(1.0) - t) + constant(1.0))
    else:
      density = tf.exp(x * x * constant(-c * c)) * x
      derivative = outer + density * constant(2.0 * half * c /
                                              math.sqrt(math.pi))
  grads = [None, None]
  grads[gelu.x_side] = tf.cast(grad, dtype) * derivative
  return grads
