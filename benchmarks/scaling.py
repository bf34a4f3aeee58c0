"""Data-parallel scaling: 2 logical CPU devices against 1, side by side.

The MNIST MLP trains in graph mode through the same path as
`make_tpu_estimator(..., distribute=...)`: the wrapped model_fn is called
once per replica by `tf.distribute.MirroredStrategy` and the float32
gradients are all-reduced. Each replica gets the same per-replica batch as
the single device (weak scaling), so perfect scaling doubles the examples
per second: efficiency = (2-device rate / 1-device rate) / 2.

Logical CPU devices share the machine's cores. On a 2-core machine one
device already uses both cores for its matmuls, so a second device adds
coordination, not compute: the number checks that the replicated path runs
and what it costs, not the speed of real GPUs or hosts.
"""

import os

import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.models import mnist
from benchmarks import throughput

NOTE = ('Logical CPU devices share this machine\'s %d cores: on a 2-core '
        'machine this measures that data parallelism runs correctly and '
        'what its coordination costs, not speed (that needs GPUs or hosts).')


def _model_fn(features, labels, mode, params):
  """The MNIST MLP with a float32 loss and Adam: a legacy model_fn."""
  del params
  logits = mnist.mnist_mlp()(features['image'], is_training=True)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.AdamOptimizer(1e-3).minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return eb.compat.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _replica_step(model_fn, batch, seed):
  """Builds one replica's training step on fixed random digits."""
  rng = np.random.RandomState(seed)
  images = tf.constant(rng.rand(batch, 28, 28, 1).astype(np.float32))
  labels = tf.constant(rng.randint(0, 10, batch).astype(np.int32))
  spec = model_fn({'image': images}, labels, 'train', {})
  return spec.train_op


def _session(devices, precision, batch):
  """A session and its train op on `devices` logical CPU devices."""
  model_fn = eb.wrap_model_fn(_model_fn, precision, eb.WrapOptions(audit='off'))
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(0)
    if devices == 1:
      tf.compat.v1.train.get_or_create_global_step()
      train_op = _replica_step(model_fn, batch, 0)
      config = tf.compat.v1.ConfigProto()
    else:
      strategy = eb.make_strategy('mirrored', cpu_devices=devices)
      with strategy.scope():
        tf.compat.v1.train.get_or_create_global_step()
        ops = compat_distribute.call_for_each_replica(
            strategy, lambda index: _replica_step(model_fn, batch, index))
      train_op = tf.group(*ops)
      config = compat_distribute.session_config(strategy,
                                                tf.compat.v1.ConfigProto())
    init = tf.compat.v1.global_variables_initializer()
  session = tf.compat.v1.Session(graph=graph, config=config)
  session.run(init)
  return session, train_op


def measure_scaling(precision='bfloat16', per_replica_batch=256,
                    warmup_steps=5, window_steps=20, windows=6):
  """Examples/sec of 1 and 2 logical CPU devices, in alternating windows.

  Args:
    precision: `'float32'` or `'bfloat16'`.
    per_replica_batch: examples per device per step (the single device
      trains this batch; two devices train twice as many per step).
    warmup_steps, window_steps, windows: see
      `throughput.alternating_windows`.

  Returns:
    dict with 'precision', 'per_replica_batch', 'one_device_examples_per_sec'
    and 'two_devices_examples_per_sec' (medians), 'speedup' (median of the
    per-round ratios, two devices over one), 'speedup_iqr' ([q1, q3]),
    'scaling_efficiency' (speedup / 2), 'cpu_count' and 'note' (what the
    number means on this machine).
  """
  eb.compute_dtype(precision)  # raises ValueError listing the choices
  sessions = {devices: _session(devices, precision, per_replica_batch)
              for devices in (1, 2)}
  try:
    variants = {
        'one_device': (lambda: sessions[1][0].run(sessions[1][1]),
                       per_replica_batch),
        'two_devices': (lambda: sessions[2][0].run(sessions[2][1]),
                        2 * per_replica_batch),
    }
    rates = throughput.alternating_windows(
        variants, warmup_steps=warmup_steps, window_steps=window_steps,
        windows=windows)
  finally:
    for session, _ in sessions.values():
      session.close()
  summary = throughput.summarize(rates, 'two_devices', 'one_device')
  cpus = os.cpu_count() or 1
  return {
      'precision': precision,
      'per_replica_batch': per_replica_batch,
      'one_device_examples_per_sec': summary['one_device_examples_per_sec'],
      'two_devices_examples_per_sec': summary['two_devices_examples_per_sec'],
      'speedup': summary['ratio'],
      'speedup_iqr': summary['ratio_iqr'],
      'scaling_efficiency': summary['ratio'] / 2.0,
      'cpu_count': cpus,
      'note': NOTE % cpus,
  }


if __name__ == '__main__':
  for name, value in measure_scaling().items():
    print('%s: %s' % (name, value))
