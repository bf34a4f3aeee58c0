"""ModeKeys, EstimatorSpec and TPUEstimatorSpec with tf.estimator's fields.

A legacy model_fn constructs these by keyword (`TPUEstimatorSpec(mode,
loss=loss, train_op=train_op, eval_metrics=(metric_fn, [labels, logits]))`),
so the classes are namedtuples with the field names and order of
`tf.compat.v1.estimator.EstimatorSpec` / `tf.compat.v1.estimator.tpu.
TPUEstimatorSpec`. That also lets `estimator_bf16.precision.float32_spec.
float32_spec` (duck typed on those fields) make them float32 exactly as it does the real ones.
Validation happens at construction, where the model_fn author can still see
which argument is wrong.
"""

import collections

import tensorflow as tf

from estimator_bf16.precision import op_lists
from estimator_bf16.compat import calling


class ModeKeys(object):
  """The three modes a model_fn is called in; the strings are tf.estimator's.

  They are `estimator_bf16.compat.calling`'s, which the precision logic
  compares with: that is why both backends can share it.
  """
  TRAIN = calling.TRAIN
  EVAL = calling.EVAL
  PREDICT = calling.PREDICT


_MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)
_TENSORS = (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)


def _check_mode(mode):
  if mode not in _MODES:
    raise ValueError('mode must be one of ModeKeys.TRAIN/EVAL/PREDICT (%s), '
                     'got %r.' % (', '.join(repr(m) for m in _MODES), mode))


def _check_loss(loss, mode):
  """The loss: a scalar tensor (shape [] or [1]), required but in PREDICT."""
  if loss is None:
    if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
      raise ValueError('loss is required in %s mode.' % mode)
    return None
  if not isinstance(loss, tf.Tensor):
    raise TypeError('loss must be a Tensor, got %r.' % (loss,))
  shape = loss.shape
  if shape.rank is not None and shape.num_elements() not in (None, 1):
    raise ValueError('loss must be a scalar (shape [] or [1]), got shape %s.'
                     % shape)
  return tf.reshape(loss, []) if shape.rank == 1 else loss


def _check_train_op(train_op, mode):
  if train_op is None:
    if mode == ModeKeys.TRAIN:
      raise ValueError('train_op is required in TRAIN mode.')
    return None
  op = getattr(train_op, 'op', None)
  if (isinstance(train_op, tf.Variable) and isinstance(op, tf.Operation) and
      op.type not in op_lists.VARIABLE_OPS):
    # The not-yet-read result of an assignment (what a v1 optimizer returns
    # under MultiWorkerMirroredStrategy on TensorFlow 2.16+): its op is the
    # update itself.
    return op
  if not isinstance(train_op, (tf.Tensor, tf.Operation)):
    raise TypeError('train_op must be an Operation or Tensor, got %r.' %
                    (train_op,))
  return train_op


def _check_predictions(predictions, mode):
  if predictions is None:
    if mode == ModeKeys.PREDICT:
      raise ValueError('predictions are required in PREDICT mode.')
    return {}
  leaves = (predictions.values() if isinstance(predictions, dict)
            else [predictions])
  for leaf in leaves:
    if not isinstance(leaf, _TENSORS):
      raise TypeError('predictions must be a Tensor or a dict of Tensors, '
                      'got %r.' % (leaf,))
  return predictions


def _check_hooks(hooks, field):
  hooks = tuple(hooks or ())
  for hook in hooks:
    if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
      raise TypeError('%s must be SessionRunHook instances, got %r.' %
                      (field, hook))
  return hooks


def _check_export_outputs(export_outputs):
  if export_outputs is None:
    return None
  if not isinstance(export_outputs, dict):
    raise TypeError('export_outputs must be a dict of name -> ExportOutput, '
                    'got %r.' % type(export_outputs).__name__)
  for name, output in export_outputs.items():
    # Duck typed, so tf.estimator's own export outputs (TF 2.15) work too.
    if not callable(getattr(output, 'as_signature_def', None)):
      raise TypeError('export_outputs[%r] must be an ExportOutput '
                      '(PredictOutput, ClassificationOutput, '
                      'RegressionOutput), got %r.' % (name, output))
  return export_outputs


def _check_metric_ops(eval_metric_ops):
  """eval_metric_ops: {name: (value tensor, update op)} as tf.metrics give."""
  eval_metric_ops = dict(eval_metric_ops or {})
  for name, metric in eval_metric_ops.items():
    if not (isinstance(metric, (tuple, list)) and len(metric) == 2):
      raise TypeError('eval_metric_ops[%r] must be a (value, update_op) '
                      'tuple as tf.compat.v1.metrics return, got %r.' %
                      (name, metric))
  return eval_metric_ops


def _check_call(call, field):
  """(fn, tensors) for eval_metrics / host_call: a list or a dict of tensors."""
  if call is None:
    return None
  if not (isinstance(call, (tuple, list)) and len(call) == 2 and
          callable(call[0])):
    raise TypeError('%s must be a (function, tensors) pair, got %r.' %
                    (field, call))
  fn, tensors = call
  if not isinstance(tensors, (tuple, list, dict)):
    raise TypeError('%s[1] must be a list or dict of tensors (the arguments '
                    'of %s[0]), got %r.' % (field, field, tensors))
  return (fn, tensors)


class EstimatorSpec(collections.namedtuple('EstimatorSpec', [
    'mode', 'predictions', 'loss', 'train_op', 'eval_metric_ops',
    'export_outputs', 'training_chief_hooks', 'training_hooks', 'scaffold',
    'evaluation_hooks', 'prediction_hooks'])):
  """What a model_fn returns to an `Estimator`.

  Fields:
    mode: a `ModeKeys` string.
    predictions: Tensor or dict of Tensors; required in PREDICT.
    loss: scalar Tensor; required in TRAIN and EVAL.
    train_op: Operation or Tensor; required in TRAIN.
    eval_metric_ops: {name: (value Tensor, update op)}.
    export_outputs: {signature name: ExportOutput}, PREDICT mode.
    training_chief_hooks, training_hooks, evaluation_hooks,
    prediction_hooks: tuples of `SessionRunHook`.
    scaffold: a `tf.compat.v1.train.Scaffold` or None.
  """

  def __new__(cls, mode, predictions=None, loss=None, train_op=None,
              eval_metric_ops=None, export_outputs=None,
              training_chief_hooks=None, training_hooks=None, scaffold=None,
              evaluation_hooks=None, prediction_hooks=None):
    _check_mode(mode)
    if scaffold is not None and not isinstance(
        scaffold, tf.compat.v1.train.Scaffold):
      raise TypeError('scaffold must be a tf.compat.v1.train.Scaffold, got '
                      '%r.' % (scaffold,))
    return super(EstimatorSpec, cls).__new__(
        cls, mode=mode,
        predictions=_check_predictions(predictions, mode),
        loss=_check_loss(loss, mode),
        train_op=_check_train_op(train_op, mode),
        eval_metric_ops=_check_metric_ops(eval_metric_ops),
        export_outputs=_check_export_outputs(export_outputs),
        training_chief_hooks=_check_hooks(training_chief_hooks,
                                          'training_chief_hooks'),
        training_hooks=_check_hooks(training_hooks, 'training_hooks'),
        scaffold=scaffold,
        evaluation_hooks=_check_hooks(evaluation_hooks, 'evaluation_hooks'),
        prediction_hooks=_check_hooks(prediction_hooks, 'prediction_hooks'))


class TPUEstimatorSpec(collections.namedtuple('TPUEstimatorSpec', [
    'mode', 'predictions', 'loss', 'train_op', 'eval_metrics',
    'export_outputs', 'scaffold_fn', 'host_call', 'training_hooks',
    'evaluation_hooks', 'prediction_hooks'])):
  """What a model_fn returns to a `TPUEstimator`.

  Fields as `EstimatorSpec`, except:
    eval_metrics: `(metric_fn, tensors)`; `metric_fn(*tensors)` (or
      `**tensors` for a dict) returns `{name: (value, update_op)}`. It runs
      on the host, after model_fn.
    host_call: `(host_fn, tensors)`; `host_fn` runs on the host at every
      training step with the tensors' values (typically to write
      `tf.compat.v2.summary` scalars).
    scaffold_fn: a function returning a `Scaffold`, called on the host.
  """

  def __new__(cls, mode, predictions=None, loss=None, train_op=None,
              eval_metrics=None, export_outputs=None, scaffold_fn=None,
              host_call=None, training_hooks=None, evaluation_hooks=None,
              prediction_hooks=None):
    _check_mode(mode)
    if scaffold_fn is not None and not callable(scaffold_fn):
      raise TypeError('scaffold_fn must be callable, got %r.' % (scaffold_fn,))
    return super(TPUEstimatorSpec, cls).__new__(
        cls, mode=mode,
        predictions=_check_predictions(predictions, mode),
        loss=_check_loss(loss, mode),
        train_op=_check_train_op(train_op, mode),
        eval_metrics=_check_call(eval_metrics, 'eval_metrics'),
        export_outputs=_check_export_outputs(export_outputs),
        scaffold_fn=scaffold_fn,
        host_call=_check_call(host_call, 'host_call'),
        training_hooks=_check_hooks(training_hooks, 'training_hooks'),
        evaluation_hooks=_check_hooks(evaluation_hooks, 'evaluation_hooks'),
        prediction_hooks=_check_hooks(prediction_hooks, 'prediction_hooks'))

  def as_estimator_spec(self):
    """The `EstimatorSpec` this spec means on a host, as TF 1.x's gave.

    Model code that runs off the TPU returns it to a plain Estimator
    (tensorflow/tpu's detection models do, with `use_tpu=False`):
    `eval_metrics` and `host_call` run on the host, `scaffold_fn` is called.

    Returns:
      An `EstimatorSpec`.
    """
    # Imported here: the conversion lives with TPUEstimator, which imports
    # this module.
    from estimator_bf16.compat import tpu_estimator as compat_tpu  # pylint: disable=g-import-not-at-top
    return compat_tpu.as_estimator_spec(self)
