"""Adam with decoupled weight decay, the way BERT trains.

L2 regularization added to the loss goes through Adam's per-element scaling,
so large-gradient weights are barely regularized. Decoupled weight decay
(Loshchilov & Hutter, arXiv:1711.05101) instead shrinks the parameter
directly, next to the Adam step:

  m   = beta1 * m + (1 - beta1) * g
  v   = beta2 * v + (1 - beta2) * g ** 2
  u   = m / (sqrt(v) + epsilon)
  u   = u + weight_decay_rate * var       (unless the name is excluded)
  var = var - learning_rate * u

As in BERT there is no bias correction of m and v (the learning-rate warmup
plays that role), and layer-norm scales, batch-norm parameters and biases are
excluded from the decay by name.
"""

import re

import tensorflow as tf

from estimator_bf16 import dense_update

DEFAULT_EXCLUDE = ('LayerNorm', 'layer_norm', 'bias', 'batch_normalization',
                   'BatchNorm')


class AdamWeightDecayOptimizer(dense_update.DenseUpdateOptimizer):
  """Adam with decoupled weight decay and no bias correction (BERT's AdamW).

  Slots `'m'` and `'v'` are float32 with the variable's shape, whatever the
  variable or gradient dtype, so the optimizer composes with
  `CrossShardOptimizer` and `get_slot` like any built-in optimizer.
  """

  def __init__(self,
               learning_rate,
               weight_decay_rate=0.0,
               beta1=0.9,
               beta2=0.999,
               epsilon=1e-6,
               exclude_from_weight_decay=DEFAULT_EXCLUDE,
               use_locking=False,
               name='AdamWeightDecay'):
    """Creates the optimizer.

    Args:
      learning_rate: a Python float, a float32 scalar tensor or a
        no-argument callable returning one.
      weight_decay_rate: decay per unit of learning rate; the parameter
        shrinks by `learning_rate * weight_decay_rate * var` each step.
      beta1: decay of the first-moment average, in [0, 1).
      beta2: decay of the second-moment average, in [0, 1).
      epsilon: added to sqrt(v) in the denominator.
      exclude_from_weight_decay: regular expressions; a variable whose name
        (without `:0`) matches any of them with `re.search` is not decayed.
      use_locking: passed to the assign ops.
      name: prefix of the ops and of the slot variable names.

    Raises:
      ValueError: for hyper-parameters outside their ranges.
    """
    if weight_decay_rate < 0:
      raise ValueError('weight_decay_rate must be >= 0, got %r.' %
                       (weight_decay_rate,))
    for label, beta in (('beta1', beta1), ('beta2', beta2)):
      if not 0.0 <= beta < 1.0:
        raise ValueError('%s must be in [0, 1), got %r.' % (label, beta))
    super().__init__(use_locking, name)
    self._learning_rate = learning_rate
    self._weight_decay_rate = weight_decay_rate
    self._beta1 = beta1
    self._beta2 = beta2
    self._epsilon = epsilon
    self._exclude = tuple(exclude_from_weight_decay or ())
    self._lr_t = None

  def decays(self, var_name):
    """True if the variable named `var_name` (e.g. 'dense/kernel') decays."""
    if not self._weight_decay_rate:
      return False
    return not any(re.search(pattern, var_name) for pattern in self._exclude)

  def _create_slots(self, var_list):
    zeros = tf.compat.v1.zeros_initializer()
    for var in var_list:
      for slot in ('m', 'v'):
        self._get_or_make_slot_with_initializer(
            var, zeros, var.shape, tf.float32, slot,
            '%s_%s' % (self._name, slot))

  def _prepare(self):
    self._lr_t = tf.cast(self._call_if_callable(self._learning_rate),
                         tf.float32)

  def _update(self, grad, var):
    """Builds the update of `var` (ref or resource) from a dense gradient."""
    grad = tf.cast(grad, tf.float32)
    m = self.get_slot(var, 'm')
    v = self.get_slot(var, 'v')
    with dense_update.after(grad):
      value = tf.cast(tf.identity(var), tf.float32)
      new_m = self._beta1 * tf.identity(m) + (1.0 - self._beta1) * grad
      new_v = self._beta2 * tf.identity(v) + (1.0 - self._beta2) * tf.square(
          grad)
      update = new_m / (tf.sqrt(new_v) + self._epsilon)
      if self.decays(var.op.name):
        # Decoupled: the decay bypasses m and v, so every decayed weight
        # shrinks by the same fraction regardless of its gradient history.
        update += self._weight_decay_rate * value
      new_value = tf.cast(value - self._lr_t * update, var.dtype.base_dtype)
    return tf.group(
        tf.compat.v1.assign(m, new_m, use_locking=self._use_locking),
        tf.compat.v1.assign(v, new_v, use_locking=self._use_locking),
        tf.compat.v1.assign(var, new_value, use_locking=self._use_locking))
