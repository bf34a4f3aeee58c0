"""Training progress a person can follow: steps of total, loss, speed, ETA.

`ProgressHook` reports a training run:

* on a terminal, a `tqdm` progress bar (steps done of the total, examples
  per second, time left) with the latest loss beside it;
* elsewhere (a log file, CI, a pipe), plain log lines at round steps (every
  `every_steps`, counted from step 0, so 100, 200, ... not 24, 44, ...), plus
  the first step and the last, so even a short run says something:
  `step 200/1000 (20%): loss 0.4123, 5600 examples/s, 0:01:23 left`.

The loss is the one the Estimator records as its 'loss' summary; a graph
without one is reported without a loss. Steps are counted from the global
step read when the session starts, `steps_per_run` a `run` (a TPU loop runs
`iterations_per_loop`), and the last line reads it again: exact.
"""

import sys
import time

from absl import logging
import tensorflow as tf
import tqdm

from estimator_bf16.precision import op_lists


def _loss_tensor(graph):
  """The tensor of the graph's scalar summary tagged 'loss', or None."""
  for op in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES):
    op = getattr(op, 'op', op)
    if op.type != op_lists.OP.ScalarSummary or len(op.inputs) != 2:
      continue
    tags = op.inputs[0]
    if tags.op.type != op_lists.OP.Const:
      continue
    tag = tf.make_ndarray(tags.op.get_attr('value'))
    if getattr(tag, 'size', 1) == 1 and tag.item() in (b'loss', 'loss'):
      return op.inputs[1]
  return None


def _clock(seconds):
  seconds = int(round(seconds))
  return '%d:%02d:%02d' % (seconds // 3600, seconds // 60 % 60, seconds % 60)


class ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Reports steps done of `total_steps`, the loss, examples/s, time left.

  Args:
    total_steps: the step training ends at (the Estimator's max_steps).
    batch_size: examples per step (global), for examples/s.
    every_steps: interval of the plain log lines.
    steps_per_run: training steps one `session.run` makes.
    bar: True for a tqdm bar, False for log lines; default: a bar when
      `out` is a terminal.
    out: where the bar goes (default sys.stderr).
  """

  def __init__(self, total_steps, batch_size, every_steps=100,
               steps_per_run=1, bar=None, out=None):
    self._total = int(total_steps)
    self._batch_size = batch_size
    self._every = max(1, int(every_steps))
    self._steps_per_run = steps_per_run
    self._out = out or sys.stderr
    self._bar_wanted = (self._out.isatty() if bar is None and
                        hasattr(self._out, 'isatty') else bool(bar))
    self._bar = None

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    self._fetches = {}
    loss = _loss_tensor(tf.compat.v1.get_default_graph())
    if loss is not None:
      self._fetches['loss'] = loss
    self._step = None
    self._first = None  # (step, time) when training began
    self._last_logged = None
    self._loss = None

  def after_create_session(self, session, coord):
    del coord
    step = self._step = int(session.run(self._global_step))
    self._first = (step, time.perf_counter())
    if step:
      logging.info('resuming at step %d of %d', step, self._total)
    if self._bar_wanted:
      self._bar = tqdm.tqdm(total=self._total, initial=step, unit='step',
                            file=self._out, dynamic_ncols=True,
                            desc='training')

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._fetches)

  def after_run(self, run_context, run_values):
    del run_context
    self._step += self._steps_per_run
    step = min(self._step, self._total)
    self._loss = run_values.results.get('loss')
    if self._bar is not None:
      self._bar.update(step - self._bar.n)
      if self._loss is not None:
        self._bar.set_postfix(loss='%.4g' % self._loss, refresh=False)
      return
    first = self._last_logged is None
    boundary = (step // self._every) > ((self._last_logged or 0) //
                                        self._every)
    if (first or boundary) and step < self._total:
      self._log(step, self._loss)

  def _log(self, step, loss):
    self._last_logged = step
    start_step, start_time = self._first
    elapsed = time.perf_counter() - start_time
    done = step - start_step
    parts = []
    if loss is not None:
      parts.append('loss %.4g' % loss)
    # The first run carries the start-up work: no rate from it alone.
    if done > 1 and elapsed > 0:
      parts.append('%.0f examples/s' % (self._batch_size * done / elapsed))
      parts.append('%s left' % _clock(elapsed / done *
                                      max(0, self._total - step)))
    logging.info('step %d/%d (%d%%)%s', step, self._total,
                 100 * step // max(1, self._total),
                 ': ' + ', '.join(parts) if parts else '')

  def end(self, session):
    # The last line, at the exact step training ended (also when a signal
    # stopped it early).
    step = int(session.run(self._global_step))
    if self._bar is not None:
      self._bar.update(step - self._bar.n)
      self._bar.close()
      self._bar = None
    elif self._first is not None and step != self._last_logged:
      self._log(step, self._loss)
