"""The Estimator's calling rule: which arguments a model_fn / input_fn gets.

An Estimator passes a model_fn `features` and, each only if the function
declares it by name, `labels`, `mode`, `params` and `config`; an input_fn
gets `params`, `mode`, `config` and (under a distribution strategy)
`input_context` the same way. So `model_fn(features, labels, mode, params)`,
`input_fn(params)` and `input_fn()` all work unchanged. Every place in the
package that calls a user's function (the precision wrapper, the numeric
guard, the levers, the compat Estimator, the runner, the memory planner)
calls it through this module, so they agree on what a function accepts and
on the error a bad signature gets.

The mode strings are here too: they are the same in tf.estimator and in the
compat backend, and code below the Estimator needs them without importing
either.
"""

import functools
import inspect

# tf.estimator.ModeKeys' values (estimator_bf16.compat.ModeKeys uses these).
TRAIN = 'train'
EVAL = 'eval'
PREDICT = 'infer'

MODEL_FN_ARGS = ('features', 'labels', 'mode', 'params', 'config')
INPUT_FN_ARGS = ('params', 'mode', 'config', 'input_context')


def signature(fn, what):
  """`inspect.signature(fn)`; a TypeError naming `what` if there is none."""
  if not callable(fn):
    raise TypeError('%s must be callable, got %r.' % (what, fn))
  try:
    return inspect.signature(fn)
  except (TypeError, ValueError) as e:
    raise TypeError('Cannot read the signature of %s %r: %s' % (what, fn, e))


def arg_names(fn, what):
  """The names of `fn`'s named parameters (functools.partial-aware).

  Args:
    fn: a callable.
    what: its role in error messages, e.g. `'input_fn'`.

  Returns:
    A tuple of str, `*args` and `**kwargs` left out.

  Raises:
    TypeError: `fn` is not callable or has no readable signature.
  """
  parameters = signature(fn, what).parameters.values()
  return tuple(p.name for p in parameters
               if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def estimator_arg_names(fn):
  """The argument names tf.estimator reads of `fn`, by its own rule.

  TensorFlow 2.15's `function_utils.fn_args`, restated so that both
  backends can hold a wrapper to it: a `functools.partial` gives its
  function's positional-or-keyword names minus those it binds (a name
  after a keyword-bound one stays, though `inspect.signature` makes it
  keyword-only); a callable object gives its `__call__`'s, a bound method
  its function's without `self`. Keyword-only names, and the names behind a
  `functools.wraps` wrapper of `(*args, **kwargs)`, are not read.

  Args:
    fn: a callable.

  Returns:
    A tuple of str.
  """
  if isinstance(fn, functools.partial):
    names = estimator_arg_names(fn.func)
    return tuple(name for name in names[len(fn.args):]
                 if name not in (fn.keywords or {}))
  if hasattr(fn, '__call__') and inspect.ismethod(fn.__call__):
    fn = fn.__call__
  names = inspect.getfullargspec(fn).args
  if inspect.ismethod(fn) and fn.__self__ is not None and names:
    names = names[1:]
  return tuple(names)


def offered_signature(fn, what):
  """A signature for a wrapper of `fn` that both rules read as `fn`'s.

  Positional-or-keyword parameters named by `estimator_arg_names(fn)`
  (what tf.estimator 2.15 passes), then `fn`'s other named parameters as
  keyword-only (what this module's rule, `arg_names`, also passes), then
  its `**kwargs`. A wrapper that forwards `(*args, **kwargs)` to `fn` and
  carries this signature is called with exactly the arguments `fn` would
  be called with, by either backend: copying `inspect.signature(fn)`
  instead loses a keyword-bound partial's later names for tf.estimator.

  Args:
    fn: a callable.
    what: its role in error messages, e.g. `'input_fn'`.

  Returns:
    An `inspect.Signature`.

  Raises:
    TypeError: `fn` is not callable or has no readable signature.
  """
  found = signature(fn, what)
  read = estimator_arg_names(fn)
  by_name = found.parameters
  empty = inspect.Parameter.empty
  positional = []
  for name in read:
    default = by_name[name].default if name in by_name else empty
    if default is empty and positional and positional[-1].default is not empty:
      # A keyword-bound partial's later names may lack defaults after one
      # that has one; an Estimator passes them by name either way.
      default = None
    positional.append(inspect.Parameter(
        name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default))
  rest = [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY,
                            default=p.default)
          for p in by_name.values()
          if p.name not in read and p.kind not in (p.VAR_POSITIONAL,
                                                   p.VAR_KEYWORD)]
  var_keyword = [p for p in by_name.values() if p.kind == p.VAR_KEYWORD]
  return inspect.Signature(positional + rest + var_keyword)


def model_fn_arg_names(model_fn):
  """Returns the Estimator arguments model_fn takes; raises if unsupported.

  Args:
    model_fn: the user's model_fn.

  Returns:
    A tuple of the names in `MODEL_FN_ARGS` that `model_fn` declares.

  Raises:
    TypeError: `model_fn` is not callable or has no readable signature.
    ValueError: it takes no `features`, or a required argument an
      Estimator cannot pass.
  """
  found = signature(model_fn, 'model_fn')
  names = []
  for param in found.parameters.values():
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
      continue
    if param.name in MODEL_FN_ARGS:
      names.append(param.name)
    elif param.default is param.empty:
      raise ValueError(
          'model_fn %r has the argument %r, which an Estimator cannot pass. '
          'A model_fn takes (features, labels, mode, params, config), any '
          'subset containing features; give %r a default or bind it with '
          'functools.partial.' % (getattr(model_fn, '__name__', model_fn),
                                  param.name, param.name))
  if 'features' not in names:
    raise ValueError('model_fn %r must take a `features` argument; its '
                     'signature is %s.' % (
                         getattr(model_fn, '__name__', model_fn), found))
  return tuple(names)


def model_fn_kwargs(accepted, labels, mode, params, config):
  """The keyword arguments (besides features) a model_fn taking `accepted` gets.

  Args:
    accepted: the argument names from `model_fn_arg_names(model_fn)`.
    labels, mode, params, config: what the Estimator passed.

  Returns:
    A dict with only the arguments the model_fn takes.

  Raises:
    ValueError: labels were given to a model_fn without a labels argument.
  """
  if labels is not None and 'labels' not in accepted:
    raise ValueError('model_fn does not take labels, but the input_fn '
                     'returned labels.')
  kwargs = {'labels': labels, 'mode': mode, 'params': params,
            'config': config}
  return {k: v for k, v in kwargs.items() if k in accepted}


def call_model_fn(model_fn, features, labels=None, mode=None, params=None,
                  config=None, accepted=None):
  """Calls `model_fn` the way an Estimator does; returns what it returns.

  Args:
    model_fn: the model_fn.
    features: its features (passed by name, as tf.estimator does).
    labels, mode, params, config: passed only if `model_fn` declares them.
    accepted: `model_fn_arg_names(model_fn)`, when the caller has read it
      already (a wrapper reads it once, when it is built).

  Returns:
    The model_fn's result (an EstimatorSpec or TPUEstimatorSpec).

  Raises:
    TypeError, ValueError: as `model_fn_arg_names` and `model_fn_kwargs`.
  """
  if accepted is None:
    accepted = model_fn_arg_names(model_fn)
  return model_fn(features=features, **model_fn_kwargs(
      accepted, labels, mode, params, config))


def input_fn_kwargs(input_fn, params=None, mode=None, config=None,
                    input_context=None):
  """The keyword arguments an Estimator gives `input_fn`.

  Args:
    input_fn: the input_fn.
    params, mode, config, input_context: passed only if `input_fn` declares
      them.

  Returns:
    A dict of the arguments among `INPUT_FN_ARGS` that `input_fn` declares.

  Raises:
    TypeError: `input_fn` is not callable or has no readable signature.
  """
  names = arg_names(input_fn, 'input_fn')
  values = zip(INPUT_FN_ARGS, (params, mode, config, input_context))
  return {k: v for k, v in values if k in names}
