"""Resume only from a readable checkpoint.

`ensure_restorable(model_dir)`: before training resumes, reads the checkpoint
the Estimator would restore and, if it cannot be read (a save interrupted
while it rewrote an index, a truncated copy), points the `checkpoint` state
file at the newest one that can. TensorFlow's saver already writes the state
file atomically and only after the data and index are complete; this covers
the cases it does not. Works for any tf.compat.v1 training loop (Estimator
or MonitoredSession), whatever the precision.
"""

import os
import re

from absl import logging
import tensorflow as tf

_STEP_RE = re.compile(r'-(\d+)$')


class CheckpointError(ValueError):
  """No usable checkpoint, or one that does not fit the model."""


def checkpoint_step(prefix):
  """The global step in a checkpoint prefix such as 'model.ckpt-120'."""
  match = _STEP_RE.search(prefix)
  return int(match.group(1)) if match else None


def verify_checkpoint(prefix):
  """Reads every tensor of a checkpoint.

  Args:
    prefix: a checkpoint prefix, e.g. '.../model.ckpt-120'.

  Returns:
    None if the checkpoint reads completely, else a one-line reason.
  """
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except (tf.errors.OpError, ValueError) as e:
    return '%s: %s' % (type(e).__name__, str(e).strip().splitlines()[0])
  return None


def _listed_checkpoints(model_dir):
  """Prefixes the state file lists (oldest first), or None if unreadable."""
  if not tf.io.gfile.exists(os.path.join(model_dir, 'checkpoint')):
    return None
  try:
    state = tf.train.get_checkpoint_state(model_dir)
  except (tf.errors.OpError, ValueError) as e:  # a garbled state file
    logging.warning('Cannot parse %s/checkpoint (%s).', model_dir, e)
    return None
  if state is None:
    return None
  listed = list(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path and state.model_checkpoint_path not in listed:
    listed.append(state.model_checkpoint_path)
  return listed


def _checkpoints_on_disk(model_dir):
  prefixes = [path[:-len('.index')] for path in
              tf.io.gfile.glob(os.path.join(model_dir, '*.index'))]
  return sorted((p for p in prefixes if checkpoint_step(p) is not None),
                key=checkpoint_step)


def _remove_interrupted_saves(model_dir):
  # The saver writes into '<prefix>_temp/' and merges it into place; a
  # directory left behind is a save that was killed part way.
  for path in tf.io.gfile.glob(os.path.join(model_dir, '*_temp')):
    if (tf.io.gfile.isdir(path) and
        checkpoint_step(path[:-len('_temp')]) is not None):
      logging.info('Removing %s, left by an interrupted checkpoint save.',
                   path)
      tf.io.gfile.rmtree(path)


def ensure_restorable(model_dir):
  """Makes sure the checkpoint training resumes from can be read.

  The Estimator restores the checkpoint named by `model_dir/checkpoint`.
  If that one is unreadable, the newest readable one it lists takes its
  place (the state file is rewritten); if the state file is missing or
  garbled but checkpoints exist, the newest readable one on disk is named.
  Leftovers of interrupted saves are removed.

  Args:
    model_dir: the training directory (local or gs://).

  Returns:
    The checkpoint prefix training will resume from, or None for a fresh
    start (no checkpoint).

  Raises:
    CheckpointError: checkpoints exist but none can be read.
  """
  if not tf.io.gfile.isdir(model_dir):
    return None
  _remove_interrupted_saves(model_dir)
  listed = _listed_checkpoints(model_dir)
  candidates = listed if listed else _checkpoints_on_disk(model_dir)
  if not candidates:
    return None
  bad = []
  for prefix in reversed(candidates):  # newest first
    reason = verify_checkpoint(prefix)
    if reason is None:
      break
    bad.append((prefix, reason))
  else:
    raise CheckpointError(
        'No checkpoint in %s can be read: %s. Move them away to start from '
        'step 0, or restore a copy.' % (
            model_dir, '; '.join('%s (%s)' % pair for pair in bad)))
  if bad or not listed:
    for unreadable, reason in bad:
      logging.warning('Checkpoint %s is unreadable (%s); not resuming from '
                      'it.', unreadable, reason)
    keep = [p for p in candidates[:candidates.index(prefix) + 1]
            if p not in dict(bad)]
    # Relative names, as the Estimator's saver writes them, so the
    # directory can still be moved or copied.
    tf.compat.v1.train.update_checkpoint_state(
        model_dir, os.path.basename(prefix),
        all_model_checkpoint_paths=[os.path.basename(p) for p in keep])
  logging.info('Resuming from %s (global step %s).', prefix,
               checkpoint_step(prefix))
  return prefix
