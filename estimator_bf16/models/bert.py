"""A BERT classifier written from scratch, float32 or bfloat16.

Token ids are integers, so the compute dtype cannot be read from the inputs:
it is an argument, `bert_classifier(config, num_labels, dtype)`. In bfloat16
the network must be built inside `eb.bfloat16_scope('bfloat16')`, which
stores every weight as float32 and reads it as bfloat16; the model_fn casts
the logits to float32 before the loss.

    network_fn = bert_classifier(BertConfig.preset('tiny'), num_labels=2,
                                 dtype=tf.bfloat16)
    logits = network_fn(features, is_training=True)   # [B, 2] bfloat16

The layers live in `bert_layers.py`; variable names match
google-research/bert (`bert/...`, `output_weights`, `output_bias`).
"""

import dataclasses

import tensorflow as tf

from estimator_bf16.models import bert_layers

# name -> (layers, hidden size, attention heads); the sizes of the published
# English BERT models (Turc et al., 2019, for the small ones).
_PRESETS = {
    'tiny': (2, 128, 2),
    'mini': (4, 256, 4),
    'small': (4, 512, 8),
    'medium': (8, 512, 8),
    'base': (12, 768, 12),
}
PRESETS = tuple(_PRESETS)

_FEATURE_KEYS = ('input_ids', 'input_mask', 'segment_ids')


@dataclasses.dataclass
class BertConfig:
  """Sizes of a BERT encoder; the defaults are BERT-base.

  Attributes:
    vocab_size: rows of the word embedding table (30522 for the uncased
      English WordPiece vocabulary; synthetic tasks can use far fewer).
    hidden_size: width of every token vector.
    num_hidden_layers: transformer layers.
    num_attention_heads: must divide `hidden_size`.
    intermediate_size: width of the GELU feed-forward layer (4 x hidden).
    hidden_dropout_prob: dropout on embeddings, layer outputs and the pooled
      vector while training.
    attention_probs_dropout_prob: dropout on attention weights.
    max_position_embeddings: longest sequence the position table covers.
    type_vocab_size: number of segment ids (2: sentence A and B).
    initializer_range: standard deviation of the truncated-normal weights.
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  initializer_range: float = 0.02

  @classmethod
  def preset(cls, name, **overrides):
    """Returns the config of a named size; keyword overrides win.

    Args:
      name: one of 'tiny' (2 layers, hidden 128, 2 heads), 'mini'
        (4/256/4), 'small' (4/512/8), 'medium' (8/512/8), 'base' (12/768/12).
      **overrides: any other field, e.g. `vocab_size=1000`.

    Returns:
      A `BertConfig` with intermediate size 4 x hidden.

    Raises:
      ValueError: for an unknown name; the message lists the choices.
    """
    if name not in _PRESETS:
      raise ValueError('BERT preset must be one of %s, got %r.' %
                       (', '.join(repr(p) for p in PRESETS), name))
    layers, hidden, heads = _PRESETS[name]
    fields = dict(num_hidden_layers=layers, hidden_size=hidden,
                  num_attention_heads=heads, intermediate_size=4 * hidden)
    fields.update(overrides)
    return cls(**fields)

  def __post_init__(self):
    if self.hidden_size % self.num_attention_heads:
      raise ValueError('hidden_size (%d) must be a multiple of '
                       'num_attention_heads (%d).' %
                       (self.hidden_size, self.num_attention_heads))


def _as_compute_dtype(dtype):
  # None means float32, so callers that have no precision need not care.
  dtype = tf.float32 if dtype is None else tf.as_dtype(dtype)
  if dtype not in (tf.float32, tf.bfloat16):
    raise ValueError('BERT compute dtype must be float32 or bfloat16, got %s.'
                     % dtype.name)
  return dtype


def _check_features(features, config):
  missing = [key for key in _FEATURE_KEYS if key not in features]
  if missing:
    raise ValueError('BERT features need %s; missing %s.' %
                     (', '.join(_FEATURE_KEYS), ', '.join(missing)))
  for key in _FEATURE_KEYS:
    # The parser casts int64 (all tf.Example stores) to int32, which is what
    # TPUs handle; anything else here means the cast was skipped.
    if features[key].dtype != tf.int32:
      raise TypeError('BERT feature %r must be int32, got %s; cast it in the '
                      'input pipeline.' % (key, features[key].dtype.name))
  seq_length = features['input_ids'].shape[1]
  if seq_length is not None and seq_length > config.max_position_embeddings:
    raise ValueError('Sequence length %d exceeds max_position_embeddings %d.'
                     % (seq_length, config.max_position_embeddings))


def bert_encoder(config, dtype=tf.float32):
  """Returns `encoder_fn(features, is_training) -> (sequence, pooled)`.

  Args:
    config: a `BertConfig`.
    dtype: compute dtype, `tf.float32` or `tf.bfloat16` (or their names);
      None means float32.

  Returns:
    A function taking features {'input_ids', 'input_mask', 'segment_ids'},
    each [B, S] int32, and a Python bool `is_training`; it returns the last
    layer's [B, S, H] outputs and the [B, H] pooled first-token vector (a
    tanh dense layer), both in `dtype`. Variables live under `bert/`.

  Raises:
    ValueError: for a dtype other than float32 or bfloat16.
  """
  dtype = _as_compute_dtype(dtype)

  def encoder_fn(features, is_training):
    _check_features(features, config)
    with tf.compat.v1.variable_scope('bert'):
      sequence = bert_layers.embeddings(
          features['input_ids'], features['segment_ids'], config, dtype,
          is_training)
      mask_adder = bert_layers.attention_mask_adder(features['input_mask'],
                                                    dtype)
      with tf.compat.v1.variable_scope('encoder'):
        for index in range(config.num_hidden_layers):
          with tf.compat.v1.variable_scope('layer_%d' % index):
            sequence = bert_layers.transformer_layer(
                sequence, mask_adder, config, is_training)
      with tf.compat.v1.variable_scope('pooler'):
        pooled = bert_layers.dense(
            sequence[:, 0], config.hidden_size,
            stddev=config.initializer_range, activation=tf.tanh)
    return sequence, pooled

  return encoder_fn


def bert_classifier(config, num_labels, dtype=tf.float32):
  """Returns a sentence(-pair) classifier on top of the pooled BERT vector.

  Args:
    config: a `BertConfig`.
    num_labels: number of classes.
    dtype: compute dtype, `tf.float32` or `tf.bfloat16` (or their names);
      None means float32. The model_fn passes
      `eb.compute_dtype(params['precision'])`.

  Returns:
    `network_fn(features, is_training) -> logits`: features
    {'input_ids', 'input_mask', 'segment_ids'}, each [B, S] int32; logits
    [B, num_labels] in `dtype`. The classifier variables are `output_weights`
    [num_labels, H] and `output_bias`, as in BERT's `run_classifier.py`.

  Raises:
    ValueError: for a dtype other than float32 or bfloat16.
  """
  encoder_fn = bert_encoder(config, dtype)
  dtype = _as_compute_dtype(dtype)

  def network_fn(features, is_training):
    _, pooled = encoder_fn(features, is_training)
    pooled = bert_layers.dropout(pooled, config.hidden_dropout_prob,
                                 is_training)
    weights = tf.compat.v1.get_variable(
        'output_weights', [num_labels, config.hidden_size], dtype=dtype,
        initializer=bert_layers.initializer(config.initializer_range))
    bias = tf.compat.v1.get_variable(
        'output_bias', [num_labels], dtype=dtype,
        initializer=tf.compat.v1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(pooled, weights, transpose_b=True), bias)

  return network_fn
