"""Evaluation by the compat Estimator: metrics, the session, the summary.

The graph (input_fn and model_fn in EVAL mode) is built by the Estimator;
this module adds tf.estimator's `'loss'` metric, runs the metric updates
over the evaluation data from one checkpoint, and writes the results where
TensorBoard and tf.estimator look for them (`model_dir/eval[_<name>]`).
"""

import os

import numpy as np
import tensorflow as tf


def metrics_with_loss(spec):
  """The spec's eval_metric_ops, plus the mean loss unless it names one.

  Args:
    spec: an EVAL-mode `EstimatorSpec` (its loss a float scalar).

  Returns:
    dict {name: (value tensor, update op)}.
  """
  metrics = dict(spec.eval_metric_ops)
  if 'loss' not in metrics:
    metrics['loss'] = tf.compat.v1.metrics.mean(spec.loss)
  return metrics


def run_evaluation(spec, input_hooks, hooks, steps, checkpoint_path,
                   session_config):
  """Runs the metrics of `spec` over the data; returns their final values.

  Called with the EVAL graph as the default graph.

  Args:
    spec: the EVAL-mode `EstimatorSpec`.
    input_hooks: `SessionRunHook`s input_fn needs.
    hooks: the caller's extra `SessionRunHook`s, or None.
    steps: batches to evaluate; None runs until the input runs out.
    checkpoint_path: the checkpoint to restore, or None for the initial
      values.
    session_config: a `tf.compat.v1.ConfigProto`.

  Returns:
    dict {metric name: numpy value} with `'global_step'` (int64).
  """
  metrics = metrics_with_loss(spec)
  values = {key: value for key, (value, _) in metrics.items()}
  values[tf.compat.v1.GraphKeys.GLOBAL_STEP] = (
      tf.compat.v1.train.get_global_step())
  updates = [update for _, update in metrics.values()]
  final = tf.compat.v1.train.FinalOpsHook(values)
  creator = tf.compat.v1.train.ChiefSessionCreator(
      scaffold=spec.scaffold or tf.compat.v1.train.Scaffold(),
      checkpoint_filename_with_path=checkpoint_path, config=session_config)
  all_hooks = (list(input_hooks) + list(spec.evaluation_hooks) +
               list(hooks or []) + [final])
  with tf.compat.v1.train.MonitoredSession(creator, all_hooks) as session:
    done = 0
    while not session.should_stop():
      session.run(updates)
      done += 1
      if steps is not None and done >= steps:
        break
  return final.final_ops_values


def write_summary(results, model_dir, name):
  """Writes the scalar results as a summary at their global step.

  Args:
    results: dict from `run_evaluation`.
    model_dir: the Estimator's model_dir.
    name: None, or the evaluation's name (directory `eval_<name>`).
  """
  directory = os.path.join(model_dir, 'eval' if not name else 'eval_' + name)
  # tf.estimator's line (`_write_dict_to_summary`), word for word and on its
  # logger, which `tf.compat.v1.logging.set_verbosity` controls.
  tf.compat.v1.logging.info(
      'Saving dict for global step %d: %s', int(results['global_step']),
      ', '.join('%s = %s' % (key, value)
                for key, value in sorted(results.items())
                if not isinstance(value, bytes)))
  summary = tf.compat.v1.Summary()
  for key, value in sorted(results.items()):
    if key == tf.compat.v1.GraphKeys.GLOBAL_STEP:
      continue
    if np.ndim(value) == 0 and np.issubdtype(np.asarray(value).dtype,
                                             np.number):
      summary.value.add(tag=key, simple_value=float(value))
  # v1 FileWriters refuse to open under eager execution (TF's default
  # outside our graphs); an empty graph is all one needs.
  with tf.Graph().as_default():
    writer = tf.compat.v1.summary.FileWriter(directory)
    writer.add_summary(summary, int(results['global_step']))
    writer.close()
