"""The TensorFlow 2.16+ backend (estimator_bf16.compat).

Runs under both TensorFlow 2.15 and the newest TensorFlow:

* install() / uninstall() change TensorFlow's modules only in between;
* the spec and config classes have tf.estimator's fields and checks;
* an unmodified legacy TPUEstimator program (tests/support/legacy_tpu_program.py)
  trains, evaluates, predicts, runs its host_call and exports, in float32
  and bfloat16;
* on TensorFlow 2.15 the compat backend is compared, in one process, with
  the real TPUEstimator (same params, same numbers, checkpoints continued
  across backends);
* with the other virtualenv present (.venv for 2.15, .venv-tf-latest for the
  newest; or $ESTIMATOR_BF16_OTHER_PYTHON), the same protocol runs there in
  a subprocess and the numbers, checkpoints and SavedModels cross versions.

Agreement tolerance: 1e-4 (absolute) on eval loss, predicted probabilities,
served probabilities and every trained weight, for the same precision on the
same start checkpoint and data. Measured on the CI machine type: 0 for loss
and weights, 6e-8 for probabilities, between TF 2.15's TPUEstimator and this
backend on TF 2.21. For scale, bfloat16 and float32 weights differ by ~0.09
after the same 40 steps, so the check would catch a precision mix-up.
"""

import functools
import glob
import json
import os
import re
import subprocess
import sys
import textwrap
import unittest
from unittest import mock

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16 import compat
from estimator_bf16.compat import _install
from estimator_bf16.compat import export as export_lib
from estimator_bf16.compat import private_paths
from estimator_bf16.platform import backend as backend_lib
from tests.support import compat_protocol as protocol
from tests.support import legacy_model
from tests.support import paths
from tests.support import scratch

REPO = paths.REPO
TOLERANCE = 1e-4
IS_TF215 = eb.BACKEND == 'tf_estimator'
NEEDS_TF215 = unittest.skipUnless(
    IS_TF215, 'needs the real TPUEstimator of TensorFlow 2.15')
NEEDS_TF216 = unittest.skipIf(IS_TF215, 'TensorFlow 2.16+ behaviour')
_MISSING = object()


def _other_python():
  """The interpreter of the other TensorFlow's virtualenv, or None."""
  path = os.environ.get('ESTIMATOR_BF16_OTHER_PYTHON') or os.path.join(
      REPO, '.venv-tf-latest' if IS_TF215 else '.venv', 'bin', 'python')
  return path if os.path.exists(path) else None


def _api_state():
  """What install() may touch, read independently of its implementation."""
  modules = {'tf': tf, 'v1': tf.compat.v1, 'v2': tf.compat.v2,
             'v1.v1': tf.compat.v1.compat.v1, 'v1.v2': tf.compat.v1.compat.v2,
             'v2.v1': tf.compat.v2.compat.v1, 'v2.v2': tf.compat.v2.compat.v2}
  modules.update({name: module for name, module in sys.modules.items()
                  if name.startswith('tensorflow') and module is not None
                  and name.endswith(('compat.v1', 'compat.v2'))})
  state = {'sys.modules': sorted(n for n in sys.modules
                                 if n.startswith('tensorflow')),
           'tensorflow.python.estimator': id(vars(sys.modules[
               'tensorflow.python']).get('estimator', _MISSING))}
  for key, module in modules.items():
    namespaces = [('outer', vars(module))]
    if '_tfmw_wrapped_module' in vars(module):
      namespaces.append(('inner', vars(vars(module)['_tfmw_wrapped_module'])))
    for name in ('estimator', 'layers'):
      for where, namespace in namespaces:
        state[key, name, where] = id(namespace.get(name, _MISSING))
      # pylint: disable=protected-access
      if hasattr(type(module), '_fastdict_key_in'):
        cached = module._fastdict_key_in(name)
        state[key, name, 'cache'] = (
            id(module._fastdict_get(name)) if cached else None)
      # pylint: enable=protected-access
    state[key, '__all__'] = list(getattr(module, '__all__', None) or [])
  return state


class InstallTest(tf.test.TestCase):

  def setUp(self):
    super().setUp()
    # The newest-TF run may have installed compat for the whole session
    # (tests/support/compat_install_plugin.py); these tests start from uninstalled.
    self._session_install = compat.installed()
    compat.uninstall()

  def tearDown(self):
    compat.uninstall()
    if self._session_install:
      compat.install()
    super().tearDown()

  @pytest.mark.slow
  def test_import_installs_nothing_and_install_routes_layers(self):
    """In a fresh process, without TF_USE_LEGACY_KERAS."""
    code = textwrap.dedent("""
        import tensorflow as tf
        before = getattr(tf.compat.v1, 'estimator', None)
        import estimator_bf16 as eb
        assert getattr(tf.compat.v1, 'estimator', None) is before
        assert not eb.compat.installed()
        eb.compat.install()
        with tf.Graph().as_default():
          dense = tf.compat.v1.layers.dense(tf.zeros([2, 5]), 3)
        print('estimator before import:', type(before).__name__)
        print('dense:', dense.shape, type(tf.compat.v1.layers).__name__)
        """)
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop('TF_USE_LEGACY_KERAS', None)
    result = subprocess.run([sys.executable, '-c', code], env=env, cwd=REPO,
                            capture_output=True, text=True, timeout=300,
                            check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn('dense: (2, 3)', result.stdout)
    self.assertIn('estimator before import: %s' % (
        'LazyLoader' if IS_TF215 else 'NoneType'), result.stdout)

  def test_every_spelling_resolves_after_install(self):
    namespace = compat.install()
    self.assertIs(compat.install(), namespace)  # idempotent
    self.assertIs(tf.estimator, namespace)
    self.assertIs(tf.compat.v1.estimator.tpu.TPUEstimator, compat.TPUEstimator)
    self.assertIs(tf.compat.v2.estimator.EstimatorSpec, compat.EstimatorSpec)
    self.assertIs(tf.compat.v1.compat.v1.estimator.ModeKeys, compat.ModeKeys)
    scope = {}
    # The import statements legacy programs use, run as written.
    exec('from tensorflow.compat.v1 import estimator as tf_estimator\n'  # pylint: disable=exec-used
         'import tensorflow.compat.v1.estimator.tpu as tpu\n'
         'from tensorflow.estimator.export import PredictOutput\n', scope)
    self.assertIs(scope['tf_estimator'], namespace)
    self.assertIs(scope['tpu'].TPUEstimatorSpec, compat.TPUEstimatorSpec)
    self.assertIs(scope['PredictOutput'], compat.PredictOutput)
    self.assertIs(namespace.tpu.RunConfig, compat.TPURunConfig)
    self.assertIs(namespace.SessionRunHook, tf.compat.v1.train.SessionRunHook)

  def test_private_estimator_paths_resolve(self):
    # As tensorflow/tpu's programs import them. TensorFlow 2.15 has the
    # real modules (they stay); 2.16+ gets the compat stand-ins.
    folder = self.create_tempdir().full_path
    with tf.Graph().as_default():
      step = tf.compat.v1.train.get_or_create_global_step()
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.assign(step, 7))
        tf.compat.v1.train.Saver().save(
            session, os.path.join(folder, 'model.ckpt'), global_step=step)
    compat.install()
    scope = {}
    exec('from tensorflow.python.estimator import estimator\n'  # pylint: disable=exec-used
         'from tensorflow_estimator.python.estimator.tpu import tpu_config\n'
         'import tensorflow.python.estimator.model_fn as model_fn\n', scope)
    load = scope['estimator']._load_global_step_from_checkpoint_dir  # pylint: disable=protected-access
    self.assertEqual(load(folder), 7)
    self.assertEqual(load(self.create_tempdir().full_path), 0)
    config = scope['tpu_config'].RunConfig(
        tpu_config=scope['tpu_config'].TPUConfig(iterations_per_loop=3))
    self.assertEqual(config.tpu_config.iterations_per_loop, 3)
    self.assertTrue(hasattr(scope['model_fn'].ModeKeys, 'TRAIN'))
    if not IS_TF215:
      self.assertIs(scope['tpu_config'].TPUConfig, compat.TPUConfig)
      with self.assertRaisesRegex(AttributeError,
                                  r'estimator\._get_features.*provides only'):
        scope['estimator']._get_features  # pylint: disable=protected-access,pointless-statement

  def test_private_stand_ins_link_parents_to_children(self):
    new, attached = private_paths.stand_ins(private_paths.ROOTS)
    modules = dict(new)
    root = modules['tensorflow_estimator.python.estimator']
    self.assertIs(root.tpu.tpu_estimator.TPUEstimator,
                  compat.TPUEstimator)
    self.assertIs(modules['tensorflow.python.estimator.estimator'].Estimator,
                  compat.Estimator)
    self.assertNotIn('tensorflow', modules)  # real modules are never replaced
    self.assertIn(('tensorflow.python', 'estimator',
                   modules['tensorflow.python.estimator']), attached)

  def test_uninstall_restores_modules(self):
    before = _api_state()
    compat.install()
    compat.install()
    during = _api_state()
    self.assertNotEqual(before, during)
    compat.uninstall()
    compat.uninstall()
    self.assertEqual(before, _api_state())
    self.assertFalse(compat.installed())

  @NEEDS_TF216
  def test_missing_tf_keras_says_what_to_install(self):
    legacy_layers = _install._LEGACY_LAYERS  # pylint: disable=protected-access
    with mock.patch.dict(sys.modules, {legacy_layers: None}):
      compat.install()
      with self.assertRaisesRegex(ImportError, 'pip install "tf-keras~='):
        tf.compat.v1.layers.dense  # pylint: disable=pointless-statement
      # Plain-ops model code keeps working without tf-keras.
      self.assertIs(tf.estimator.ModeKeys, compat.ModeKeys)
      compat.uninstall()


class SpecAndConfigTest(tf.test.TestCase):

  def test_fields_match_tf_estimator(self):
    expected = {
        compat.EstimatorSpec: (
            'mode', 'predictions', 'loss', 'train_op', 'eval_metric_ops',
            'export_outputs', 'training_chief_hooks', 'training_hooks',
            'scaffold', 'evaluation_hooks', 'prediction_hooks'),
        compat.TPUEstimatorSpec: (
            'mode', 'predictions', 'loss', 'train_op', 'eval_metrics',
            'export_outputs', 'scaffold_fn', 'host_call', 'training_hooks',
            'evaluation_hooks', 'prediction_hooks'),
        compat.ServingInputReceiver: (
            'features', 'receiver_tensors', 'receiver_tensors_alternatives'),
    }
    for cls, fields in expected.items():
      self.assertEqual(cls._fields, fields)
    self.assertEqual((compat.ModeKeys.TRAIN, compat.ModeKeys.EVAL,
                      compat.ModeKeys.PREDICT), ('train', 'eval', 'infer'))
    if IS_TF215:
      real = tf.compat.v1.estimator
      pairs = [(compat.EstimatorSpec, real.EstimatorSpec),
               (compat.TPUEstimatorSpec, real.tpu.TPUEstimatorSpec),
               (compat.TPUConfig, real.tpu.TPUConfig),
               (compat.ServingInputReceiver, real.export.ServingInputReceiver),
               (compat.TensorServingInputReceiver,
                real.export.TensorServingInputReceiver)]
      for ours, theirs in pairs:
        self.assertEqual(ours._fields, theirs._fields, ours.__name__)
      self.assertEqual(real.tpu.TPUConfig(), compat.TPUConfig())

  def test_run_config_rules(self):
    config = compat.RunConfig()
    self.assertEqual((config.save_checkpoints_steps,
                      config.save_checkpoints_secs), (None, 600))
    config = compat.TPURunConfig(model_dir='m', save_checkpoints_steps=5)
    self.assertEqual((config.save_checkpoints_steps,
                      config.save_checkpoints_secs), (5, None))
    self.assertEqual(config.tpu_config.iterations_per_loop, 2)
    replaced = config.replace(save_checkpoints_secs=30)
    self.assertEqual((replaced.save_checkpoints_steps,
                      replaced.save_checkpoints_secs), (None, 30))
    self.assertEqual(replaced.model_dir, 'm')
    with self.assertRaisesRegex(ValueError, 'at most one'):
      compat.RunConfig(save_checkpoints_steps=5, save_checkpoints_secs=5)
    with self.assertRaisesRegex(ValueError,
                                'train_distribute=object is not supported'):
      compat.RunConfig(train_distribute=object())
    with self.assertRaisesRegex(NotImplementedError, 'device_fn'):
      compat.RunConfig(device_fn=lambda op: '/cpu:0')

  def test_spec_checks(self):
    with tf.Graph().as_default():
      loss = tf.constant(1.0)
      with self.assertRaisesRegex(ValueError, 'train_op is required'):
        compat.EstimatorSpec('train', loss=loss)
      with self.assertRaisesRegex(ValueError, 'mode must be one of'):
        compat.TPUEstimatorSpec('training', loss=loss)
      with self.assertRaisesRegex(TypeError, 'eval_metrics must be'):
        compat.TPUEstimatorSpec('eval', loss=loss, eval_metrics=[loss])
      with self.assertRaisesRegex(ValueError, 'scalar'):
        compat.EstimatorSpec('eval', loss=tf.zeros([3]))
      receiver = compat.ServingInputReceiver(loss, loss)
      self.assertEqual(list(receiver.features), ['feature'])
      self.assertEqual(list(receiver.receiver_tensors), ['input'])

  def test_export_output_signatures(self):
    """Same SignatureDefs as tf.estimator's export outputs (checked on 2.15)."""
    with tf.Graph().as_default():
      examples = tf.compat.v1.placeholder(tf.string, [None], name='examples')
      scores = tf.zeros([2, 3])
      classes = tf.constant([['a', 'b', 'c']] * 2)
      value = tf.zeros([2])
      outputs = {
          'classify': compat.ClassificationOutput(scores, classes),
          'regress': compat.RegressionOutput(value),
          'serving_default': compat.PredictOutput({'scores': scores}),
      }
      signatures = export_lib.signature_defs(
          compat.ServingInputReceiver({'x': examples}, examples), outputs)
      self.assertEqual(
          {name: s.method_name for name, s in signatures.items()},
          {'classify': 'tensorflow/serving/classify',
           'regress': 'tensorflow/serving/regress',
           'serving_default': 'tensorflow/serving/predict'})
      if IS_TF215:
        real = tf.compat.v1.estimator.export
        theirs = {'classify': real.ClassificationOutput(scores, classes),
                  'regress': real.RegressionOutput(value),
                  'serving_default': real.PredictOutput({'scores': scores})}
        for name, output in theirs.items():
          self.assertEqual(output.as_signature_def({'input': examples}),
                           signatures[name], name)
      # A float input cannot feed a classify signature: that one is left
      # out, the others are kept.
      images = tf.compat.v1.placeholder(tf.float32, [None, 4])
      kept = export_lib.signature_defs(
          compat.ServingInputReceiver(images, images), outputs)
      self.assertEqual(sorted(kept), ['serving_default'])
      self.assertEqual(sorted(export_lib.export_outputs_for(
          {'only': outputs['regress']}, None)), ['only', 'serving_default'])

  def test_use_tpu_fails_early_with_the_way_out(self):
    with self.assertRaisesRegex(ValueError, 'TensorFlow 2.15 runtime'):
      compat.TPUEstimator(legacy_model.model_fn, use_tpu=True,
                          train_batch_size=8)
    with self.assertRaisesRegex(ValueError, 'use_tpu=False'):
      eb.make_tpu_estimator(
          legacy_model.model_fn, model_dir='m', precision='bfloat16',
          train_batch_size=8, use_tpu=True, tpu='local',
          estimator_options=eb.EstimatorOptions(backend='compat'))

  def test_tpu_estimator_argument_errors(self):
    def no_params(features, labels, mode):
      del features, labels, mode
    with self.assertRaisesRegex(ValueError, 'must take a `params`'):
      compat.TPUEstimator(no_params, use_tpu=False)
    with self.assertRaisesRegex(ValueError, 'must not set batch_size'):
      compat.TPUEstimator(legacy_model.model_fn, use_tpu=False,
                          params={'batch_size': 3})
    with self.assertRaisesRegex(ValueError, 'backend must be one of'):
      eb.make_tpu_estimator(
          legacy_model.model_fn, model_dir='m', precision='float32',
          train_batch_size=8,
          estimator_options=eb.EstimatorOptions(backend='keras'))
    if not IS_TF215:
      with self.assertRaisesRegex(ValueError, 'needs TensorFlow 2.15'):
        eb.make_tpu_estimator(
            legacy_model.model_fn, model_dir='m', precision='float32',
            train_batch_size=8,
            estimator_options=eb.EstimatorOptions(backend='tf_estimator'))


def _linear_model_fn(features, labels, mode):
  """A plain-Estimator model_fn: EstimatorSpec, eval_metric_ops, tf ops only."""
  weights = tf.compat.v1.get_variable('w', [2, 1])
  value = tf.matmul(features['x'], weights)[:, 0]
  predictions = {'value': value, 'double': 2.0 * value}
  if mode == compat.ModeKeys.PREDICT:
    return compat.EstimatorSpec(mode, predictions=predictions, export_outputs={
        'regress': compat.PredictOutput({'value': value})})
  loss = tf.compat.v1.losses.mean_squared_error(labels, value)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return compat.EstimatorSpec(mode, loss=loss, train_op=train_op,
                              eval_metric_ops={'mae': tf.compat.v1.metrics
                                               .mean_absolute_error(
                                                   labels, value)})


def _linear_input_fn():
  x = np.random.RandomState(0).rand(64, 2).astype(np.float32)
  y = x @ np.array([1.0, -2.0], np.float32)
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(16)


class TPUSpecOffTheTpuTest(tf.test.TestCase):

  def test_as_estimator_spec_runs_the_host_parts(self):
    # TF 1.x code running off the TPU (tensorflow/tpu's detection models)
    # hands a plain Estimator `spec.as_estimator_spec()`.
    with tf.Graph().as_default():
      labels = tf.constant([1.0, 2.0])
      predictions = tf.constant([1.5, 2.0])
      scaffold = tf.compat.v1.train.Scaffold()
      spec = compat.TPUEstimatorSpec(
          compat.ModeKeys.EVAL, loss=tf.constant(0.5),
          eval_metrics=(lambda l, p: {'mae': tf.compat.v1.metrics
                                      .mean_absolute_error(l, p)},
                        [labels, predictions]),
          scaffold_fn=lambda: scaffold)
      plain = spec.as_estimator_spec()
      self.assertIsInstance(plain, compat.EstimatorSpec)
      self.assertEqual(plain.mode, compat.ModeKeys.EVAL)
      self.assertIs(plain.loss, spec.loss)
      self.assertIs(plain.scaffold, scaffold)
      value, update = plain.eval_metric_ops['mae']
      with tf.compat.v1.Session() as session:
        session.run(tf.compat.v1.local_variables_initializer())
        session.run(update)
        self.assertAllClose(session.run(value), 0.25)
    if IS_TF215:
      self.assertTrue(callable(getattr(
          tf.compat.v1.estimator.tpu.TPUEstimatorSpec, 'as_estimator_spec')))


class PlainEstimatorTest(tf.test.TestCase):

  def test_train_steps_evaluate_predict_export(self):
    model_dir = self.create_tempdir().full_path
    estimator = compat.Estimator(
        _linear_model_fn, config=compat.RunConfig(
            model_dir=model_dir, save_checkpoints_steps=3,
            keep_checkpoint_max=2, tf_random_seed=1))
    estimator.train(lambda: _linear_input_fn().repeat(), steps=5)
    estimator.train(lambda: _linear_input_fn().repeat(), steps=5)
    # Every 3 steps counted from where the second call resumed (5), as
    # tf.estimator's CheckpointSaverHook counts, plus the final step.
    state = tf.train.get_checkpoint_state(model_dir)
    self.assertEqual([os.path.basename(p) for p in
                      state.all_model_checkpoint_paths],
                     ['model.ckpt-8', 'model.ckpt-10'])
    # Training until the input runs out: 64 examples / 16 = 4 more steps.
    estimator.train(_linear_input_fn)
    self.assertEqual(estimator.get_variable_value('global_step'), 14)
    metrics = estimator.evaluate(_linear_input_fn)
    self.assertEqual(sorted(metrics), ['global_step', 'loss', 'mae'])
    self.assertEqual(metrics['global_step'], 14)
    batches = list(estimator.predict(_linear_input_fn, predict_keys='double',
                                     yield_single_examples=False))
    self.assertEqual([b['double'].shape for b in batches], [(16,)] * 4)
    examples = list(estimator.predict(_linear_input_fn))
    self.assertLen(examples, 64)
    self.assertAllClose(examples[0]['double'], 2 * examples[0]['value'])

    def serving_input_fn():
      x = tf.compat.v1.placeholder(tf.float32, [None, 2], name='x')
      return compat.ServingInputReceiver({'x': x}, {'x': x})
    export_dir = estimator.export_saved_model(
        os.path.join(model_dir, 'export'), serving_input_fn)
    self.assertIsInstance(export_dir, bytes)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      meta = tf.compat.v1.saved_model.load(session, ['serve'], export_dir)
      self.assertEqual(sorted(meta.signature_def),
                       ['regress', 'serving_default'])
    self.assertNotEmpty(glob.glob(os.path.join(model_dir, 'eval', 'events.*')))


def _events(pattern):
  """{tag: [step, ...]} over the summary event files matching pattern."""
  tags = {}
  for path in glob.glob(pattern):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        tags.setdefault(value.tag, []).append(event.step)
  return tags


@parameterized.parameters(*eb.PRECISIONS)
class LegacyProgramTest(tf.test.TestCase, parameterized.TestCase):
  """The unmodified legacy program, on the compat backend after install()."""

  @pytest.mark.slow
  def test_train_evaluate_predict_host_call_export(self, precision):
    model_dir = self.create_tempdir().full_path
    wrap = functools.partial(eb.wrap_input_fn, precision=precision)
    installed = compat.installed()
    with protocol.legacy_program('compat') as program:
      self.assertIs(program.tf_estimator, tf.estimator)
      estimator = program.build_estimator(
          eb.wrap_model_fn(program.model_fn_builder(model_dir), precision),
          model_dir)
      self.assertIsInstance(estimator, compat.TPUEstimator)
      estimator.train(wrap(program.train_input_fn), max_steps=30)
      # Resumes from model_dir; keep_checkpoint_max=3 drops older ones.
      estimator.train(wrap(program.train_input_fn), max_steps=50)
      metrics = estimator.evaluate(wrap(program.eval_input_fn), steps=4)
      predictions = list(estimator.predict(wrap(program.predict_input_fn)))
      export_dir = estimator.export_saved_model(
          os.path.join(model_dir, 'export'), program.serving_input_receiver_fn)
    self.assertEqual(compat.installed(), installed)

    # Every 20 steps from each session's start (0, 20, final 30; 30 again,
    # final 50), the last keep_checkpoint_max=3 kept.
    state = tf.train.get_checkpoint_state(model_dir)
    self.assertEqual([os.path.basename(p) for p in
                      state.all_model_checkpoint_paths],
                     ['model.ckpt-20', 'model.ckpt-30', 'model.ckpt-50'])
    reader = tf.train.load_checkpoint(model_dir)
    for name, dtype in reader.get_variable_to_dtype_map().items():
      if dtype.is_floating:
        self.assertEqual(dtype, tf.float32, name)

    self.assertEqual(metrics['global_step'], 50)
    self.assertGreater(metrics['accuracy'], 0.8)  # 4 classes: chance 0.25
    self.assertLess(metrics['loss'], 0.6)
    self.assertLen(predictions, 16)
    probabilities = np.stack([p['probabilities'] for p in predictions])
    self.assertEqual(probabilities.dtype, np.float32)
    self.assertAllClose(probabilities.sum(axis=1), np.ones(16), atol=1e-2)

    # The host_call ran at every step; v1 summaries every 5 steps.
    summaries = _events(os.path.join(model_dir, 'events.*'))
    self.assertEqual(sorted(summaries[program.HOST_CALL_TAG]),
                     list(range(50)))
    self.assertIn('loss', summaries)
    self.assertIn('accuracy', _events(os.path.join(model_dir, 'eval', '*')))

    served = protocol.serve(export_dir)
    self.assertEqual(served.dtype, np.float32)
    self.assertAllClose(served, probabilities[:protocol.SERVING_IMAGES],
                        atol=1e-6)


def _assert_agree(test, ours, theirs, what):
  """Same-precision runs of two backends agree within TOLERANCE."""
  test.assertEqual(ours['global_step'], theirs['global_step'], what)
  test.assertAllClose(ours['loss'], theirs['loss'], atol=TOLERANCE, rtol=0,
                      msg=what)
  for key in ('probabilities', 'serving'):
    test.assertAllClose(ours[key], theirs[key], atol=TOLERANCE, rtol=0,
                        msg='%s %s' % (what, key))
  test.assertEqual(sorted(ours['weights']), sorted(theirs['weights']))
  for name in ours['weights']:
    test.assertAllClose(ours['weights'][name], theirs['weights'][name],
                        atol=TOLERANCE, rtol=0, msg='%s %s' % (what, name))


def _assert_continued(test, continued, what):
  test.assertEqual(continued['step_after'],
                   continued['step_before'] + protocol.CONTINUE_STEPS, what)
  test.assertTrue(continued['changed'], what)
  test.assertLess(continued['loss'], 0.6, what)


def _max_weight_gap(a, b):
  return max(np.max(np.abs(np.subtract(a[k], b[k]))) for k in a)


_SCRATCH = scratch.ModuleScratch()


def setUpModule():
  _SCRATCH.start()


def tearDownModule():
  _SCRATCH.stop()


@_SCRATCH.cached
def _protocol_start():
  """The float32 start checkpoint, made once by this TensorFlow's backend."""
  return protocol.make_start(eb.BACKEND, _SCRATCH.root)


@_SCRATCH.cached
def _protocol_run(backend, precision):
  """protocol.run from the shared start, once per (backend, precision).

  The backend agreement and the cross-version test both compare this
  TensorFlow's run of the protocol with another's: they share it.
  """
  return protocol.run(backend, precision, _protocol_start(), _SCRATCH.root)


class BackendAgreementTest(tf.test.TestCase):

  @NEEDS_TF215
  def test_same_params_as_tpu_estimator(self):
    """input_fn / model_fn see the same params in every mode, export too."""
    seen = {}

    def recording(backend, input_mode, fn, where):
      def recorded(features, labels, mode, params):
        seen.setdefault(backend, []).append(
            (where, mode, sorted(params.items()), labels is None))
        return fn(features, labels, mode, params)

      def input_fn(params):
        seen.setdefault(backend, []).append(('input', input_mode,
                                             sorted(params.items())))
        return fn(params)
      return recorded if where == 'model' else input_fn

    files = {}
    for backend in backend_lib.BACKENDS:
      model_dir = self.create_tempdir().full_path
      estimator = eb.make_tpu_estimator(
          recording(backend, None, legacy_model.model_fn, 'model'),
          model_dir=model_dir, precision='bfloat16', train_batch_size=8,
          eval_batch_size=8, predict_batch_size=4, params={'lr': 0.01},
          estimator_options=eb.EstimatorOptions(save_checkpoints_steps=1,
                                                keep_checkpoint_max=2,
                                                backend=backend))
      estimator.train(recording(backend, 'train', legacy_model.train_input_fn,
                                'input'), max_steps=2)
      estimator.evaluate(recording(backend, 'eval',
                                   legacy_model.eval_input_fn, 'input'),
                         steps=1)
      list(estimator.predict(recording(backend, 'predict',
                                       legacy_model.predict_input_fn,
                                       'input')))
      estimator.export_saved_model(os.path.join(model_dir, 'export'),
                                   legacy_model.serving_input_fn)
      # Event file names carry a time stamp and the host name.
      files[backend] = sorted(re.sub(r'^events\.out\.tfevents\..*', 'events',
                                     name) for name in os.listdir(model_dir))
    self.assertEqual(seen['tf_estimator'], seen['compat'])
    self.assertEqual(files['tf_estimator'], files['compat'])

  @NEEDS_TF215
  @pytest.mark.slow
  def test_same_numbers_and_checkpoints_cross_backends(self):
    work_dir = self.create_tempdir().full_path
    results = {}
    for precision in eb.PRECISIONS:
      for backend in backend_lib.BACKENDS:
        results[backend, precision] = _protocol_run(backend, precision)
      _assert_agree(self, results['compat', precision],
                    results['tf_estimator', precision], precision)
      for backend, other in (('compat', 'tf_estimator'),
                             ('tf_estimator', 'compat')):
        continued = protocol.continue_training(
            backend, precision, results[other, precision]['model_dir'],
            work_dir)
        _assert_continued(self, continued, '%s after %s' % (backend, other))
    # The tolerance is far below what a precision mix-up would cause.
    self.assertGreater(_max_weight_gap(
        results['compat', 'float32']['weights'],
        results['compat', 'bfloat16']['weights']), 100 * TOLERANCE)


@pytest.mark.slow
class CrossVersionTest(tf.test.TestCase):
  """This TensorFlow against the other virtualenv's, through a subprocess."""

  def test_numbers_checkpoints_and_savedmodels_cross_versions(self):
    python = _other_python()
    if python is None:
      self.skipTest('the other TensorFlow virtualenv is not there (run '
                    'scripts/test_matrix.sh to create both)')
    work_dir = self.create_tempdir().full_path
    start = _protocol_start()
    theirs_dir = os.path.join(work_dir, 'other')
    out = os.path.join(work_dir, 'other.json')
    handoff_path = os.path.join(work_dir, 'ours.json')
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop('ESTIMATOR_BF16_OTHER_PYTHON', None)
    # On TF 2.16+, tf.compat.v1.layers must then come from install() alone.
    env.pop('TF_USE_LEGACY_KERAS', None)
    # The other TensorFlow starts (imports, trains its own half) while this
    # one trains; it waits for the handoff file before it continues ours.
    # Its log goes to a file: a pipe nobody reads while this process trains
    # could fill up and stop it.
    log_path = os.path.join(work_dir, 'other.log')
    with open(log_path, 'w') as log:
      process = subprocess.Popen(
          [python, '-m', 'tests.support.compat_protocol', '--start_dir',
           start, '--work_dir', theirs_dir, '--theirs', handoff_path,
           '--out', out], cwd=REPO, env=env, stdout=log,
          stderr=subprocess.STDOUT)
    try:
      ours = {p: _protocol_run(eb.BACKEND, p) for p in eb.PRECISIONS}
      handoff = {p: {'model_dir': r['model_dir'],
                     'export_dir': r['export_dir']} for p, r in ours.items()}
      # Written whole, then renamed: the other process never reads a part.
      with open(handoff_path + '.part', 'w') as f:
        json.dump(handoff, f)
      os.replace(handoff_path + '.part', handoff_path)
      process.wait(timeout=900)
    finally:
      if process.poll() is None:
        process.kill()
        process.wait()
    with open(log_path) as f:
      self.assertEqual(process.returncode, 0, f.read()[-5000:])
    with open(out) as f:
      theirs = json.load(f)
    self.assertNotEqual(theirs['tf_version'][:4], tf.__version__[:4])
    self.assertNotEqual(theirs['backend'], eb.BACKEND)
    for precision in eb.PRECISIONS:
      other = theirs[precision]
      what = '%s: TF %s vs %s' % (precision, tf.__version__,
                                  theirs['tf_version'])
      _assert_agree(self, ours[precision], other['run'], what)
      # Our checkpoint continued there, our SavedModel served there ...
      _assert_continued(self, other['continued'], what)
      self.assertAllClose(other['served'], ours[precision]['serving'],
                          atol=1e-6)
      # ... and theirs here.
      _assert_continued(self, protocol.continue_training(
          eb.BACKEND, precision, other['run']['model_dir'], work_dir), what)
      self.assertAllClose(protocol.serve(other['run']['export_dir']),
                          other['run']['serving'], atol=1e-6)


if __name__ == '__main__':
  tf.test.main()
