"""Making a model_fn's returned spec float32 at its boundary.

Works by duck typing on the namedtuple fields that `EstimatorSpec` and
`TPUEstimatorSpec` share, so it serves any backend whose spec classes keep
those field names (a TensorFlow 2.16+ backend included).
"""

from absl import logging
import tensorflow as tf

from estimator_bf16.precision import rounding
from estimator_bf16.precision import casting


def _float32_call(call):
  """(fn, tensors) -> (fn, float32 tensors) for eval_metrics / host_call."""
  if call is None:
    return None
  fn, tensors = call
  return (fn, casting.to_float32(tensors))


def _float32_export_output(output):
  """Rebuilds an ExportOutput with float32 tensors, keeping its class."""
  cls = type(output)
  if hasattr(output, 'scores') and hasattr(output, 'classes'):
    return cls(scores=casting.to_float32(output.scores), classes=output.classes)
  if hasattr(output, 'value') and not hasattr(output, 'outputs'):
    return cls(value=casting.to_float32(output.value))
  if hasattr(output, 'outputs'):
    return cls(casting.to_float32(output.outputs))
  return output


def float32_spec(spec):
  """Returns `spec` with every floating output tensor float32.

  Args:
    spec: an `EstimatorSpec` or `TPUEstimatorSpec` (any namedtuple with some
      of the fields `loss`, `predictions`, `export_outputs`, `eval_metrics`,
      `host_call`).

  Returns:
    A spec of the same class. `loss` and `predictions` are cast; export
    outputs are rebuilt with float32 tensors; the tensors handed to
    `eval_metrics` and `host_call` functions are cast, so those functions
    (which run later, on the host) see float32. `train_op`, hooks and
    `eval_metric_ops` are kept.
  """
  fields = getattr(spec, '_fields', ())
  if 'loss' not in fields:
    raise TypeError('model_fn must return an EstimatorSpec or TPUEstimatorSpec,'
                    ' got %r.' % type(spec).__name__)
  changes = {}
  loss = spec.loss
  if loss is not None and loss.dtype.base_dtype != tf.float32:
    # A loss computed in float32 and rounded by TensorFlow's own loss code
    # (tf.compat.v1.losses casts back to the logits' dtype) is replaced by
    # its float32 value in to_float32; only a loss reduced in 16 bits warns.
    if rounding.float32_original(loss) is None:
      logging.warning(
          'The loss of the wrapped model_fn is %s; it is cast to float32 for '
          'the training loop, but it was reduced in %s. Compute it with '
          'tf.compat.v1.losses or from tf.cast(logits, tf.float32).',
          loss.dtype.name, loss.dtype.name)
    changes['loss'] = casting.to_float32(loss)
  if getattr(spec, 'predictions', None) is not None:
    changes['predictions'] = casting.to_float32(spec.predictions)
  if getattr(spec, 'export_outputs', None):
    changes['export_outputs'] = {
        key: _float32_export_output(value)
        for key, value in spec.export_outputs.items()}
  for field in ('eval_metrics', 'host_call'):
    if field in fields and getattr(spec, field) is not None:
      changes[field] = _float32_call(getattr(spec, field))
  if not changes:
    return spec
  if any(field in fields for field in ('eval_metrics', 'host_call')):
    # Through the constructor: TensorFlow 2.15's `TPUEstimatorSpec.__new__`
    # also stores the host calls aside (`_host_calls`, on the class, so the
    # spec built last wins for every instance), and off the TPU
    # `as_estimator_spec` runs those, not the fields; `_replace` would skip
    # it and hand `metric_fn` the model's bfloat16 tensors. This rebuild
    # must stay the last spec built before TPUEstimator reads it.
    return type(spec)(**dict(spec._asdict(), **changes))
  # `_replace` keeps the class and skips the constructor's checks, which the
  # original spec already passed.
  return spec._replace(**changes)
