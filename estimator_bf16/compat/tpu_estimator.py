"""TPUEstimator for TensorFlow 2.16+: TPUEstimator(use_tpu=False) semantics.

What a legacy program relies on when it runs TPUEstimator on a CPU, kept:

* `params['batch_size']` is the global batch of the mode (train, eval or
  predict batch size) for input_fn and model_fn, or under a distribution
  strategy (`RunConfig(train_distribute=...)`) that batch divided by the
  replicas, as a TPU core gets it; model_fn also gets
  `params['use_tpu'] = False`. An export calls model_fn without
  `'batch_size'` (serving batches have any size).
* `eval_metrics=(metric_fn, tensors)` is turned into eval_metric_ops by
  calling `metric_fn` on the host after model_fn returns.
* `host_call=(host_fn, tensors)` runs `host_fn` on the host and fetches its
  ops at every step, with the v2 summary writers it creates initialized when
  the session starts and flushed when it ends.
* `scaffold_fn` is called on the host to get the Scaffold.

`use_tpu=True` fails at construction: Cloud TPUs run TensorFlow 2.15, where
estimator_bf16 uses the real TPUEstimator.
"""

import tensorflow as tf

from estimator_bf16.compat import config as config_lib
from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.compat import estimator as estimator_lib
from estimator_bf16.compat import estimator_spec as spec_lib
from estimator_bf16.compat import calling

ModeKeys = spec_lib.ModeKeys

_RESERVED_PARAMS = ('batch_size', 'context')
# Where graph-mode v2 summary writers register their initializers; the name
# is the same in every TensorFlow 2.x release.
_SUMMARY_WRITER_INITIALIZERS = '_SUMMARY_WRITER_V2'

USE_TPU_MESSAGE = (
    'use_tpu=True is not supported on TensorFlow %s: tf.estimator (and with '
    'it the TPU training loop) was removed in TensorFlow 2.16, and this '
    'backend runs on the CPU/GPU only. Pass use_tpu=False to train here, or '
    'run on a Cloud TPU with the TensorFlow 2.15 runtime (e.g. '
    'tpu-vm-tf-2.15.0-pjrt; tpu-submit picks it), where '
    'estimator_bf16 uses the real TPUEstimator.')


def _call_on_host(call):
  """Runs the host function of an eval_metrics / host_call pair."""
  fn, tensors = call
  if isinstance(tensors, dict):
    return fn(**tensors)
  return fn(*tensors)


class _HostCallHook(tf.compat.v1.train.SessionRunHook):
  """Runs a host_call's ops at every step, as TPUEstimator does off-TPU."""

  def __init__(self, fetches):
    self._fetches = fetches

  def begin(self):
    graph = tf.compat.v1.get_default_graph()
    self._init_ops = graph.get_collection(_SUMMARY_WRITER_INITIALIZERS)
    # Each initializer's first input is its writer resource: flush those.
    self._flush_ops = [tf.raw_ops.FlushSummaryWriter(writer=op.inputs[0])
                       for op in self._init_ops]

  def after_create_session(self, session, coord):
    del coord
    session.run(self._init_ops)

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._fetches)

  def end(self, session):
    session.run(self._flush_ops)


def as_estimator_spec(spec, keep_host_call=True):
  """Turns a TPUEstimatorSpec into the EstimatorSpec it means on a host.

  Args:
    spec: this module's TPUEstimatorSpec, tf.estimator's (duck typed on its
      fields), or an EstimatorSpec (returned as it is).
    keep_host_call: False drops `host_call`: under a distribution strategy
      only the chief's first replica writes its summaries.

  Returns:
    An `estimator_bf16.compat.EstimatorSpec`.
  """
  fields = getattr(spec, '_fields', None)
  if fields != spec_lib.TPUEstimatorSpec._fields:
    return estimator_lib.as_estimator_spec(spec)
  if not isinstance(spec, spec_lib.TPUEstimatorSpec):
    spec = spec_lib.TPUEstimatorSpec(**spec._asdict())
  eval_metric_ops = None
  if spec.eval_metrics is not None:
    eval_metric_ops = _call_on_host(spec.eval_metrics)
  host_hooks = ()
  if spec.host_call is not None and keep_host_call:
    host_hooks = (_HostCallHook(_call_on_host(spec.host_call)),)
  return spec_lib.EstimatorSpec(
      mode=spec.mode, predictions=spec.predictions, loss=spec.loss,
      train_op=spec.train_op, eval_metric_ops=eval_metric_ops,
      export_outputs=spec.export_outputs,
      scaffold=spec.scaffold_fn() if spec.scaffold_fn else None,
      training_hooks=spec.training_hooks + host_hooks,
      evaluation_hooks=spec.evaluation_hooks + host_hooks,
      prediction_hooks=spec.prediction_hooks + host_hooks)


class TPUEstimator(estimator_lib.Estimator):
  """`tf.compat.v1.estimator.tpu.TPUEstimator`, running on the host.

  Args:
    model_fn: `(features, labels, mode, params[, config])`; must take
      `params` (that is where the batch size arrives). Returns a
      `TPUEstimatorSpec` or `EstimatorSpec`.
    model_dir, config, params, warm_start_from: as in `Estimator`;
      `params` must not set 'batch_size' or 'context'.
    use_tpu: must be False (see the module docstring).
    train_batch_size, eval_batch_size, predict_batch_size: global batch of
      each mode, given to input_fn and model_fn as `params['batch_size']`.
    batch_axis, eval_on_tpu, export_to_tpu, export_to_cpu,
    export_saved_model_api_version: accepted and unused on a host.
    embedding_config_spec: TPU embeddings; must be None.
  """

  def __init__(self, model_fn=None, model_dir=None, config=None, params=None,
               use_tpu=True, train_batch_size=None, eval_batch_size=None,
               predict_batch_size=None, batch_axis=None, eval_on_tpu=True,
               export_to_tpu=True, export_to_cpu=True, warm_start_from=None,
               embedding_config_spec=None,
               export_saved_model_api_version=None):
    del batch_axis, eval_on_tpu, export_to_tpu, export_to_cpu
    del export_saved_model_api_version
    if use_tpu:
      raise ValueError(USE_TPU_MESSAGE % tf.__version__)
    if embedding_config_spec is not None:
      raise NotImplementedError('TPU embeddings (embedding_config_spec) need '
                                'a TPU; this backend runs on the host.')
    if model_fn is None:
      raise ValueError('TPUEstimator needs a model_fn.')
    if 'params' not in calling.arg_names(model_fn, 'model_fn'):
      raise ValueError('model_fn %r must take a `params` argument: '
                       'TPUEstimator passes the batch size as '
                       "params['batch_size']." % (model_fn,))
    reserved = sorted(set(params or {}) & set(_RESERVED_PARAMS))
    if reserved:
      raise ValueError('params must not set %s: TPUEstimator fills them in.'
                       % ', '.join(reserved))
    config_lib.check_positive('train_batch_size', train_batch_size)
    config_lib.check_positive('eval_batch_size', eval_batch_size)
    config_lib.check_positive('predict_batch_size', predict_batch_size)
    super(TPUEstimator, self).__init__(model_fn, model_dir=model_dir,
                                       config=config, params=params,
                                       warm_start_from=warm_start_from)
    self._batch_sizes = {ModeKeys.TRAIN: train_batch_size,
                         ModeKeys.EVAL: eval_batch_size,
                         ModeKeys.PREDICT: predict_batch_size}

  def _input_fn_params(self, mode):
    params = self.params
    if self._batch_sizes[mode] is not None:
      params['batch_size'] = self._batch_sizes[mode]
    return params

  def _model_fn_params(self, mode, export):
    params = self.params
    if not export and self._batch_sizes[mode] is not None:
      params['batch_size'] = self._batch_sizes[mode]
    params['use_tpu'] = False
    return params

  def _replica_params(self, params, mode, strategy):
    # The batch sizes given to TPUEstimator are global, as on a TPU, where
    # each core gets its share.
    if 'batch_size' in params:
      params['batch_size'] = compat_distribute.per_replica_batch(
          params['batch_size'], strategy, '%s_batch_size' % mode)
    return params

  def _build(self, input_fn, mode):
    if 'params' not in calling.arg_names(input_fn, 'input_fn'):
      raise ValueError('input_fn %r must take a `params` argument: '
                       "TPUEstimator passes the batch size as "
                       "params['batch_size']." % (input_fn,))
    return super(TPUEstimator, self)._build(input_fn, mode)

  def _to_estimator_spec(self, spec, mode, keep_host_call=True):
    del mode
    return as_estimator_spec(spec, keep_host_call=keep_host_call)
