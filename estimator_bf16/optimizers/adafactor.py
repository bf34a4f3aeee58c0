"""Adafactor: an adaptive optimizer whose state grows with rows + columns.

Adam keeps two float32 slots the size of every variable, so a model of P
parameters pays 2 * P floats of optimizer state on each TPU core. Adafactor
(Shazeer & Stern, 2018, arXiv:1804.04235) keeps, for a matrix of shape
[..., R, C], only the running mean of the squared gradient along each row
(shape [..., R]) and along each column (shape [..., C]); their outer product,
divided by the overall mean, estimates the full second moment. A 1024 x 1024
kernel therefore costs 2048 floats instead of Adam's 2 * 1024 * 1024.

The update for one variable at update number t (1-based) is:

  g2      = g ** 2 + epsilon1
  decay   = 1 - t ** -decay_exponent          (unless `decay_rate` is fixed)
  v_row   = decay * v_row + (1 - decay) * mean(g2, axis=-1)
  v_col   = decay * v_col + (1 - decay) * mean(g2, axis=-2)
  v_hat   = v_row[..., :, None] * v_col[..., None, :] / mean(v_row, axis=-1)
  u       = g / sqrt(v_hat)                   (full `v` for rank < 2)
  u       = u / max(1, rms(u) / clipping_threshold)
  step    = lr * max(epsilon2, rms(var))      (`multiply_by_parameter_scale`)
  m       = beta1 * m + (1 - beta1) * step * u       (only when beta1 > 0)
  var     = var - m   (or var - step * u without momentum)

All slots are float32 whatever the variable or gradient dtype: the second
moment of a bfloat16 gradient underflows and loses precision quickly, and the
package keeps float32 master weights anyway (see `bfloat16_scope`).
"""

import tensorflow as tf

from estimator_bf16.optimizers import dense_update

# Names under which `get_slot(var, name)` finds the optimizer state.
SLOT_ROW = 'v_row'  # Factored variables: mean squared gradient of each row.
SLOT_COL = 'v_col'  # Factored variables: mean squared gradient of each column.
SLOT_FULL = 'v'  # Variables of rank < 2: full second moment.
SLOT_MOMENTUM = 'm'  # Only when beta1 > 0.

_STEP_NAME = 'adafactor_step'


def _rms(x):
  """Root mean square of all elements of a float32 tensor (a scalar)."""
  return tf.sqrt(tf.reduce_mean(tf.square(x)))


class AdafactorOptimizer(dense_update.DenseUpdateOptimizer):
  """Adafactor for tf.compat.v1 graph-mode training (TPUEstimator, Estimator).

  Works as is under `tf.compat.v1.tpu.CrossShardOptimizer`: it implements the
  standard `_create_slots` / `_prepare` / `_apply_dense` / `_finish` hooks,
  so the wrapper's `compute_gradients`, `apply_gradients`, `get_slot` and
  `get_slot_names` behave as for any built-in optimizer.

  Slots (all float32, read them with `get_slot(var, name)`):
    * `'v_row'`, `'v_col'`: variables of rank >= 2 with `factored=True`;
      shapes `var.shape[:-1]` and `var.shape[:-2] + var.shape[-1:]`.
    * `'v'`: variables of rank 0 or 1 (or all, with `factored=False`); the
      variable's shape.
    * `'m'`: the variable's shape, only when `beta1 > 0`.
  """

  def __init__(self,
               learning_rate=None,
               decay_rate=None,
               decay_exponent=0.8,
               beta1=0.0,
               clipping_threshold=1.0,
               multiply_by_parameter_scale=True,
               factored=True,
               epsilon1=1e-30,
               epsilon2=1e-3,
               use_locking=False,
               name='Adafactor'):
    """Creates the optimizer.

    Args:
      learning_rate: None, a Python float, a float32 scalar tensor or a
        no-argument callable returning one. None means the paper's relative
        step `min(1e-2, 1 / sqrt(t))`, t the 1-based update count. With
        `multiply_by_parameter_scale` the rate is relative: it is multiplied
        by the RMS of each variable.
      decay_rate: None for the schedule `1 - t ** -decay_exponent` (0 at the
        first update, so no bias correction is needed), or a float in [0, 1)
        for a fixed decay of the second-moment averages.
      decay_exponent: exponent of the decay schedule (the paper's 0.8).
      beta1: momentum coefficient in [0, 1). 0 (the default) keeps no first
        moment, which is where most of the memory saving comes from.
      clipping_threshold: the update is scaled down so that its RMS is at
        most this value (before the step size is applied). None disables it.
      multiply_by_parameter_scale: scale the step by `max(epsilon2, rms(var))`
        so that each variable moves by a fraction of its own size.
      factored: keep row and column accumulators for variables of rank >= 2.
        False keeps a full accumulator for every variable (Adam-like memory).
      epsilon1: added to squared gradients so that an all-zero gradient does
        not divide by zero.
      epsilon2: lower bound of the parameter scale, so that variables
        initialized at zero can still move.
      use_locking: passed to the assign ops.
      name: prefix of the ops and of the slot variable names.

    Raises:
      ValueError: for hyper-parameters outside their ranges.
    """
    if not 0.0 <= beta1 < 1.0:
      raise ValueError('beta1 must be in [0, 1), got %r.' % (beta1,))
    if decay_rate is not None and not 0.0 <= decay_rate < 1.0:
      raise ValueError('decay_rate must be None or in [0, 1), got %r.' %
                       (decay_rate,))
    if clipping_threshold is not None and clipping_threshold <= 0:
      raise ValueError('clipping_threshold must be None or positive, got %r.' %
                       (clipping_threshold,))
    super().__init__(use_locking, name)
    self._learning_rate = learning_rate
    self._decay_rate = decay_rate
    self._decay_exponent = decay_exponent
    self._beta1 = beta1
    self._clipping_threshold = clipping_threshold
    self._multiply_by_parameter_scale = multiply_by_parameter_scale
    self._factored = factored
    self._epsilon1 = epsilon1
    self._epsilon2 = epsilon2
    # Per-apply_gradients tensors, set by _prepare.
    self._lr_t = None
    self._decay_t = None

  def _is_factored(self, shape):
    return self._factored and shape.rank >= 2

  def _create_slots(self, var_list):
    # The update count is the optimizer's own non-slot variable (as Adam's
    # beta powers are), not a read of the global step: the decay schedule is
    # the bias correction of *these* accumulators, so it must count their
    # updates. The global step may be missing, may be incremented elsewhere
    # or not at all (apply_gradients without global_step), and keeps counting
    # when a run switches optimizers from a checkpoint; any of these would
    # mis-scale the first updates. float32 like Adam's powers, so it lives
    # on any device; it stops increasing at 2**24 updates, where the decay
    # and default step size have long since flattened out.
    first_var = min(var_list, key=lambda v: v.name)
    self._create_non_slot_variable(
        initial_value=0.0, name=_STEP_NAME, colocate_with=first_var)
    for var in var_list:
      shape = var.shape
      if not shape.is_fully_defined():
        raise ValueError(
            'AdafactorOptimizer needs static variable shapes; %s has shape %s.'
            % (var.name, shape))
      zeros = tf.compat.v1.zeros_initializer()
      if self._is_factored(shape):
        self._get_or_make_slot_with_initializer(
            var, zeros, shape[:-1], tf.float32, SLOT_ROW,
            '%s_%s' % (self._name, SLOT_ROW))
        self._get_or_make_slot_with_initializer(
            var, zeros, shape[:-2].concatenate(shape[-1:]), tf.float32,
            SLOT_COL, '%s_%s' % (self._name, SLOT_COL))
      else:
        self._get_or_make_slot_with_initializer(
            var, zeros, shape, tf.float32, SLOT_FULL,
            '%s_%s' % (self._name, SLOT_FULL))
      if self._beta1 > 0.0:
        self._get_or_make_slot_with_initializer(
            var, zeros, shape, tf.float32, SLOT_MOMENTUM,
            '%s_%s' % (self._name, SLOT_MOMENTUM))

  def _step_variable(self):
    # Keyed by the graph it was created in (under init_scope, the outermost
    # one): inside a loop body with control flow v2, as in TPUEstimator's
    # training loop, the default graph is the body's function graph.
    with tf.init_scope():
      graph = tf.compat.v1.get_default_graph()
    return self._get_non_slot_variable(_STEP_NAME, graph=graph)

  def _prepare(self):
    # Read the count once per apply_gradients; every variable update depends
    # on this read, and _finish increments the count only after all of them.
    t = tf.identity(self._step_variable()) + 1.0
    if self._learning_rate is None:
      self._lr_t = tf.minimum(1e-2, tf.math.rsqrt(t))
    else:
      self._lr_t = tf.cast(self._call_if_callable(self._learning_rate),
                           tf.float32)
    if self._decay_rate is None:
      self._decay_t = 1.0 - tf.pow(t, -self._decay_exponent)
    else:
      self._decay_t = tf.constant(self._decay_rate, tf.float32)

  def _update(self, grad, var):
    """Builds the update of one variable and its slots.

    Args:
      grad: dense gradient, shape `var.shape`, any float dtype (bfloat16
        gradients are computed in float32).
      var: the variable (ref or resource), float32 normally; a bfloat16
        variable is read and written through float32 math.

    Returns:
      An op that assigns the variable and its slots.
    """
    grad = tf.cast(grad, tf.float32)
    with dense_update.after(grad):
      value = tf.cast(tf.identity(var), tf.float32)
      decay = self._decay_t
      mix = 1.0 - decay
      grad_sq = tf.square(grad) + self._epsilon1
      assigns = []

      if self._is_factored(var.shape):
        v_row = self.get_slot(var, SLOT_ROW)
        v_col = self.get_slot(var, SLOT_COL)
        new_row = (decay * tf.identity(v_row) +
                   mix * tf.reduce_mean(grad_sq, axis=-1))
        new_col = (decay * tf.identity(v_col) +
                   mix * tf.reduce_mean(grad_sq, axis=-2))
        assigns += [self._assign(v_row, new_row),
                    self._assign(v_col, new_col)]
        # Normalizing the rows by their mean makes row x column an estimate
        # of each element's mean square (the row sums and column sums both
        # count the total once).
        row_scale = tf.math.rsqrt(
            new_row / tf.reduce_mean(new_row, axis=-1, keepdims=True))
        col_scale = tf.math.rsqrt(new_col)
        update = (grad * tf.expand_dims(row_scale, -1) *
                  tf.expand_dims(col_scale, -2))
      else:
        v = self.get_slot(var, SLOT_FULL)
        new_v = decay * tf.identity(v) + mix * grad_sq
        assigns.append(self._assign(v, new_v))
        update = grad * tf.math.rsqrt(new_v)

      if self._clipping_threshold is not None:
        # A stale second moment (a gradient much larger than the average
        # of recent ones) would otherwise give a huge step; the paper's fix
        # for training without warmup and without momentum.
        update /= tf.maximum(1.0, _rms(update) / self._clipping_threshold)

      step_size = self._lr_t
      if self._multiply_by_parameter_scale:
        step_size *= tf.maximum(_rms(value), self._epsilon2)
      delta = step_size * update

      if self._beta1 > 0.0:
        m = self.get_slot(var, SLOT_MOMENTUM)
        delta = self._beta1 * tf.identity(m) + (1.0 - self._beta1) * delta
        assigns.append(self._assign(m, delta))

      new_value = tf.cast(value - delta, var.dtype.base_dtype)
      assigns.append(self._assign(var, new_value))
    return tf.group(*assigns)

  def _assign(self, ref, value):
    return tf.compat.v1.assign(ref, value, use_locking=self._use_locking)

  def _finish(self, update_ops, name_scope):
    step = self._step_variable()
    with tf.control_dependencies(update_ops):
      with tf.compat.v1.colocate_with(step):
        increment = tf.compat.v1.assign_add(
            step, 1.0, use_locking=self._use_locking)
    return tf.group(*(list(update_ops) + [increment]), name=name_scope)
