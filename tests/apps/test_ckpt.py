"""Tests for checkpoint conversion from older bfloat16 conventions."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.safety import checkpoint_convert


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _save(prefix, variables):
  """Writes {name: numpy value with dtype} as a checkpoint."""
  with tf.Graph().as_default():
    made = [tf.compat.v1.Variable(value, name=name)
            for name, value in variables.items()]
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver(made).save(sess, prefix)


def _old_style(directory):
  bf16 = tf.bfloat16.as_numpy_dtype
  prefix = os.path.join(directory, 'model.ckpt-7')
  _save(prefix, {
      'bfloat16/dense/kernel': np.array([[1.5, -2.25]], dtype=bf16),
      'bfloat16/dense/bias': np.array([0.5, 0.25], dtype=np.float32),
      'global_step': np.int64(7),
  })
  return prefix


class CkptTest(tf.test.TestCase):

  def test_convert_old_convention_and_restore_into_scope(self):
    directory = self.get_temp_dir()
    source = _old_style(os.path.join(directory, 'old'))
    target = os.path.join(directory, 'new', 'model.ckpt-7')
    report = checkpoint_convert.convert_checkpoint(source, target)
    self.assertEqual(report.total, 3)
    self.assertEqual(sorted(new for _, new in report.renamed),
                     ['dense/bias', 'dense/kernel'])
    self.assertEqual(report.cast, [('dense/kernel', 'bfloat16')])
    self.assertEqual(report.kept, ['global_step'])

    # A prefix names itself; a model_dir its latest checkpoint.
    self.assertEqual(checkpoint_convert.resolve_checkpoint(source), source)
    self.assertEqual(
        checkpoint_convert.resolve_checkpoint(os.path.dirname(target)), target)
    found = checkpoint_convert.inspect_checkpoint(os.path.dirname(target))
    self.assertEqual(found['dense/kernel'], ('float32', (1, 2)))
    self.assertEqual(found['global_step'][0], 'int64')

    # The converted checkpoint restores into what the scope builds.
    with tf.Graph().as_default():
      x = tf.ones([1, 1], tf.bfloat16)
      with eb.bfloat16_scope('bfloat16'):
        y = tf.compat.v1.layers.dense(x, 2, name='dense')
      step = tf.compat.v1.train.get_or_create_global_step()
      with tf.compat.v1.Session() as sess:
        tf.compat.v1.train.Saver().restore(sess, target)
        got, got_step = sess.run([tf.cast(y, tf.float32), step])
    self.assertAllClose(got, [[2.0, -2.0]])  # 1.5 + 0.5, -2.25 + 0.25
    self.assertEqual(got_step, 7)

  def test_dry_run_writes_nothing_and_refuses_overwrite(self):
    directory = self.get_temp_dir()
    source = _old_style(os.path.join(directory, 'old2'))
    target = os.path.join(directory, 'dry', 'model.ckpt-7')
    report = checkpoint_convert.convert_checkpoint(source, target, dry_run=True)
    self.assertEqual(report.output, '')
    self.assertFalse(tf.io.gfile.exists(os.path.dirname(target)))
    checkpoint_convert.convert_checkpoint(source, target)
    with self.assertRaisesRegex(ValueError, 'already holds a checkpoint'):
      checkpoint_convert.convert_checkpoint(source, target)

  def test_name_collision_and_missing_input(self):
    directory = self.get_temp_dir()
    prefix = os.path.join(directory, 'clash', 'model.ckpt-1')
    _save(prefix, {'bfloat16/w': np.float32(1), 'w': np.float32(2)})
    with self.assertRaisesRegex(ValueError, "would be named 'w'"):
      checkpoint_convert.convert_checkpoint(prefix, prefix + '-out')
    with self.assertRaisesRegex(ValueError, 'no checkpoint at'):
      checkpoint_convert.convert_checkpoint(os.path.join(directory, 'nothing'), 'x')

  @pytest.mark.slow
  def test_command_line(self):
    # One process per command (each pays a TensorFlow import): convert,
    # inspect, and the refused convert with its exit status.
    directory = self.get_temp_dir()
    source = _old_style(os.path.join(directory, 'cli'))
    target = os.path.join(directory, 'cli_out', 'model.ckpt-7')
    run = lambda *args: subprocess.run(
        [sys.executable, '-m', 'estimator_bf16.apps.ckpt', *args],
        capture_output=True, text=True, timeout=300, check=False)
    result = run('convert', '--input=' + source, '--output=' + target)
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertIn('3 variable(s): 2 renamed, 1 cast to float32', result.stdout)
    # A model_dir names the checkpoint it resolved to (a prefix resolving to
    # itself is checked in-process above); bfloat16 weights are marked.
    result = run('inspect', '--input=' + os.path.dirname(source))
    self.assertEqual(result.returncode, 0, result.stderr)
    self.assertTrue(result.stdout.startswith(
        'checkpoint: %s (global step 7)\n' % source), result.stdout)
    self.assertRegex(result.stdout,
                     r'bfloat16/dense/kernel +bfloat16 .*<- not float32')
    self.assertNotRegex(result.stdout, r'dense/bias .*not float32')
    result = run('convert', '--input=' + source, '--output=' + target)
    self.assertEqual(result.returncode, 2)
    self.assertIn('already holds a checkpoint', result.stderr)

if __name__ == '__main__':
  tf.test.main()
