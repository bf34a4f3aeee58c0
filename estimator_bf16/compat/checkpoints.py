"""Checkpoints of the compat Estimator: the Saver, warm start, the step.

Checkpoints are written by a `tf.compat.v1.train.Saver` under tf.estimator's
names (`model.ckpt-N`, `checkpoint`), with relative paths so a model_dir can
be moved; `warm_start` initializes a fresh model from another run's
checkpoint, the way `tf.estimator.WarmStartSettings` describes it.
"""

import os

import tensorflow as tf


def checkpoint_step(model_dir):
  """The global step (int) of the newest checkpoint in `model_dir`, or 0."""
  path = tf.train.latest_checkpoint(model_dir)
  if path is None:
    return 0
  return int(tf.train.load_checkpoint(path).get_tensor(
      tf.compat.v1.GraphKeys.GLOBAL_STEP))


def add_saver(scaffold, config):
  """Registers the Saver checkpoints are written with, in the default graph.

  Nothing is added when model_fn brought its own Saver (in its Scaffold or
  the SAVERS collection): the checkpoint hooks then use that one.

  Args:
    scaffold: the training `tf.compat.v1.train.Scaffold`.
    config: the `RunConfig`, for keep_checkpoint_max and
      keep_checkpoint_every_n_hours.
  """
  if scaffold.saver or tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.SAVERS):
    return
  tf.compat.v1.add_to_collection(
      tf.compat.v1.GraphKeys.SAVERS,
      tf.compat.v1.train.Saver(
          sharded=True, max_to_keep=config.keep_checkpoint_max,
          keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
          defer_build=True, save_relative_paths=True))


def warm_start(source):
  """Initializes the default graph's variables from another checkpoint.

  Args:
    source: None (nothing to do), a checkpoint file or directory, or an
      object with `WarmStartSettings`' fields (`ckpt_to_initialize_from`,
      `vars_to_warm_start`, `var_name_to_prev_var_name`).
  """
  if source is None:
    return
  path = getattr(source, 'ckpt_to_initialize_from', source)
  variables = getattr(source, 'vars_to_warm_start', '.*')
  renames = getattr(source, 'var_name_to_prev_var_name', None)
  tf.compat.v1.train.warm_start(os.fspath(path), vars_to_warm_start=variables,
                                var_name_to_prev_var_name=renames)
