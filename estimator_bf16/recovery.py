"""Recovery: stop cleanly on SIGTERM, resume only from a readable checkpoint.

What a preempted or killed training job needs, for any tf.compat.v1
training loop (Estimator or MonitoredSession), whatever the precision:

* `stop_on_sigterm()`: on SIGTERM (a preemptible TPU VM's notice) the loop
  stops after the current step and the `CheckpointSaverHook` writes a final
  checkpoint as it closes; a second SIGTERM exits at once.
* `ensure_restorable(model_dir)`: before training resumes, reads the
  checkpoint the Estimator would restore and, if it cannot be read (a save
  interrupted while it rewrote an index, a truncated copy), points the
  `checkpoint` state file at the newest one that can.
* `CheckpointMatchHook`: before any session exists, compares the
  checkpoint in model_dir with the graph and fails with the names and shapes
  at fault when it belongs to a different model, instead of TensorFlow's
  restore error after the session has started.

TensorFlow's saver already writes the `checkpoint` state file atomically
and only after the data and index are complete; these pieces cover the
cases it does not.
"""

import os
import re
import signal
import threading

from absl import logging
import tensorflow as tf

from estimator_bf16.casting import HALF_DTYPES
from estimator_bf16.ckpt import OLD_PREFIX

_STEP_RE = re.compile(r'-(\d+)$')
_SHOWN = 5  # names listed in an error message before "and N more"


class CheckpointError(ValueError):
  """No usable checkpoint, or one that does not fit the model."""


class CheckpointMismatchError(CheckpointError):
  """model_dir holds a checkpoint of a different model (or precision)."""


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


class _StopHook(tf.compat.v1.train.SessionRunHook):
  """Stops the loop once a signal has arrived; counts the steps it saw."""

  def __init__(self, stopper, steps_per_run):
    self._stopper = stopper
    self._steps_per_run = steps_per_run

  def after_create_session(self, session, coord):
    del coord
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is not None:
      self._stopper.step = int(session.run(global_step))

  def after_run(self, run_context, run_values):
    del run_values
    if self._stopper.step is not None:
      self._stopper.step += self._steps_per_run
    if self._stopper.requested:
      logging.warning('Stopping at global step %s on %s; the final '
                      'checkpoint is written as training closes.',
                      self._stopper.step, self._stopper.signal_name)
      run_context.request_stop()


class SignalStopper(object):
  """Turns SIGTERM into a clean stop of a training loop.

  Use it as a context manager around `estimator.train(...)` and pass
  `stopper.hook` in the training hooks. The handler is installed on entry
  (main thread only: Python delivers signals there) and the previous one
  restored on exit.

  Attributes:
    requested: True once a signal arrived.
    signal_name: e.g. 'SIGTERM', once a signal arrived.
    step: global step after the last completed `session.run` (exact when
      `steps_per_run` matches the loop), or None before training starts.
    hook: the `SessionRunHook` that requests the stop.
  """

  def __init__(self, signals=(signal.SIGTERM,), steps_per_run=1):
    self._signals = tuple(signals)
    self._previous = {}
    self._event = threading.Event()
    self.signal_name = None
    self.step = None
    self.hook = _StopHook(self, steps_per_run)

  @property
  def requested(self):
    return self._event.is_set()

  def _handle(self, signum, frame):
    del frame
    if self._event.is_set():
      # A second signal means "now": restore the old handler and re-send.
      self._restore()
      os.kill(os.getpid(), signum)
      return
    self.signal_name = signal.Signals(signum).name
    self._event.set()
    logging.warning('%s received: training stops after the current step '
                    'and writes a checkpoint; send it again to exit at once.',
                    self.signal_name)

  def _restore(self):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      for signum in self._signals:
        self._previous[signum] = signal.signal(signum, self._handle)
    else:
      logging.warning('Not on the main thread: SIGTERM will not stop '
                      'training cleanly.')
    return self

  def __exit__(self, *exc_info):
    self._restore()
    return False


def stop_on_sigterm(steps_per_run=1):
  """Returns a `SignalStopper` for SIGTERM (see there)."""
  return SignalStopper((signal.SIGTERM,), steps_per_run=steps_per_run)


def _saved_variables(graph):
  """{checkpoint key: (shape, dtype)} of what a default Saver stores."""
  saved = {}
  for variable in graph.get_collection(
      tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
    slice_info = getattr(variable, '_save_slice_info', None)
    if slice_info is not None:  # one part of a partitioned variable
      saved[slice_info.full_name] = (list(slice_info.full_shape),
                                     variable.dtype.base_dtype)
    else:
      saved[variable.op.name] = (variable.shape.as_list(),
                                 variable.dtype.base_dtype)
  return saved


def _listing(items):
  items = list(items)
  text = ', '.join(items[:_SHOWN])
  if len(items) > _SHOWN:
    text += ' and %d more' % (len(items) - _SHOWN)
  return text


def check_checkpoint_matches(checkpoint, graph):
  """Raises if `checkpoint` cannot restore the variables of `graph`.

  Args:
    checkpoint: a checkpoint prefix.
    graph: the training graph, fully built.

  Raises:
    CheckpointMismatchError: naming the missing variables, the shapes that
      differ, and half-precision stored weights (with the command that
      converts them).
  """
  reader = tf.train.load_checkpoint(checkpoint)
  stored_shapes = reader.get_variable_to_shape_map()
  stored_dtypes = reader.get_variable_to_dtype_map()
  needed = _saved_variables(graph)
  # The model's own weights first: they say more than optimizer slots.
  trainable = {v.op.name for v in graph.get_collection(
      tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
  missing = sorted((name for name in needed if name not in stored_shapes),
                   key=lambda name: (name not in trainable, name))
  shapes = sorted(
      '%s (checkpoint %s, model %s)' % (name, stored_shapes[name], shape)
      for name, (shape, _) in needed.items()
      if name in stored_shapes and stored_shapes[name] != shape)
  half = sorted(name for name, (_, dtype) in needed.items()
                if stored_dtypes.get(name) in HALF_DTYPES and dtype == tf.float32)
  problems = []
  if missing:
    problems.append("%d of the model's %d variables are not in it (%s)" % (
        len(missing), len(needed), _listing(missing)))
  if shapes:
    problems.append('shapes differ for %s' % _listing(shapes))
  if half:
    problems.append('it stores %s in 16 bits' % _listing(half))
  if not problems:
    return
  old_convention = half or any(OLD_PREFIX + name in stored_shapes
                               for name in missing)
  if old_convention:
    advice = ('It follows an older bfloat16 convention: convert it with '
              '`python -m estimator_bf16.ckpt convert --input=%s '
              '--output=...`.' % checkpoint)
  else:
    advice = ('It was written by a different model: train in a new '
              'model_dir, or move the old checkpoints away.')
  raise CheckpointMismatchError('%s cannot restore this model: %s. %s' % (
      checkpoint, '; '.join(problems), advice))


class CheckpointMatchHook(tf.compat.v1.train.SessionRunHook):
  """Fails before the session starts if model_dir's checkpoint won't fit.

  Put it first in the training hooks: `begin` runs after the graph is built
  and before any other hook writes to model_dir or a session restores.
  """

  def __init__(self, model_dir):
    self._model_dir = model_dir

  def begin(self):
    checkpoint = tf.train.latest_checkpoint(self._model_dir)
    if checkpoint:
      check_checkpoint_matches(checkpoint, tf.compat.v1.get_default_graph())
