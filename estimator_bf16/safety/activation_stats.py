"""How close bfloat16 activations come to the format's limits.

bfloat16 keeps float32's exponent range (largest finite value about 3.39e38)
but only 8 bits of precision, so outright overflow is rare; what a debug run
wants to see is how large activations get and how many values fall below the
smallest normal number, which TPUs flush to zero. `ActivationStatsHook`
measures both for every bfloat16 activation of the forward graph, on the
steps it is asked to, and costs nothing on the others.
"""

import json

from absl import logging
import tensorflow as tf

from estimator_bf16.precision import op_lists

# Smallest normal bfloat16 (the exponent range is float32's): TPUs flush
# anything smaller to zero.
BFLOAT16_TINY = 2.0 ** -126
BFLOAT16_MAX = float(tf.bfloat16.max)
# Worth a warning: within a factor of ~3e8 of overflow, or more than 1% of
# values flushed to zero on a TPU.
_NEAR_OVERFLOW = 1e30
_UNDERFLOW_WARNING = 0.01


def _watched_tensors(graph):
  """bfloat16 activations of the forward pass that a session can fetch."""
  tensors = []
  for op in graph.get_operations():
    if (op.type not in op_lists.ACTIVATION_OPS or
        op.name.startswith('gradients')):
      continue
    # Tensors inside while/cond bodies or TPU computations cannot be fetched.
    if op._control_flow_context is not None:  # pylint: disable=protected-access
      continue
    try:
      op.get_attr('_tpu_replicate')
      continue
    except ValueError:
      pass
    if op.outputs and op.outputs[0].dtype == tf.bfloat16:
      tensors.append(op.outputs[0])
  return tensors


class ActivationStatsHook(tf.compat.v1.train.SessionRunHook):
  """Reports the range of bfloat16 activations every `every_n_steps` steps.

  For each bfloat16 output of a matmul, convolution, activation,
  normalisation or add in the forward graph, the hook reads `max_abs`,
  `zero_share`, `underflow_share` (share of values with 0 < |x| < 2**-126)
  and `nonfinite` (count of NaN/Inf). They are computed only on the runs
  that start at a global step divisible by `every_n_steps`; the others cost
  nothing.

  Attributes:
    report: list of dicts, one per tensor (largest `max_abs` first), from
      the latest measured step; empty until then (or in a float32 graph).
    step: global step of `report`.
  """

  def __init__(self, every_n_steps=100, output_path=None, log_top=10):
    """Creates the hook.

    Args:
      every_n_steps: measure the runs that start at a global step
        divisible by it (local runs: one step per run).
      output_path: if set, the final report is written there as JSON.
      log_top: tensors listed in the log at the end.
    """
    if every_n_steps < 1:
      raise ValueError('every_n_steps must be >= 1, got %r.' % every_n_steps)
    self._every = every_n_steps
    self._output_path = output_path
    self._log_top = log_top
    self.report = []
    self.step = None

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    self._due = False
    self._names = []
    stats = []
    with tf.name_scope('activation_stats'):
      for tensor in _watched_tensors(tf.compat.v1.get_default_graph()):
        magnitude = tf.abs(tf.cast(tensor, tf.float32))
        size = tf.cast(tf.size(magnitude), tf.float32)
        stats.append(tf.stack([
            tf.reduce_max(tf.where(tf.math.is_finite(magnitude), magnitude,
                                   tf.zeros_like(magnitude))),
            tf.reduce_sum(tf.cast(tf.equal(magnitude, 0.0), tf.float32)) /
            size,
            tf.reduce_sum(tf.cast((magnitude > 0.0) &
                                  (magnitude < BFLOAT16_TINY), tf.float32)) /
            size,
            tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(
                magnitude)), tf.float32))]))
        self._names.append(tensor.name)
    self._stats = tf.stack(stats) if stats else None
    if self._stats is None:
      logging.info('activation stats: no bfloat16 activations to watch.')

  def before_run(self, run_context):
    fetches = {'step': self._global_step}
    if self._stats is not None and self._due:
      fetches['stats'] = self._stats
    return tf.compat.v1.train.SessionRunArgs(fetches)

  def after_create_session(self, session, coord):
    del coord
    self._due = session.run(self._global_step) % self._every == 0

  def after_run(self, run_context, run_values):
    results = run_values.results
    if 'stats' in results:
      self._record(int(results['step']), results['stats'])
    # The step read above is the one before this run's update.
    self._due = (int(results['step']) + 1) % self._every == 0

  def _record(self, step, stats):
    rows = []
    for name, (max_abs, zeros, underflow, nonfinite) in zip(self._names,
                                                            stats):
      rows.append({'tensor': name, 'max_abs': float(max_abs),
                   'zero_share': float(zeros),
                   'underflow_share': float(underflow),
                   'nonfinite': int(nonfinite)})
    rows.sort(key=lambda row: -row['max_abs'])
    self.report, self.step = rows, step

  def end(self, session):
    del session
    if not self.report:
      return
    logging.info('activation stats at step %d (%d bfloat16 tensors; '
                 'bfloat16 max %.3g, smallest normal %.3g):', self.step,
                 len(self.report), BFLOAT16_MAX, BFLOAT16_TINY)
    for row in self.report[:self._log_top]:
      logging.info('  %-60s max|x| %.3g  zeros %.1f%%  underflow %.2f%%%s',
                   row['tensor'], row['max_abs'], 100 * row['zero_share'],
                   100 * row['underflow_share'],
                   '  NON-FINITE %d' % row['nonfinite']
                   if row['nonfinite'] else '')
    worst = max(row['underflow_share'] for row in self.report)
    if (worst > _UNDERFLOW_WARNING or
        self.report[0]['max_abs'] > _NEAR_OVERFLOW):
      logging.warning('activation stats: values near the bfloat16 limits '
                      '(max|x| %.3g, underflow share up to %.1f%%).',
                      self.report[0]['max_abs'], 100 * worst)
    if self._output_path:
      with tf.io.gfile.GFile(self._output_path, 'w') as f:
        json.dump({'step': self.step, 'tensors': self.report}, f, indent=1)

