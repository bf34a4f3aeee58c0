"""Refuse another model's checkpoint before any session exists.

`CheckpointMatchHook` compares the checkpoint in model_dir with the graph
and fails with the names and shapes at fault when it belongs to a different
model (or an old naming convention), instead of TensorFlow's restore error
after the session has started.
"""

import tensorflow as tf

from estimator_bf16.precision.casting import HALF_DTYPES
from estimator_bf16.safety.checkpoint_convert import OLD_PREFIX
from estimator_bf16.safety.checkpoint_repair import CheckpointError

_SHOWN = 5  # names listed in an error message before "and N more"


class CheckpointMismatchError(CheckpointError):
  """model_dir holds a checkpoint of a different model (or precision)."""


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
              '`python -m estimator_bf16.apps.ckpt convert --input=%s '
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
