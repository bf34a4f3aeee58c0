"""Export outputs, serving input receivers and SavedModel signatures.

`tf.estimator.export` names, fields and defaults: a single feature tensor is
keyed `'feature'`, a single receiver tensor `'input'`, a single prediction
`'output'`; one export output is also served as `'serving_default'`. The
signatures are built with the public `tf.compat.v1.saved_model` helpers, so a
SavedModel written here loads with `tf.compat.v1.saved_model.load` on
TensorFlow 2.15 as well as 2.16+.
"""

import collections

from absl import logging
import tensorflow as tf

DEFAULT_SERVING_KEY = (
    tf.compat.v1.saved_model.signature_constants
    .DEFAULT_SERVING_SIGNATURE_DEF_KEY)
_TENSORS = (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)


def _single_string_input(receiver_tensors, what):
  """Classify/regress signatures take one serialized tf.Example string."""
  if len(receiver_tensors) == 1:
    (examples,) = receiver_tensors.values()
    if examples.dtype == tf.string:
      return examples
  raise ValueError(
      '%s signatures need a single tf.string input of serialized tf.Examples;'
      ' this receiver has %s. Use PredictOutput for other inputs.' %
      (what, sorted(receiver_tensors)))


class ExportOutput(object):
  """Base class: one SavedModel signature built from a model's outputs."""

  def as_signature_def(self, receiver_tensors):
    """Returns a `SignatureDef` proto for `{name: input tensor}`."""
    raise NotImplementedError


class ClassificationOutput(ExportOutput):
  """Class scores and/or class names, served as a `classify` signature.

  Args:
    scores: float Tensor [batch, classes], or None.
    classes: string Tensor [batch, classes], or None. At least one is set.
  """

  def __init__(self, scores=None, classes=None):
    if scores is None and classes is None:
      raise ValueError('ClassificationOutput needs scores, classes or both.')
    if scores is not None and not (isinstance(scores, tf.Tensor) and
                                   scores.dtype.is_floating):
      raise ValueError('ClassificationOutput scores must be a float Tensor, '
                       'got %r.' % (scores,))
    if classes is not None and not (isinstance(classes, tf.Tensor) and
                                    classes.dtype == tf.string):
      raise ValueError('ClassificationOutput classes must be a string Tensor,'
                       ' got %r.' % (classes,))
    self.scores = scores
    self.classes = classes

  def as_signature_def(self, receiver_tensors):
    examples = _single_string_input(receiver_tensors, 'Classification')
    return tf.compat.v1.saved_model.classification_signature_def(
        examples, self.classes, self.scores)


class RegressionOutput(ExportOutput):
  """One float value per example, served as a `regress` signature.

  Args:
    value: float Tensor [batch] or [batch, 1].
  """

  def __init__(self, value):
    if not (isinstance(value, tf.Tensor) and value.dtype.is_floating):
      raise ValueError('RegressionOutput value must be a float Tensor, got '
                       '%r.' % (value,))
    self.value = value

  def as_signature_def(self, receiver_tensors):
    examples = _single_string_input(receiver_tensors, 'Regression')
    return tf.compat.v1.saved_model.regression_signature_def(examples,
                                                             self.value)


class PredictOutput(ExportOutput):
  """Any named tensors, served as a `predict` signature.

  Args:
    outputs: a Tensor (served as `'output'`) or a dict {str: Tensor}.
  """

  def __init__(self, outputs):
    if not isinstance(outputs, dict):
      outputs = {'output': outputs}
    for name, tensor in outputs.items():
      if not isinstance(name, str) or not isinstance(tensor, _TENSORS):
        raise ValueError('PredictOutput outputs must map str to Tensor, got '
                         '%r: %r.' % (name, tensor))
    self.outputs = outputs

  def as_signature_def(self, receiver_tensors):
    return tf.compat.v1.saved_model.predict_signature_def(receiver_tensors,
                                                          self.outputs)


def _as_tensor_dict(tensors, single_name, field):
  """A dict of str -> tensors; a lone tensor gets `single_name` as its key."""
  if tensors is None:
    raise ValueError('%s must be given.' % field)
  if not isinstance(tensors, dict):
    tensors = {single_name: tensors}
  for name, tensor in tensors.items():
    if not isinstance(name, str):
      raise ValueError('%s keys must be strings, got %r.' % (field, name))
    if not isinstance(tensor, _TENSORS):
      raise ValueError('%s[%r] must be a Tensor, SparseTensor or '
                       'RaggedTensor, got %r.' % (field, name, tensor))
  return tensors


def _alternatives(alternatives):
  if alternatives is None:
    return None
  if not isinstance(alternatives, dict):
    raise ValueError('receiver_tensors_alternatives must be a dict of '
                     'name -> receiver tensors.')
  return {name: _as_tensor_dict(value, 'input', 'receiver_tensors_'
                                'alternatives')
          for name, value in alternatives.items()}


class ServingInputReceiver(collections.namedtuple('ServingInputReceiver', [
    'features', 'receiver_tensors', 'receiver_tensors_alternatives'])):
  """What a serving_input_receiver_fn returns.

  Fields:
    features: dict {str: Tensor} given to model_fn (a lone Tensor becomes
      `{'feature': tensor}`).
    receiver_tensors: dict {str: Tensor} the SavedModel is fed (a lone
      Tensor becomes `{'input': tensor}`).
    receiver_tensors_alternatives: optional {name: receiver tensors} for
      extra signatures named `'<name>:<output key>'`.
  """

  def __new__(cls, features, receiver_tensors,
              receiver_tensors_alternatives=None):
    return super(ServingInputReceiver, cls).__new__(
        cls, features=_as_tensor_dict(features, 'feature', 'features'),
        receiver_tensors=_as_tensor_dict(receiver_tensors, 'input',
                                         'receiver_tensors'),
        receiver_tensors_alternatives=_alternatives(
            receiver_tensors_alternatives))


class TensorServingInputReceiver(collections.namedtuple(
    'TensorServingInputReceiver', [
        'features', 'receiver_tensors', 'receiver_tensors_alternatives'])):
  """Like `ServingInputReceiver`, but model_fn gets `features` as one Tensor.

  Fields:
    features: a single Tensor, passed to model_fn as it is.
    receiver_tensors, receiver_tensors_alternatives: as in
      `ServingInputReceiver`.
  """

  def __new__(cls, features, receiver_tensors,
              receiver_tensors_alternatives=None):
    if not isinstance(features, _TENSORS):
      raise ValueError('TensorServingInputReceiver features must be a single '
                       'Tensor, got %r.' % (features,))
    return super(TensorServingInputReceiver, cls).__new__(
        cls, features=features,
        receiver_tensors=_as_tensor_dict(receiver_tensors, 'input',
                                         'receiver_tensors'),
        receiver_tensors_alternatives=_alternatives(
            receiver_tensors_alternatives))


def build_raw_serving_input_receiver_fn(features, default_batch_size=None):
  """A serving_input_receiver_fn feeding placeholders shaped like `features`.

  Args:
    features: dict {str: Tensor}; each gets a placeholder of its dtype and
      shape, with the batch dimension set to `default_batch_size`.
    default_batch_size: int or None (any batch).

  Returns:
    A function returning a `ServingInputReceiver`.
  """

  def serving_input_receiver_fn():
    receivers = {}
    for name, tensor in features.items():
      shape = [default_batch_size] + tensor.shape.as_list()[1:]
      receivers[name] = tf.compat.v1.placeholder(tensor.dtype, shape,
                                                 name=name)
    return ServingInputReceiver(dict(receivers), receivers)

  return serving_input_receiver_fn


def export_outputs_for(export_outputs, predictions):
  """The export outputs to serve, with tf.estimator's defaults.

  Args:
    export_outputs: the spec's dict {name: ExportOutput}, or None.
    predictions: the spec's predictions (used when export_outputs is None).

  Returns:
    A dict {signature name: ExportOutput} with a `'serving_default'` entry.

  Raises:
    ValueError: several export outputs and none named 'serving_default'.
  """
  if export_outputs is None:
    return {DEFAULT_SERVING_KEY: PredictOutput(predictions)}
  export_outputs = dict(export_outputs)
  if DEFAULT_SERVING_KEY not in export_outputs:
    if len(export_outputs) != 1:
      raise ValueError('With several export_outputs (%s), one must be named '
                       '%r.' % (sorted(export_outputs), DEFAULT_SERVING_KEY))
    (only,) = export_outputs.values()
    export_outputs[DEFAULT_SERVING_KEY] = only
  return export_outputs


def signature_defs(receiver, export_outputs):
  """Builds {signature name: SignatureDef} for a receiver and its outputs.

  Signatures that cannot be built for this receiver (a classify signature on
  non-string inputs) are left out with a warning, as tf.estimator does.

  Raises:
    ValueError: if no signature at all could be built.
  """
  receivers = {None: receiver.receiver_tensors}
  receivers.update(receiver.receiver_tensors_alternatives or {})
  signatures = {}
  for receiver_name, tensors in receivers.items():
    for output_name, output in export_outputs.items():
      name = (output_name if receiver_name is None
              else '%s:%s' % (receiver_name, output_name))
      try:
        signatures[name] = output.as_signature_def(tensors)
      except ValueError as e:
        logging.warning('Signature %r is not exported: %s', name, e)
  if not signatures:
    raise ValueError('No serving signature could be built from '
                     'export_outputs %s.' % sorted(export_outputs))
  return signatures
