r"""What a user would pick instead: Keras with the `mixed_bfloat16` policy.

The same MNIST MLP (Flatten, Dense 512 ReLU, Dropout 0.2, Dense 10) trained
by Keras in TensorFlow 2 style (eager, `tf.function` train steps) under
`tf.keras.mixed_precision.set_global_policy('mixed_bfloat16')`, with a
float32 output activation as the Keras mixed-precision guide advises, and
Adam; against our MLP under `eb.wrap_model_fn` in bfloat16 (graph mode).

Keras's policy is global to the process and the allocator's peak counts
everything alive in it, so this runs in its own process:

    python -m benchmarks.keras_baseline --batch_size=256 --out=keras.json

It measures each model's step memory one after the other, then times them
in alternating windows (see `throughput.py`), and writes JSON.
"""

import os

# Allocator statistics exist only if set before TensorFlow is imported.
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import json

import tensorflow as tf

from benchmarks import configs
from benchmarks import graphs
from benchmarks import step_memory
from benchmarks import throughput

OURS = 'ours_bfloat16'
KERAS = 'keras_mixed_bfloat16'
KERAS_FLOAT32 = 'keras_float32'


def keras_mlp(policy, image_size=28, num_classes=10):
  """Builds and compiles the Keras MLP under `policy` (a policy name)."""
  tf.keras.mixed_precision.set_global_policy(policy)
  try:
    model = tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=(image_size, image_size, 1)),
        tf.keras.layers.Dense(512, activation='relu'),
        tf.keras.layers.Dropout(0.2),
        tf.keras.layers.Dense(num_classes),
        # The guide's advice: outputs (and so the loss) in float32.
        tf.keras.layers.Activation('linear', dtype='float32'),
    ])
  finally:
    tf.keras.mixed_precision.set_global_policy('float32')
  model.compile(
      optimizer=tf.keras.optimizers.Adam(1e-3),
      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def keras_dataset(spec, batch_size):
  """The same synthetic batch as our input_fn, as (images, labels)."""
  dataset = graphs.synthetic_input_fn(spec)({'batch_size': batch_size})
  return dataset.map(lambda features, labels: (features['image'], labels))


class KerasStep(object):
  """One Keras training step per call, as `model.fit` runs it."""

  def __init__(self, model, dataset):
    self._iterator = iter(dataset)
    self._train = model.make_train_function()
    self.logs = None

  def __call__(self):
    self.logs = self._train(self._iterator)

  def sync(self):
    # Reading a value waits for the step, should execution be asynchronous.
    return float(self.logs['loss'])


def keras_step_memory(policy, spec, batch_size):
  """Allocator peak of a Keras training step (after one warm-up step)."""
  baseline = step_memory.bytes_in_use()
  model = keras_mlp(policy, spec.image_size, spec.num_classes)
  step = KerasStep(model, keras_dataset(spec, batch_size))
  step()
  step.sync()
  persistent = step_memory.bytes_in_use() - baseline
  tf.config.experimental.reset_memory_stats('CPU:0')
  step()
  step.sync()
  peak = tf.config.experimental.get_memory_info('CPU:0')['peak'] - baseline
  return {'peak_step_bytes': int(peak), 'persistent_bytes': int(persistent),
          'transient_bytes': int(peak - persistent)}


def run(batch_size, warmup_steps, window_steps, windows):
  """Measures ours and Keras's MLP; returns the JSON-ready dict."""
  step_memory.check_allocator_stats()
  spec = configs.ModelSpec(configs.KERAS_MODEL, 'mnist_mlp',
                           batch_size=batch_size, optimizer='adam')
  results = {OURS: step_memory.measure_step_memory(
      graphs.build_train_step(spec, 'bfloat16', batch_size))}
  for name, policy in ((KERAS, 'mixed_bfloat16'),
                       (KERAS_FLOAT32, 'float32')):
    results[name] = keras_step_memory(policy, spec, batch_size)

  ours = graphs.build_train_step(spec, 'bfloat16', batch_size)
  session = graphs.start_session(ours)
  steps = {name: KerasStep(keras_mlp(policy), keras_dataset(spec, batch_size))
           for name, policy in ((KERAS, 'mixed_bfloat16'),
                                (KERAS_FLOAT32, 'float32'))}
  variants = {OURS: (lambda: session.run(ours.train_op), batch_size)}
  for name, step in steps.items():
    variants[name] = (lambda step=step: (step(), step.sync()), batch_size)
  try:
    rates = throughput.alternating_windows(
        variants, warmup_steps=warmup_steps, window_steps=window_steps,
        windows=windows)
  finally:
    session.close()
  versus_mixed = throughput.summarize(rates, OURS, KERAS)
  versus_float32 = throughput.summarize(rates, KERAS, KERAS_FLOAT32)
  for name in variants:
    results[name]['examples_per_sec'] = (
        versus_mixed.get(name + '_examples_per_sec') or
        versus_float32[name + '_examples_per_sec'])
  results.update({
      'model': spec.name, 'batch_size': batch_size,
      'throughput_ratio': versus_mixed['ratio'],
      'throughput_ratio_iqr': versus_mixed['ratio_iqr'],
      'memory_ratio': (results[OURS]['peak_step_bytes'] /
                       results[KERAS]['peak_step_bytes']),
      'keras_bfloat16_over_float32_throughput': versus_float32['ratio'],
      'keras_bfloat16_over_float32_memory': (
          results[KERAS]['peak_step_bytes'] /
          results[KERAS_FLOAT32]['peak_step_bytes']),
      'windows': dict(versus_mixed['windows'], **versus_float32['windows']),
  })
  return results


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--batch_size', type=int, default=256)
  parser.add_argument('--warmup_steps', type=int, default=3)
  parser.add_argument('--window_steps', type=int, default=40)
  parser.add_argument('--windows', type=int, default=5)
  parser.add_argument('--out', required=True, help='JSON file to write.')
  args = parser.parse_args()
  results = run(args.batch_size, args.warmup_steps, args.window_steps,
                args.windows)
  with open(args.out, 'w') as out:
    json.dump(results, out, indent=2, sort_keys=True)


if __name__ == '__main__':
  main()
