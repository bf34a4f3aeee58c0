"""Tests for estimator_bf16/models/bert.py: presets, training, masking and bfloat16 audit.

BERT-tiny at sequence length 16 is run; BERT-base at 128 is only built, and
its graph audited.
"""

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import op_lists
from estimator_bf16.models import bert
from estimator_bf16.models import bert_input
from estimator_bf16.models import bert_layers

_PRECISIONS = (
    dict(testcase_name='float32', precision='float32'),
    dict(testcase_name='bfloat16', precision='bfloat16'),
)
_SEQ_LENGTH = 16
_VOCAB_SIZE = 200
# Relative L2 norm of (bfloat16 - float32) logits of the same weights,
# BERT-tiny without dropout; bfloat16 keeps 8 significant bits.
_LOGITS_RTOL = 0.03


def setUpModule():
  tf.compat.v1.disable_eager_execution()


def _tiny_config(**overrides):
  return bert.BertConfig.preset('tiny', vocab_size=_VOCAB_SIZE, **overrides)


def _synthetic_batches(batch_size, seed=0, repeat_first=False):
  input_fn = bert_input.synthetic_bert_input_fn_builder(
      seq_length=_SEQ_LENGTH, vocab_size=_VOCAB_SIZE, seed=seed)
  dataset = input_fn({'batch_size': batch_size})
  if repeat_first:
    dataset = dataset.take(1).cache().repeat()
  return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


def _build(config, features, precision, is_training, num_labels=2):
  with eb.bfloat16_scope(precision):
    network_fn = bert.bert_classifier(config, num_labels,
                                      dtype=eb.compute_dtype(precision))
    return network_fn(features, is_training)


def _train_graph(config, precision, features, labels, learning_rate):
  logits = _build(config, features, precision, is_training=True)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
      labels, tf.cast(logits, tf.float32))
  train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(loss)
  return logits, loss, train_op


class BertConfigTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('tiny', 'tiny', 2, 128, 2), ('mini', 'mini', 4, 256, 4),
      ('small', 'small', 4, 512, 8), ('medium', 'medium', 8, 512, 8),
      ('base', 'base', 12, 768, 12))
  def test_presets(self, name, layers, hidden, heads):
    config = bert.BertConfig.preset(name)
    self.assertEqual((config.num_hidden_layers, config.hidden_size,
                      config.num_attention_heads, config.intermediate_size),
                     (layers, hidden, heads, 4 * hidden))
    self.assertEqual(config.vocab_size, 30522)
    self.assertEqual(config.max_position_embeddings, 512)

  def test_base_preset_is_the_default(self):
    self.assertEqual(bert.BertConfig.preset('base'), bert.BertConfig())

  def test_overrides_win(self):
    self.assertEqual(bert.BertConfig.preset('tiny', vocab_size=99).vocab_size,
                     99)

  def test_bad_preset_lists_choices(self):
    with self.assertRaisesRegex(ValueError, "'tiny'.*'base'.*'large'"):
      bert.BertConfig.preset('large')

  def test_heads_must_divide_hidden(self):
    with self.assertRaisesRegex(ValueError, 'multiple of num_attention_heads'):
      bert.BertConfig(hidden_size=100, num_attention_heads=3)


class LayerNormTest(tf.test.TestCase, parameterized.TestCase):
  """bert_layers.layer_norm: float32 math, a written-out gradient."""

  def _gradients(self, layer, dtype, rng_values):
    """(forward output, [d inputs, d gamma, d beta], float32 tensors kept).

    `layer(inputs, gamma, beta)` is built in a new graph on bfloat16-exact
    inputs (so both dtypes hold the same values) with the given gamma and
    beta, under a loss weighting every output element.
    """
    x, gamma_value, beta_value, weights = rng_values
    with tf.Graph().as_default() as graph:
      exact = tf.cast(tf.cast(x, tf.bfloat16), tf.float32)
      inputs = tf.identity(tf.cast(exact, dtype), name='inputs')
      output = layer(inputs)
      with tf.compat.v1.variable_scope('LayerNorm', reuse=True):
        gamma = tf.compat.v1.get_variable('gamma')
        beta = tf.compat.v1.get_variable('beta')
      loss = tf.reduce_sum(tf.cast(output, tf.float32) * weights)
      grads = tf.gradients(loss, [inputs, gamma, beta])
      # Tensors of the input's size that the backward pass reads from the
      # forward pass (constants aside).
      kept = {t.name for op in graph.get_operations()
              if op.name.startswith('gradients/LayerNorm/') and
              op.type != 'ZerosLike'  # of unused outputs: never run
              for t in op.inputs
              if not t.op.name.startswith('gradients') and
              t.op.type != 'Const' and t.shape == inputs.shape}
      with self.session(graph=graph) as sess:
        sess.run([gamma.assign(gamma_value), beta.assign(beta_value)])
        values = sess.run([tf.cast(t, tf.float32)
                           for t in [output] + grads])
    return values[0], values[1:], kept

  @parameterized.named_parameters(
      # float32: the same math in another order; bfloat16: the input
      # gradient is rounded to bfloat16 in both, so within a bfloat16 step
      # of its largest value.
      ('float32', tf.float32, 1e-5),
      ('bfloat16', tf.bfloat16, 2.0**-7))
  def test_gradient_matches_the_derived_one_without_float32_copies(
      self, dtype, tolerance):
    rng = np.random.RandomState(0)
    rng_values = (rng.randn(3, 5, 16).astype(np.float32) * 3 + 1,
                  rng.randn(16) + 1.0, rng.randn(16),
                  rng.randn(3, 5, 16).astype(np.float32))

    def derived(inputs):
      # The same float32 math, differentiated by TensorFlow op by op.
      with tf.compat.v1.variable_scope('LayerNorm'):
        gamma = tf.compat.v1.get_variable('gamma', [16])
        beta = tf.compat.v1.get_variable('beta', [16])
        values = tf.cast(inputs, tf.float32)
        mean, variance = tf.nn.moments(values, axes=[-1], keepdims=True)
        return tf.cast((values - mean) * tf.math.rsqrt(variance + 1e-12) *
                       gamma + beta, inputs.dtype)

    output, got, kept = self._gradients(bert_layers.layer_norm, dtype,
                                        rng_values)
    reference, want, derived_kept = self._gradients(derived, dtype,
                                                    rng_values)
    # The forward math is the same; grappler may fuse it differently.
    self.assertAllClose(reference, output, rtol=1e-6, atol=1e-6)
    for name, a, b in zip(('inputs', 'gamma', 'beta'), got, want):
      self.assertAllClose(a, b, atol=tolerance * np.abs(b).max(), rtol=0,
                          msg=name)
    # At the input's size the backward pass keeps the input alone (2 bytes
    # an element in bfloat16); the derived gradient keeps float32 copies.
    self.assertEqual({'inputs:0'}, kept)
    self.assertGreater(len(derived_kept), 1)


@pytest.mark.slow
class BertTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('none_is_float32', None, tf.float32),
      ('name', 'bfloat16', tf.bfloat16),
      ('dtype', tf.bfloat16, tf.bfloat16))
  def test_dtype_argument(self, dtype, expected):
    with tf.Graph().as_default():
      features, _ = _synthetic_batches(2)
      with eb.bfloat16_scope('bfloat16'):
        logits = bert.bert_classifier(_tiny_config(), 3, dtype=dtype)(
            features, is_training=False)
    self.assertEqual(logits.dtype, expected)
    self.assertEqual(logits.shape.as_list(), [2, 3])

  def test_rejects_float16(self):
    with self.assertRaisesRegex(ValueError, 'float32 or bfloat16'):
      bert.bert_classifier(_tiny_config(), 2, dtype=tf.float16)

  def test_rejects_int64_ids(self):
    with tf.Graph().as_default():
      features = {key: tf.zeros([2, 8], tf.int64)
                  for key in ('input_ids', 'input_mask', 'segment_ids')}
      with self.assertRaisesRegex(TypeError, "'input_ids' must be int32"):
        bert.bert_classifier(_tiny_config(), 2)(features, False)

  def test_builds_with_unknown_batch(self):
    # What export does: int32 serving ids, batch size unknown.
    with tf.Graph().as_default():
      features = {key: tf.compat.v1.placeholder(tf.int32, [None, 16])
                  for key in ('input_ids', 'input_mask', 'segment_ids')}
      logits = _build(_tiny_config(), features, 'float32', is_training=False)
      self.assertEqual(logits.shape.as_list(), [None, 2])
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        values = session.run(logits, {features[key]: np.ones([3, 16])
                                      for key in features})
    self.assertEqual(values.shape, (3, 2))

  # bfloat16 training is test_bfloat16_learns_synthetic_task.
  @parameterized.named_parameters(_PRECISIONS[0])
  def test_trains(self, precision):
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(1)
      features, labels = _synthetic_batches(16, repeat_first=True)
      logits, loss, train_op = _train_graph(
          _tiny_config(), precision, features, labels, 1e-3)
      self.assertEqual(logits.dtype, eb.compute_dtype(precision))
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        losses = [session.run([train_op, loss])[1] for _ in range(10)]
    self.assertTrue(np.all(np.isfinite(losses)), losses)
    self.assertLess(np.mean(losses[-3:]), losses[0])

  def test_bfloat16_learns_synthetic_task(self):
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(1)
      features, labels = _synthetic_batches(32)
      logits, loss, train_op = _train_graph(_tiny_config(), 'bfloat16',
                                            features, labels, 1e-3)
      self.assertEqual(logits.dtype, tf.bfloat16)
      # Held-out examples (another seed), no dropout.
      eval_features, eval_labels = _synthetic_batches(256, seed=1)
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       reuse=True):
        eval_logits = _build(_tiny_config(), eval_features, 'bfloat16',
                             is_training=False)
      correct = tf.equal(tf.argmax(eval_logits, -1, output_type=tf.int32),
                         eval_labels)
      accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        losses = [session.run([train_op, loss])[1] for _ in range(150)]
        self.assertGreater(session.run(accuracy), 0.9)
    self.assertTrue(np.all(np.isfinite(losses)), losses)
    self.assertLess(np.mean(losses[-3:]), losses[0])

  def test_padding_does_not_change_logits(self):
    with tf.Graph().as_default():
      features, _ = _synthetic_batches(8)
      # Rewrite every padded position with other token and segment ids.
      padding = tf.equal(features['input_mask'], 0)
      changed = dict(features)
      changed['input_ids'] = tf.where(padding, 7, features['input_ids'])
      changed['segment_ids'] = tf.where(padding, 1, features['segment_ids'])
      logits = _build(_tiny_config(), features, 'bfloat16', False)
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       reuse=True):
        changed_logits = _build(_tiny_config(), changed, 'bfloat16', False)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        mask, logits, changed_logits = session.run(
            [features['input_mask'], logits, changed_logits])
    self.assertLess(mask.sum(), mask.size)  # There was padding to change.
    self.assertAllEqual(logits, changed_logits)

  def test_bfloat16_logits_close_to_float32(self):
    config = _tiny_config()
    with tf.Graph().as_default():
      tf.compat.v1.set_random_seed(2)
      features, _ = _synthetic_batches(8)
      expected = _build(config, features, 'float32', False)
      # The bfloat16 network reads the same float32 variables.
      with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                       reuse=True):
        actual = _build(config, features, 'bfloat16', False)
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        # Larger output weights than the 0.02 initialisation, so the logits
        # reflect the whole pooled vector rather than sitting near zero.
        output_weights = [v for v in tf.compat.v1.global_variables()
                          if v.op.name == 'output_weights'][0]
        output_weights.load(
            np.random.RandomState(0).normal(size=[2, 128]), session)
        expected, actual = session.run([expected, tf.cast(actual,
                                                          tf.float32)])
    difference = (np.linalg.norm(actual - expected) /
                  np.linalg.norm(expected))
    print('BERT-tiny bfloat16 vs float32 logits: relative L2 %.4f, max abs '
          '%.4f of max %.3f' % (difference, np.abs(actual - expected).max(),
                                np.abs(expected).max()))
    self.assertLess(difference, _LOGITS_RTOL)

  def test_variable_names_match_bert_and_not_precision(self):
    signatures = {}
    for precision in ('float32', 'bfloat16'):
      with tf.Graph().as_default():
        features, _ = _synthetic_batches(2)
        _build(_tiny_config(), features, precision, is_training=True)
        signatures[precision] = sorted(
            (v.op.name, tuple(v.shape.as_list()), v.dtype.base_dtype.name)
            for v in tf.compat.v1.global_variables())
    self.assertEqual(signatures['float32'], signatures['bfloat16'])
    names = {name for name, _, _ in signatures['float32']}
    # google-research/bert's names, so its checkpoints can warm-start this.
    for name in ('bert/embeddings/word_embeddings',
                 'bert/embeddings/LayerNorm/gamma',
                 'bert/encoder/layer_1/attention/self/query/kernel',
                 'bert/encoder/layer_1/attention/output/dense/kernel',
                 'bert/encoder/layer_1/attention/output/LayerNorm/beta',
                 'bert/encoder/layer_1/intermediate/dense/kernel',
                 'bert/encoder/layer_1/output/LayerNorm/gamma',
                 'bert/pooler/dense/bias', 'output_weights', 'output_bias'):
      self.assertIn(name, names)
    # Embeddings (5) + 16 per layer + pooler (2) + classifier (2).
    self.assertLen(names, 5 + 16 * 2 + 2 + 2)

  def test_base_graph_is_bfloat16(self):
    config = bert.BertConfig.preset('base')
    with tf.Graph().as_default() as graph:
      ids = tf.zeros([2, 128], tf.int32)
      features = {'input_ids': ids, 'input_mask': tf.ones_like(ids),
                  'segment_ids': ids}
      logits = _build(config, features, 'bfloat16', is_training=True)
      self.assertEqual(logits.dtype, tf.bfloat16)
      loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
          tf.zeros([2], tf.int32), tf.cast(logits, tf.float32))
      # The backward pass must stay in bfloat16 too.
      tf.gradients(loss, tf.compat.v1.trainable_variables())
      report = eb.check_graph(graph, strict=True, loss=loss)
      variables = tf.compat.v1.global_variables()
    self.assertEqual({v.dtype.base_dtype for v in variables}, {tf.float32})
    ops = graph.get_operations()
    self.assertEmpty([op.name for op in ops if op.type == 'SparseMatMul'])
    matmuls = [op for op in ops if op.type in op_lists.MATMUL_OPS]
    self.assertGreater(len(matmuls), 12 * 8)  # 6 dense + 2 batched per layer
    self.assertEmpty([(op.name, op.get_attr('T').name) for op in matmuls
                      if op.get_attr('T') != tf.bfloat16])
    self.assertGreater(report.bfloat16_flop_share, 0.9)
    # ids reach the embedding gathers as int32, uncast.
    gathers = [op for op in ops if op.type == 'GatherV2'
               and op.name.startswith('bert/embeddings/')]
    self.assertTrue(gathers)
    for op in gathers:
      self.assertEqual(op.inputs[1].dtype, tf.int32)
      self.assertEqual(op.inputs[0].dtype, tf.bfloat16)


if __name__ == '__main__':
  tf.test.main()
