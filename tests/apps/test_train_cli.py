"""Tests for the training CLI, its library and the head.

Every model family trains a few steps in both precisions through
`training.run` (the function the CLI calls), evaluates and exports; one of
these runs (mnist_mlp in bfloat16) goes through the real command line in a
subprocess instead. Bad options fail before any graph is built, with the
flag named (`train_options`); the registry's families and data sets agree
with each other.
"""

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys
from unittest import mock

from absl import flags
from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import precision_comparison
from estimator_bf16.apps import registry
from estimator_bf16.apps import train_cli
from estimator_bf16.apps import train_options
from estimator_bf16.apps import training
from estimator_bf16.models import head
from estimator_bf16.precision import policy
from tests.support import isolated_cache
from tests.support import paths

_REPO = paths.REPO
_STEPS = 8

# Tiny sizes per family: each run takes seconds on a shared 2-core CPU.
_SMALL = {
    'mnist_mlp': dict(train_batch_size=32),
    'mnist_cnn': dict(train_batch_size=8, eval_batch_size=40, eval_steps=2),
    'resnet': dict(train_batch_size=4, eval_batch_size=8, eval_steps=2),
    'bert': dict(train_batch_size=8, eval_batch_size=8, eval_steps=2,
                 seq_length=16),
}
# Stated tolerance: |bfloat16 eval loss - float32 eval loss| after the same
# _STEPS steps from the same initialisation and data. Measured gaps on two
# seeds were at most 0.020 (MLP), 0.022 (CNN), 0.016 (ResNet-18, whose batch
# statistics over 4 images amplify rounding) and 0.010 (BERT-tiny); the
# bounds leave about 3x headroom.
_LOSS_TOLERANCE = {'mnist_mlp': 0.06, 'mnist_cnn': 0.07, 'resnet': 0.1,
                   'bert': 0.04}

_MODELS_AND_PRECISIONS = tuple(
    dict(testcase_name='%s_%s' % (m, p), model=m, precision=p)
    for m in registry.MODELS for p in eb.PRECISIONS)
_MODELS = tuple(dict(testcase_name=m, model=m) for m in registry.MODELS)

# The family run that the command line makes: a subprocess pays a
# TensorFlow import, so the CLI's training run is also this family test run
# rather than a second one.
_CLI_RUN = ('mnist_mlp', 'bfloat16')

_CACHE = isolated_cache.IsolatedCache()


def setUpModule():
  tf.compat.v1.disable_eager_execution()
  _CACHE.start()


def tearDownModule():
  _CACHE.stop()
  # pytest-xdist can leave a module and come back to it later in the same
  # worker, and setUpModule then makes a new folder: runs cached in the old
  # one go with it.
  _run.cache_clear()


def _run_cli(*arguments):
  return subprocess.run(
      [sys.executable, '-m', 'estimator_bf16.apps.train_cli'] +
      list(arguments), cwd=_REPO, capture_output=True, text=True, timeout=600,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))


@functools.lru_cache(maxsize=None)
def _run(model, precision):
  """Trains `model` for _STEPS steps once per test module; cached.

  Returns:
    `training.run`'s result; for _CLI_RUN the fields the command prints,
    'options' holding the model_dir, and the finished process as 'process'.
  """
  model_dir = os.path.join(_CACHE.root, model, precision)
  if (model, precision) == _CLI_RUN:
    done = _run_cli(
        '--model=' + model, '--precision=' + precision,
        '--model_dir=' + model_dir, '--train_steps=%d' % _STEPS,
        *['--%s=%s' % item for item in _SMALL[model].items()])
    if done.returncode != 0:
      raise AssertionError('train_cli exited with %d:\n%s' % (
          done.returncode, done.stderr[-3000:]))
    summary = json.loads(done.stdout[done.stdout.index('{'):])
    return dict(summary, options={'model_dir': model_dir}, process=done)
  options = train_options.TrainOptions(
      model=model, precision=precision, train_steps=_STEPS,
      model_dir=model_dir, **_SMALL[model])
  return training.run(options)


def _options(**overrides):
  fields = dict(model='mnist_mlp', model_dir='/nonexistent/model_dir')
  fields.update(overrides)
  return train_options.TrainOptions(**fields)


@pytest.mark.slow
class FamilyTrainingTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(*_MODELS_AND_PRECISIONS)
  def test_trains_evaluates_and_writes_summaries(self, model, precision):
    result = _run(model, precision)
    metrics = result['eval']
    self.assertEqual(metrics['global_step'], _STEPS)
    self.assertTrue(math.isfinite(metrics['loss']), metrics)
    self.assertBetween(metrics['accuracy'], 0.0, 1.0)
    self.assertGreater(result['examples_per_sec'], 0)
    model_dir = result['options']['model_dir']
    # The host_call wrote one loss per step; the Estimator wrote eval/.
    steps, losses = precision_comparison.read_scalars(model_dir, 'train/loss')
    self.assertAllEqual(steps, np.arange(_STEPS))
    self.assertTrue(np.all(np.isfinite(losses)))
    rate_steps, _ = precision_comparison.read_scalars(model_dir,
                                                      'train/learning_rate')
    self.assertLen(rate_steps, _STEPS)
    self.assertNotEmpty(tf.io.gfile.glob(os.path.join(model_dir, 'eval*')))

  @parameterized.named_parameters(*_MODELS)
  def test_bfloat16_eval_loss_close_to_float32(self, model):
    float32 = _run(model, 'float32')['eval']['loss']
    bfloat16 = _run(model, 'bfloat16')['eval']['loss']
    self.assertLessEqual(abs(bfloat16 - float32), _LOSS_TOLERANCE[model],
                         '%s: float32 %.4f, bfloat16 %.4f' %
                         (model, float32, bfloat16))

  @parameterized.named_parameters(*_MODELS_AND_PRECISIONS)
  def test_export_serves_float32(self, model, precision):
    export_dir = _run(model, precision)['export_dir']
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
      meta_graph = tf.compat.v1.saved_model.loader.load(
          sess, ['serve'], export_dir)
      signature = meta_graph.signature_def['serving_default']
      inputs = {k: tf.as_dtype(v.dtype) for k, v in signature.inputs.items()}
      outputs = {k: tf.as_dtype(v.dtype)
                 for k, v in signature.outputs.items()}
      # Clients send float32 images or int32 ids, whatever the precision.
      if model == 'bert':
        self.assertEqual(inputs, {'input_ids': tf.int32,
                                  'input_mask': tf.int32,
                                  'segment_ids': tf.int32})
      else:
        self.assertEqual(inputs, {'image': tf.float32})
      self.assertEqual(outputs, {'probabilities': tf.float32,
                                 'classes': tf.int32})
      feed = {}
      for key, info in signature.inputs.items():
        shape = [2] + [d.size for d in info.tensor_shape.dim[1:]]
        feed[info.name] = np.ones(shape, tf.as_dtype(info.dtype).as_numpy_dtype)
      probabilities = sess.run(signature.outputs['probabilities'].name, feed)
    self.assertEqual(probabilities.dtype, np.float32)
    self.assertAllClose(probabilities.sum(axis=1), [1.0, 1.0], atol=1e-5)

  def test_command_trains_evaluates_and_exports(self):
    # The family run of _CLI_RUN, made by the command line (the tests above
    # check its summaries, eval loss and export); here what it printed. In
    # this class, so that one worker makes the cached runs.
    result = _run(*_CLI_RUN)
    self.assertEqual(result['process'].returncode, 0)
    self.assertEqual(result['eval']['global_step'], _STEPS)
    self.assertGreater(result['train_seconds'], 0)
    self.assertTrue(tf.io.gfile.exists(
        os.path.join(result['export_dir'], 'saved_model.pb')))
    # TensorFlow's deprecation notices for the Estimator API it is built on
    # are not the user's to act on (`--verbose` shows them).
    self.assertNotIn('Instructions for updating', result['process'].stderr)
    self.assertNotIn('eval_on_tpu ignored', result['process'].stderr)


class OptionsTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('unknown_model', dict(model='vgg'), '--model'),
      ('bad_precision', dict(precision='float16'), '--precision'),
      ('no_model_dir', dict(model_dir=''), '--model_dir'),
      ('bad_optimizer', dict(optimizer='rmsprop'), '--optimizer'),
      ('real_data_without_data_dir', dict(model='resnet', dataset='imagenet'),
       '--data_dir'),
      ('data_dir_without_files', dict(data_dir='/nonexistent'), '--data_dir'),
      ('unknown_dataset', dict(dataset='cifar10'), '--dataset'),
      ('train_batch_not_divisible', dict(train_batch_size=12, num_shards=8),
       '--train_batch_size'),
      ('eval_batch_not_divisible', dict(eval_batch_size=100, num_shards=8),
       '--eval_batch_size'),
      ('tpu_batch_not_divisible', dict(use_tpu=True, tpu='t', dataset=None,
                                       model='resnet', train_batch_size=12),
       '--train_batch_size'),
      ('use_tpu_without_tpu', dict(use_tpu=True), '--tpu'),
      ('local_digits_on_cloud_tpu', dict(use_tpu=True, tpu='my-tpu'),
       '--data_dir'),
      ('zero_steps', dict(train_steps=0), '--train_steps'),
      ('eval_batch_over_test_set', dict(eval_batch_size=1000),
       '--eval_batch_size'),
      ('bad_resnet_depth', dict(model='resnet', resnet_depth=20),
       '--resnet_depth'),
      ('small_resnet_image', dict(model='resnet', image_size=16),
       '--image_size'),
      ('bad_bert_preset', dict(model='bert', bert_preset='huge'),
       '--bert_preset'),
      ('long_sequence', dict(model='bert', seq_length=1024), '--seq_length'),
      ('negative_learning_rate', dict(learning_rate=-1.0), '--learning_rate'),
      ('zero_accumulate', dict(accumulate=0), '--accumulate'),
      ('accumulate_not_dividing', dict(accumulate=3, train_batch_size=64),
       '--accumulate'),
      ('accumulate_on_tpu', dict(accumulate=2, use_tpu=True, tpu='t',
                                 model='resnet', dataset=None,
                                 train_batch_size=64), '--accumulate'),
      ('accumulate_times_replicas', dict(
          accumulate=4, train_batch_size=20, distribute='mirrored',
          cpu_devices=2), '--accumulate'),
  )
  def test_bad_option_names_flag_before_any_graph(self, overrides, flag):
    options = _options(**overrides)
    with mock.patch.object(registry, 'build') as build, \
        mock.patch.object(eb, 'make_tpu_estimator') as make_estimator:
      with self.assertRaises(train_options.OptionError) as caught:
        training.run(options)
    self.assertEqual(caught.exception.flag, flag)
    self.assertIn(flag, str(caught.exception))
    build.assert_not_called()
    make_estimator.assert_not_called()

  def test_a_bad_option_creates_no_model_dir(self):
    model_dir = os.path.join(self.create_tempdir().full_path, 'run')
    with self.assertRaisesRegex(train_options.OptionError,
                                '--train_batch_size'):
      training.run(_options(model='resnet', model_dir=model_dir,
                            train_batch_size=12, num_shards=8))
    self.assertFalse(os.path.exists(model_dir))

  def test_precision_is_parsed_once_and_lists_choices(self):
    for name in eb.PRECISIONS:
      options = train_options.prepare(_options(precision=name))
      self.assertIsInstance(options.precision, policy.Precision)
      self.assertEqual(options.precision, name)
    with self.assertRaisesRegex(
        train_options.OptionError,
        "--precision: precision must be one of 'float32', 'bfloat16', got "
        "'fp16'"):
      train_options.prepare(_options(precision='fp16'))

  def test_defaults_come_from_the_registry(self):
    options = train_options.prepare(_options(model='bert'))
    defaults = registry.DEFAULTS['bert']
    self.assertEqual(options.optimizer, defaults['optimizer'])
    self.assertEqual(options.bert_preset, defaults['bert_preset'])
    self.assertEqual(options.dataset, 'synthetic')
    self.assertEqual(options.warmup_steps, defaults['train_steps'] // 10)
    digits = train_options.prepare(_options(eval_batch_size=90))
    self.assertEqual((digits.dataset, digits.eval_steps), ('digits', 4))

  def test_data_dir_selects_the_real_data_set_and_its_sizes(self):
    data_dir = self.create_tempdir()
    data_dir.create_file('train-00000-of-00001')
    data_dir.create_file('validation-00000-of-00001')
    options = train_options.prepare(_options(model='resnet',
                                             data_dir=data_dir.full_path))
    self.assertEqual(
        (options.dataset, options.resnet_depth, options.image_size,
         options.num_classes, options.eval_steps),
        ('imagenet', 50, 224, 1000, 50000 // options.eval_batch_size))
    # Flags still win over the data set's sizes.
    options = train_options.prepare(_options(
        model='resnet', data_dir=data_dir.full_path, resnet_depth=18))
    self.assertEqual(options.resnet_depth, 18)

  def test_training_names_the_options_of_train_options(self):
    # Programs build a run with `training.run(training.TrainOptions(...))`.
    self.assertIs(training.TrainOptions, train_options.TrainOptions)
    self.assertIs(training.OptionError, train_options.OptionError)
    self.assertIs(training.prepare, train_options.prepare)

  def test_families_and_data_sets_agree(self):
    self.assertEqual(registry.MODELS, tuple(registry.FAMILIES))
    for name, family in registry.FAMILIES.items():
      self.assertEqual(family.name, name)
      builtin, *real = family.datasets
      # The built-in data set reads no files; every other one does.
      self.assertIsNone(registry.DATA[builtin].files, name)
      for dataset in real:
        self.assertLen(registry.DATA[dataset].files, 2, dataset)
    fields = {field.name for field in
              dataclasses.fields(train_options.TrainOptions)}
    for name, dataset in registry.DATA.items():
      self.assertEqual(dataset.name, name)
      # A data set implies only options that exist.
      self.assertContainsSubset(dataset.defaults, fields, name)

  def test_flags_parse_into_options(self):
    flag_values = flags.FlagValues()
    train_cli.define_flags(flag_values)
    flag_values(['train', '--model=bert', '--model_dir=unused',
                 '--precision=bfloat16', '--bert_preset=mini',
                 '--optimizer=adafactor', '--train_steps=7'])
    options = train_cli.options_from_flags(flag_values)
    self.assertEqual(
        (options.model, options.precision, options.bert_preset,
         options.optimizer, options.train_steps, options.learning_rate),
        ('bert', 'bfloat16', 'mini', 'adafactor', 7, None))

  def test_flag_defaults_match_train_options(self):
    # The CLI and `run(TrainOptions(...))` must start from the same run.
    flag_values = flags.FlagValues()
    train_cli.define_flags(flag_values)
    for field in dataclasses.fields(train_options.TrainOptions):
      self.assertIn(field.name, flag_values)
      # `model` and `model_dir` have no default: required flags.
      expected = (None if field.default is dataclasses.MISSING
                  else field.default)
      self.assertEqual(flag_values[field.name].default, expected, field.name)

  @parameterized.named_parameters(
      ('unknown_model', '--model=vgg', 'model'),
      ('bad_precision', '--precision=float16', 'precision'),
      ('bad_optimizer', '--optimizer=rmsprop', 'optimizer'),
      ('zero_batch', '--train_batch_size=0', 'train_batch_size'),
  )
  def test_flag_parser_rejects_bad_values(self, argument, flag):
    flag_values = flags.FlagValues()
    train_cli.define_flags(flag_values)
    with self.assertRaisesRegex(flags.IllegalFlagValueError, flag):
      flag_values(['train', '--model=mnist_mlp', '--model_dir=unused',
                   argument])


class HeadTest(tf.test.TestCase):

  def test_l2_penalty_covers_weight_matrices_only(self):
    with tf.Graph().as_default():
      tf.compat.v1.get_variable('kernel', initializer=[[1.0, 2.0]])
      tf.compat.v1.get_variable('bias', initializer=[10.0])
      penalty = head.l2_penalty()
      with self.session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        self.assertAllClose(sess.run(penalty), (1.0 + 4.0) / 2)

  def test_predictions_are_float32_from_bfloat16_logits(self):
    def network_fn_builder(params):
      del params
      return lambda images, is_training: tf.cast(
          tf.reshape(images, [-1, 3]), tf.bfloat16)

    model_fn = head.classifier_model_fn_builder(network_fn_builder,
                                                num_classes=3)
    with tf.Graph().as_default():
      spec = model_fn({'image': tf.ones([2, 3])}, None,
                      tf.estimator.ModeKeys.PREDICT, {})
      self.assertEqual(spec.predictions['probabilities'].dtype, tf.float32)
      self.assertEqual(spec.predictions['classes'].dtype, tf.int32)


class CommandLineTest(tf.test.TestCase):
  """One process per command: each pays a TensorFlow import (the training
  command is FamilyTrainingTest.test_command_trains_evaluates_and_exports)."""

  @pytest.mark.slow
  def test_an_unusable_model_dir_is_one_message_without_usage(self):
    # Also the command's way with any OptionError (a bad flag's included:
    # OptionsTest checks those name their flag and create no model_dir).
    not_a_dir = os.path.join(self.create_tempdir().full_path, 'a_file')
    with open(not_a_dir, 'w') as f:
      f.write('x')
    done = _run_cli('--model=mnist_mlp', '--model_dir=' + not_a_dir)
    self.assertEqual(done.returncode, 1, done.stderr[-3000:])
    self.assertEqual(done.stderr.strip().splitlines()[-1],
                     'error: --model_dir: cannot write to %s (%s is not a '
                     'directory); checkpoints, summaries and the export go '
                     'there, so pick a writable directory.' % (not_a_dir,
                                                               not_a_dir))
    # No dump of every flag's help.
    self.assertNotIn('--train_steps', done.stderr)

  @pytest.mark.slow
  def test_help_exits_0_and_lists_the_flags(self):
    done = _run_cli('--help')
    self.assertEqual(done.returncode, 0, done.stderr[-3000:])
    self.assertIn('--model_dir', done.stdout)


if __name__ == '__main__':
  tf.test.main()
