"""The compat backend logs tf.estimator's INFO lines, worded as it words them.

People and scripts read `Loss for final step: X.`, `Saving checkpoints for
N into PATH.` and `Saving dict for global step N: ...` (issue 45). The
compat Estimator is importable on both TensorFlows, so this runs on both;
on TensorFlow 2.15 the real tf.estimator's lines are matched too.
"""

import re
import tempfile

import numpy as np
import tensorflow as tf

import estimator_bf16 as eb

# tf.estimator 2.15's wording (tensorflow_estimator/python/estimator/
# estimator.py and TensorFlow's CheckpointSaverHook).
_LINES = (
    re.compile(r'^Loss for final step: [0-9.e+-]+\.$'),
    re.compile(r'^Saving checkpoints for 3 into .*model\.ckpt\.$'),
    re.compile(r'^Saving dict for global step 3: global_step = 3, '
               r'loss = [0-9.e+-]+$'),
)


def _model_fn(features, labels, mode):
  logits = tf.compat.v1.layers.dense(features, 2, name='logits')
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_or_create_global_step())
  return tf.compat.v1.estimator.EstimatorSpec(mode, loss=loss,
                                              train_op=train_op)


def _input_fn():
  features = np.arange(16, dtype=np.float32).reshape(8, 2) / 16
  labels = np.array([0, 1] * 4, np.int32)
  return tf.data.Dataset.from_tensor_slices((features, labels)).batch(4)


class LogLinesTest(tf.test.TestCase):

  def _messages(self, estimator_class, config_class):
    estimator = estimator_class(
        _model_fn, config=config_class(
            model_dir=tempfile.mkdtemp(dir=self.get_temp_dir()),
            save_checkpoints_steps=100, log_step_count_steps=None))
    with self.assertLogs('tensorflow', level='INFO') as logs:
      estimator.train(lambda: _input_fn().repeat(), steps=3)
      estimator.evaluate(_input_fn, steps=1)
    return [record.getMessage() for record in logs.records]

  def _assert_lines(self, messages):
    for line in _LINES:
      self.assertLen([m for m in messages if line.match(m)], 1,
                     '%s not logged once in %s' % (line.pattern, messages))

  def test_compat_estimator_logs_tf_estimator_lines(self):
    self._assert_lines(self._messages(eb.compat.Estimator, eb.compat.RunConfig))

  def test_same_lines_as_tf_estimator(self):
    if eb.BACKEND != 'tf_estimator':
      self.skipTest('needs the real tf.estimator of TensorFlow 2.15')
    from tensorflow_estimator.python.estimator import estimator  # pylint: disable=g-import-not-at-top
    from tensorflow_estimator.python.estimator import run_config  # pylint: disable=g-import-not-at-top
    self._assert_lines(self._messages(estimator.Estimator,
                                      run_config.RunConfig))


if __name__ == '__main__':
  tf.test.main()
