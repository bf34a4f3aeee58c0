"""The arguments of a model_fn: which of the Estimator's five it takes."""

import inspect

_MODEL_FN_ARGS = ('features', 'labels', 'mode', 'params', 'config')


def signature(fn, what):
  """`inspect.signature(fn)`; a TypeError naming `what` if there is none."""
  if not callable(fn):
    raise TypeError('%s must be callable, got %r.' % (what, fn))
  try:
    return inspect.signature(fn)
  except (TypeError, ValueError) as e:
    raise TypeError('Cannot read the signature of %s %r: %s' % (what, fn, e))


def model_fn_arg_names(model_fn):
  """Returns the Estimator arguments model_fn takes; raises if unsupported."""
  found = signature(model_fn, 'model_fn')
  names = []
  for param in found.parameters.values():
    if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
      continue
    if param.name in _MODEL_FN_ARGS:
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


