"""Gradient accumulation: one optimizer update from K micro-batches.

The model_fn is built once, for a micro-batch. While it runs (see `levers`)
every gradient of the variables it asks for -- through `tf.gradients` or an
optimizer's `compute_gradients` -- is replaced by the mean that K
micro-batches left in a float32 accumulator, and the true gradient of the
micro-batch is added to that accumulator instead. So the program's own
update code (clipping, an `apply_gradients` override, a separate
`global_step.assign`) is built unchanged and, when it runs, applies the mean:
clipping by global norm sees the norm of the big batch's gradient.

One training step of the Estimator is one update:

  * `AccumulationHook.before_run` runs K - 1 micro-steps (the model's
    forward and backward pass and `accumulator += gradient / K`; the first
    of them overwrites instead of adding);
  * the step itself runs the K-th micro-step, then the update.

`global_step` therefore counts updates, and every hook that reads it (stop,
checkpoint, summary, logging) keeps the meaning it had at the big batch.

Accumulators are local variables: they are not in checkpoints, which are the
same with and without accumulation. A checkpoint is always written after a
whole update, so a run that stops mid-update (a crash, preemption, the end
of the input) loses at most K - 1 micro-batches of work, never an applied
update. Batch norm computes its statistics per micro-batch.

Nothing here depends on the precision or on tf.estimator.
"""

import re

import tensorflow as tf

# Graph collections of each replica's micro-step ops (under a tf.distribute
# strategy the model_fn runs once per replica; the hook runs them all): the
# first micro-step of an update, and the others before the training step.
FIRST_MICRO_STEP_COLLECTION = 'estimator_bf16_accumulate_first'
MICRO_STEP_COLLECTION = 'estimator_bf16_accumulate'


def check_steps(steps):
  """Returns `steps` if it is a valid accumulation count.

  Args:
    steps: the `gradient_accumulation_steps` given.

  Returns:
    int, `steps`.

  Raises:
    ValueError: `steps` is not an integer >= 1.
  """
  if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
    raise ValueError('gradient_accumulation_steps must be an integer >= 1 '
                     '(micro-batches per optimizer update), got %r.' %
                     (steps,))
  return steps


def micro_batch_size(train_batch_size, steps, replicas=1, split='replicas'):
  """The global batch of one micro-step.

  Args:
    train_batch_size: int, the effective global batch of one update.
    steps: int, micro-batches per update (`check_steps`).
    replicas: int, replicas or TPU cores that split each micro-batch.
    split: what the replicas are, for the error (e.g. 'replicas of the
      strategy').

  Returns:
    int, `train_batch_size // steps`.

  Raises:
    ValueError: `train_batch_size` is not a multiple of steps x replicas.
  """
  check_steps(steps)
  if train_batch_size % (steps * replicas):
    over = ('' if replicas == 1 else ' x %d %s = %d' % (
        replicas, split, steps * replicas))
    raise ValueError(
        'train_batch_size=%d is not divisible by gradient_accumulation_steps'
        '=%d%s: an update is %d micro-batches of equal size%s.' % (
            train_batch_size, steps, over, steps,
            '' if replicas == 1 else ', each split evenly over the replicas'))
  return train_batch_size // steps


def _variable_name(variable):
  op = getattr(variable, 'op', None)
  name = op.name if op is not None else 'variable'
  # A mirrored variable's copy on another device is 'name/replica_N'; the
  # strategy creates each replica's accumulator under one shared name.
  return re.sub(r'/replica_\d+$', '', name)


class Accumulators(object):
  """The accumulators of one model_fn call and what updates them.

  Args:
    steps: int >= 2, micro-batches per update.
  """

  def __init__(self, steps):
    self.steps = steps
    self.variables = []
    self.first_ops = []  # accumulator = gradient / K
    self.add_ops = []  # accumulator += gradient / K

  def mean_gradients(self, gradients, variables):
    """Accumulates `gradients`; returns what an update should apply.

    Args:
      gradients: list of tensors, `IndexedSlices` or None, the gradients of
        one micro-batch, aligned with `variables`.
      variables: list of the variables they are gradients of.

    Returns:
      A list aligned with `gradients`: None stays None; anything else
      becomes a dense tensor (the accumulator's dtype, the variable's
      shape) holding the mean over the K micro-batches of this update,
      read after this micro-batch's share was added.
    """
    means = []
    for gradient, variable in zip(gradients, variables):
      if gradient is None:
        means.append(None)
        continue
      means.append(self._accumulate(gradient, variable))
    return means

  def _accumulate(self, gradient, variable):
    dtype = gradient.dtype.base_dtype
    name = _variable_name(variable) + '/gradient_accumulator'
    with tf.control_dependencies(None):
      # Created free of the control dependencies and control-flow context
      # the gradient call may sit in: its initializer must run alone.
      # ON_READ keeps one copy per replica under a tf.distribute strategy
      # (each replica sums its own micro-batches; the optimizer all-reduces
      # the mean as it would a gradient). Local: never saved, so
      # checkpoints do not change.
      accumulator = tf.compat.v1.Variable(
          tf.zeros(variable.shape, dtype), trainable=False,
          use_resource=True, name=name,
          collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM)
    self.variables.append(accumulator)
    scale = 1.0 / self.steps
    with tf.name_scope('gradient_accumulation'):
      # Each micro-batch adds its share, gradient / K, so the accumulator
      # holds the mean itself: the update reads it without a scaled copy,
      # and at the update the accumulators stand in for the gradients an
      # ordinary step would hold, rather than adding to them.
      if isinstance(gradient, tf.IndexedSlices):
        share = tf.IndexedSlices(gradient.values * scale, gradient.indices,
                                 gradient.dense_shape)
        # Embedding rows are added in place, never as a dense copy.
        added = accumulator.scatter_add(share)
        first = accumulator.assign(tf.convert_to_tensor(share))
      else:
        share = gradient * scale
        added = accumulator.assign_add(share)
        first = accumulator.assign(share)
      # The first micro-step of an update overwrites what the last update
      # left, so no op has to zero the accumulators after an update.
      self.first_ops.append(_as_op(first))
      self.add_ops.append(_as_op(added))
      with tf.control_dependencies([_as_op(added)]):
        return accumulator.read_value()

  def finish(self, train_op, update_ops=()):
    """Registers the micro-step ops for `AccumulationHook`.

    Args:
      train_op: the program's train op, built on `mean_gradients`' results.
      update_ops: ops that must run with every micro-batch's forward pass
        (batch-norm moving averages, from UPDATE_OPS).

    Returns:
      The op of a training step: `train_op`, which reads the accumulators
      after the step's own micro-batch was added.
    """
    update_ops = list(update_ops)
    tf.compat.v1.add_to_collection(
        FIRST_MICRO_STEP_COLLECTION,
        tf.group(*(self.first_ops + update_ops),
                 name='gradient_accumulation/first_micro_step'))
    tf.compat.v1.add_to_collection(
        MICRO_STEP_COLLECTION,
        tf.group(*(self.add_ops + update_ops),
                 name='gradient_accumulation/micro_step'))
    return train_op


def _as_op(value):
  return value.op if hasattr(value, 'op') else value


class AccumulationHook(tf.compat.v1.train.SessionRunHook):
  """Runs the first K - 1 micro-steps of each update before the step.

  Every training step of the session is then one update, so the hooks that
  count steps or read `global_step` need no change. The micro-steps read
  the input pipeline like the step does; running out of data in them ends
  training the way running out in a step does (OutOfRangeError), with the
  incomplete update dropped.

  Args:
    steps: int >= 2, micro-batches per update.
  """

  def __init__(self, steps):
    self._steps = check_steps(steps)
    self._first = self._add = None

  def begin(self):
    first = tf.compat.v1.get_collection(FIRST_MICRO_STEP_COLLECTION)
    add = tf.compat.v1.get_collection(MICRO_STEP_COLLECTION)
    if not first:
      raise ValueError('AccumulationHook: the graph has no micro-step op; '
                       'the model_fn was not built with '
                       'gradient_accumulation_steps > 1.')
    # One op per replica under a tf.distribute strategy: run them together.
    self._first = tf.group(*first, name='gradient_accumulation/first')
    self._add = tf.group(*add, name='gradient_accumulation/add')

  def before_run(self, run_context):
    run_context.session.run(self._first)
    for _ in range(self._steps - 2):
      run_context.session.run(self._add)
    return None
