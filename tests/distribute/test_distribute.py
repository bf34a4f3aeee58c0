"""Data-parallel training with tf.distribute, in float32 and bfloat16.

Two logical CPU devices under MirroredStrategy must train the same variables
as one device given the same global batch and data: the gradients of the
replicas are averaged in float32 before the update. Checkpoints move between
the two set-ups, each replica's graph really computes in bfloat16, and bad
strategies, batches and TF_CONFIGs fail before any graph is built.
"""

import json
import os
import shutil
import sys
from unittest import mock

from absl.testing import parameterized
import numpy as np
import pytest
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import training
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.distribute import cluster as cluster_lib
from tests.support import isolated_cache

_FEATURES = 12
_CLASSES = 4
_GLOBAL_BATCH = 16
_STEPS = 6
# bfloat16 replicas reduce 8 examples each in bfloat16 before the float32
# all-reduce, one device reduces 16: bfloat16 keeps 8 significant bits, so
# each gradient differs by up to about 2**-8 relative, and the differences
# add up over the steps. The weights are of order 0.1 to 0.5; the largest
# difference measured was 6e-4 after 6 steps and 2.4e-3 after 12 (float32:
# 1e-7). Replicas that each get the whole batch setting instead of their
# share, or a sum instead of a mean over replicas, differ by about 7e-2.
_TOLERANCE = {'float32': 1e-5, 'bfloat16': 1e-2}


_CACHE = isolated_cache.IsolatedCache()


def setUpModule():
  _CACHE.start()


def tearDownModule():
  _CACHE.stop()


def _data():
  rng = np.random.RandomState(0)
  x = rng.randn(_GLOBAL_BATCH * _STEPS * 2, _FEATURES).astype(np.float32)
  y = rng.randint(0, _CLASSES, len(x)).astype(np.int32)
  return x, y


def _dense(inputs, units, name):
  with tf.compat.v1.variable_scope(name):
    kernel = tf.compat.v1.get_variable(
        'kernel', [inputs.shape[-1], units], dtype=inputs.dtype,
        initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
    bias = tf.compat.v1.get_variable(
        'bias', [units], dtype=inputs.dtype,
        initializer=tf.compat.v1.zeros_initializer())
    return tf.nn.bias_add(tf.matmul(inputs, kernel), bias)


def model_fn(features, labels, mode, params):
  """A legacy TPUEstimator model_fn: MLP, softmax cross-entropy, momentum.

  Momentum rather than Adam: Adam's update divides by the gradient's RMS,
  so a rounding difference in a near-zero gradient becomes a full step.
  """
  hidden = tf.nn.relu(_dense(features['x'], 32, 'hidden'))
  logits = _dense(hidden, _CLASSES, 'logits')
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = None
  if mode == 'train':
    train_op = tf.compat.v1.train.MomentumOptimizer(0.05, 0.9).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())

  def metric_fn(labels, logits):
    return {'accuracy': tf.compat.v1.metrics.accuracy(
        labels, tf.argmax(logits, axis=-1))}

  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, logits]))


def input_fn(params):
  """Consecutive batches of params['batch_size'] (per replica), in order."""
  x, y = _data()
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).batch(
      params['batch_size'], drop_remainder=True).repeat()


class _GraphHook(tf.compat.v1.train.SessionRunHook):
  """Keeps the training graph for inspection."""

  def begin(self):
    self.graph = tf.compat.v1.get_default_graph()


def _variables(model_dir):
  reader = tf.train.load_checkpoint(model_dir)
  dtypes = reader.get_variable_to_dtype_map()
  return {name: reader.get_tensor(name) for name in dtypes
          if name.startswith(('hidden', 'logits'))
          and 'Momentum' not in name}, dtypes


def _copy_model_dir(source, target):
  """Copies a model_dir; the copy's state file names its own checkpoint."""
  shutil.copytree(source, target)
  prefix = os.path.basename(tf.train.latest_checkpoint(source))
  tf.compat.v1.train.update_checkpoint_state(target, prefix)


def _strategy(devices):
  return eb.make_strategy('mirrored', cpu_devices=devices)


class MirroredTest(tf.test.TestCase, parameterized.TestCase):

  def _train(self, precision, devices, model_dir, steps, spelling='make'):
    if spelling == 'make':
      estimator = eb.make_tpu_estimator(
          model_fn, model_dir=model_dir, precision=precision,
          train_batch_size=_GLOBAL_BATCH, eval_batch_size=_GLOBAL_BATCH,
          distribute=_strategy(devices) if devices > 1 else None,
          estimator_options=eb.EstimatorOptions(save_checkpoints_steps=1000,
                                                tf_random_seed=0,
                                                log_step_count_steps=None,
                                                backend='compat'))
    else:
      # The legacy spelling: an Estimator with a RunConfig holding the
      # strategies; input_fn gets params['batch_size'] per replica.
      strategy = _strategy(devices)
      config = eb.compat.RunConfig(
          model_dir=model_dir, tf_random_seed=0, train_distribute=strategy,
          eval_distribute=strategy, log_step_count_steps=None)
      per_replica = _GLOBAL_BATCH // devices

      def plain_model_fn(features, labels, mode, params):
        spec = model_fn(features, labels, mode, params)
        metrics = spec.eval_metrics[0](*spec.eval_metrics[1])
        return eb.compat.EstimatorSpec(mode, loss=spec.loss,
                                       train_op=spec.train_op,
                                       eval_metric_ops=metrics)

      estimator = eb.compat.Estimator(
          eb.wrap_model_fn(plain_model_fn, precision), config=config,
          params={'batch_size': per_replica, 'precision': precision})
    hook = _GraphHook()
    estimator.train(eb.wrap_input_fn(input_fn, precision), max_steps=steps,
                    hooks=[hook])
    return estimator, hook.graph

  # Each run restarts input_fn, so a run that continues a checkpoint is the
  # same whichever test made that checkpoint: the tests share their runs
  # (one of 1 device, 6 steps serves as the reference of the comparisons and
  # as the start of a run that continues on 2 devices). Only the class's
  # runs write to them; a continued run trains in a copy.
  _runs = {}

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._runs = {}

  def _run(self, precision, devices, steps, spelling='make', start=None):
    """(model_dir, estimator, graph) of a run, trained once per class.

    Args:
      precision, devices, steps, spelling: as for `_train`.
      start: the key of the run whose checkpoint this one continues, or
        None to start afresh.
    """
    key = (precision, devices, steps, spelling, start)
    if key not in self._runs:
      source = self._run(*start)[0] if start is not None else None
      model_dir = os.path.join(_CACHE.root, 'mirrored_%d' % len(self._runs))
      if source is not None:
        _copy_model_dir(source, model_dir)
      estimator, graph = self._train(precision, devices, model_dir, steps,
                                     spelling)
      self._runs[key] = (model_dir, estimator, graph)
    return self._runs[key]

  @parameterized.product(precision=eb.PRECISIONS, spelling=('make', 'config'))
  @pytest.mark.slow
  def test_two_devices_match_one(self, precision, spelling):
    one, _, _ = self._run(precision, 1, _STEPS)
    two, estimator, graph = self._run(precision, 2, _STEPS, spelling)
    values_one, _ = _variables(one)
    values_two, dtypes = _variables(two)
    self.assertEqual(sorted(values_one), sorted(values_two))
    self.assertEqual(_STEPS, tf.train.load_checkpoint(two).get_tensor(
        'global_step'))
    for name in values_one:
      self.assertEqual(tf.float32, dtypes[name], name)
      self.assertAllClose(values_one[name], values_two[name], rtol=0,
                          atol=_TOLERANCE[precision], msg=name)
    # The weights did move: the comparison is not between initial values.
    self.assertGreater(np.abs(values_two['logits/bias']).max(), 1e-3)
    # Each replica built its own network on its own device.
    matmuls = [op for op in graph.get_operations() if op.type == 'MatMul'
               and 'gradients' not in op.name]
    devices = {tf.DeviceSpec.from_string(op.device).device_index
               for op in matmuls}
    self.assertEqual({0, 1}, devices)
    dtypes_by_device = {(tf.DeviceSpec.from_string(op.device).device_index,
                         op.get_attr('T')) for op in matmuls}
    want = eb.compute_dtype(precision)
    self.assertEqual({(0, want), (1, want)}, dtypes_by_device)
    # Evaluation with the mirrored strategy: metrics over both replicas.
    metrics = estimator.evaluate(eb.wrap_input_fn(input_fn, precision),
                                 steps=2)
    self.assertEqual(_STEPS, metrics['global_step'])
    self.assertBetween(metrics['accuracy'], 0.0, 1.0)

  @parameterized.parameters(*eb.PRECISIONS)
  @pytest.mark.slow
  def test_checkpoints_move_between_one_and_two_devices(self, precision):
    # The reference continues on 1 device what 1 device trained.
    reference, _, _ = self._run(precision, 1, 2 * _STEPS,
                                start=(precision, 1, _STEPS))
    want, _ = _variables(reference)
    for order in ((2, 1), (1, 2)):
      model_dir, _, _ = self._run(precision, order[1], 2 * _STEPS,
                                  start=(precision, order[0], _STEPS))
      self.assertEqual(2 * _STEPS, tf.train.load_checkpoint(
          model_dir).get_tensor('global_step'))
      got, dtypes = _variables(model_dir)
      for name in want:
        self.assertEqual(tf.float32, dtypes[name])
        self.assertAllClose(want[name], got[name], rtol=0,
                            atol=_TOLERANCE[precision], msg=name)

  def test_model_fn_runs_as_written_in_each_replica(self):
    # In graph mode the strategy would hand model_fn (and the package's
    # wrappers around it) to autograph, which runs a rewritten copy from a
    # generated file. It runs as written, as TPUEstimator and one device
    # run it.
    files = []

    def recording_model_fn(features, labels, mode, params):
      files.append(sys._getframe().f_code.co_filename)  # pylint: disable=protected-access
      return model_fn(features, labels, mode, params)

    estimator = eb.make_tpu_estimator(
        recording_model_fn, model_dir=self.get_temp_dir(), precision='bfloat16',
        train_batch_size=_GLOBAL_BATCH, distribute=_strategy(2),
        estimator_options=eb.EstimatorOptions(log_step_count_steps=None,
                                              backend='compat'))
    estimator.train(eb.wrap_input_fn(input_fn, 'bfloat16'), max_steps=1)
    self.assertEqual([__file__] * 2, files)

  def test_batch_not_divisible_by_replicas(self):
    with self.assertRaisesRegex(ValueError, 'train_batch_size=15 is not '
                                'divisible by the 2 replicas'):
      eb.make_tpu_estimator(model_fn, model_dir=self.get_temp_dir(),
                            precision='bfloat16', train_batch_size=15,
                            distribute=_strategy(2))

  def test_strategy_with_tpu_or_real_estimator_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'TPUEstimator itself'):
      eb.make_tpu_estimator(model_fn, model_dir=self.get_temp_dir(),
                            precision='bfloat16', train_batch_size=16,
                            use_tpu=True, tpu='local',
                            distribute=_strategy(2))
    if eb.BACKEND == 'tf_estimator':
      with self.assertRaisesRegex(ValueError, 'tensorflow#26207'):
        eb.make_tpu_estimator(
            model_fn, model_dir=self.get_temp_dir(), precision='bfloat16',
            train_batch_size=16, distribute=_strategy(2),
            estimator_options=eb.EstimatorOptions(backend='tf_estimator'))

  def test_unsupported_strategy_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'OneDeviceStrategy is not '
                                'supported'):
      eb.compat.RunConfig(
          train_distribute=tf.distribute.OneDeviceStrategy('/cpu:0'))
    with self.assertRaisesRegex(ValueError, "one of 'mirrored', "
                                "'multi_worker'"):
      eb.make_strategy('parameter_server')
    with self.assertRaisesRegex(ValueError, 'cpu_devices must be a positive'):
      eb.make_strategy('mirrored', cpu_devices=0)

  def test_config_copies_share_the_strategy(self):
    strategy = _strategy(2)
    config = eb.compat.RunConfig(train_distribute=strategy)
    estimator = eb.compat.Estimator(model_fn, config=config)
    self.assertIs(strategy, estimator.config.train_distribute)
    self.assertTrue(estimator.config.is_chief)
    self.assertEqual(1, estimator.config.num_worker_replicas)


def _config(cluster_jobs, task_type='worker', index=0):
  return json.dumps({'cluster': cluster_jobs,
                     'task': {'type': task_type, 'index': index}})


class TFConfigTest(tf.test.TestCase, parameterized.TestCase):

  @parameterized.named_parameters(
      ('missing_chief', _config({'worker': ['127.0.0.1:1', '127.0.0.1:2']}),
       'exactly one "chief"'),
      ('duplicate_port', _config({'chief': ['127.0.0.1:1'],
                                  'worker': ['127.0.0.1:1']}),
       r'address 127.0.0.1:1 is listed twice \(chief:0 and worker:0\)'),
      ('task_not_in_cluster', _config({'chief': ['127.0.0.1:1'],
                                       'worker': ['127.0.0.1:2']},
                                      'worker', 3),
       r'this task \(worker, index 3\) is not in the cluster'),
      ('unknown_task_type', _config({'chief': ['127.0.0.1:1']}, 'worker'),
       "task's type 'worker' is not a job"),
      ('parameter_servers', _config({'chief': ['127.0.0.1:1'],
                                     'ps': ['127.0.0.1:2']}),
       'parameter servers'),
      ('not_json', '{chief', 'not valid JSON'),
  )
  def test_bad_tf_config_is_named_before_any_graph(self, text, message):
    graphs_before = tf.compat.v1.get_default_graph().get_operations()
    with self.assertRaisesRegex(cluster_lib.ClusterError, message):
      eb.make_strategy('multi_worker', environ={'TF_CONFIG': text})
    self.assertEqual(graphs_before,
                     tf.compat.v1.get_default_graph().get_operations())

  def test_missing_tf_config(self):
    with self.assertRaisesRegex(cluster_lib.ClusterError,
                                'TF_CONFIG is not set'):
      eb.make_strategy('multi_worker', environ={})

  def test_good_tf_config(self):
    parsed = cluster_lib.parse_tf_config(
        _config(
            {
                'chief': ['127.0.0.1:1'],
                'worker': ['127.0.0.1:2', '127.0.0.1:3'],
                'evaluator': ['127.0.0.1:4']
            }, 'worker', 1))
    self.assertEqual(3, parsed.num_workers)
    self.assertEqual(2, parsed.worker_index)
    self.assertFalse(parsed.is_chief)
    self.assertEqual('worker:1', parsed.name)
    self.assertNotIn('evaluator', parsed.training_jobs)

  def test_evaluator_gets_no_strategy(self):
    text = _config({'chief': ['127.0.0.1:1'], 'evaluator': ['127.0.0.1:2']},
                   'evaluator')
    with self.assertRaisesRegex(cluster_lib.ClusterError, 'is the evaluator'):
      eb.make_strategy('multi_worker', environ={'TF_CONFIG': text})

  def test_worker_failure_names_the_task(self):
    text = _config({'chief': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2']},
                   'chief')
    strategy = eb.make_strategy('multi_worker', environ={'TF_CONFIG': text},
                                timeout_seconds=5)
    self.assertTrue(compat_distribute.is_multi_worker(strategy))
    self.assertEqual(2, strategy.num_replicas_in_sync)
    error = tf.errors.UnavailableError(
        None, None, 'Socket closed. Additional GRPC error information from '
        'remote target /job:worker/replica:0/task:0 while calling RecvBuf')
    failure = compat_distribute.explain(error, strategy)
    self.assertIsInstance(failure, compat_distribute.WorkerFailure)
    self.assertIn('Task chief:0 stopped: worker:0 did not answer',
                  str(failure))
    self.assertIsNone(
        compat_distribute.explain(
            tf.errors.InvalidArgumentError(None, None, 'bad shape'), strategy))

  def test_timed_out_collective_names_the_silent_peers(self):
    # A collective that times out names no task; the other training tasks
    # are the suspects (the evaluator takes no part in all-reduce).
    timeout = tf.errors.DeadlineExceededError(
        None, None, 'Collective has timed out waiting for other workers.')
    for cluster_def, suspects in (
        ({'chief': ['127.0.0.1:1'], 'worker': ['127.0.0.1:2'],
          'evaluator': ['127.0.0.1:3']}, 'worker:0 did not answer'),
        ({'chief': ['127.0.0.1:1'],
          'worker': ['127.0.0.1:2', '127.0.0.1:3']},
         'one of worker:0, worker:1 did not answer')):
      strategy = eb.make_strategy(
          'multi_worker', environ={'TF_CONFIG': _config(cluster_def,
                                                        'chief')},
          timeout_seconds=5)
      failure = compat_distribute.explain(timeout, strategy)
      self.assertIn('Task chief:0 stopped: ' + suspects, str(failure))
      self.assertIn('DeadlineExceededError', str(failure))


class CliTest(tf.test.TestCase):
  """--distribute and --cpu_devices of the training CLI (estimator_bf16.apps.training)."""

  def _options(self, **kwargs):
    values = dict(model='mnist_mlp', model_dir=os.path.join(
        self.get_temp_dir(), 'cli'), precision='bfloat16', train_steps=8,
        train_batch_size=32, eval_batch_size=40, eval_steps=2)
    values.update(kwargs)
    return training.TrainOptions(**values)

  @pytest.mark.slow
  def test_mirrored_run_trains_evaluates_and_exports(self):
    options = self._options(distribute='mirrored', cpu_devices=2)
    result = training.run(options)
    self.assertEqual(8, result['global_step'])
    self.assertEqual(8, result['eval']['global_step'])
    self.assertTrue(os.path.isdir(result['export_dir']))
    reader = tf.train.load_checkpoint(options.model_dir)
    dtypes = reader.get_variable_to_dtype_map()
    self.assertEqual({tf.float32}, {dtypes[name] for name in dtypes
                                    if name.startswith('mnist_mlp/')})

  def test_bad_distribute_options_name_the_flag(self):
    cases = [
        (dict(cpu_devices=2), '--cpu_devices: needs --distribute=mirrored'),
        (dict(distribute='mirrored', cpu_devices=2, train_batch_size=33),
         '--train_batch_size: 33 is not divisible by the 2 replicas'),
        (dict(distribute='mirrored', use_tpu=True, tpu='local'),
         '--distribute: is for CPUs and GPUs'),
        (dict(distribute='multi_worker', cpu_devices=2),
         '--cpu_devices: needs --distribute=mirrored'),
    ]
    for kwargs, message in cases:
      with self.assertRaisesRegex(training.OptionError, message):
        training.prepare(self._options(**kwargs))
    text = json.dumps({'cluster': {'worker': ['127.0.0.1:1']},
                       'task': {'type': 'worker', 'index': 0}})
    with mock.patch.dict(os.environ, {'TF_CONFIG': text}):
      with self.assertRaisesRegex(training.OptionError,
                                  '--distribute=multi_worker: TF_CONFIG: '
                                  'needs exactly one "chief"'):
        training.prepare(self._options(distribute='multi_worker'))
    self.assertFalse(os.path.exists(os.path.join(self.get_temp_dir(),
                                                 'cli')))


if __name__ == '__main__':
  tf.test.main()
