"""A BERT classifier written the way google-research/bert writes its model.

Nothing here asks for a dtype: every weight comes from
`tf.compat.v1.get_variable` without one, the word embeddings are read with
`tf.gather`, the token-type embeddings with `one_hot(ids) @ table`, the
attention mask becomes a float32 `-10000.0` adder added to the attention
scores, and layer norm is tf-slim's (or hand-written with `tf.nn.moments`).
Under plain TensorFlow all of it is float32; it is the test of whether a
package can put such code in bfloat16 without edits.
"""

import dataclasses
import math

import tensorflow as tf
import tf_slim as slim

from estimator_bf16.models.styles import synthetic

NUM_CLASSES = 2


@dataclasses.dataclass
class BertStyleConfig:
  vocab_size: int = 32
  hidden_size: int = 32
  num_layers: int = 2
  num_heads: int = 2
  intermediate_size: int = 64
  max_positions: int = 16
  type_vocab_size: int = 2
  initializer_range: float = 0.02
  slim_layer_norm: bool = True  # False: by hand with tf.nn.moments


def _weight(name, shape, config):
  return tf.compat.v1.get_variable(
      name, shape, initializer=tf.compat.v1.truncated_normal_initializer(
          stddev=config.initializer_range))


def _dense(x, units, name, config, activation=None):
  """x [..., in] -> [..., units] with a get_variable kernel and bias."""
  with tf.compat.v1.variable_scope(name):
    kernel = _weight('kernel', [x.shape[-1], units], config)
    bias = tf.compat.v1.get_variable('bias', [units],
                                     initializer=tf.zeros_initializer())
    shape = tf.shape(x)
    flat = tf.reshape(x, [-1, x.shape[-1]])
    out = tf.nn.bias_add(tf.matmul(flat, kernel), bias)
    out = tf.reshape(out, tf.concat([shape[:-1], [units]], 0))
    return activation(out) if activation else out


def _layer_norm(x, name, config):
  if config.slim_layer_norm:
    return slim.layer_norm(x, begin_norm_axis=-1, begin_params_axis=-1,
                           scope=name)
  with tf.compat.v1.variable_scope(name):
    gamma = tf.compat.v1.get_variable('gamma', [x.shape[-1]],
                                      initializer=tf.ones_initializer())
    beta = tf.compat.v1.get_variable('beta', [x.shape[-1]],
                                     initializer=tf.zeros_initializer())
    mean, variance = tf.nn.moments(x, [-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + 1e-12) * gamma + beta


def _gelu(x):
  """The tanh approximation, as BERT writes it."""
  return 0.5 * x * (1.0 + tf.tanh(
      math.sqrt(2.0 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))


def _embeddings(input_ids, segment_ids, config):
  """int32 [B, S] ids -> [B, S, H] (float32 under plain TensorFlow)."""
  seq_length = input_ids.shape[1]
  table = _weight('word_embeddings', [config.vocab_size, config.hidden_size],
                  config)
  output = tf.gather(table, input_ids)
  types = _weight('token_type_embeddings',
                  [config.type_vocab_size, config.hidden_size], config)
  one_hot = tf.one_hot(tf.reshape(segment_ids, [-1]), config.type_vocab_size)
  output += tf.reshape(tf.matmul(one_hot, types),
                       [-1, seq_length, config.hidden_size])
  positions = _weight('position_embeddings',
                      [config.max_positions, config.hidden_size], config)
  output += tf.slice(positions, [0, 0], [seq_length, -1])[None]
  return _layer_norm(output, 'LayerNorm', config)


def _attention(x, adder, config):
  """Multi-head self-attention; `adder` float32 [B, 1, S, S] masks keys."""
  heads, width = config.num_heads, config.hidden_size // config.num_heads

  def split(t):  # [B, S, H] -> [B, heads, S, width]
    return tf.transpose(tf.reshape(t, [-1, t.shape[1], heads, width]),
                        [0, 2, 1, 3])

  query = split(_dense(x, config.hidden_size, 'query', config))
  key = split(_dense(x, config.hidden_size, 'key', config))
  value = split(_dense(x, config.hidden_size, 'value', config))
  scores = tf.matmul(query, key, transpose_b=True)
  scores = tf.multiply(scores, 1.0 / math.sqrt(float(width)))
  scores += adder
  probs = tf.nn.softmax(scores)
  context = tf.transpose(tf.matmul(probs, value), [0, 2, 1, 3])
  return tf.reshape(context, [-1, x.shape[1], config.hidden_size])


def encoder(features, config):
  """features int32 [B, S] ids/mask/segments -> pooled [B, H]."""
  with tf.compat.v1.variable_scope('bert'):
    with tf.compat.v1.variable_scope('embeddings'):
      x = _embeddings(features['input_ids'], features['segment_ids'], config)
    mask = tf.cast(features['input_mask'][:, None, None, :], tf.float32)
    adder = (1.0 - mask) * -10000.0
    with tf.compat.v1.variable_scope('encoder'):
      for i in range(config.num_layers):
        with tf.compat.v1.variable_scope('layer_%d' % i):
          with tf.compat.v1.variable_scope('attention'):
            attended = _attention(x, adder, config)
            attended = _dense(attended, config.hidden_size, 'output', config)
            x = _layer_norm(attended + x, 'LayerNorm', config)
          inner = _dense(x, config.intermediate_size, 'intermediate', config,
                         activation=_gelu)
          out = _dense(inner, config.hidden_size, 'output', config)
          x = _layer_norm(out + x, 'output_LayerNorm', config)
    with tf.compat.v1.variable_scope('pooler'):
      return _dense(x[:, 0], config.hidden_size, 'dense', config,
                    activation=tf.tanh)


def classifier_network(config, num_classes=NUM_CLASSES):
  """Returns network_fn(features, is_training) -> logits [B, num_classes].

  The head as run_classifier writes it: `output_weights` read with
  `tf.matmul(..., transpose_b=True)` plus `output_bias`.
  """

  def network_fn(features, is_training):
    del is_training  # no dropout in this model
    pooled = encoder(features, config)
    output_weights = _weight('output_weights', [num_classes,
                                                config.hidden_size], config)
    output_bias = tf.compat.v1.get_variable(
        'output_bias', [num_classes], initializer=tf.zeros_initializer())
    return tf.nn.bias_add(
        tf.matmul(pooled, output_weights, transpose_b=True), output_bias)

  return network_fn


def model_fn_builder(config=None, learning_rate=2e-3):
  """Returns a legacy model_fn, shaped like run_classifier's.

  The loss is BERT's: log-softmax summed against float32 one-hot labels.
  """
  network_fn = classifier_network(config or BertStyleConfig())

  def model_fn(features, labels, mode, params):
    del params
    logits = network_fn(features, mode == tf.estimator.ModeKeys.TRAIN)
    probabilities = tf.nn.softmax(logits, axis=-1)
    predictions = {'probabilities': probabilities,
                   'classes': tf.argmax(logits, axis=-1, output_type=tf.int32)}
    if mode == tf.estimator.ModeKeys.PREDICT:
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode=mode, predictions=predictions)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    one_hot_labels = tf.one_hot(labels, depth=NUM_CLASSES, dtype=tf.float32)
    per_example_loss = -tf.reduce_sum(one_hot_labels * log_probs, axis=-1)
    loss = tf.reduce_mean(per_example_loss)
    if mode == tf.estimator.ModeKeys.EVAL:
      def metric_fn(per_example_loss, labels, logits):
        predicted = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return {'eval_accuracy': tf.compat.v1.metrics.accuracy(labels,
                                                               predicted),
                'eval_loss': tf.compat.v1.metrics.mean(per_example_loss)}
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode=mode, loss=loss,
          eval_metrics=(metric_fn, [per_example_loss, labels, logits]))
    train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(
        loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode=mode, loss=loss, train_op=train_op)

  return model_fn


def input_fn_builder(num, seed, training, config=None):
  """Returns input_fn(params) over `num` synthetic token sequences."""
  config = config or BertStyleConfig()
  features, labels = synthetic.tokens(num, seed, config.max_positions,
                                      config.vocab_size)
  return synthetic.dataset_input_fn(features, labels, training)
