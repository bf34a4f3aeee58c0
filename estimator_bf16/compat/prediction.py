"""Prediction by the compat Estimator: the session and what it yields.

The graph (input_fn and model_fn in PREDICT mode) is built by the
Estimator; this module picks the requested prediction keys, restores a
checkpoint, runs until the input is exhausted and yields whole batches or,
as tf.estimator does by default, one example at a time.
"""

import numpy as np
import tensorflow as tf


def select(predictions, keys):
  """The predictions under `keys` (a key, a list of keys, or None: all).

  Raises:
    ValueError: keys given for a single-tensor prediction, or not in it.
  """
  if keys is None:
    return predictions
  if not isinstance(predictions, dict):
    raise ValueError('predict_keys needs dict predictions.')
  keys = [keys] if isinstance(keys, str) else list(keys)
  missing = sorted(set(keys) - set(predictions))
  if missing:
    raise ValueError('predict_keys %s are not in the predictions %s.' %
                     (missing, sorted(predictions)))
  return {key: predictions[key] for key in keys}


def unbatch(batch):
  """Splits a batch of predictions (array or dict of arrays) into examples.

  Raises:
    ValueError: the arrays of a dict differ in their first dimension (or
      one is a scalar), so there are no examples to split into.
  """
  if not isinstance(batch, dict):
    return list(batch)
  sizes = {key: np.shape(value)[0] if np.ndim(value) else None
           for key, value in batch.items()}
  if None in sizes.values() or len(set(sizes.values())) != 1:
    raise ValueError('yield_single_examples needs every prediction to have '
                     'the same batch size; got %s. Use '
                     'yield_single_examples=False.' % sizes)
  (size,) = set(sizes.values())
  return [{key: value[i] for key, value in batch.items()}
          for i in range(size)]


def run_predictions(spec, input_hooks, hooks, predict_keys, checkpoint_path,
                    session_config, yield_single_examples):
  """Yields the predictions of `spec` batch by batch or example by example.

  Called with the PREDICT graph as the default graph.

  Args:
    spec: the PREDICT-mode `EstimatorSpec`.
    input_hooks: `SessionRunHook`s input_fn needs.
    hooks: the caller's extra `SessionRunHook`s, or None.
    predict_keys: see `select`.
    checkpoint_path: the checkpoint to restore, or None for the initial
      values.
    session_config: a `tf.compat.v1.ConfigProto`.
    yield_single_examples: True yields single examples (values without
      their batch dimension), False whole batches.

  Yields:
    dicts of numpy arrays (or arrays, if predictions is one tensor).
  """
  predictions = select(spec.predictions, predict_keys)
  creator = tf.compat.v1.train.ChiefSessionCreator(
      scaffold=spec.scaffold or tf.compat.v1.train.Scaffold(),
      checkpoint_filename_with_path=checkpoint_path, config=session_config)
  all_hooks = input_hooks + list(spec.prediction_hooks) + list(hooks or [])
  with tf.compat.v1.train.MonitoredSession(creator, all_hooks) as session:
    while not session.should_stop():
      batch = session.run(predictions)
      if not yield_single_examples:
        yield batch
        continue
      for example in unbatch(batch):
        yield example
