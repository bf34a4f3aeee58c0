"""How the compat Estimator runs a model_fn under a tf.distribute strategy.

Graph mode, as tf.estimator did it, without tf.estimator's distribute
coordinator (whose deep copies of the strategy fail with "cannot pickle
'_thread.lock'" on TensorFlow 2.x):

* input_fn is called once per worker process, on its host CPU, with
  `params['batch_size']` per replica and a `tf.distribute.InputContext`
  (`num_input_pipelines` = workers, `input_pipeline_id` = this worker), so
  it can shard by worker; each local replica takes the next batch of it;
* model_fn is called once per replica through
  `strategy.extended.call_for_each_replica`, each call in the replica's own
  thread and device scope, so a wrapped (bfloat16) model_fn builds each
  replica's network itself;
* `tf.compat.v1.train.Optimizer.apply_gradients` all-reduces the
  gradients (the variables, and so the gradients, are float32) with the
  loss scaled by 1 / replicas, so the update equals that of one device on
  the global batch;
* in a multi-worker run every process starts a gRPC server for its task and
  its session runs there; the strategy's config names the group leader.
"""

import re

import tensorflow as tf

from estimator_bf16.compat import estimator_spec as spec_lib

ModeKeys = spec_lib.ModeKeys

# Strategies whose replicas all hold the whole model and all-reduce their
# gradients: the data parallelism this backend implements (class names of
# the TF2 and the tf.compat.v1 spellings).
_MIRRORED = ('MirroredStrategy', 'MirroredStrategyV1')
_MULTI_WORKER = ('MultiWorkerMirroredStrategy',
                 'MultiWorkerMirroredStrategyV1',
                 'CollectiveAllReduceStrategy',
                 'CollectiveAllReduceStrategyV1',
                 '_CollectiveAllReduceStrategyExperimental')
_TASK_RE = re.compile(r'/job:(\w+)/replica:\d+/task:(\d+)')


class WorkerFailure(RuntimeError):
  """Another task of a multi-worker job failed or stopped answering."""


# The end of every message that stops a task of a multi-worker job.
RESUME_ADVICE = ('A multi-worker job stops when one task fails; run the same '
                 'command again to resume all tasks from the chief\'s last '
                 'checkpoint.')


def check_strategy(strategy, name):
  """Returns `strategy` if this backend runs it, else raises ValueError.

  Args:
    strategy: None or a `tf.distribute` strategy (TF2 or tf.compat.v1).
    name: the argument it came in, for the message.
  """
  if strategy is None:
    return None
  kind = type(strategy).__name__
  if kind in _MIRRORED + _MULTI_WORKER:
    return strategy
  if 'TPU' in kind:
    raise ValueError('%s=%s: TPUs train through TPUEstimator with '
                     'use_tpu=True (TensorFlow 2.15), not through a strategy.'
                     % (name, kind))
  raise ValueError(
      '%s=%s is not supported: the Estimator runs data parallelism with '
      'tf.distribute.MirroredStrategy (local devices) or '
      'tf.distribute.MultiWorkerMirroredStrategy (hosts, TF_CONFIG).' %
      (name, kind))


def is_multi_worker(strategy):
  return type(strategy).__name__ in _MULTI_WORKER and num_workers(strategy) > 1


def num_local_replicas(strategy):
  return len(strategy.extended.worker_devices)


def num_workers(strategy):
  return strategy.num_replicas_in_sync // num_local_replicas(strategy)


def _task(strategy):
  """(task_type, task_id) of this process in a multi-worker strategy."""
  resolver = strategy.cluster_resolver
  return resolver.task_type, resolver.task_id


def worker_index(strategy):
  """This process's position among the training workers (chief first)."""
  if num_workers(strategy) == 1:
    return 0
  task_type, task_id = _task(strategy)
  jobs = strategy.cluster_resolver.cluster_spec().as_dict()
  if task_type == 'worker' and 'chief' in jobs:
    return 1 + task_id
  return task_id


def is_chief(strategy):
  """True for the task that writes checkpoints and summaries.

  The 'chief' task if the cluster has one, else worker 0 (tf.distribute's
  own rule); always True for a one-process strategy.
  """
  return worker_index(strategy) == 0


def task_name(strategy):
  if num_workers(strategy) == 1:
    return 'chief:0'
  return '%s:%d' % _task(strategy)


def input_context(strategy):
  """The `tf.distribute.InputContext` input_fn gets in this process."""
  return tf.distribute.InputContext(
      num_input_pipelines=num_workers(strategy),
      input_pipeline_id=worker_index(strategy),
      num_replicas_in_sync=strategy.num_replicas_in_sync)


def per_replica_batch(global_batch, strategy, name):
  """`global_batch` / replicas; raises ValueError if it does not divide."""
  if global_batch is None:
    return None
  replicas = strategy.num_replicas_in_sync
  if global_batch % replicas:
    raise ValueError(
        '%s=%d is not divisible by the %d replicas of the strategy: each '
        "replica gets params['batch_size'] = %s / replicas examples." %
        (name, global_batch, replicas, name))
  return global_batch // replicas


def host_device(strategy):
  """The CPU of this worker, where input pipelines run."""
  spec = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])
  return spec.replace(device_type='CPU', device_index=0).to_string()


def call_for_each_replica(strategy, replica_fn):
  """Calls `replica_fn(local_index)` in each local replica's context.

  Args:
    strategy: a checked strategy; the caller is inside `strategy.scope()`.
    replica_fn: builds one replica's part of the graph and returns anything
      (not regrouped: Python objects such as EstimatorSpecs are fine).

  Returns:
    The list of `replica_fn`'s results, by local replica index.
  """
  count = num_local_replicas(strategy)
  results = [None] * count

  # In graph mode the strategy would run autograph over run_replica and
  # everything it calls: the user's model_fn and the package's wrappers,
  # audit included (about 2.5 s of a task's start for the MNIST MLP, 700+
  # functions converted). Legacy model_fns are graph-mode code that
  # TPUEstimator and the one-device path call as they are, so they are
  # called as they are here too: the same graph on every path.
  @tf.autograph.experimental.do_not_convert
  def run_replica():
    context = tf.distribute.get_replica_context()
    # The replica id is global (worker * local count + local index).
    index = tf.get_static_value(context.replica_id_in_sync_group) % count
    results[index] = replica_fn(index)

  # What tf.estimator switches on: v1 optimizers then scale the loss by
  # 1 / replicas before the gradients are summed (a MEAN over replicas),
  # unless the loss was reduced with SUM.
  # pylint: disable=protected-access
  with strategy._scale_loss_for_estimator_enabled():
    strategy.extended.call_for_each_replica(run_replica)
  # pylint: enable=protected-access
  return results


def merge_replica_specs(specs, metrics, mode):
  """One EstimatorSpec standing for the specs of all local replicas.

  Args:
    specs: each local replica's `EstimatorSpec`, by local index.
    metrics: in EVAL mode, each replica's {name: (value, update op)}, its
      loss metric included; otherwise ignored.
    mode: TRAIN or EVAL.

  Returns:
    An `EstimatorSpec` with the mean of the replicas' losses, their train
    ops grouped, each eval metric's value (the metrics aggregate over the
    replicas themselves) with every replica's update; hooks and scaffold
    are the first replica's.
  """
  first = specs[0]
  loss = tf.add_n([spec.loss for spec in specs]) / float(len(specs))
  eval_metric_ops = None
  if mode == ModeKeys.EVAL:
    eval_metric_ops = {
        key: (value, tf.group(*[replica[key][1] for replica in metrics]))
        for key, (value, _) in metrics[0].items()}
  train_op = None
  if mode == ModeKeys.TRAIN:
    train_op = tf.group(*[spec.train_op for spec in specs])
  return spec_lib.EstimatorSpec(
      mode=mode, loss=loss, train_op=train_op,
      eval_metric_ops=eval_metric_ops, scaffold=first.scaffold,
      training_hooks=first.training_hooks,
      training_chief_hooks=first.training_chief_hooks,
      evaluation_hooks=first.evaluation_hooks)


def session_config(strategy, config):
  """`config` with what the strategy's sessions need.

  Logical CPU devices named by the strategy ('/cpu:1', ...) are created
  through `device_count`, which graph-mode sessions read (they ignore
  `tf.config.set_logical_device_configuration` when given a config). A
  multi-worker strategy adds its collective settings (group leader, device
  filters).
  """
  config = tf.compat.v1.ConfigProto.FromString(config.SerializeToString())
  cpus = [tf.DeviceSpec.from_string(d).device_index or 0
          for d in strategy.extended.worker_devices
          if (tf.DeviceSpec.from_string(d).device_type or '').upper() ==
          'CPU']
  if cpus:
    config.device_count['CPU'] = max(config.device_count.get('CPU', 1),
                                     max(cpus) + 1)
  if is_multi_worker(strategy):
    config = strategy.update_config_proto(config)
  return config


def session_target(strategy, config):
  """'' for one process; the gRPC target of this task's server otherwise.

  The server (one per process and strategy) is started on first use with
  the strategy's session config, which the collective ops of this task
  read.
  """
  if not is_multi_worker(strategy):
    return ''
  server = getattr(strategy, '_estimator_bf16_server', None)
  if server is None:
    resolver = strategy.cluster_resolver
    task_type, task_id = _task(strategy)
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=task_type, task_index=task_id,
        protocol=resolver.rpc_layer or 'grpc', config=config, start=True)
    strategy._estimator_bf16_server = server  # pylint: disable=protected-access
  return server.target


def collective_timeout(strategy):
  """Seconds a collective op of `strategy` waits for peers, or None.

  None for a strategy without collectives or without a timeout (TensorFlow
  then waits for ever).
  """
  options = getattr(strategy.extended, '_communication_options', None)
  timeout = getattr(options, 'timeout_seconds', None)
  return float(timeout) if timeout else None


def suspects(strategy):
  """The other training tasks, as a message names them.

  When a collective waits, they are the only suspects: 'worker:0', or
  'one of worker:0, worker:1'.
  """
  others = _peers(strategy)
  return others[0] if len(others) == 1 else 'one of %s' % ', '.join(others)


def _peers(strategy):
  """'job:index' of every training task but this one, sorted."""
  me = _task(strategy)
  jobs = strategy.cluster_resolver.cluster_spec().as_dict()
  return ['%s:%d' % (job, index) for job in sorted(jobs)
          for index in range(len(jobs[job])) if (job, index) != me]


def explain(error, strategy):
  """A `WorkerFailure` naming the failed task behind a TensorFlow error.

  Args:
    error: a `tf.errors.OpError` raised while a multi-worker session ran.
    strategy: the strategy of that session.

  Returns:
    A `WorkerFailure`, or None if `error` is not about another task. A
    collective that timed out names no task (its peer was silent, hung or
    gone without closing its connections): the message then names the
    other training tasks, the only suspects.
  """
  if not is_multi_worker(strategy):
    return None
  if not isinstance(error, (tf.errors.UnavailableError,
                            tf.errors.DeadlineExceededError,
                            tf.errors.CancelledError,
                            tf.errors.AbortedError,
                            tf.errors.InternalError)):
    return None
  message = getattr(error, 'message', None) or str(error)
  me = _task(strategy)
  others = sorted({(job, int(task)) for job, task in _TASK_RE.findall(message)
                   if (job, int(task)) != me})
  if not others and not isinstance(error, tf.errors.DeadlineExceededError):
    return None
  if others:
    named = ', '.join('%s:%d' % task for task in others)
  else:
    named = suspects(strategy)
  first_line = message.strip().splitlines()[0] if message.strip() else ''
  return WorkerFailure(
      'Task %s stopped: %s did not answer (%s: %s). %s' % (
          task_name(strategy), named, type(error).__name__, first_line[:300],
          RESUME_ADVICE))
