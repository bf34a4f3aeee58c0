"""AdamW with a manual global-step update, as TF 1.x BERT wrote it."""

import re

import tensorflow as tf


def create_optimizer(loss, init_lr, num_train_steps, use_tpu):
  """A train_op: tf.gradients, global-norm clipping, AdamW, step += 1."""
  global_step = tf.train.get_or_create_global_step()
  learning_rate = tf.train.polynomial_decay(
      tf.constant(init_lr, shape=[], dtype=tf.float32), global_step,
      num_train_steps, end_learning_rate=0.0, power=1.0, cycle=False)
  optimizer = AdamWeightDecayOptimizer(
      learning_rate=learning_rate, weight_decay_rate=0.01,
      exclude_from_weight_decay=['LayerNorm', 'bias'])
  if use_tpu:
    optimizer = tf.contrib.tpu.CrossShardOptimizer(optimizer)
  tvars = tf.trainable_variables()
  grads = tf.gradients(loss, tvars)
  grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)
  train_op = optimizer.apply_gradients(zip(grads, tvars),
                                       global_step=global_step)
  new_global_step = global_step + 1
  return tf.group(train_op, [global_step.assign(new_global_step)])


class AdamWeightDecayOptimizer(tf.train.Optimizer):
  """Adam with decoupled weight decay; overrides apply_gradients whole."""

  def __init__(self, learning_rate, weight_decay_rate=0.0, beta_1=0.9,
               beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=None,
               name='AdamWeightDecayOptimizer'):
    super(AdamWeightDecayOptimizer, self).__init__(False, name)
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    assignments = []
    for grad, param in grads_and_vars:
      if grad is None or param is None:
        continue
      param_name = re.match('^(.*):\\d+$', param.name).group(1)
      m = tf.get_variable(name=param_name + '/adam_m',
                          shape=param.shape.as_list(), dtype=tf.float32,
                          trainable=False, initializer=tf.zeros_initializer())
      v = tf.get_variable(name=param_name + '/adam_v',
                          shape=param.shape.as_list(), dtype=tf.float32,
                          trainable=False, initializer=tf.zeros_initializer())
      # tf.multiply densifies the embedding's IndexedSlices gradient.
      next_m = (tf.multiply(self.beta_1, m) +
                tf.multiply(1.0 - self.beta_1, grad))
      next_v = (tf.multiply(self.beta_2, v) +
                tf.multiply(1.0 - self.beta_2, tf.square(grad)))
      update = next_m / (tf.sqrt(next_v) + self.epsilon)
      if self._do_use_weight_decay(param_name):
        update += self.weight_decay_rate * param
      next_param = param - self.learning_rate * update
      assignments.extend([param.assign(next_param), m.assign(next_m),
                          v.assign(next_v)])
    return tf.group(*assignments, name=name)

  def _do_use_weight_decay(self, param_name):
    for r in self.exclude_from_weight_decay or []:
      if re.search(r, param_name) is not None:
        return False
    return bool(self.weight_decay_rate)
