"""Building a compat Estimator's inputs from an input_fn, in graph mode.

The input_fn is called by the Estimator's calling rule
(`estimator_bf16.compat.calling`); its Dataset becomes an initializable
iterator on the host's CPU, one element per local replica.
"""

import tensorflow as tf

from estimator_bf16.compat import calling


class _IteratorInitializerHook(tf.compat.v1.train.SessionRunHook):
  """Initializes a dataset iterator once the session exists.

  An initializable iterator (rather than a one-shot one) is what lets a
  dataset capture variables, lookup tables or placeholders-fed constants.
  """

  def __init__(self, iterator):
    self._initializer = iterator.initializer

  def after_create_session(self, session, coord):
    del coord
    session.run(self._initializer)


def _split(result):
  """(features, labels) from an input_fn result or dataset element."""
  if isinstance(result, (tuple, list)) and len(result) == 2:
    return result[0], result[1]
  return result, None


def _check_features(features, result):
  leaves = tf.nest.flatten(features)
  if not leaves or not all(isinstance(
      leaf, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)) for leaf in leaves):
    raise TypeError('input_fn must return a tf.data.Dataset or tensors '
                    '(features or (features, labels)); got %r.' % (result,))


def call_input_fn(input_fn, params, mode, config, input_context=None,
                  replicas=None, device='/cpu:0'):
  """Calls `input_fn` and returns `(features, labels, hooks)`.

  Args:
    input_fn: returns a `tf.data.Dataset` of `features` or `(features,
      labels)`, or such tensors directly.
    params: dict given as `params` (a copy, so the function may change it).
    mode: a ModeKeys string, given as `mode` if declared.
    config: the RunConfig, given as `config` if declared.
    input_context: a `tf.distribute.InputContext`, given as `input_context`
      if declared (tf.estimator's name for it).
    replicas: None for one model replica; else the number of local
      replicas, each of which takes the next element of the Dataset.
    device: where the input pipeline is built (this host's CPU).

  Returns:
    features (Tensor or dict), labels (or None) and a list of hooks the
    session must run (the iterator initializer for a Dataset). With
    `replicas`, features and labels are lists, one per replica.

  Raises:
    TypeError: the result is neither a Dataset nor tensors.
    ValueError: `replicas` is set and input_fn returned tensors, which
      every replica would share.
  """
  kwargs = calling.input_fn_kwargs(input_fn, params, mode, config,
                                   input_context)
  with tf.device(device):
    # The host builds the input pipeline, as TPUEstimator does.
    result = input_fn(**kwargs)
    hooks = []
    if isinstance(result, tf.data.Dataset):
      iterator = tf.compat.v1.data.make_initializable_iterator(result)
      hooks.append(_IteratorInitializerHook(iterator))
      elements = [iterator.get_next() for _ in range(replicas or 1)]
    elif replicas:
      raise ValueError('Under a distribution strategy input_fn must return '
                       'a tf.data.Dataset (each replica takes its own '
                       'batches from it); got %r.' % (result,))
    else:
      elements = [result]
  pairs = [_split(element) for element in elements]
  for features, _ in pairs:
    _check_features(features, result)
  if replicas is None:
    features, labels = pairs[0]
    return features, labels, hooks
  return [f for f, _ in pairs], [l for _, l in pairs], hooks
