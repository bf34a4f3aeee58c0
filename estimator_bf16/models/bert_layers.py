"""The building blocks of the BERT encoder, dtype-explicit.

Every function takes the compute dtype (float32 or bfloat16) as an argument
or from its input and keeps matmuls in it: weights are requested with
`get_variable(..., dtype=dtype)`, so inside `eb.bfloat16_scope('bfloat16')`
they are float32 variables read through a bfloat16 cast and never meet
bfloat16 activations as float32 (which would turn a matmul into a float32
`SparseMatMul`). The numerically sensitive parts run in float32 and hand back
the compute dtype: layer-norm statistics and the attention softmax.

Variable names follow google-research/bert's `modeling.py`, so
`tf.compat.v1.train.init_from_checkpoint(path, {'bert/': 'bert/'})` can warm
start from a published checkpoint in either precision.
"""

import tensorflow as tf


def shape_list(tensor):
  """Static dimensions where known, dynamic scalars elsewhere."""
  static = tensor.shape.as_list()
  dynamic = tf.shape(tensor)
  return [dim if dim is not None else dynamic[i]
          for i, dim in enumerate(static)]


def initializer(stddev):
  return tf.compat.v1.truncated_normal_initializer(stddev=stddev)


def dense(inputs, units, *, stddev, activation=None, name='dense'):
  """A fully connected layer on the last axis, in the dtype of `inputs`.

  Args:
    inputs: [N, D] float32 or bfloat16.
    units: output width.
    stddev: truncated-normal standard deviation of the kernel.
    activation: optional elementwise function.
    name: variable scope; variables are `<name>/kernel` [D, units] and
      `<name>/bias` [units].

  Returns:
    [N, units] in the dtype of `inputs`.
  """
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        'kernel', [inputs.shape[-1], units], dtype=inputs.dtype,
        initializer=initializer(stddev))
    bias = tf.compat.v1.get_variable(
        'bias', [units], dtype=inputs.dtype,
        initializer=tf.compat.v1.zeros_initializer())
  outputs = tf.nn.bias_add(tf.matmul(inputs, kernel), bias)
  return activation(outputs) if activation else outputs


def layer_norm(inputs, epsilon=1e-12, name='LayerNorm'):
  """Layer norm over the last axis with float32 statistics and parameters.

  A mean and variance over 768 bfloat16 values lose most of their bits, and
  BERT's epsilon of 1e-12 is below bfloat16's resolution next to 1, so the
  whole normalisation runs in float32 and only the result is cast back.

  The gradient is written out (`_normalize`) rather than derived op by op:
  TensorFlow's derived gradient keeps `x - mean` and the normalised values,
  two float32 tensors of the input's size, from the forward pass until the
  backward pass reaches this layer. Here the backward pass keeps only the
  input, in its own dtype (half the bytes in bfloat16), and the per-row mean
  and inverse deviation, and recomputes the normalised values from them;
  in float32 and bfloat16 alike, with the same values as the derived one.

  Args:
    inputs: [..., D] float32 or bfloat16.
    epsilon: added to the variance.
    name: variable scope; `gamma` and `beta` are float32 [D].

  Returns:
    Same shape and dtype as `inputs`.
  """
  depth = inputs.shape[-1]
  with tf.compat.v1.variable_scope(name):
    gamma = tf.compat.v1.get_variable(
        'gamma', [depth], dtype=tf.float32,
        initializer=tf.compat.v1.ones_initializer())
    beta = tf.compat.v1.get_variable(
        'beta', [depth], dtype=tf.float32,
        initializer=tf.compat.v1.zeros_initializer())
    return _normalize(inputs, tf.convert_to_tensor(gamma),
                      tf.convert_to_tensor(beta), epsilon)


def _normalize(inputs, gamma, beta, epsilon):
  """`layer_norm`'s computation: float32 inside, the input's dtype outside."""

  @tf.custom_gradient
  def normalize(x, gamma, beta):
    values = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(values, axes=[-1], keepdims=True)
    inverse = tf.math.rsqrt(variance + epsilon)
    output = tf.cast((values - mean) * inverse * gamma + beta, x.dtype)

    def gradient(d_output):
      # Recomputed after the incoming gradient exists: made any earlier (it
      # depends on forward tensors only), the float32 copy would be held
      # from the forward pass on, which is what this gradient avoids.
      with tf.control_dependencies([d_output]):
        normed = (tf.cast(x, tf.float32) - mean) * inverse
      d_normed = tf.cast(d_output, tf.float32)
      rows = list(range(d_normed.shape.ndims - 1))
      d_gamma = tf.reduce_sum(d_normed * normed, rows)
      d_beta = tf.reduce_sum(d_normed, rows)
      d_normed *= gamma
      # d/dx of (x - mean) * rsqrt(variance + epsilon), for each row.
      d_x = inverse * (
          d_normed - tf.reduce_mean(d_normed, -1, keepdims=True) -
          normed * tf.reduce_mean(d_normed * normed, -1, keepdims=True))
      return tf.cast(d_x, x.dtype), d_gamma, d_beta

    return output, gradient

  return normalize(inputs, gamma, beta)


def dropout(inputs, rate, is_training):
  # Only while training; a zero rate adds no op.
  if not is_training or not rate:
    return inputs
  return tf.nn.dropout(inputs, rate=rate)


def embeddings(input_ids, segment_ids, config, dtype, is_training):
  """Word + position + segment embeddings, layer norm and dropout.

  Args:
    input_ids: [B, S] int32 token ids (never cast: a gather takes int32
      indices on every device).
    segment_ids: [B, S] int32 segment (token type) ids.
    config: a `BertConfig`.
    dtype: compute dtype, float32 or bfloat16.
    is_training: Python bool; enables dropout.

  Returns:
    [B, S, H] in `dtype`.
  """
  init = initializer(config.initializer_range)
  hidden = config.hidden_size
  with tf.compat.v1.variable_scope('embeddings'):
    word_table = tf.compat.v1.get_variable(
        'word_embeddings', [config.vocab_size, hidden], dtype=dtype,
        initializer=init)
    type_table = tf.compat.v1.get_variable(
        'token_type_embeddings', [config.type_vocab_size, hidden],
        dtype=dtype, initializer=init)
    position_table = tf.compat.v1.get_variable(
        'position_embeddings', [config.max_position_embeddings, hidden],
        dtype=dtype, initializer=init)
    seq_length = shape_list(input_ids)[1]
    output = tf.gather(word_table, input_ids) + tf.gather(type_table,
                                                          segment_ids)
    # Positions are the same for every example: one slice, broadcast over
    # the batch.
    output += tf.slice(position_table, [0, 0], [seq_length, -1])[None]
    output = layer_norm(output)
  return dropout(output, config.hidden_dropout_prob, is_training)


def attention_mask_adder(input_mask, dtype):
  """Turns a [B, S] 0/1 mask into a [B, 1, 1, S] additive score mask.

  Kept positions add 0 and padding adds -10000, which the softmax turns into
  a zero weight. The adder is built in the compute dtype: a float32 constant
  added to bfloat16 scores fails to build (mismatched dtypes), and -10000 is
  representable closely enough in bfloat16 (-9984 .. -10048) to vanish in the
  softmax either way.

  Args:
    input_mask: [B, S] int32, 1 for real tokens and 0 for padding.
    dtype: the dtype of the attention scores.

  Returns:
    [B, 1, 1, S] in `dtype`.
  """
  mask = tf.cast(input_mask, dtype)[:, None, None, :]
  return (tf.constant(1.0, dtype) - mask) * tf.constant(-10000.0, dtype)


def self_attention(inputs, mask_adder, config, is_training):
  """Multi-head self-attention over a [B, S, H] sequence.

  Args:
    inputs: [B, S, H] float32 or bfloat16.
    mask_adder: [B, 1, 1, S] in the dtype of `inputs`.
    config: a `BertConfig`; `hidden_size` must divide by
      `num_attention_heads`.
    is_training: Python bool; enables dropout on the attention weights.

  Returns:
    [B, S, H] context vectors (before the output projection), same dtype.
  """
  batch, seq_length, hidden = shape_list(inputs)
  heads = config.num_attention_heads
  head_size = config.hidden_size // heads
  flat = tf.reshape(inputs, [-1, hidden])

  def project(name):
    # [B*S, H] -> [B, heads, S, head_size]
    values = dense(flat, hidden, stddev=config.initializer_range, name=name)
    values = tf.reshape(values, [batch, seq_length, heads, head_size])
    return tf.transpose(values, [0, 2, 1, 3])

  dtype = inputs.dtype
  # Scaling the queries rather than the scores touches S*d values, not S*S.
  query = project('query') * tf.constant(head_size ** -0.5, dtype)
  key = project('key')
  value = project('value')
  scores = tf.matmul(query, key, transpose_b=True) + mask_adder
  # The softmax normalises in float32 (a sum of up to 512 exponentials), and
  # the weights go back to the compute dtype for the second matmul.
  weights = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32)), dtype)
  weights = dropout(weights, config.attention_probs_dropout_prob, is_training)
  context = tf.matmul(weights, value)
  context = tf.transpose(context, [0, 2, 1, 3])
  return tf.reshape(context, [batch, seq_length, hidden])


def transformer_layer(inputs, mask_adder, config, is_training):
  """One post-norm transformer layer: attention and GELU feed-forward.

  Args:
    inputs: [B, S, H] float32 or bfloat16.
    mask_adder: [B, 1, 1, S] in the same dtype.
    config: a `BertConfig`.
    is_training: Python bool; enables dropout.

  Returns:
    [B, S, H] in the dtype of `inputs`.
  """
  batch, seq_length, hidden = shape_list(inputs)
  stddev = config.initializer_range
  flat_inputs = tf.reshape(inputs, [-1, hidden])
  with tf.compat.v1.variable_scope('attention'):
    with tf.compat.v1.variable_scope('self'):
      context = self_attention(inputs, mask_adder, config, is_training)
    with tf.compat.v1.variable_scope('output'):
      attended = dense(tf.reshape(context, [-1, hidden]), hidden,
                       stddev=stddev)
      attended = dropout(attended, config.hidden_dropout_prob, is_training)
      attended = layer_norm(attended + flat_inputs)
  with tf.compat.v1.variable_scope('intermediate'):
    # BERT's tanh approximation of GELU, which published checkpoints were
    # trained with.
    expanded = dense(attended, config.intermediate_size, stddev=stddev,
                     activation=lambda x: tf.nn.gelu(x, approximate=True))
  with tf.compat.v1.variable_scope('output'):
    output = dense(expanded, hidden, stddev=stddev)
    output = dropout(output, config.hidden_dropout_prob, is_training)
    output = layer_norm(output + attended)
  return tf.reshape(output, [batch, seq_length, hidden])
