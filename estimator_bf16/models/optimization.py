"""Learning-rate schedule and train op for the reference models.

The optimizers themselves are `estimator_bf16.optimizers.registry` (shared with the
memory planner):

  lr = learning_rate_schedule(1e-4, global_step, warmup_steps=100,
                              decay_steps=train_steps)
  optimizer = optimizers.create_optimizer('adamw', lr, weight_decay_rate=0.01,
                                          use_tpu=params['use_tpu'])
  op = train_op(loss, optimizer, clip_norm=1.0)
"""

import tensorflow as tf


def learning_rate_schedule(base_lr,
                           global_step,
                           *,
                           warmup_steps=0,
                           decay_steps=None,
                           end_lr=0.0,
                           power=1.0):
  """Linear warmup, then polynomial decay (BERT's schedule).

  Steps count from 0. During warmup (`step < warmup_steps`) the rate is
  `base_lr * (step + 1) / warmup_steps`, so the first step already moves
  the weights and the last warmup step reaches `base_lr`. Afterwards it is
  `(base_lr - end_lr) * (1 - step / decay_steps) ** power + end_lr`, with
  `step` capped at `decay_steps`: like BERT, `decay_steps` is the total
  number of training steps (warmup included), not the length after warmup.

  Args:
    base_lr: Python float, the peak rate.
    global_step: integer or float scalar tensor (usually the global step).
    warmup_steps: int >= 0; 0 disables warmup.
    decay_steps: int > 0, or None for a constant rate after warmup.
    end_lr: rate reached at `decay_steps` and kept afterwards.
    power: polynomial exponent of the decay (1.0 is linear).

  Returns:
    A float32 scalar tensor.

  Raises:
    ValueError: for negative warmup, non-positive decay_steps or power.
  """
  if warmup_steps < 0:
    raise ValueError('warmup_steps must be >= 0, got %r.' % (warmup_steps,))
  if decay_steps is not None and decay_steps <= 0:
    raise ValueError('decay_steps must be None or > 0, got %r.' %
                     (decay_steps,))
  if power <= 0:
    raise ValueError('power must be > 0, got %r.' % (power,))
  with tf.name_scope('learning_rate'):
    # float32 counts steps exactly up to 2**24, far beyond any schedule here.
    step = tf.cast(global_step, tf.float32)
    lr = tf.constant(base_lr, tf.float32)
    if decay_steps is not None:
      remaining = 1.0 - tf.minimum(step, float(decay_steps)) / decay_steps
      lr = (base_lr - end_lr) * tf.pow(remaining, power) + end_lr
    if warmup_steps > 0:
      warmup_lr = base_lr * (step + 1.0) / warmup_steps
      lr = tf.where(step < warmup_steps, warmup_lr, lr)
    return tf.identity(lr, name='value')


def train_op(loss, optimizer, *, global_step=None, clip_norm=None):
  """Builds the training op: gradients, optional clipping, update.

  The graph's UPDATE_OPS (batch-norm moving averages) run before the
  variable update, as the `tf.compat.v1.layers.batch_normalization`
  documentation requires; without this the moving averages never change
  and evaluation uses the initial statistics.

  Args:
    loss: float32 scalar tensor. A bfloat16 loss is rejected: TPU training
      loops expect float32, and the loss reduction loses precision in
      bfloat16 (cast the logits to float32 before the loss).
    optimizer: a `tf.compat.v1.train.Optimizer`, possibly a
      `CrossShardOptimizer`.
    global_step: the variable to increment; default the graph's global step
      (created if missing).
    clip_norm: None, or a float: gradients are scaled together so that their
      global norm is at most this. Under `CrossShardOptimizer` this clips
      each core's gradients before they are summed across cores.

  Returns:
    The training `tf.Operation`.

  Raises:
    ValueError: if the loss is not float32 or no variable has a gradient.
  """
  if loss.dtype != tf.float32:
    raise ValueError(
        'train_op needs a float32 loss, got %s (%s). Cast the logits to '
        'float32 before the loss, e.g. with estimator_bf16.to_float32.' %
        (loss.dtype.name, loss.name))
  if global_step is None:
    global_step = tf.compat.v1.train.get_or_create_global_step()
  grads_and_vars = [(g, v) for g, v in optimizer.compute_gradients(loss)
                    if g is not None]
  if not grads_and_vars:
    raise ValueError('No trainable variable has a gradient from %s.' %
                     (loss.name,))
  if clip_norm is not None:
    grads, variables = zip(*grads_and_vars)
    grads, _ = tf.clip_by_global_norm(grads, clip_norm)
    grads_and_vars = list(zip(grads, variables))
  update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
  with tf.control_dependencies(update_ops):
    return optimizer.apply_gradients(grads_and_vars, global_step=global_step)
