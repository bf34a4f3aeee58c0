r"""The main demo: the same MNIST MLP in float32 and bfloat16, compared.

    python -m estimator_bf16.apps.demo --out_dir=runs/demo

Trains the Keras-tutorial MLP (Flatten, Dense 512 ReLU, Dropout 0.2,
Dense 10) on scikit-learn's shipped digits with an unmodified TPUEstimator
model_fn, once per precision, in local TPUEstimator mode. Prints accuracy,
losses, examples/sec and the measured peak memory of a training step side
by side, and writes `loss_curves.png` and `results.json` into --out_dir.
`--quick` trains a few steps only (the smoke test).
"""

import os

# The allocator statistics PeakMemoryHook reads exist only if this is set
# before TensorFlow is imported (estimator_bf16.memory.peak.ALLOCATOR_ENV).
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
# C++ info lines; under `python -m` the package has loaded TensorFlow, and
# with it the log level, already (the Makefile sets it for `make demo`).
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
import json
import shutil

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import precision_comparison
from estimator_bf16.apps import training
from estimator_bf16.memory.peak import PeakMemoryHook
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import cpu_bfloat16


def define_flags():
  flags.DEFINE_string('out_dir', 'runs/demo', 'Where runs, table and plot go.')
  flags.DEFINE_enum('model', 'mnist_mlp', ('mnist_mlp', 'mnist_cnn'),
                    'MNIST-size network.')
  flags.DEFINE_integer('train_steps', 300, 'Training steps per precision.',
                       lower_bound=10)
  flags.DEFINE_integer('train_batch_size', 1024, 'Training batch; large '
                       'enough that activations (what bfloat16 halves) '
                       'rather than float32 weights and Adam slots (what it '
                       'keeps) dominate the memory peak.', lower_bound=1)
  flags.DEFINE_bool('quick', False, 'Smoke run: 20 steps, no export.')


def train_both(out_dir, model='mnist_mlp', train_steps=300,
               train_batch_size=1024, export=True):
  """Trains `model` in each precision; returns {precision: summary row}.

  Args:
    out_dir: parent of one model_dir per precision (emptied first, so the
      numbers come from this run, not a resumed one).
    model: 'mnist_mlp' or 'mnist_cnn'.
    train_steps: steps per precision.
    train_batch_size: global training batch.
    export: also export each run's float32 SavedModel.

  Returns:
    (rows, curves, results): `precision_comparison.summary_row` dicts, (steps, losses)
    curves and raw `training.run` results, each keyed by precision.
  """
  rows, curves, results = {}, {}, {}
  for precision in eb.PRECISIONS:
    model_dir = os.path.join(out_dir, precision)
    shutil.rmtree(model_dir, ignore_errors=True)
    # Trace calls 2-4: after start-up work, before ThroughputHook's timing
    # starts; the median damps what the input threads allocate meanwhile.
    memory = PeakMemoryHook(trace_steps=(2, 3, 4))
    options = training.TrainOptions(
        model=model, model_dir=model_dir, precision=precision,
        train_steps=train_steps, train_batch_size=train_batch_size,
        export=export)
    # Progress: a bar on a terminal (training.run's ProgressHook), and
    # these lines either way.
    print('%s: training %d steps of batch %d ...' % (
        precision, train_steps, train_batch_size), flush=True)
    results[precision] = training.run(options, hooks=[memory])
    print('%s: done, eval accuracy %.4f' % (
        precision, results[precision]['eval']['accuracy']), flush=True)
    peak = int(np.median(list(memory.per_step.values()) or [0]))
    results[precision]['peak_bytes'] = peak
    curves[precision] = precision_comparison.read_scalars(model_dir)
    rows[precision] = precision_comparison.summary_row(results[precision],
                                         curves[precision][1], peak)
  return rows, curves, results


def main(argv):
  del argv
  # The table is the output; TensorFlow's deprecation notices would bury it.
  tf.get_logger().setLevel('ERROR')
  logging.set_verbosity(logging.WARNING)
  f = flags.FLAGS
  steps = 20 if f.quick else f.train_steps
  # Before the runs: on an AVX2-only CPU the speed column is not the point.
  cpu_bfloat16.warn_if_emulated()
  os.makedirs(f.out_dir, exist_ok=True)
  rows, curves, results = train_both(
      f.out_dir, model=f.model, train_steps=steps,
      train_batch_size=f.train_batch_size, export=not f.quick)
  table = '\n\n'.join([precision_comparison.comparison_table(rows),
                       precision_comparison.speed_spread(rows),
                       precision_comparison.cpu_bfloat16_note()])
  title = '%s on the digits, %d steps of batch %d' % (
      f.model, steps, f.train_batch_size)
  precision_comparison.plot_loss_curves(curves, os.path.join(f.out_dir, 'loss_curves.png'),
                          title='Training loss: ' + title)
  with open(os.path.join(f.out_dir, 'results.json'), 'w') as out:
    json.dump({'title': title, 'rows': rows, 'runs': results,
               'loss_curves': {p: {'steps': s.tolist(), 'loss': v.tolist()}
                               for p, (s, v) in curves.items()}},
              out, indent=2, sort_keys=True)
  with open(os.path.join(f.out_dir, 'table.txt'), 'w') as out:
    out.write(title + '\n\n' + table + '\n')
  logging.info('Wrote %s', f.out_dir)
  print('\n' + title + '\n\n' + table + '\n')
  print('Loss curves: %s' % os.path.join(f.out_dir, 'loss_curves.png'))


if __name__ == '__main__':
  if eb.BACKEND == backend_lib.COMPAT_BACKEND:
    eb.compat.install()  # TensorFlow 2.16+: see estimator_bf16/apps/train_cli.py.
  define_flags()
  app.run(main)
