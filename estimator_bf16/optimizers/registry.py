"""Optimizers by name, for the training CLI and the memory planner alike.

Every optimizer here keeps float32 state for float32 master weights, so it
works unchanged whether the network runs in float32 or bfloat16.
"""

import tensorflow as tf

from estimator_bf16.optimizers.adafactor import AdafactorOptimizer
from estimator_bf16.optimizers.adamw import AdamWeightDecayOptimizer
from estimator_bf16.optimizers.adamw import DEFAULT_EXCLUDE

OPTIMIZERS = ('sgd', 'momentum', 'adam', 'adamw', 'adafactor')


def create_optimizer(name,
                     learning_rate,
                     *,
                     weight_decay_rate=0.0,
                     use_tpu=False,
                     momentum=0.9,
                     beta1=0.9,
                     beta2=0.999,
                     epsilon=None,
                     exclude_from_weight_decay=DEFAULT_EXCLUDE,
                     adafactor_options=None):
  """Returns a `tf.compat.v1.train.Optimizer` chosen by name.

  Args:
    name: one of `OPTIMIZERS`.
    learning_rate: Python float or float32 scalar tensor (e.g. from
      `learning_rate_schedule`). For 'adafactor', None selects the relative
      step `min(1e-2, 1/sqrt(t))`, and any rate is multiplied by each
      variable's RMS (see `AdafactorOptimizer`).
    weight_decay_rate: decoupled weight decay; only 'adamw' supports it.
    use_tpu: wrap in `tf.compat.v1.tpu.CrossShardOptimizer`, which sums the
      gradients of the TPU cores (and averages the loss over them).
    momentum: the 'momentum' optimizer's coefficient.
    beta1: first-moment decay for 'adam' and 'adamw'.
    beta2: second-moment decay for 'adam' and 'adamw'.
    epsilon: None for each optimizer's usual value (1e-8 for 'adam', 1e-6
      for 'adamw' as in BERT).
    exclude_from_weight_decay: name patterns that 'adamw' does not decay.
    adafactor_options: dict of extra `AdafactorOptimizer` keyword arguments
      (e.g. `{'beta1': 0.9}`).

  Returns:
    The optimizer, wrapped for cross-shard gradient summation when
    `use_tpu`.

  Raises:
    ValueError: unknown name, a missing learning rate, or weight decay asked
      of an optimizer that would silently ignore it.
  """
  if name not in OPTIMIZERS:
    raise ValueError('Unknown optimizer %r; choose one of %s.' %
                     (name, ', '.join(OPTIMIZERS)))
  if weight_decay_rate and name != 'adamw':
    raise ValueError(
        'weight_decay_rate=%r is only implemented by optimizer \'adamw\', '
        'got %r; pass weight_decay_rate=0.0 or choose \'adamw\'.' %
        (weight_decay_rate, name))
  if learning_rate is None and name != 'adafactor':
    raise ValueError('Optimizer %r needs a learning_rate; only \'adafactor\' '
                     'has a default (its relative step size).' % (name,))

  if name == 'sgd':
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
  elif name == 'momentum':
    optimizer = tf.compat.v1.train.MomentumOptimizer(learning_rate, momentum)
  elif name == 'adam':
    optimizer = tf.compat.v1.train.AdamOptimizer(
        learning_rate, beta1=beta1, beta2=beta2,
        epsilon=1e-8 if epsilon is None else epsilon)
  elif name == 'adamw':
    optimizer = AdamWeightDecayOptimizer(
        learning_rate, weight_decay_rate=weight_decay_rate, beta1=beta1,
        beta2=beta2, epsilon=1e-6 if epsilon is None else epsilon,
        exclude_from_weight_decay=exclude_from_weight_decay)
  else:
    optimizer = AdafactorOptimizer(learning_rate=learning_rate,
                                   **(adafactor_options or {}))

  if use_tpu:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  return optimizer
