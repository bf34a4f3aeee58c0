"""The tf.distribute strategies a training program picks by name.

    strategy = eb.make_strategy('mirrored')               # all local GPUs
    strategy = eb.make_strategy('mirrored', cpu_devices=2)  # try it on a CPU
    strategy = eb.make_strategy('multi_worker')           # hosts, TF_CONFIG

The strategy goes to `eb.make_tpu_estimator(..., distribute=strategy)` or to
`RunConfig(train_distribute=strategy)`; docs/distribute.md explains what the
Estimator then does.
"""

import tensorflow as tf

from estimator_bf16.distribute import cluster as cluster_lib

KINDS = ('mirrored', 'multi_worker')
# A collective op that waits longer than this for a peer fails (naming the
# peer) instead of hanging: long enough for a slow step or a checkpoint
# save on a busy host, short enough that a lost host is noticed.
DEFAULT_TIMEOUT_SECONDS = 120.0


def _graph_mode():
  """Builds a strategy the way the Estimator runs it: for graph mode.

  Built eagerly, a strategy creates eager state on its devices (which then
  must exist in the eager context) and a multi-worker one starts an eager
  server on the task's port; built for graph mode it reduces through
  graph ops and leaves the server to the Estimator's session.
  """
  return tf.Graph().as_default()


def cpu_device_names(count):
  """'/cpu:0' .. '/cpu:<count-1>': logical CPU devices for trying replicas.

  The Estimator creates them in its sessions (`ConfigProto.device_count`),
  so nothing global changes and the count may differ between runs of one
  process.
  """
  if isinstance(count, bool) or not isinstance(count, int) or count < 1:
    raise ValueError('cpu_devices must be a positive integer, got %r.' %
                     (count,))
  return ['/cpu:%d' % index for index in range(count)]


def make_strategy(kind, *, cpu_devices=None,
                  timeout_seconds=DEFAULT_TIMEOUT_SECONDS, environ=None):
  """Builds a data-parallel strategy by name.

  Args:
    kind: `'mirrored'` (the local devices of one process: every GPU, or
      `cpu_devices` logical CPUs) or `'multi_worker'` (one process per host,
      the cluster read from TF_CONFIG, gradients all-reduced between them).
    cpu_devices: for `'mirrored'`, split the CPU into this many logical
      devices instead of using the GPUs (None: the GPUs if any, else the
      CPU). Not used by `'multi_worker'`, which runs one replica per GPU
      (or one on the CPU) in each process.
    timeout_seconds: for `'multi_worker'`, how long a collective op waits
      for the other tasks before failing.
    environ: where TF_CONFIG is read (default `os.environ`).

  Returns:
    A `tf.distribute.MirroredStrategy` or
    `tf.distribute.MultiWorkerMirroredStrategy`.

  Raises:
    ValueError: an unknown kind or a bad `cpu_devices`.
    cluster.ClusterError: TF_CONFIG is missing or bad, or names the
      evaluator (which evaluates checkpoints and trains nothing).
  """
  if kind not in KINDS:
    raise ValueError('distribute must be one of %s, got %r.' %
                     (', '.join(repr(k) for k in KINDS), kind))
  if kind == 'mirrored':
    devices = (cpu_device_names(cpu_devices) if cpu_devices is not None
               else None)
    with _graph_mode():
      return tf.distribute.MirroredStrategy(devices=devices)
  if cpu_devices not in (None, 1):
    raise ValueError('cpu_devices=%r: multi_worker runs one replica per '
                     'process on a CPU; start more processes instead.' %
                     (cpu_devices,))
  if timeout_seconds is not None and timeout_seconds <= 0:
    raise ValueError('timeout_seconds must be > 0 or None, got %r.' %
                     (timeout_seconds,))
  cluster = cluster_lib.read_tf_config(environ)
  if cluster.task_type == cluster_lib.EVALUATOR:
    raise cluster_lib.ClusterError(
        'TF_CONFIG: this task is the evaluator, which trains nothing: it '
        'evaluates each new checkpoint of the chief without a strategy.')
  # Only the all-reduce peers: the evaluator takes no part in collectives.
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(cluster.training_jobs),
      task_type=cluster.task_type, task_id=cluster.task_index,
      num_accelerators={
          'GPU': len(tf.config.list_physical_devices('GPU'))},
      rpc_layer='grpc')
  options = tf.distribute.experimental.CommunicationOptions(
      timeout_seconds=timeout_seconds)
  with _graph_mode():
    return tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options)
