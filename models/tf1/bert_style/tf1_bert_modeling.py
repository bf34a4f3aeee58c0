"""A tiny Transformer encoder in the style of TF 1.x BERT model code."""

import math

import tensorflow as tf


def gelu(x):
  cdf = 0.5 * (1.0 + tf.tanh(
      math.sqrt(2 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
  return x * cdf


def layer_norm(input_tensor, name=None):
  return tf.contrib.layers.layer_norm(
      inputs=input_tensor, begin_norm_axis=-1, begin_params_axis=-1,
      scope=name)


def dense(x, width, name):
  """A dense layer from raw variables, as TF 1.x model code often wrote."""
  in_width = x.shape[-1].value  # A Dimension in TF 1.x.
  w = tf.get_variable(name + '/kernel', [in_width, width],
                      initializer=tf.truncated_normal_initializer(
                          stddev=0.02))
  b = tf.get_variable(name + '/bias', [width],
                      initializer=tf.zeros_initializer())
  return tf.nn.bias_add(tf.matmul(x, w), b)


def attention(x, mask, num_heads, seq_length, name):
  """Self-attention over [batch * seq, width] with a float mask adder."""
  width = x.shape[-1].value
  head = width // num_heads

  def split(t):
    t = tf.reshape(t, [-1, seq_length, num_heads, head])
    return tf.transpose(t, [0, 2, 1, 3])

  with tf.variable_scope(name):
    q = split(dense(x, width, 'query'))
    k = split(dense(x, width, 'key'))
    v = split(dense(x, width, 'value'))
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(head))
    adder = (1.0 - tf.cast(mask[:, None, None, :], tf.float32)) * -10000.0
    probs = tf.nn.softmax(scores + adder)
    context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
    return tf.reshape(context, [-1, width])


class Encoder(object):
  """Embeddings, `num_layers` Transformer layers, a masked mean pool."""

  def __init__(self, input_ids, input_mask, is_training, vocab_size=32,
               width=32, num_layers=2, num_heads=2):
    batch_size, seq_length = input_ids.shape.as_list()
    dropout = 0.1 if is_training else 0.0
    with tf.variable_scope('bert'):
      table = tf.get_variable('word_embeddings', [vocab_size, width],
                              initializer=tf.truncated_normal_initializer(
                                  stddev=0.02))
      positions = tf.get_variable('position_embeddings', [seq_length, width])
      x = tf.gather(table, tf.reshape(input_ids, [-1]))
      x = tf.reshape(x, [-1, seq_length, width]) + positions
      x = layer_norm(tf.reshape(x, [-1, width]), 'embeddings/LayerNorm')
      for i in range(num_layers):
        with tf.variable_scope('layer_%d' % i):
          a = attention(x, input_mask, num_heads, seq_length, 'attention')
          a = tf.nn.dropout(a, keep_prob=1.0 - dropout)
          x = layer_norm(x + dense(a, width, 'attention_output'),
                         'attention_LayerNorm')
          h = gelu(dense(x, 2 * width, 'intermediate'))
          x = layer_norm(x + dense(h, width, 'output'), 'output_LayerNorm')
      weights = tf.cast(input_mask, tf.float32)[:, :, None]
      mean = tf.reduce_sum(tf.reshape(x, [-1, seq_length, width]) * weights,
                           axis=1) / tf.reduce_sum(weights, axis=1)
      with tf.variable_scope('pooler'):
        self.pooled_output = tf.tanh(dense(mean, width, 'dense'))
    del batch_size
