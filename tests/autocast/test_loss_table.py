"""The losses model_fns write, one row each, under bfloat16 (issue 45).

Every row builds a one-layer model_fn whose loss is the row's, wraps it
with `eb.wrap_model_fn(..., 'bfloat16')` (strict audit, TRAIN mode) and
asserts that the returned loss is float32, that no bfloat16 tensor lies
between the loss's first float32 op and the loss (no rounding inside the
loss's own ops), that its value is the float32 loss of the same bfloat16
predictions up to float32 arithmetic, and that it is within bfloat16
rounding of the float32 build.
"""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import op_lists

L = tf.compat.v1.losses
R = tf.compat.v1.losses.Reduction
DEFAULT = R.SUM_BY_NONZERO_WEIGHTS
CLASSES = 5
BATCH = 8
_RNG = np.random.RandomState(45)
FEATURES = _RNG.randn(BATCH, 6).astype(np.float32)
KERNEL = (_RNG.randn(6, CLASSES) * 0.7).astype(np.float32)
LABELS = _RNG.randint(0, CLASSES, BATCH).astype(np.int32)
WEIGHTS = np.abs(_RNG.randn(BATCH)).astype(np.float32)
WEIGHTS[3] = 0.0  # SUM_BY_NONZERO_WEIGHTS counts the nonzero ones.


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _one_hot(labels):
  return tf.one_hot(labels, CLASSES)


def _reduced(loss):
  """A scalar: Reduction.NONE leaves one loss per example."""
  return tf.reduce_mean(loss) if loss.shape.rank else loss


# Each library loss: (its call on (labels, predictions, weights,
# reduction), how predictions are made from the logits).
_LIBRARY = {
    'absolute_difference': (lambda l, p, w, r: L.absolute_difference(
        _one_hot(l), p, w[:, None], reduction=r), 'logits'),
    'cosine_distance': (lambda l, p, w, r: L.cosine_distance(
        tf.nn.l2_normalize(_one_hot(l), -1), p, axis=-1,
        weights=w[:, None], reduction=r), 'normalized'),
    'hinge_loss': (lambda l, p, w, r: L.hinge_loss(
        _one_hot(l), p, w[:, None], reduction=r), 'logits'),
    'huber_loss': (lambda l, p, w, r: L.huber_loss(
        _one_hot(l), p, w[:, None], delta=0.5, reduction=r), 'logits'),
    'log_loss': (lambda l, p, w, r: L.log_loss(
        _one_hot(l), p, w[:, None], reduction=r), 'sigmoid'),
    'mean_squared_error': (lambda l, p, w, r: L.mean_squared_error(
        _one_hot(l), p, w[:, None], reduction=r), 'logits'),
    'sigmoid_cross_entropy': (lambda l, p, w, r: L.sigmoid_cross_entropy(
        _one_hot(l), p, w[:, None], reduction=r), 'logits'),
    'softmax_cross_entropy': (lambda l, p, w, r: L.softmax_cross_entropy(
        _one_hot(l), p, w, reduction=r), 'logits'),
    'sparse_softmax_cross_entropy': (
        lambda l, p, w, r: L.sparse_softmax_cross_entropy(
            tf.cast(l, tf.int64), p, w, reduction=r), 'logits'),
    'compute_weighted_loss': (lambda l, p, w, r: L.compute_weighted_loss(
        tf.square(p - _one_hot(l)), w[:, None], reduction=r), 'logits'),
}

_ROWS = [('%s_%s' % (name, reduction), call, kind, reduction)
         for name, (call, kind) in sorted(_LIBRARY.items())
         # SUM_OVER_NONZERO_WEIGHTS is SUM_BY_NONZERO_WEIGHTS's old name.
         for reduction in sorted(set(R.all()))]


def _sce(l, p, w, r=DEFAULT, **kwargs):
  return L.softmax_cross_entropy(_one_hot(l), p, w, reduction=r, **kwargs)


def _total_loss(l, p, w, r):
  _sce(l, p, w, r)
  return L.get_total_loss(add_regularization_losses=False)


def _total_loss_with_penalty(l, p, w, r):
  _sce(l, p, w, r)
  L.add_loss(1e-3 * tf.nn.l2_loss(p),
             tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)
  return L.get_total_loss()


def _hand_logsumexp(l, p, w, r):
  del w, r
  picked = tf.reduce_sum(_one_hot(l) * tf.cast(p, tf.float32), -1)
  return tf.reduce_mean(tf.reduce_logsumexp(p, -1) - picked)


_ROWS += [
    ('softmax_cross_entropy_label_smoothing', lambda l, p, w, r: _sce(
        l, p, w, label_smoothing=0.1), 'logits', DEFAULT),
    ('sigmoid_cross_entropy_label_smoothing',
     lambda l, p, w, r: L.sigmoid_cross_entropy(
         _one_hot(l), p, w[:, None], label_smoothing=0.1), 'logits', DEFAULT),
    ('mean_pairwise_squared_error',
     lambda l, p, w, r: L.mean_pairwise_squared_error(
         _one_hot(l), p, w[:, None]), 'logits', DEFAULT),
    # How model_fns combine them (the failing program ended with
    # get_total_loss).
    ('get_total_loss', _total_loss, 'logits', DEFAULT),
    ('get_total_loss_with_regularization', _total_loss_with_penalty,
     'logits', DEFAULT),
    ('identity', lambda l, p, w, r: tf.identity(_sce(l, p, w)), 'logits',
     DEFAULT),
    ('sum_of_two', lambda l, p, w, r: _sce(l, p, w) + _sce(
        l, p, 2.0 * w, R.MEAN), 'logits', DEFAULT),
    ('scaled', lambda l, p, w, r: _sce(l, p, w) * 0.3, 'logits', DEFAULT),
    ('under_control_dependencies', lambda l, p, w, r: (
        lambda loss: tf.identity(loss))(_sce(l, p, w)), 'logits', DEFAULT),
    # Chosen by tf.cond (a warm-up schedule, a mode switch): the loss
    # leaves its branch in float32 (autocast/branches.py); with a library
    # loss in one branch and a float32 one by hand in the other, the cond
    # failed ("true_fn and false_fn ... must have the same ... type").
    ('through_cond', lambda l, p, w, r: tf.cond(
        tf.constant(True), lambda: _sce(l, p, w),
        lambda: _sce(l, p, 2.0 * w, R.MEAN)), 'logits', DEFAULT),
    ('through_cond_by_hand', lambda l, p, w, r: tf.cond(
        tf.constant(False), lambda: _sce(l, p, w),
        lambda: -tf.reduce_mean(tf.reduce_sum(
            _one_hot(l) * tf.nn.log_softmax(p), -1))), 'logits', DEFAULT),
    # The other branch computes in bfloat16 (a max is exact): it is cast
    # to float32 to match the branch that returns the float32 loss.
    ('through_cond_other_branch_bfloat16', lambda l, p, w, r: tf.cond(
        tf.constant(False), lambda: _sce(l, p, w),
        lambda: -tf.reduce_max(p)), 'logits', DEFAULT),
    # tf.nn cross-entropies.
    ('nn_softmax_cross_entropy_with_logits', lambda l, p, w, r:
     tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(
         labels=_one_hot(l), logits=p)), 'logits', DEFAULT),
    ('nn_v1_softmax_cross_entropy_with_logits', lambda l, p, w, r:
     tf.reduce_mean(tf.compat.v1.nn.softmax_cross_entropy_with_logits(
         labels=_one_hot(l), logits=p)), 'logits', DEFAULT),
    ('nn_sparse_softmax_cross_entropy_with_logits', lambda l, p, w, r:
     tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
         labels=l, logits=p)), 'logits', DEFAULT),
    ('nn_sigmoid_cross_entropy_with_logits', lambda l, p, w, r:
     tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
         labels=_one_hot(l), logits=p)), 'logits', DEFAULT),
    ('nn_weighted_cross_entropy_with_logits', lambda l, p, w, r:
     tf.reduce_mean(tf.nn.weighted_cross_entropy_with_logits(
         labels=_one_hot(l), logits=p, pos_weight=2.0)), 'logits', DEFAULT),
    # Written by hand.
    ('log_softmax_times_one_hot', lambda l, p, w, r: -tf.reduce_mean(
        tf.reduce_sum(_one_hot(l) * tf.nn.log_softmax(p), -1)), 'logits',
     DEFAULT),
    ('log_softmax_gathered', lambda l, p, w, r: -tf.reduce_mean(
        tf.gather(tf.reshape(tf.nn.log_softmax(p), [-1]),
                  tf.range(BATCH) * CLASSES + l)), 'logits', DEFAULT),
    ('log_softmax_weighted_sum', lambda l, p, w, r: -tf.reduce_sum(
        w * tf.reduce_sum(_one_hot(l) * tf.nn.log_softmax(p), -1)) /
     tf.reduce_sum(w), 'logits', DEFAULT),
    ('reduce_logsumexp', _hand_logsumexp, 'logits', DEFAULT),
    ('log_of_softmax', lambda l, p, w, r: -tf.reduce_mean(tf.math.log(
        tf.reduce_sum(_one_hot(l) * tf.nn.softmax(p), -1))), 'logits',
     DEFAULT),
]


def _predictions(logits, kind):
  if kind == 'sigmoid':
    return tf.nn.sigmoid(logits)
  if kind == 'normalized':
    return tf.nn.l2_normalize(logits, -1)
  return logits


def _build(call, kind, reduction, precision):
  """Builds the row's TRAIN graph; returns (loss, predictions)."""
  built = {}

  def model_fn(features, labels, mode):
    logits = tf.compat.v1.layers.dense(
        features, CLASSES, kernel_initializer=tf.constant_initializer(KERNEL),
        name='logits')
    built['predictions'] = _predictions(logits, kind)
    loss = _reduced(call(labels, built['predictions'], tf.constant(WEIGHTS),
                         reduction))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_or_create_global_step())
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, loss=loss, train_op=train_op)

  spec = eb.wrap_model_fn(model_fn, precision)(
      tf.constant(FEATURES), tf.constant(LABELS), 'train')
  return spec.loss, built['predictions']


def _run(fetches):
  with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    return sess.run(fetches)


def _bfloat16_after_float32_ops(loss, start):
  """bfloat16 tensors on paths from a float32-list op's result to `loss`.

  Args:
    loss: the float32 loss.
    start: tensors where the walk stops (the predictions).

  Returns:
    Names of bfloat16 tensors that depend on a float32-list op's output and
    that `loss` depends on: roundings inside the loss's own ops.
  """
  float32_ops = op_lists.FLOAT32_OPS | op_lists.FLOAT32_KEEP_DTYPE_OPS
  stop = {t.ref() for t in start}
  after = {}

  def depends(tensor):
    key = tensor.ref()
    if key not in after:
      after[key] = False  # Cycles (none in a forward graph) end here.
      if key not in stop:
        # Every input is walked: a float32 op's inputs may be roundings
        # of an earlier float32 op's result.
        from_inputs = [depends(t) for t in tensor.op.inputs]
        after[key] = tensor.op.type in float32_ops or any(from_inputs)
    return after[key]

  depends(loss)
  return sorted(ref.deref().name for ref, found in after.items()
                if found and ref.deref().dtype.base_dtype == tf.bfloat16)


# Rows still rounded to bfloat16 somewhere after predictions (left open,
# issue 45): elementwise terms that the row itself builds in the
# predictions' dtype around a float32 op. A rounding is rearranged before a
# float32 op reads it (a gather of log-softmax output), or the row squares
# a bfloat16 difference before `compute_weighted_loss`. A rule that made
# those ops float32 would also make layer norm's `x - mean` float32.
# TensorFlow's own multi-op losses (sigmoid and weighted cross-entropy,
# reduce_logsumexp, and tf.compat.v1.losses' cross-entropies with their
# label smoothing) are computed whole in float32 (autocast.composites).
# These rows hold their value to bfloat16 rounding of the elementwise
# terms; the others to float32 arithmetic.
_ROUNDED_TERMS = ('log_softmax_gathered', 'compute_weighted_loss')


@pytest.mark.slow
class LossTableTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_ROWS)
  def test_float32_loss_computed_in_float32(self, call, kind, reduction):
    rounded_terms = self._testMethodName.split(
        'computed_in_float32_')[1].startswith(_ROUNDED_TERMS)
    with tf.Graph().as_default():
      loss, predictions = _build(call, kind, reduction, 'bfloat16')
      self.assertEqual(predictions.dtype, tf.bfloat16)
      self.assertEqual(loss.dtype, tf.float32)
      if not rounded_terms:
        self.assertEqual(_bfloat16_after_float32_ops(loss, [predictions]),
                         [])
      got, predicted = _run([loss, tf.cast(predictions, tf.float32)])
    with tf.Graph().as_default():  # The float32 loss of the same predictions.
      same = _reduced(call(tf.constant(LABELS), tf.constant(predicted),
                           tf.constant(WEIGHTS), reduction))
      expected = _run(same)
    tolerance = 2.0**-8 if rounded_terms else 1e-5  # bfloat16: 8 bits.
    self.assertAllClose(got, expected, rtol=tolerance, atol=1e-6)
    with tf.Graph().as_default():
      float32_loss, _ = _build(call, kind, reduction, 'float32')
      self.assertEqual(float32_loss.dtype, tf.float32)
      float32_value = _run(float32_loss)
    # The predictions differ by bfloat16 rounding of the layer's inputs.
    self.assertAllClose(got, float32_value, rtol=3e-2, atol=3e-3)


if __name__ == '__main__':
  tf.test.main()
