"""BERT classification inputs: run_classifier TFRecords and a synthetic task.

Both return `input_fn(params)` closures for (TPU)Estimator yielding
`(features, labels)`: features {'input_ids', 'input_mask', 'segment_ids'},
each [B, S] int32, and labels [B] int32, with B = `params['batch_size']`.
Nothing is floating point, so `params['precision']` plays no part here; the
network takes the compute dtype as an argument.
"""

import numpy as np
import tensorflow as tf

from estimator_bf16.models import records

_ID_KEYS = ('input_ids', 'input_mask', 'segment_ids')

# Token ids of the synthetic task. Real BERT vocabularies put [PAD] at 0 too;
# the others only need to be distinct from the filler tokens.
_PAD, _CLS, _SEP, _FIRST_MARKER = 0, 1, 2, 3


def _to_int32(tensor):
  # tf.Example only stores int64, but TPUs only handle int32 well.
  return tf.cast(tensor, tf.int32)


def _check_example(example, seq_length, num_labels, path, offset):
  """An op failing, with the record named, on a missing or bad feature."""
  lengths = [tf.size(example[key].values) for key in _ID_KEYS]
  label = example['label_ids']
  no_label = tf.equal(tf.size(label.values), 0)
  bad = [tf.not_equal(length, seq_length) for length in lengths]
  bad_label = tf.zeros([], tf.bool)
  if num_labels is not None:
    value = tf.reduce_max(label.values)
    bad_label = ~no_label & ((value < 0) | (value >= num_labels))

  def describe(_):
    text = tf.constant('missing feature label_ids (int64)')
    if num_labels is not None:
      text = tf.where(bad_label, tf.strings.join([
          'label_ids ', tf.strings.as_string(tf.reduce_max(label.values)),
          ' is outside [0, %d)' % num_labels]), text)
    for key, length, wrong in reversed(list(zip(_ID_KEYS, lengths, bad))):
      text = tf.where(wrong, tf.strings.join([
          'feature %s holds ' % key, tf.strings.as_string(length), ' ids, but '
          '--seq_length=%d needs %d' % (seq_length, seq_length)]), text)
    return text

  return records.check_records(
      tf.reshape(tf.reduce_any(tf.stack(bad + [no_label, bad_label])), [1]),
      describe, tf.reshape(path, [1]), tf.reshape(offset, [1]))


def bert_input_fn_builder(file_pattern, *, seq_length, is_training,
                          drop_remainder=True, shuffle_buffer=100,
                          num_labels=None, skip_corrupt=False,
                          skipped=None):
  """Returns an input_fn reading BERT `run_classifier`-format TFRecords.

  Each record holds `input_ids`, `input_mask`, `segment_ids` (int64
  [seq_length]) and `label_ids` (int64 scalar); other features (such as
  `is_real_example`) are ignored.

  Args:
    file_pattern: glob of TFRecord files.
    seq_length: sequence length the records were written with.
    is_training: shuffle and repeat forever when True; read once in order
      when False.
    drop_remainder: drop a last partial batch (a TPU needs static shapes;
      set False only for CPU/GPU prediction over every example).
    shuffle_buffer: examples in the shuffle buffer while training.
    num_labels: if set, `label_ids` must lie in [0, num_labels).
    skip_corrupt: skip the unreadable rest of a damaged file (with a
      warning) instead of failing; see `records.read_records`.
    skipped: a `records.SkippedFiles` recording what was skipped, or None.

  Returns:
    `input_fn(params)` -> `tf.data.Dataset` of (features, labels) as the
    module docstring describes. A record with a missing feature, ids of
    another length or a label out of range fails with a 'bad input:' error
    naming its file and offset.

  Raises:
    ValueError: if no file matches `file_pattern`.
  """
  if not tf.io.gfile.glob(file_pattern):
    raise ValueError('No BERT TFRecord files match %r.' % file_pattern)
  # Parsed with variable length, so a record of the wrong length is named
  # in the error rather than reported by the parser without its file.
  keys = {key: tf.io.VarLenFeature(tf.int64)
          for key in _ID_KEYS + ('label_ids',)}

  def parse(record, path, offset):
    example = tf.io.parse_single_example(record, keys)
    check = _check_example(example, seq_length, num_labels, path, offset)
    with tf.control_dependencies([check]):
      features = {key: tf.reshape(_to_int32(example[key].values),
                                  [seq_length]) for key in _ID_KEYS}
      label = tf.reshape(_to_int32(example['label_ids'].values), [])
    return features, label

  def input_fn(params):
    dataset = records.read_records(file_pattern, skip_corrupt=skip_corrupt,
                                   skipped=skipped,
                                   shuffle_files=is_training, cycle_length=4)
    if is_training:
      dataset = dataset.shuffle(shuffle_buffer).repeat()
    dataset = dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(params['batch_size'],
                            drop_remainder=drop_remainder)
    return dataset.prefetch(tf.data.AUTOTUNE)

  return input_fn


def _synthetic_example(index, *, seed, seq_length, vocab_size, num_labels):
  """One example of the marker task, from stateless ops.

  The sequence is `[CLS] filler.. [SEP] filler.. [SEP] [PAD]..` with a random
  length; one filler position (anywhere) holds marker token
  `_FIRST_MARKER + label`, and the label is which marker it is. Finding one
  distinctive token is what attention does best, so a tiny BERT learns it in
  a few hundred steps.
  """
  def op_seed(stream):
    return tf.stack([tf.constant(seed * 4 + stream, tf.int64), index])

  min_length = max(5, seq_length // 4)
  label = tf.random.stateless_uniform(
      [], op_seed(0), minval=0, maxval=num_labels, dtype=tf.int32)
  length = tf.random.stateless_uniform(
      [], op_seed(1), minval=min_length, maxval=seq_length + 1,
      dtype=tf.int32)
  filler = tf.random.stateless_uniform(
      [seq_length], op_seed(2), minval=_FIRST_MARKER + num_labels,
      maxval=vocab_size, dtype=tf.int32)
  # The marker goes anywhere between [CLS] and the final [SEP] except on
  # the middle [SEP].
  middle = length // 2
  marker = tf.random.stateless_uniform(
      [], op_seed(3), minval=1, maxval=length - 2, dtype=tf.int32)
  marker = tf.where(marker >= middle, marker + 1, marker)

  # tf.equal, not ==: in graph mode a Tensor's == compares object identity.
  position = tf.range(seq_length)
  real = position < length
  ids = tf.where(real, filler, _PAD)
  ids = tf.where(tf.equal(position, 0), _CLS, ids)
  ids = tf.where(
      tf.equal(position, middle) | tf.equal(position, length - 1), _SEP, ids)
  ids = tf.where(tf.equal(position, marker), _FIRST_MARKER + label, ids)
  segments = tf.cast(real & (position > middle), tf.int32)
  features = {'input_ids': ids, 'input_mask': tf.cast(real, tf.int32),
              'segment_ids': segments}
  return features, label


def synthetic_bert_input_fn_builder(*, seq_length, vocab_size, num_labels=2,
                                    seed=0, num_examples=None):
  """Returns an input_fn of a learnable synthetic classification task.

  Each example is a random-length token sequence (between a quarter of and
  the full `seq_length`, padded with 0 and masked) in two segments; exactly
  one token is a class marker (ids 3 .. 3 + num_labels - 1) and the label
  says which. Filler tokens never collide with markers or [CLS]/[SEP]
  (ids 1, 2). Generated with stateless ops, so the stream is identical on
  every run and needs no Python on the input host.

  Args:
    seq_length: sequence length, at least 8.
    vocab_size: the model's vocabulary size; ids stay below it.
    num_labels: number of classes.
    seed: picks the examples; use different seeds for train and eval.
    num_examples: None for an endless stream, else that many examples.

  Returns:
    `input_fn(params)` -> `tf.data.Dataset` of (features, labels) as the
    module docstring describes.

  Raises:
    ValueError: if `seq_length` < 8 or the vocabulary leaves fewer than 8
      filler tokens.
  """
  if seq_length < 8:
    raise ValueError('seq_length must be at least 8, got %d.' % seq_length)
  if vocab_size < _FIRST_MARKER + num_labels + 8:
    raise ValueError('vocab_size %d is too small for %d labels; need at '
                     'least %d.' % (vocab_size, num_labels,
                                    _FIRST_MARKER + num_labels + 8))

  def input_fn(params):
    count = num_examples if num_examples is not None else np.iinfo(np.int64).max

    def example(index):
      return _synthetic_example(index, seed=seed, seq_length=seq_length,
                                vocab_size=vocab_size, num_labels=num_labels)

    dataset = tf.data.Dataset.range(count).map(
        example, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(params['batch_size'], drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)

  return input_fn
