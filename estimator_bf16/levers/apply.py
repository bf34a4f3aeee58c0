"""Memory levers beyond bfloat16, applied to an unmodified model_fn.

Two levers change how a TRAIN graph computes its gradients, and nothing
else in it:

  * gradient accumulation (`gradient_accumulation_steps=K`): each update
    applies the mean gradient of K micro-batches (`accumulation`);
  * recomputation (`recompute=True`): activations are recomputed segment
    by segment during backprop instead of kept from the forward pass
    (`recompute`).

Both work by standing in for TensorFlow's gradient function while the
model_fn runs: `tf.gradients`, `tf.compat.v1.gradients` and the one that
`tf.compat.v1.train.Optimizer.compute_gradients` (so also `minimize`, a
`CrossShardOptimizer` and this package's optimizers) calls. A call counts
when all its `xs` are variables -- the gradients an update applies; a
gradient with respect to a tensor (a gradient penalty, saliency) is left
to TensorFlow. The swap is process-wide while any model_fn is being built
(`patching.Patcher`) but acts only in the thread building it, and is undone
when the model_fn returns or raises.

Nothing here depends on the precision or on tf.estimator.
"""

import contextlib
import functools
import inspect
import threading

import tensorflow as tf
from tensorflow.python.ops import gradients as gradients_module

from estimator_bf16.compat import calling
from estimator_bf16.levers import accumulation
from estimator_bf16.levers import batch_dim
from estimator_bf16.levers import device_accumulation
from estimator_bf16.levers import recompute as recompute_lib
from estimator_bf16.platform import patching



class _Local(threading.local):
  """Per-thread state: the active levers and patched-call depth."""

  def __init__(self):
    super().__init__()
    self.active = []
    self.inside = 0


_LOCAL = _Local()


class _Levers(object):
  """What one model_fn build asked for and what its gradient calls did."""

  def __init__(self, steps, recompute, device=None):
    self.steps = steps
    self.recompute = recompute
    # On a TPU the micro-steps are a loop inside the step (`device`);
    # elsewhere a hook runs them between steps (`accumulators`).
    self.device = device
    self.accumulators = (accumulation.Accumulators(steps)
                         if steps > 1 and device is None else None)
    self.calls = 0


def _is_variable(value):
  """A variable, or the ref-typed tensor of a reference variable.

  A v1 optimizer differentiates with respect to a reference variable's
  ref tensor (`variable._ref()`), as programs that call
  `disable_v2_behavior()` or `disable_resource_variables()` make them.
  """
  return isinstance(value, tf.Variable) or (
      isinstance(value, tf.Tensor) and value.dtype._is_ref_dtype)  # pylint: disable=protected-access


def _gradients_in_levers(original):
  """`original` (a tf.gradients function) with the active levers applied."""
  signature = inspect.signature(original)

  @functools.wraps(original)
  def gradients(*args, **kwargs):
    levers = _LOCAL.active[-1] if _LOCAL.active else None
    if levers is None or _LOCAL.inside:
      return original(*args, **kwargs)
    arguments = signature.bind(*args, **kwargs).arguments
    xs = arguments['xs']
    xs_list = list(xs) if isinstance(xs, (list, tuple)) else [xs]
    if not xs_list or not all(_is_variable(x) for x in xs_list):
      return original(*args, **kwargs)
    options = {k: v for k, v in arguments.items()
               if k not in ('ys', 'xs', 'grad_ys', 'name')}
    gradients_fn = None
    _LOCAL.inside += 1
    try:
      if levers.recompute:
        gradients_fn = recompute_lib.gradients_with_recompute
        # Under TensorFlow's own name scope, where the audit and the
        # planner look for the backward pass.
        grads = recompute_lib.gradients_with_recompute(
            arguments['ys'], xs_list, arguments.get('grad_ys'),
            name=arguments.get('name') or 'gradients', **options)
      else:
        grads = original(*args, **kwargs)
      if levers.device is not None:
        ys = arguments['ys']
        ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
        grad_ys = arguments.get('grad_ys')
        if grad_ys is not None and not isinstance(grad_ys, (list, tuple)):
          grad_ys = [grad_ys]
        grads = levers.device.mean_gradients(
            [tf.convert_to_tensor(y) for y in ys], xs_list, grad_ys,
            list(grads), options, gradients_fn)
    finally:
      _LOCAL.inside -= 1
    levers.calls += 1
    if levers.accumulators is not None:
      grads = levers.accumulators.mean_gradients(list(grads), xs_list)
    return list(grads)

  return gradients


def _swap_gradient_functions():
  undo = []
  # The module attribute the v1 optimizers call, and the two public names.
  for owner, name in ((gradients_module, 'gradients'),
                      (tf.compat.v1, 'gradients'), (tf, 'gradients')):
    original = getattr(owner, name)
    setattr(owner, name, _gradients_in_levers(original))
    undo.append((owner, name, original))
  return undo


_PATCHER = patching.Patcher(_swap_gradient_functions)


@contextlib.contextmanager
def _levers_active(levers):
  with _PATCHER.active():
    _LOCAL.active.append(levers)
    try:
      yield levers
    finally:
      _LOCAL.active.remove(levers)


def check_levers(gradient_accumulation_steps=1, recompute=False):
  """Checks the lever arguments; returns them.

  Raises:
    ValueError: K is not an integer >= 1, or recompute is not a bool.
  """
  accumulation.check_steps(gradient_accumulation_steps)
  if not isinstance(recompute, bool):
    raise ValueError('recompute must be True or False, got %r.' %
                     (recompute,))
  return gradient_accumulation_steps, recompute


def _batch_size(params, features):
  """The batch of one step's input: params['batch_size'], or dimension 0."""
  batch = ((params or {}).get('batch_size') or
           batch_dim.static_batch_size(features, None))
  if not batch:
    raise ValueError('gradient accumulation on a TPU needs the batch: give '
                     "params['batch_size'] or inputs of a static batch.")
  return batch


def _spec_with(spec, train_op, hook):
  # A tuple: TPUEstimatorSpec adds its own hooks to it as a tuple.
  hooks = tuple(getattr(spec, 'training_hooks', None) or ()) + (hook,)
  return spec._replace(train_op=train_op, training_hooks=hooks)


def levers_model_fn(model_fn, gradient_accumulation_steps=1,
                    recompute=False):
  """Wraps a model_fn so its TRAIN graph uses the memory levers.

  Args:
    model_fn: `(features, labels, mode[, params][, config])` returning an
      `EstimatorSpec` or `TPUEstimatorSpec` (a namedtuple); left unmodified.
      It is called with the micro-batch: off a TPU the caller gives the
      input_fn and model_fn `train_batch_size / gradient_accumulation_steps`;
      on a TPU (`params['use_tpu']`) the input_fn keeps the update's batch
      and this wrapper hands the model_fn its first micro-batch.
    gradient_accumulation_steps: int >= 1, micro-batches per update (1: no
      accumulation). Off a TPU the returned TRAIN spec's `train_op` is one
      update: the K-th micro-step and the program's own train op applying
      the mean; its `training_hooks` gain the
      `accumulation.AccumulationHook` that runs the K - 1 micro-steps
      before it. On a TPU the step itself loops over the micro-batches
      (`device_accumulation`) and the spec is the program's.
    recompute: recompute activations during backprop (`recompute`).

  Returns:
    A model_fn `(features, labels, mode, params, config)`; `model_fn`
    itself when no lever is on. EVAL and PREDICT graphs are unchanged.

  Raises:
    ValueError: bad lever values or model_fn signature (now); at build
      time, a TRAIN graph whose model_fn computed no gradients of
      variables, or on a TPU a batch K does not divide or a forward pass
      in TensorFlow 1.x control flow.
  """
  steps, recompute = check_levers(gradient_accumulation_steps, recompute)
  accepted = calling.model_fn_arg_names(model_fn)
  if steps == 1 and not recompute:
    return model_fn

  @functools.wraps(model_fn)
  def model_fn_with_levers(features, labels=None, mode=None, params=None,
                           config=None):
    kwargs = calling.model_fn_kwargs(accepted, labels, mode, params, config)
    if mode != calling.TRAIN:
      return model_fn(features=features, **kwargs)
    device = None
    if steps > 1 and (params or {}).get('use_tpu'):
      # The device loop runs the steps: the micro-steps are a loop inside
      # each one (`device_accumulation`), the model_fn sees micro-batch 0.
      device = device_accumulation.DeviceAccumulation(
          features, labels, _batch_size(params, features), steps)
      features = device.features
      params = dict(params, batch_size=device.micro_batch)
      kwargs = calling.model_fn_kwargs(accepted, device.labels, mode, params,
                                       config)
    graph = tf.compat.v1.get_default_graph()
    update_ops_before = len(
        graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS))
    with _levers_active(_Levers(steps, recompute, device)) as levers:
      spec = model_fn(features=features, **kwargs)
    if not levers.calls:
      raise ValueError(
          'gradient_accumulation_steps=%d / recompute=%s: the model_fn '
          'computed no gradients of variables through tf.gradients or a '
          'tf.compat.v1 Optimizer, so the levers have nothing to act on '
          '(Keras optimizers and GradientTape are not covered).' %
          (steps, recompute))
    if levers.accumulators is None:
      return spec
    # Moving averages (batch norm) follow every micro-batch, as they would
    # every step without accumulation.
    update_ops = graph.get_collection(
        tf.compat.v1.GraphKeys.UPDATE_OPS)[update_ops_before:]
    train_op = levers.accumulators.finish(spec.train_op, update_ops)
    return _spec_with(spec, train_op,
                      accumulation.AccumulationHook(steps))

  # Estimators read argument names to decide what to pass: show all five.
  del model_fn_with_levers.__wrapped__
  return model_fn_with_levers

