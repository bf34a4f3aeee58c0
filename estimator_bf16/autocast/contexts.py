"""The public autocast context managers, and what entering one installs.

`autocast`, `float32_ops` and `keep_float32` push a mode onto this thread's
stack (`state`); while any thread is inside one, TensorFlow's op creation
and tensor conversion are replaced by the stand-ins in `rules`, and put
back when the last one leaves. `recast_weights_at_any_batch` is for graphs
built at a stand-in batch (the memory planner's).
"""

import contextlib

import tensorflow as tf

from estimator_bf16.autocast import branches
from estimator_bf16.autocast import composites
from estimator_bf16.autocast import master_weights
from estimator_bf16.autocast import rules
from estimator_bf16.autocast import state
from estimator_bf16.platform import patching
from estimator_bf16.precision import policy


_REPLACEMENTS = {'_apply_op_helper': rules.apply_op_with_autocast,
                 'convert': rules.convert_with_autocast,
                 'cond_v2': branches.cond_v2_with_autocast}


def _install():
  # The two entry points every graph op and every tensor conversion pass
  # through, and the one every v2 `tf.cond` is built by (`branches`); all
  # are looked up by module attribute at call time. What is
  # there now (TensorFlow's function or someone's stand-in) is what the
  # rules defer to and what the undo puts back; it is recorded before the
  # attribute changes, so a rule never finds its own replacement there.
  undo = [state.forget_replaced]  # Undone last, after the attributes.
  for owner, name in state.SWAPPED:
    original = getattr(owner, name)
    state.remember_replaced(name, original)
    undo.append((owner, name, original))
    setattr(owner, name, _REPLACEMENTS[name])
  # TensorFlow's loss functions made of several ops, computed whole in
  # float32 while autocast is in force (`composites`).
  try:
    undo.extend(composites.swap())
  except Exception:
    patching.restore(undo)
    raise
  return undo


_PATCHER = patching.Patcher(_install)


@contextlib.contextmanager
def _entered(mode):
  with _PATCHER.active():
    state.STATE.modes.append(mode)
    try:
      yield
    finally:
      state.STATE.modes.pop()
      if not state.STATE.modes:
        state.STATE.forget_graph()


@contextlib.contextmanager
def autocast(precision):
  """Context manager: ops built on this thread compute in `precision`.

  Args:
    precision: `'bfloat16'` applies every autocast rule (see the
      `estimator_bf16.autocast` package docstring); `'float32'` changes
      nothing.

  Yields:
    None.

  Raises:
    ValueError: if `precision` is not one of `PRECISIONS`.
  """
  if not policy.parse_precision(precision).bfloat16:
    yield
    return
  with _entered('bfloat16'), tf.compat.v1.variable_creator_scope(
      master_weights.float32_trainable_storage):
    yield


@contextlib.contextmanager
def recast_weights_at_any_batch():
  """Context manager: the weight recast ignores `RECAST_MIN_ROWS` here.

  For graphs built at a stand-in batch: the memory planner builds its
  graphs at small batches and extrapolates to large ones, so every build
  must make the recast decisions of a large batch, not some the one way
  and some the other (a 4x4 stage meets 128 rows at batch 8 and 256 at
  16). Only this thread's builds are affected, and only inside the block.
  """
  previous = state.STATE.recast_at_any_batch
  state.STATE.recast_at_any_batch = True
  try:
    yield
  finally:
    state.STATE.recast_at_any_batch = previous


@contextlib.contextmanager
def float32_ops():
  """Context manager: only the float32 list is in force on this thread.

  Softmax and log-softmax compute in float32 and return their input's dtype;
  cross-entropy, reductions, statistics and summaries compute in float32.
  Nested uses are cheap; inside `autocast('bfloat16')` it changes nothing.
  """
  with _entered('float32_list'):
    yield


@contextlib.contextmanager
def keep_float32():
  """Context manager: ops built inside are left as TensorFlow builds them.

  The escape hatch for a block that must stay float32 inside a bfloat16
  model_fn (e.g. a matmul whose inputs are read from trainable variables).
  """
  with _entered('off'):
    yield
