"""Numeric guards: stop on the first NaN/Inf, before it reaches the weights.

A diverging bfloat16 run usually shows up as a NaN loss many steps after the
cause, and by then the NaN is in the variables and, at the next save, in the
checkpoint. The guard checks the loss and every gradient in the same
`session.run` as the update and makes the update wait for the check, so the
step whose numbers went bad is never applied:

    model_fn = guards.guard_model_fn(model_fn)       # compose with anything
    estimator = eb.make_tpu_estimator(model_fn, precision='bfloat16', ...)
    try:
      estimator.train(input_fn, max_steps=...)
    except tf.errors.InvalidArgumentError as e:
      raise guards.translate_error(e) or e           # -> NumericGuardError

It works by wrapping `tf.compat.v1.train.Optimizer.compute_gradients` and
`apply_gradients` (and overrides of them in subclasses) while model_fn runs,
with the same patch-and-restore discipline as the float32 list: the wrappers
are removed when model_fn returns or raises, and calls from other threads
pass through untouched. Nothing here depends on the precision or on
tf.estimator. Its bench/debug companion, which watches activation ranges,
is `activation_stats.ActivationStatsHook`.
"""

import contextlib
import functools
import re
import threading
import weakref

from absl import logging
import tensorflow as tf

from estimator_bf16.compat import calling
from estimator_bf16.platform import patching

_MARKER = 'numeric guard:'
_MESSAGE_RE = re.compile(
    re.escape(_MARKER) + r' NaN/Inf at global step (\S+) in (.*)\. The update '
    r'of this step was not applied', re.DOTALL)


class NumericGuardError(FloatingPointError):
  """Training stopped on a NaN/Inf; the update of that step was not applied.

  Attributes:
    step: int, the global step when the check failed (the update that would
      have made it step + 1 never ran), or None if unknown.
    tensors: list of str, what was not finite, e.g.
      'gradient of dense/kernel (3 NaN, 0 Inf of 5120 values)'.
  """

  def __init__(self, message, step=None, tensors=()):
    super().__init__(message)
    self.step = step
    self.tensors = list(tensors)


def translate_error(error):
  """Returns the `NumericGuardError` behind a TensorFlow error, or None.

  Args:
    error: an exception raised by `session.run` / `Estimator.train`.

  Returns:
    A `NumericGuardError` naming the step and the tensors if `error` came
    from a guard check, else None.
  """
  match = _MESSAGE_RE.search(getattr(error, 'message', None) or str(error))
  if not match:
    return None
  step_text, what = match.groups()
  step = int(step_text) if step_text.isdigit() else None
  tensors = [part.strip() for part in what.split('; ') if part.strip()]
  message = ('NaN/Inf at global step %s in %s. The update of that step was '
             'not applied: the variables and the checkpoints keep their '
             'values from before it.' % (step_text, '; '.join(tensors)))
  return NumericGuardError(message, step=step, tensors=tensors)


def _raising_guard_errors(train):
  """`train`, raising `NumericGuardError` for a guard's stop."""

  @functools.wraps(train)
  def train_raising_guard_errors(*args, **kwargs):
    try:
      return train(*args, **kwargs)
    except tf.errors.InvalidArgumentError as e:
      numeric = translate_error(e)
      if numeric is None:
        raise
      raise numeric from e

  return train_raising_guard_errors


def _swap_train(estimator_ref):
  """Wraps one estimator's `train` on the instance; the Patcher's apply.

  Not a TensorFlow swap: the class and every other estimator keep their
  `train`; only this instance (one the package made, in
  `make_tpu_estimator`) gets an attribute of its own. It goes through a
  Patcher all the same, so that it is applied once however many users ask,
  reads the `train` in place when applied (a stand-in an instance already
  had is wrapped, and put back), and is undone by the last user.
  """
  estimator = estimator_ref()
  original = vars(estimator).get('train', patching.MISSING)
  estimator.train = _raising_guard_errors(estimator.train)

  def undo():
    # By weak reference, so that the Patcher (kept beside the estimator,
    # not on it) does not keep a started estimator alive.
    target = estimator_ref()
    if target is not None:
      patching.restore([(target, 'train', original)])

  return [undo]


# One Patcher per estimator given to `raise_guard_errors`, for as long as
# the estimator lives.
_TRAIN_PATCHERS = weakref.WeakKeyDictionary()
_TRAIN_PATCHERS_LOCK = threading.Lock()


def _train_patcher(estimator):
  with _TRAIN_PATCHERS_LOCK:
    patcher = _TRAIN_PATCHERS.get(estimator)
    if patcher is None:
      patcher = patching.Patcher(
          functools.partial(_swap_train, weakref.ref(estimator)))
      _TRAIN_PATCHERS[estimator] = patcher
    return patcher


def raise_guard_errors(estimator):
  """Makes `estimator.train` raise `NumericGuardError` for a guard's stop.

  The guard stops a step with a `tf.errors.InvalidArgumentError` from inside
  the session; this turns that error into the `NumericGuardError` it stands
  for (the original chained as its cause). Other errors pass unchanged.
  Only this estimator is changed; `stop_raising_guard_errors` undoes it.

  Args:
    estimator: an Estimator whose model_fn went through `guard_model_fn`.

  Returns:
    `estimator`, whose `train` is wrapped on this instance only (once,
    however often this is called).
  """
  _train_patcher(estimator).start()
  return estimator


def stop_raising_guard_errors(estimator):
  """Undoes one `raise_guard_errors(estimator)`; the last puts `train` back.

  Args:
    estimator: an estimator given to `raise_guard_errors`.

  Raises:
    RuntimeError: if there is no `raise_guard_errors` left to undo.
  """
  _train_patcher(estimator).stop()


class _Local(threading.local):
  """Per-thread guard state: the active guards and patched-call depth."""

  def __init__(self):
    super().__init__()
    self.guards = []
    self.inside = 0


_LOCAL = _Local()


class _Guard(object):
  """What one `numeric_guard()` block has seen."""

  def __init__(self):
    self.pending = {}  # graph -> [check tensors of compute_gradients]
    self.checked = {}  # id -> gradient already checked (kept alive here)
    self.updates = 0


@contextlib.contextmanager
def _inside_patched_call():
  # An override that calls the base method (CrossShardOptimizer does) must
  # be checked once, at the outermost call, not once per level.
  _LOCAL.inside += 1
  try:
    yield
  finally:
    _LOCAL.inside -= 1


def _active_guard():
  if not _LOCAL.guards or _LOCAL.inside:
    return None
  return _LOCAL.guards[-1]


def _values(tensor):
  if isinstance(tensor, tf.IndexedSlices):
    return tensor.values
  return tensor


def _variable_name(variable):
  op = getattr(variable, 'op', None)
  return op.name if op is not None else str(variable)


def _finite_check(items, global_step):
  """Returns a bool tensor that is True when every item is finite.

  When one is not, the returned tensor raises instead, with a message that
  names the step and each non-finite item with its NaN and Inf counts. The
  counting only runs on that failure path.

  Args:
    items: list of (tensor or IndexedSlices, description); the tensors of
      any floating dtype and shape.
    global_step: the global step tensor, or None.
  """
  with tf.name_scope('numeric_guard'):
    values = [_values(t) for t, _ in items]
    finite = tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in values])
    all_finite = tf.reduce_all(finite)

    def raise_error():
      # Every value in one float64 vector (exact for every float dtype),
      # counted per item from running totals at the items' boundaries, and
      # the lines formatted as one string vector: a few ops per item rather
      # than a dozen. The branch is built into every guarded step of every
      # model (a ResNet-50 has 161 gradients) and runs only when a check
      # fails. Nothing here is as long as the values but what runs then: a
      # per-value index vector would be, and grappler would fold it into a
      # constant of every model's size from the static shapes.
      sizes = tf.stack([tf.size(v, out_type=tf.int64) for v in values])
      flat = tf.concat([tf.reshape(tf.cast(v, tf.float64), [-1])
                        for v in values], 0)
      ends = tf.cumsum(sizes)
      starts = ends - sizes

      def count(predicate):
        running = tf.concat(
            [[0], tf.cumsum(tf.cast(predicate(flat), tf.int64))], 0)
        return tf.strings.as_string(tf.gather(running, ends) -
                                    tf.gather(running, starts))

      lines = tf.strings.join([
          tf.constant([description for _, description in items]), ' (',
          count(tf.math.is_nan), ' NaN, ', count(tf.math.is_inf),
          ' Inf of ', tf.strings.as_string(sizes), ' values)'])
      bad = tf.boolean_mask(lines, tf.logical_not(finite))
      step = ('?' if global_step is None else
              tf.strings.as_string(tf.cast(global_step, tf.int64)))
      message = tf.strings.join([
          _MARKER, ' NaN/Inf at global step ', step, ' in ',
          tf.strings.reduce_join(bad, separator='; '),
          '. The update of this step was not applied.'])
      with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
        return tf.constant(False)

    return tf.cond(all_finite, lambda: tf.constant(True), raise_error)


def _after(condition, gradient):
  """`gradient`, available only once `condition` has been computed."""
  if gradient is None:
    return None
  with tf.control_dependencies([condition]):
    if isinstance(gradient, tf.IndexedSlices):
      return tf.IndexedSlices(tf.identity(gradient.values), gradient.indices,
                              gradient.dense_shape)
    return tf.identity(gradient)


def _global_step(args, kwargs):
  if 'global_step' in kwargs:
    return kwargs['global_step']
  if args:
    return args[0]
  return tf.compat.v1.train.get_global_step()


def _guarded_compute_gradients(original):
  @functools.wraps(original)
  def compute_gradients(self, loss, *args, **kwargs):
    guard = _active_guard()
    with _inside_patched_call():
      grads_and_vars = original(self, loss, *args, **kwargs)
    if guard is None or not isinstance(loss, tf.Tensor):
      return grads_and_vars
    # Checked here, before any clipping mixes one bad gradient into all
    # of them, so the message names the variable where the NaN started.
    items = [(loss, 'loss')] + [
        (g, 'gradient of ' + _variable_name(v))
        for g, v in grads_and_vars if g is not None]
    check = _finite_check(items, tf.compat.v1.train.get_global_step())
    guard.pending.setdefault(loss.graph, []).append(check)
    guard.checked.update((id(g), g) for g, _ in grads_and_vars)
    return grads_and_vars
  return compute_gradients


def _guarded_apply_gradients(original):
  @functools.wraps(original)
  def apply_gradients(self, grads_and_vars, *args, **kwargs):
    guard = _active_guard()
    if guard is None:
      with _inside_patched_call():
        return original(self, grads_and_vars, *args, **kwargs)
    grads_and_vars = list(grads_and_vars)
    graph = tf.compat.v1.get_default_graph()
    earlier = guard.pending.pop(graph, [])
    # Gradients changed since compute_gradients (clipped, summed, scaled)
    # are checked again, after the raw ones so that a raw NaN is reported
    # first; the update waits for every check.
    items = [(g, 'gradient of %s (as applied)' % _variable_name(v))
             for g, v in grads_and_vars
             if g is not None and guard.checked.get(id(g)) is not g]
    if items:
      with tf.control_dependencies(earlier):
        check = _finite_check(items, _global_step(args, kwargs))
    else:
      check = tf.group(*earlier)
    grads_and_vars = [(_after(check, g), v) for g, v in grads_and_vars]
    guard.updates += 1
    with _inside_patched_call():
      return original(self, grads_and_vars, *args, **kwargs)
  return apply_gradients


def _optimizer_classes():
  found, todo = [], [tf.compat.v1.train.Optimizer]
  while todo:
    cls = todo.pop()
    if cls not in found:
      found.append(cls)
      todo.extend(cls.__subclasses__())
  return found


def _wrap_optimizers():
  """Wraps the gradient methods each v1 optimizer class defines itself."""
  undo = []
  for cls in _optimizer_classes():
    for name, wrap in (('compute_gradients', _guarded_compute_gradients),
                       ('apply_gradients', _guarded_apply_gradients)):
      original = cls.__dict__.get(name)
      if original is not None:
        setattr(cls, name, wrap(original))
        undo.append((cls, name, original))
  return undo


_PATCHER = patching.Patcher(_wrap_optimizers)


@contextlib.contextmanager
def numeric_guard():
  """Context manager: v1 optimizers built inside it get the guard.

  Every `compute_gradients` (so also `minimize`) checks the loss and the raw
  gradients, and every `apply_gradients` checks the gradients it applies and
  runs the update only after both checks pass. A failed check raises
  `tf.errors.InvalidArgumentError` at run time, which `translate_error`
  turns into a `NumericGuardError`.

  Yields:
    An object whose `updates` attribute counts the guarded
    `apply_gradients` calls made inside the block.
  """
  guard = _Guard()
  with _PATCHER.active():
    _LOCAL.guards.append(guard)
    try:
      yield guard
    finally:
      _LOCAL.guards.remove(guard)


def guard_model_fn(model_fn):
  """Wraps a model_fn so its TRAIN graph carries the numeric guard.

  Compose it with the precision wrapper in either order, e.g.
  `eb.make_tpu_estimator(guard_model_fn(model_fn), ...)`. EVAL and PREDICT
  graphs are left alone. On a TPU (`params['use_tpu']`) the guard stands
  aside with a warning: XLA compiles assertions to nothing, so it could not
  stop anything there.

  Args:
    model_fn: `(features, labels, mode[, params][, config])`.

  Returns:
    A model_fn `(features, labels, mode, params, config)`.

  Raises:
    ValueError: a model_fn signature an Estimator cannot call.
  """
  accepted = calling.model_fn_arg_names(model_fn)

  @functools.wraps(model_fn)
  def guarded_model_fn(features, labels=None, mode=None, params=None,
                       config=None):
    kwargs = calling.model_fn_kwargs(accepted, labels, mode, params, config)
    if mode != calling.TRAIN:
      return model_fn(features=features, **kwargs)
    if (params or {}).get('use_tpu'):
      logging.warning('numeric guard: off on a TPU, where XLA drops '
                      'assertions; the Estimator still stops on a NaN loss.')
      return model_fn(features=features, **kwargs)
    with numeric_guard() as guard:
      spec = model_fn(features=features, **kwargs)
    if not guard.updates:
      logging.warning('numeric guard: model_fn made no tf.compat.v1 '
                      'Optimizer update, so nothing was guarded.')
    return spec

  # Estimators read argument names to decide what to pass: show all five.
  del guarded_model_fn.__wrapped__
  return guarded_model_fn

