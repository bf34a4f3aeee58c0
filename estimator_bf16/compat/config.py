"""RunConfig, TPUConfig and InputPipelineConfig with tf.estimator's fields.

Legacy programs build these objects themselves (`tf_estimator.tpu.RunConfig(
..., tpu_config=tf_estimator.tpu.TPUConfig(iterations_per_loop=...))`), so
the constructors take the same keyword arguments and the objects expose the
same read-only properties. Options that only mean something for a cluster or
a distribution strategy are accepted only at their "off" value; anything else
fails at construction with the reason, not half-way through training.
"""

import collections
import copy
import os
import re

import tensorflow as tf

from estimator_bf16.compat import distribute as compat_distribute

# Sentinel for "not given", so that an explicit None (switch checkpointing
# off) differs from leaving the argument out (RunConfig's 600 s default).
_USE_DEFAULT = object()
_DEFAULT_CHECKPOINT_SECS = 600


class InputPipelineConfig(object):
  """How a TPU host feeds its cores; on a CPU/GPU every value runs the same.

  The numbers are tf.estimator's, so code that compares or logs them keeps
  working; the TF 2.16+ backend calls `input_fn` once per mode either way.
  """
  PER_SHARD_V1 = 1
  PER_HOST_V1 = 2
  PER_HOST_V2 = 3
  BROADCAST = 4
  SLICED = 5


_TPU_CONFIG_FIELDS = (
    ('iterations_per_loop', 2),
    ('num_shards', None),
    ('num_cores_per_replica', None),
    ('per_host_input_for_training', True),
    ('tpu_job_name', None),
    ('initial_infeed_sleep_secs', None),
    ('input_partition_dims', None),
    ('eval_training_input_configuration', InputPipelineConfig.PER_HOST_V1),
    ('experimental_host_call_every_n_steps', 1),
    ('experimental_allow_per_host_v2_parallel_get_next', False),
    ('experimental_feed_hook', None),
)


def check_positive(name, value, allow_none=True):
  """Raises a ValueError naming `name` unless `value` is an int > 0.

  None passes with `allow_none`; a bool is not a count.
  """
  if value is None and allow_none:
    return
  if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
    raise ValueError('%s must be a positive integer, got %r.' % (name, value))


class TPUConfig(collections.namedtuple(
    'TPUConfig', [name for name, _ in _TPU_CONFIG_FIELDS])):
  """TPU settings, kept for the programs that set them.

  Fields (all as in `tf.compat.v1.estimator.tpu.TPUConfig`):
    iterations_per_loop: int > 0 or a duration string such as `'300s'`; on a
      CPU/GPU training runs step by step, so it only shapes logging.
    num_shards, num_cores_per_replica: positive ints or None.
    The other fields are stored and otherwise unused off-TPU.
  """

  def __new__(cls, *args, **kwargs):
    names = [name for name, _ in _TPU_CONFIG_FIELDS]
    if len(args) > len(names):
      raise TypeError('TPUConfig takes at most %d arguments.' % len(names))
    values = dict(_TPU_CONFIG_FIELDS)
    values.update(zip(names, args))
    unknown = sorted(set(kwargs) - set(names))
    if unknown:
      raise TypeError('TPUConfig got unexpected arguments %s.' % unknown)
    values.update(kwargs)
    loop = values['iterations_per_loop']
    if isinstance(loop, str):
      if not re.fullmatch(r'\d+[smh]?', loop):
        raise ValueError('iterations_per_loop must be an int or a duration '
                         "such as '300s', got %r." % loop)
    else:
      check_positive('iterations_per_loop', loop, allow_none=False)
    # Booleans are tf.estimator's older spelling of the first two modes.
    per_host = values['per_host_input_for_training']
    if per_host is True:
      values['per_host_input_for_training'] = InputPipelineConfig.PER_HOST_V1
    elif per_host is False:
      values['per_host_input_for_training'] = InputPipelineConfig.PER_SHARD_V1
    check_positive('num_shards', values['num_shards'])
    check_positive('num_cores_per_replica', values['num_cores_per_replica'])
    return super(TPUConfig, cls).__new__(cls, **values)


def _check_off(name, value):
  """Cluster options that this backend has no use for."""
  if value is not None:
    raise NotImplementedError(
        'RunConfig(%s=...) is not supported by the compat backend of '
        'estimator_bf16. Leave it unset; for several devices or hosts pass '
        'a tf.distribute strategy as train_distribute.' % name)


def _check_eval_distribute(strategy):
  strategy = compat_distribute.check_strategy(strategy, 'eval_distribute')
  if strategy is not None and compat_distribute.is_multi_worker(strategy):
    raise ValueError(
        'eval_distribute=%s: evaluation runs in one process (the chief, or '
        'the evaluator task); give it a MirroredStrategy over its local '
        'devices or leave it unset.' % type(strategy).__name__)
  return strategy


def _checkpoint_schedule(steps, secs):
  """Resolves tf.estimator's rules: one of steps/secs, 600 s by default."""
  if steps is _USE_DEFAULT and secs is _USE_DEFAULT:
    return None, _DEFAULT_CHECKPOINT_SECS
  steps = None if steps is _USE_DEFAULT else steps
  secs = None if secs is _USE_DEFAULT else secs
  if steps is not None and secs is not None:
    raise ValueError('Set at most one of save_checkpoints_steps (%r) and '
                     'save_checkpoints_secs (%r).' % (steps, secs))
  check_positive('save_checkpoints_steps', steps)
  check_positive('save_checkpoints_secs', secs)
  return steps, secs


class RunConfig(object):
  """Where and how often an Estimator saves, logs and seeds.

  Properties have tf.estimator's names and defaults: `model_dir` (str or
  None), `tf_random_seed` (int or None), `save_summary_steps` (100),
  `save_checkpoints_steps` / `save_checkpoints_secs` (at most one set; 600 s
  if neither is given; both None switches periodic checkpoints off, the final
  one included), `session_config` (`tf.compat.v1.ConfigProto` or None),
  `keep_checkpoint_max` (5), `keep_checkpoint_every_n_hours`,
  `log_step_count_steps` (100), `train_distribute` / `eval_distribute`
  (a `tf.distribute.MirroredStrategy` or, for training only,
  `MultiWorkerMirroredStrategy`; see docs/distribute.md), plus the cluster
  answers, read from the training strategy (`is_chief`,
  `num_worker_replicas`, `task_type`, `task_id`; one process: True, 1,
  'worker', 0).
  """

  def __init__(self, model_dir=None, tf_random_seed=None,
               save_summary_steps=100,
               save_checkpoints_steps=_USE_DEFAULT,
               save_checkpoints_secs=_USE_DEFAULT, session_config=None,
               keep_checkpoint_max=5, keep_checkpoint_every_n_hours=10000,
               log_step_count_steps=100, train_distribute=None,
               device_fn=None, protocol=None, eval_distribute=None,
               experimental_distribute=None,
               experimental_max_worker_delay_secs=None,
               session_creation_timeout_secs=7200,
               checkpoint_save_graph_def=True):
    for name, value in (('experimental_distribute', experimental_distribute),
                        ('device_fn', device_fn)):
      _check_off(name, value)
    train_distribute = compat_distribute.check_strategy(train_distribute,
                                                 'train_distribute')
    eval_distribute = _check_eval_distribute(eval_distribute)
    steps, secs = _checkpoint_schedule(save_checkpoints_steps,
                                       save_checkpoints_secs)
    if keep_checkpoint_max is not None and (
        isinstance(keep_checkpoint_max, bool) or
        not isinstance(keep_checkpoint_max, int) or keep_checkpoint_max < 0):
      raise ValueError('keep_checkpoint_max must be an int >= 0 (0 or None '
                       'keeps all), got %r.' % (keep_checkpoint_max,))
    check_positive('save_summary_steps', save_summary_steps or None)
    check_positive('log_step_count_steps', log_step_count_steps or None)
    if session_config is not None and not isinstance(
        session_config, tf.compat.v1.ConfigProto):
      raise TypeError('session_config must be a tf.compat.v1.ConfigProto, '
                      'got %r.' % type(session_config).__name__)
    self._values = {
        'model_dir': os.fspath(model_dir) if model_dir else None,
        'tf_random_seed': tf_random_seed,
        'save_summary_steps': save_summary_steps,
        'save_checkpoints_steps': steps,
        'save_checkpoints_secs': secs,
        'session_config': session_config,
        'keep_checkpoint_max': keep_checkpoint_max,
        'keep_checkpoint_every_n_hours': keep_checkpoint_every_n_hours,
        'log_step_count_steps': log_step_count_steps,
        'protocol': protocol,
        'experimental_max_worker_delay_secs':
            experimental_max_worker_delay_secs,
        'session_creation_timeout_secs': session_creation_timeout_secs,
        'checkpoint_save_graph_def': checkpoint_save_graph_def,
        'train_distribute': train_distribute,
        'eval_distribute': eval_distribute,
    }

  def __getattr__(self, name):
    # Only reached for names not found normally: the stored settings.
    values = self.__dict__.get('_values', {})
    if name in values:
      return values[name]
    raise AttributeError('%s has no attribute %r.' % (type(self).__name__,
                                                      name))

  # The cluster properties that legacy code reads: this process, as the
  # training strategy places it (one local process without one).
  master = ''
  evaluation_master = ''
  num_ps_replicas = 0
  service = None
  device_fn = None

  def _multi_worker(self):
    strategy = self._values['train_distribute']
    if strategy is not None and compat_distribute.is_multi_worker(strategy):
      return strategy
    return None

  @property
  def is_chief(self):
    strategy = self._multi_worker()
    return strategy is None or compat_distribute.is_chief(strategy)

  @property
  def num_worker_replicas(self):
    strategy = self._multi_worker()
    return 1 if strategy is None else compat_distribute.num_workers(strategy)

  @property
  def task_type(self):
    strategy = self._multi_worker()
    return 'worker' if strategy is None else strategy.cluster_resolver.task_type

  @property
  def task_id(self):
    strategy = self._multi_worker()
    return 0 if strategy is None else strategy.cluster_resolver.task_id

  @property
  def global_id_in_cluster(self):
    strategy = self._multi_worker()
    return 0 if strategy is None else compat_distribute.worker_index(strategy)

  @property
  def cluster_spec(self):
    strategy = self._multi_worker()
    return None if strategy is None else (
        strategy.cluster_resolver.cluster_spec())

  def __deepcopy__(self, memo):
    # Strategies hold locks and devices (tf.estimator's deep copy of them is
    # its "cannot pickle '_thread.lock'" failure): copies share them.
    clone = copy.copy(self)
    clone._values = dict(self._values)  # pylint: disable=protected-access
    return clone

  def replace(self, **kwargs):
    """Returns a copy with the given settings changed (validated again).

    Args:
      **kwargs: any constructor argument of this class.

    Returns:
      A new config of the same class.
    """
    arguments = self._arguments()
    unknown = sorted(set(kwargs) - set(arguments))
    if unknown:
      raise ValueError('RunConfig.replace got unknown settings %s.' % unknown)
    if ('save_checkpoints_steps' in kwargs) != (
        'save_checkpoints_secs' in kwargs):
      # Changing one of the pair switches the other off, as tf.estimator
      # does, rather than failing because both are now set.
      other = ('save_checkpoints_secs' if 'save_checkpoints_steps' in kwargs
               else 'save_checkpoints_steps')
      arguments[other] = _USE_DEFAULT
    arguments.update(kwargs)
    return type(self)(**arguments)

  def _arguments(self):
    arguments = dict(self._values)
    return arguments

  def __repr__(self):
    return '%s(%s)' % (type(self).__name__, ', '.join(
        '%s=%r' % item for item in sorted(self._arguments().items())))


class TPURunConfig(RunConfig):
  """`tf.compat.v1.estimator.tpu.RunConfig`: a RunConfig with a TPUConfig.

  Args:
    tpu_config: a `TPUConfig`; a default one if None.
    evaluation_master, master: kept for the program to read.
    cluster: a TPU cluster resolver; only meaningful with `use_tpu=True`,
      which this backend rejects, so it is stored and otherwise unused.
    **kwargs: the `RunConfig` arguments.
  """

  def __init__(self, tpu_config=None, evaluation_master=None, master=None,
               cluster=None, **kwargs):
    super(TPURunConfig, self).__init__(**kwargs)
    if tpu_config is not None and not isinstance(tpu_config, TPUConfig):
      raise TypeError('tpu_config must be a TPUConfig, got %r.' %
                      type(tpu_config).__name__)
    self._values.update(tpu_config=tpu_config or TPUConfig(),
                        cluster=cluster)
    self._tpu_masters = {'master': master or '',
                         'evaluation_master': evaluation_master or master or ''}

  @property
  def master(self):
    return self._tpu_masters['master']

  @property
  def evaluation_master(self):
    return self._tpu_masters['evaluation_master']

  def _arguments(self):
    arguments = dict(self._values)
    arguments.update(self._tpu_masters)
    return arguments

  def __deepcopy__(self, memo):
    # The cluster resolver may hold a network client; share it.
    clone = copy.copy(self)
    clone._values = dict(self._values)  # pylint: disable=protected-access
    return clone
