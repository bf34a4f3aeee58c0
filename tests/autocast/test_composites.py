"""TensorFlow's multi-op losses: whole in float32 under autocast, else TF's."""

import threading

import tensorflow as tf

import estimator_bf16 as eb
from tensorflow.python.ops import nn_impl


class CompositesTest(tf.test.TestCase):

  def test_float32_inside_autocast_and_put_back_after(self):
    original = nn_impl.sigmoid_cross_entropy_with_logits
    public = tf.compat.v1.nn.sigmoid_cross_entropy_with_logits
    with tf.Graph().as_default():
      logits = tf.constant([[0.5, -2.0]], tf.bfloat16)
      labels = tf.constant([[1.0, 0.0]], tf.bfloat16)
      with eb.autocast('bfloat16'):
        loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                       logits=logits)
        logsumexp = tf.reduce_logsumexp(logits, -1)
      # The composite's own ops are float32: no bfloat16 op but the inputs.
      inside = [op for op in loss.graph.get_operations()
                if op.type not in ('Const', 'Cast') and
                any(t.dtype == tf.bfloat16 for t in op.outputs)]
    self.assertEqual(loss.dtype, tf.float32)
    self.assertEqual(logsumexp.dtype, tf.float32)
    self.assertEqual(inside, [])
    self.assertIs(nn_impl.sigmoid_cross_entropy_with_logits, original)
    self.assertIs(tf.compat.v1.nn.sigmoid_cross_entropy_with_logits, public)

  def test_a_cond_with_a_bfloat16_true_branch_rounds_the_loss_to_it(self):
    # TensorFlow's loss code returned the logits' dtype; a cond whose other
    # branch is bfloat16 (built first) still gets matching branches.
    with tf.Graph().as_default():
      logits = tf.constant([[0.5, -2.0, 1.0]], tf.bfloat16)
      labels = tf.constant([[0.0, 0.0, 1.0]])
      with eb.autocast('bfloat16'):
        picked = tf.cond(
            tf.constant(False), lambda: -tf.reduce_max(logits, -1)[0],
            lambda: tf.compat.v1.losses.softmax_cross_entropy(
                labels, logits, label_smoothing=0.1))
      with tf.compat.v1.Session() as session:
        value = session.run(picked)
      expected = tf.compat.v1.losses.softmax_cross_entropy(
          labels, tf.cast(logits, tf.float32), label_smoothing=0.1)
      with tf.compat.v1.Session() as session:
        expected = session.run(expected)
    self.assertEqual(picked.dtype, tf.bfloat16)
    self.assertAllClose(value, expected, rtol=2.0**-8)

  def test_another_thread_builds_as_tensorflow_does(self):
    # The swap is process-wide while a thread is inside autocast; a thread
    # outside it gets TensorFlow's function, bfloat16 in, bfloat16 out.
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def hold_autocast():
      with tf.Graph().as_default(), eb.autocast('bfloat16'):
        inside.set()
        done.wait(30)

    holder = threading.Thread(target=hold_autocast)
    holder.start()
    try:
      self.assertTrue(inside.wait(30))
      with tf.Graph().as_default():
        logits = tf.constant([[0.5, -2.0]], tf.bfloat16)
        seen['dtype'] = tf.nn.sigmoid_cross_entropy_with_logits(
            labels=tf.zeros_like(logits), logits=logits).dtype
    finally:
      done.set()
      holder.join()
    self.assertEqual(seen['dtype'], tf.bfloat16)


if __name__ == '__main__':
  tf.test.main()
