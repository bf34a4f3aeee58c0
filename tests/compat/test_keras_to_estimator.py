"""A compiled Keras model made an Estimator (`model_to_estimator`), in bfloat16.

The TF 1.x road from Keras to an Estimator: on TensorFlow 2.15 the real
`tf.keras.estimator.model_to_estimator`, on 2.16+ the compat backend's
(`estimator_bf16/compat/keras_estimator.py`), both run unmodified by `run`.
"""

import json
import os
import textwrap

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context

import estimator_bf16 as eb
from estimator_bf16.compat import keras_estimator
from estimator_bf16.runner import program as runner
from estimator_bf16.runner import report as run_report

# The model users bring, narrower (Dense 32, not 512) to stay fast.
_PROGRAM = '''
import json, sys
import numpy as np
import tensorflow as tf

# Seeded layers: the same initial weights and dropout masks in both
# precisions, so the two runs differ by the precision alone.
model = tf.keras.models.Sequential([
    tf.keras.layers.Flatten(input_shape=(28, 28)),
    tf.keras.layers.Dense(32, activation='relu', kernel_initializer=(
        tf.keras.initializers.GlorotUniform(seed=1))),
    tf.keras.layers.Dropout(0.2, seed=2),
    tf.keras.layers.Dense(10, activation='softmax', kernel_initializer=(
        tf.keras.initializers.GlorotUniform(seed=3)))])
model.compile(optimizer='adam', loss='sparse_categorical_crossentropy',
              metrics=['accuracy'])

def input_fn():
  rng = np.random.RandomState(0)
  # A learnable image: the label's row is brighter.
  y = rng.randint(10, size=256).astype(np.int32)
  x = rng.rand(256, 28, 28).astype(np.float32)
  x[np.arange(256), y, :] += 1.0
  return tf.data.Dataset.from_tensor_slices(
      ({model.input_names[0]: x}, y)).repeat().batch(32)

estimator = tf.keras.estimator.model_to_estimator(
    keras_model=model, model_dir=sys.argv[1])
estimator.train(input_fn, steps=60)
metrics = estimator.evaluate(input_fn, steps=8)
with open(sys.argv[2], 'w') as f:
  json.dump({k: [float(v), np.asarray(v).dtype.name]
             for k, v in metrics.items()}, f)
'''


def _small_model(compiled=True, metrics=('accuracy',)):
  model = tf.keras.models.Sequential([
      tf.keras.layers.Flatten(input_shape=(4, 4)),
      tf.keras.layers.Dense(8, activation='relu'),
      tf.keras.layers.Dense(3, activation='softmax')])
  if compiled:
    model.compile(optimizer='adam', loss='sparse_categorical_crossentropy',
                  metrics=list(metrics))
  return model


def _examples(count, seed):
  """4x4 images and a label the model can learn: the brightest of the
  first three pixels."""
  x = np.random.RandomState(seed).rand(count, 4, 4).astype(np.float32)
  return x, x.reshape(count, -1)[:, :3].argmax(axis=1).astype(np.int32)


def _repeating(features, labels):
  """An input_fn over (features, labels), repeated, in batches of 8."""
  return lambda: tf.data.Dataset.from_tensor_slices(
      (features, labels)).repeat().batch(8)


@pytest.mark.slow
class RunTest(tf.test.TestCase, parameterized.TestCase):

  def _run(self, precision):
    folder = self.create_tempdir().full_path
    program = os.path.join(folder, 'keras_mnist.py')
    with open(program, 'w') as f:
      f.write(textwrap.dedent(_PROGRAM))
    model_dir, out = os.path.join(folder, 'model'), os.path.join(folder,
                                                                 'm.json')
    result = runner.run_program(program, [model_dir, out],
                                precision=precision)
    self.assertEqual(result.exit_code, 0, result.error)
    with open(out) as f:
      return result, json.load(f), model_dir

  def test_trains_in_bfloat16_like_float32(self):
    result, metrics, model_dir = self._run('bfloat16')
    self.assertEqual(result.train_steps, [60])
    self.assertEqual(result.reports[-1].bfloat16_flop_share, 1.0)
    self.assertEqual(result.problems, [])
    # Float32 master weights in the checkpoint, float32 metrics.
    reader = tf.train.load_checkpoint(model_dir)
    floating = {name: dtype for name, dtype in
                reader.get_variable_to_dtype_map().items()
                if dtype.is_floating}
    self.assertNotEmpty(floating)
    self.assertEqual(set(floating.values()), {tf.float32}, floating)
    self.assertEqual(metrics['accuracy'][1], 'float32')
    # What the runner saw evaluate return, and reports.
    self.assertEqual(result.evaluations[-1]['accuracy'], metrics['accuracy'])
    self.assertIn('evaluation: accuracy %.4g (float32)' %
                  metrics['accuracy'][0], run_report.format_run_report(result))
    self.assertEqual(metrics['global_step'][0], 60)
    _, reference, _ = self._run('float32')
    # Chance is 0.1; both learn, and by about as much.
    self.assertGreater(metrics['accuracy'][0], 0.5)
    self.assertGreater(reference['accuracy'][0], 0.5)
    self.assertNear(metrics['loss'][0], reference['loss'][0], 0.15)


@pytest.mark.slow
class CompatModelToEstimatorTest(tf.test.TestCase):
  """The compat backend's own function (TensorFlow 2.16+'s), on both."""

  def setUp(self):
    super().setUp()
    # Keras models as TF 2 programs make them, whatever another test module
    # of this process did to the global mode (setUpModule's
    # disable_eager_execution()).
    self.enterContext(context.eager_mode())

  def test_a_model_made_with_eager_execution_off(self):
    # TF 1.x programs: Keras' v1 training loop, a legacy optimizer, the
    # metrics kept on the model.
    input_fn = _repeating(*_examples(16, seed=4))
    with context.graph_mode(), tf.Graph().as_default():
      model = _small_model()
      estimator = keras_estimator.model_to_estimator(
          keras_model=model, model_dir=self.create_tempdir().full_path)
    estimator.train(input_fn, steps=2)
    metrics = estimator.evaluate(input_fn, steps=1)
    self.assertEqual(sorted(metrics), ['accuracy', 'global_step', 'loss'])

  def test_starts_from_the_models_weights(self):
    model = _small_model()
    x = np.random.RandomState(1).rand(6, 4, 4).astype(np.float32)
    expected = model.predict(x, verbose=0)
    name = model.output_names[0]
    estimator = keras_estimator.model_to_estimator(
        keras_model=model, model_dir=self.create_tempdir().full_path)
    predictions = estimator.predict(
        lambda: tf.data.Dataset.from_tensor_slices(x).batch(3))
    got = np.stack([p[name] for p in predictions])
    self.assertAllClose(got, expected, atol=1e-5)

  def test_trains_and_names_its_metrics(self):
    model = _small_model(metrics=('acc',))
    x, y = _examples(32, seed=2)
    estimator = keras_estimator.model_to_estimator(
        keras_model=model, model_dir=self.create_tempdir().full_path,
        metric_names_map={'acc': 'train_accuracy'})
    wrapped = eb.wrap_input_fn(_repeating({model.input_names[0]: x}, y),
                               'bfloat16')
    estimator._model_fn = eb.wrap_model_fn(estimator.model_fn, 'bfloat16')  # pylint: disable=protected-access
    estimator.train(wrapped, steps=5)
    metrics = estimator.evaluate(wrapped, steps=2)
    self.assertEqual(metrics['global_step'], 5)
    self.assertBetween(metrics['train_accuracy'], 0.0, 1.0)
    self.assertTrue(np.isfinite(metrics['loss']))

  def test_clipping_is_kept_and_binary_labels_may_be_integers(self):
    model = tf.keras.models.Sequential([
        tf.keras.layers.Flatten(input_shape=(4, 4)),
        tf.keras.layers.Dense(1, activation='sigmoid')])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1, clipnorm=0.5),
                  loss='binary_crossentropy', metrics=['accuracy', 'mae'])
    cls, config = keras_estimator._legacy_optimizer(model.optimizer)  # pylint: disable=protected-access
    self.assertEqual(cls.from_config(config).clipnorm, 0.5)
    x = np.random.RandomState(3).rand(16, 4, 4).astype(np.float32)
    y = (x[:, 0, 0] > 0.5).astype(np.int32)  # integer 0/1 labels
    estimator = keras_estimator.model_to_estimator(
        keras_model=model, model_dir=self.create_tempdir().full_path)
    estimator.train(_repeating(x, y), steps=2)
    metrics = estimator.evaluate(_repeating(x, y), steps=2)
    self.assertBetween(metrics['accuracy'], 0.0, 1.0)
    self.assertTrue(np.isfinite(metrics['mae']))

  def test_bad_models_fail_at_the_call(self):
    with self.assertRaisesRegex(ValueError, 'not compiled'):
      keras_estimator.model_to_estimator(keras_model=_small_model(False))
    with self.assertRaisesRegex(ValueError, 'exactly one'):
      keras_estimator.model_to_estimator()
    with self.assertRaisesRegex(NotImplementedError, "metric 'auc'"):
      keras_estimator.model_to_estimator(
          keras_model=_small_model(metrics=('auc',)))
    with self.assertRaisesRegex(NotImplementedError, 'checkpoint_format'):
      keras_estimator.model_to_estimator(
          keras_model=_small_model(), checkpoint_format='checkpoint')


if __name__ == '__main__':
  tf.test.main()
