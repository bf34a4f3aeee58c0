"""Bad data and bad model_dirs: a clear error, and no checkpoint written.

Each case writes MNIST-format TFRecords with one defect (or a model_dir
with one problem) and runs `training.run`, the function behind
`python -m estimator_bf16.apps.train_cli`. The error must name the file (and record, flag
or variables) at fault, and the run must leave no new checkpoint behind.
The BERT and ImageNet readers get the same record checks.
"""

import os
import shutil
import tempfile

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

from estimator_bf16.apps import training
from estimator_bf16.models import bert_input
from estimator_bf16.models import digits
from estimator_bf16.models import imagenet_input
from estimator_bf16.models import records
from estimator_bf16.safety import checkpoint_match
from estimator_bf16.safety import checkpoint_repair
from tests.support import record_writers

_RECORDS = 48  # per file: small, but six batches of 8
_BATCH = 8
_tmp_root = None


def setUpModule():
  global _tmp_root
  tf.compat.v1.disable_eager_execution()
  _tmp_root = tempfile.mkdtemp()


def tearDownModule():
  shutil.rmtree(_tmp_root, ignore_errors=True)


def _example(image=None, label=None, size=28):
  """An MNIST-format example; None drops that feature."""
  feature = {}
  if image is not False:
    pixels = np.full([size, size], 7, np.uint8) if image is None else image
    feature['image_raw'] = tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[pixels.tobytes()]))
  if label is not False:
    feature['label'] = tf.train.Feature(int64_list=tf.train.Int64List(
        value=[3 if label is None else label]))
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def _write(path, serialized):
  with tf.io.TFRecordWriter(path) as writer:
    for record in serialized:
      writer.write(record)


def _data_dir(name, train=None, test=None, damage=None):
  """A data dir of MNIST-format train and test records (default: good ones).

  Args:
    name: directory name.
    train, test: lists of serialized examples for train/test.tfrecords.
    damage: optional function(path) that spoils train.tfrecords on disk.
  """
  data_dir = os.path.join(_tmp_root, 'data_' + name)
  os.makedirs(data_dir)
  good = [digits.serialize_example(np.full([28, 28], i, np.uint8), i % 10)
          for i in range(_RECORDS)]
  _write(os.path.join(data_dir, 'test.tfrecords'),
         good if test is None else test)
  _write(os.path.join(data_dir, 'train.tfrecords'),
         good if train is None else train)
  if damage:
    damage(os.path.join(data_dir, 'train.tfrecords'))
  return data_dir


def _flip_byte(fraction):
  """Damages the record `fraction` of the way into the file."""
  def damage(path):
    offset = int(os.path.getsize(path) * fraction)
    with open(path, 'r+b') as f:
      f.seek(offset)
      byte = f.read(1)
      f.seek(offset)
      f.write(bytes([byte[0] ^ 0xFF]))
  return damage


def _truncate(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 100)


def _garbage(path):
  with open(path, 'wb') as f:
    f.write(os.urandom(2000))


def _empty(path):
  open(path, 'wb').close()


def _options(name, data_dir, **overrides):
  fields = dict(model='mnist_mlp', precision='bfloat16', dataset='mnist',
                data_dir=data_dir, model_dir=os.path.join(_tmp_root,
                                                          'model_' + name),
                train_steps=3, train_batch_size=_BATCH,
                eval_batch_size=_BATCH, eval_steps=1, export=False)
  fields.update(overrides)
  return training.TrainOptions(**fields)


def _checkpoint_files(model_dir):
  if not os.path.isdir(model_dir):
    return set()
  return {name for name in os.listdir(model_dir)
          if name.startswith('model.ckpt') or name == 'checkpoint'}


def _bad_label_at(index):
  return [_example(label=12 if i == index else None) for i in range(_RECORDS)]


@pytest.mark.slow
class BadDataTest(tf.test.TestCase, parameterized.TestCase):
  """Every defect is caught before training writes a checkpoint."""

  @parameterized.named_parameters(
      ('corrupt_record', dict(damage=_flip_byte(2 / 3)),
       r'train\.tfrecords is corrupt or truncated: read \d+ of \d+ bytes.*'
       r'--skip_corrupt_records'),
      ('truncated_file', dict(damage=_truncate),
       r'train\.tfrecords is corrupt or truncated'),
      ('not_a_tfrecord_file', dict(damage=_garbage),
       r'train\.tfrecords is corrupt or truncated: read 0 of 2000 bytes'),
      ('empty_file', dict(damage=_empty),
       r'training data: .*train\.tfrecords holds no records'),
      # Training repeats its data; evaluation reads it once.
      ('eval_smaller_than_a_batch', dict(test=[_example()] * 5),
       r'eval data holds fewer than one batch of 8 examples'),
      ('missing_label', dict(train=[_example()] * 20 + [
          _example(label=False)] * 28),
       r'missing feature label \(int64\) \(record at byte \d+ of '
       r'.*train\.tfrecords\)'),
      ('missing_image', dict(train=[_example(image=False)] * _RECORDS),
       r'missing feature image_raw \(bytes\) \(record at byte \d+ of '
       r'.*train\.tfrecords'),
      ('wrong_image_size', dict(train=[_example(
          image=np.zeros([8, 8], np.uint8), size=8)] * _RECORDS),
       r'feature image_raw holds 64 bytes, but --image_size=28 needs 784'),
      ('label_out_of_range', dict(train=[_example(label=12)] * _RECORDS),
       r'label 12 is outside \[0, 10\) \(--num_classes=10\) \(record at '
       r'byte \d+ of .*train\.tfrecords\)'),
  )
  def test_clear_error_and_no_checkpoint(self, data, pattern):
    name = self._testMethodName
    options = _options(name, _data_dir(name, **data))
    with self.assertRaisesRegex(records.InputError, pattern) as caught:
      training.run(options)
    self.assertRegex(str(caught.exception), r'^(Bad input in the|The) '
                     r'(training|eval) data')
    self.assertEqual(_checkpoint_files(options.model_dir), set())

  def test_skip_corrupt_records_skips_and_counts(self):
    options = _options('skip', _data_dir('skip', damage=_flip_byte(2 / 3)),
                       skip_corrupt_records=True)
    result = training.run(options)
    self.assertEqual(result['global_step'], 3)
    (path, (read, size, times)), = result['skipped_files'].items()
    self.assertTrue(path.endswith('train.tfrecords'))
    self.assertLess(read, size)
    self.assertGreaterEqual(times, 1)

  def test_bad_record_found_while_training_names_step_and_keeps_checkpoints(
      self):
    # One bad label among 48 shuffled records: the first batch usually
    # misses it, training meets it at some step. The checkpoint the run
    # wrote as it started is whole; nothing half-written is left.
    options = _options('late', _data_dir('late', train=_bad_label_at(40)),
                       train_steps=40, save_checkpoints_steps=2)
    with self.assertRaisesRegex(
        records.InputError,
        r'training data( at global step \d+)?: label 12 is outside') as (
            caught):
      training.run(options)
    self.assertIn('record at byte', str(caught.exception))
    state = tf.train.get_checkpoint_state(options.model_dir)
    if state is not None:  # None if the first batch held the bad record
      for prefix in state.all_model_checkpoint_paths:
        self.assertIsNone(checkpoint_repair.verify_checkpoint(prefix), prefix)
      self.assertFalse([n for n in os.listdir(options.model_dir)
                        if n.endswith('_temp')])


@pytest.mark.slow
class BadModelDirTest(tf.test.TestCase):

  def test_read_only_model_dir_names_the_flag(self):
    if os.geteuid() == 0:
      # Permission bits do not stop root; sysfs refuses new entries to all.
      model_dir = '/sys/estimator_bf16_test/model'
    else:
      parent = self.create_tempdir().full_path
      os.chmod(parent, 0o555)
      model_dir = os.path.join(parent, 'model')
    options = _options('read_only', _data_dir('read_only'),
                       model_dir=model_dir)
    with self.assertRaisesRegex(training.OptionError,
                                '--model_dir: cannot write to') as caught:
      training.run(options)
    self.assertEqual(caught.exception.flag, '--model_dir')

  def _foreign_checkpoint(self, model_dir, variables, step=1):
    """Writes a checkpoint of `variables` {name: array} at `step`."""
    with tf.Graph().as_default():
      global_step = tf.compat.v1.train.get_or_create_global_step()
      for name, value in variables.items():
        tf.compat.v1.get_variable(name, initializer=value)
      saver = tf.compat.v1.train.Saver()
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(global_step.assign(step))
        saver.save(session, os.path.join(model_dir, 'model.ckpt'),
                   global_step=step)
    return _checkpoint_files(model_dir), tf.train.latest_checkpoint(model_dir)

  def test_checkpoint_of_another_model_is_named_and_left_alone(self):
    model_dir = self.create_tempdir().full_path
    before, latest = self._foreign_checkpoint(model_dir, {
        'cnn/conv1/kernel': np.zeros([5, 5, 1, 32], np.float32)})
    options = _options('foreign', _data_dir('foreign'), model_dir=model_dir)
    with self.assertRaisesRegex(
        checkpoint_match.CheckpointMismatchError,
        r"model\.ckpt-1 cannot restore this model: \d+ of the model's \d+ "
        r'variables are not in it \(.*mnist_mlp/hidden/kernel.*different '
        r'model'):
      training.run(options)
    self.assertEqual(_checkpoint_files(model_dir), before)
    self.assertEqual(tf.train.latest_checkpoint(model_dir), latest)

  def test_checkpoint_with_other_shapes_or_bfloat16_weights(self):
    # At step 5, past --train_steps: training is skipped, the check runs
    # before evaluation restores.
    model_dir = self.create_tempdir().full_path
    self._foreign_checkpoint(model_dir, {
        'mnist_mlp/hidden/kernel': np.zeros([784, 64], np.float32)}, step=5)
    with self.assertRaisesRegex(
        checkpoint_match.CheckpointMismatchError,
        r'shapes differ for mnist_mlp/hidden/kernel \(checkpoint \[784, 64\], '
        r'model \[784, 512\]\)'):
      training.run(_options('shapes', _data_dir('shapes'),
                            model_dir=model_dir))
    model_dir = self.create_tempdir().full_path
    self._foreign_checkpoint(model_dir, {
        'mnist_mlp/hidden/kernel': np.zeros(
            [784, 512], tf.bfloat16.as_numpy_dtype)})
    with self.assertRaisesRegex(checkpoint_match.CheckpointMismatchError,
                                r'stores mnist_mlp/hidden/kernel in 16 bits.*'
                                r'python -m estimator_bf16\.apps\.ckpt convert'):
      training.run(_options('bf16_weights', _data_dir('bf16_weights'),
                            model_dir=model_dir))


def _first_batch(input_fn, batch_size):
  with tf.Graph().as_default():
    batch = tf.compat.v1.data.make_one_shot_iterator(
        input_fn({'batch_size': batch_size})).get_next()
    with tf.compat.v1.Session() as session:
      return session.run(batch)


class OtherReadersTest(tf.test.TestCase):

  def test_bert_record_of_wrong_length_or_label_is_named(self):
    path = os.path.join(self.create_tempdir().full_path, 'train.tf_record')

    def example(length=8, label=1):
      return {'input_ids': [5] * length, 'input_mask': [1] * length,
              'segment_ids': [0] * length, 'label_ids': label}

    record_writers.write_bert_tfrecord(path, [example(), example(length=6)])
    input_fn = bert_input.bert_input_fn_builder(
        path, seq_length=8, is_training=False, num_labels=2)
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'feature input_ids holds 6 ids, but --seq_length=8 needs 8.*record '
        r'at byte \d+ of .*train\.tf_record'):
      _first_batch(input_fn, 2)
    record_writers.write_bert_tfrecord(path, [example(label=4)])
    input_fn = bert_input.bert_input_fn_builder(
        path, seq_length=8, is_training=False, num_labels=2)
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                r'label_ids 4 is outside \[0, 2\)'):
      _first_batch(input_fn, 1)

  def test_imagenet_record_without_label_is_named(self):
    path = os.path.join(self.create_tempdir().full_path, 'train-00000')
    record_writers.write_imagenet_tfrecord(
        path, [np.zeros([20, 20, 3], np.uint8)], [1])
    # A second record with the image but no label.
    with open(path, 'rb') as f:
      first = f.read()
    serialized = tf.train.Example(features=tf.train.Features(feature={
        'image/encoded': tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[b'not read'])),
    })).SerializeToString()
    _write(path + '-b', [serialized])
    with open(path, 'wb') as f:
      f.write(first)
      with open(path + '-b', 'rb') as extra:
        f.write(extra.read())
    os.remove(path + '-b')
    input_fn = imagenet_input.imagenet_input_fn_builder(
        path, is_training=False, image_size=16, num_classes=10)
    with self.assertRaisesRegex(
        tf.errors.InvalidArgumentError,
        r'missing feature image/class/label \(int64\) \(record at byte \d+ '
        r'of .*train-00000\)'):
      _first_batch(input_fn, 2)


if __name__ == '__main__':
  tf.test.main()
