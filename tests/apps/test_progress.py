"""Tests for estimator_bf16.apps.progress: what a person sees while training."""

import io
import re

import tensorflow as tf

from estimator_bf16.apps import progress


def _train(hook, steps, stop_at=None):
  """Runs `steps` steps of a loop with a 'loss' summary, like an Estimator."""
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    loss = 10.0 / tf.cast(global_step + 1, tf.float32)
    tf.compat.v1.summary.scalar('loss', loss)
    train_op = global_step.assign_add(1)
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
      for _ in range(steps):
        session.run(train_op)
        if stop_at is not None and session.run(global_step) >= stop_at:
          break


class ProgressHookTest(tf.test.TestCase):

  def _lines(self, hook, steps, stop_at=None):
    with self.assertLogs('absl', level='INFO') as logs:
      _train(hook, steps, stop_at)
    return [r.getMessage() for r in logs.records
            if r.getMessage().startswith('step ')]

  def test_plain_lines_at_round_steps_with_loss_speed_and_time_left(self):
    lines = self._lines(progress.ProgressHook(25, batch_size=8,
                                              every_steps=10, bar=False), 25)
    self.assertEqual([int(re.match(r'step (\d+)/25', l).group(1))
                      for l in lines], [1, 10, 20, 25])
    # The first run carries the start-up work: a loss, no rate yet.
    self.assertRegex(lines[0], r'^step 1/25 \(4%\): loss [0-9.]+$')
    self.assertRegex(lines[1], r'^step 10/25 \(40%\): loss [0-9.]+, '
                     r'\d+ examples/s, \d:\d\d:\d\d left$')
    self.assertRegex(lines[-1], r'^step 25/25 \(100%\): loss [0-9.]+, ')

  def test_a_short_run_says_its_first_and_last_step(self):
    lines = self._lines(progress.ProgressHook(3, batch_size=8,
                                              every_steps=100, bar=False), 3)
    self.assertEqual([l.split(' (')[0] for l in lines],
                     ['step 1/3', 'step 3/3'])

  def test_a_stopped_run_ends_with_the_step_it_reached(self):
    lines = self._lines(progress.ProgressHook(100, batch_size=8,
                                              every_steps=10, bar=False),
                        100, stop_at=7)
    self.assertEqual(lines[-1].split(' (')[0], 'step 7/100')

  def test_bar_on_a_terminal(self):
    out = io.StringIO()
    _train(progress.ProgressHook(20, batch_size=8, bar=True, out=out), 20)
    text = out.getvalue()
    self.assertIn('20/20', text)
    self.assertIn('loss=', text)

  def test_no_bar_when_the_output_is_not_a_terminal(self):
    hook = progress.ProgressHook(5, batch_size=8, out=io.StringIO())
    lines = self._lines(hook, 5)
    self.assertEqual(lines[-1].split(' (')[0], 'step 5/5')


if __name__ == '__main__':
  tf.test.main()
