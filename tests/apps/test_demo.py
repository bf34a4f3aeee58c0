"""Smoke test of the demo (`make demo`) in its --quick form, and its report."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from estimator_bf16.apps import precision_comparison
from tests.support import paths

_REPO = paths.REPO
_ROW_LABELS = ('eval accuracy', 'eval loss', 'final train loss',
               'examples/sec', 'peak training-step memory')


class DemoTest(tf.test.TestCase):

  @pytest.mark.slow
  def test_quick_demo_prints_table_and_writes_plot(self):
    out_dir = self.create_tempdir().full_path
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
               ESTIMATOR_BF16_CACHE=os.path.join(out_dir, 'cache'))
    # A small batch: the smoke test checks the demo's outputs, not its
    # memory-peak argument, which the default batch of 1024 is for.
    done = subprocess.run(
        [sys.executable, '-m', 'estimator_bf16.apps.demo', '--out_dir=' + out_dir,
         '--quick', '--train_batch_size=64'], cwd=_REPO, env=env,
        capture_output=True, text=True, timeout=600)
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertIn('bfloat16/float32', done.stdout)
    for label in _ROW_LABELS:
      self.assertIn(label, done.stdout)
    with open(os.path.join(out_dir, 'loss_curves.png'), 'rb') as f:
      self.assertEqual(f.read(8), b'\x89PNG\r\n\x1a\n')
    with open(os.path.join(out_dir, 'results.json')) as f:
      results = json.load(f)
    for precision in ('float32', 'bfloat16'):
      row = results['rows'][precision]
      self.assertBetween(row['accuracy'], 0.0, 1.0)
      self.assertGreater(row['examples_per_sec'], 0)
      # The demo turns on the allocator statistics itself.
      self.assertGreater(row['peak_mib'], 0)
      self.assertLen(results['loss_curves'][precision]['loss'], 20)
    self.assertTrue(os.path.exists(os.path.join(out_dir, 'table.txt')))


class ReportTest(tf.test.TestCase):

  def test_table_has_ratios_and_marks_missing_numbers(self):
    rows = {
        'float32': dict(accuracy=0.9, eval_loss=0.4, final_train_loss=0.2,
                        examples_per_sec=1000.0, peak_mib=20.0),
        'bfloat16': dict(accuracy=0.9, eval_loss=0.5, final_train_loss=0.2,
                         examples_per_sec=1500.0, peak_mib=None),
    }
    lines = precision_comparison.comparison_table(rows).splitlines()
    by_label = {line.split('  ')[0].strip(): line for line in lines[2:]}
    self.assertTrue(by_label['examples/sec (training)'].endswith('1.50x'))
    self.assertTrue(by_label['eval loss'].endswith('1.25x'))
    self.assertTrue(
        by_label['peak training-step memory (MiB)'].endswith('n/a'))

  def test_speed_spread_pairs_windows_and_names_noise(self):
    def rows(base, other):
      return {'float32': {'window_rates': base},
              'bfloat16': {'window_rates': other}}
    clear = precision_comparison.speed_spread(
        rows([100.0] * 5, [150.0, 140.0, 160.0, 150.0, 145.0]))
    self.assertEqual(clear, 'examples/sec bfloat16/float32 over 5 paired '
                     'timing windows: median 1.50x, interquartile range '
                     '1.45x-1.50x.')
    noisy = precision_comparison.speed_spread(
        rows([100.0] * 4, [90.0, 105.0, 98.0, 120.0, 300.0]))
    self.assertIn('over 4 paired timing windows', noisy)
    self.assertIn('(within noise: the range includes 1.00x)', noisy)
    self.assertIn('too few for a spread',
                  precision_comparison.speed_spread(rows([1.0], [2.0, 3.0])))

  def test_read_scalars_reads_v2_summaries(self):
    model_dir = self.create_tempdir().full_path
    with tf.Graph().as_default():
      writer = tf.compat.v2.summary.create_file_writer(model_dir)
      with writer.as_default():
        ops = [tf.compat.v2.summary.scalar('train/loss', 1.0 / (s + 1),
                                           step=s) for s in range(3)]
      with tf.compat.v1.Session() as sess:
        sess.run(writer.init())
        sess.run(ops)
        sess.run(writer.flush())
    steps, values = precision_comparison.read_scalars(model_dir)
    self.assertAllEqual(steps, [0, 1, 2])
    self.assertAllClose(values, [1.0, 0.5, 1.0 / 3])

  def test_plot_writes_png(self):
    path = os.path.join(self.create_tempdir().full_path, 'curves.png')
    curve = (np.arange(5), np.linspace(2.0, 0.1, 5))
    precision_comparison.plot_loss_curves({'float32': curve, 'bfloat16': curve}, path)
    self.assertGreater(os.path.getsize(path), 1000)


if __name__ == '__main__':
  tf.test.main()
