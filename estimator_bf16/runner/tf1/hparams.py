"""`tf.contrib.training.HParams`, which left TensorFlow with tf.contrib.

TPU programs of 2018-2019 (tensorflow/tpu's amoeba_net, retinanet,
efficientnet's autoaugment) keep their hyperparameters in one: built from
keyword arguments, extended with `add_hparam`, changed with `set_hparam`,
`override_from_dict` or a `--hparams=a=1,b=[2,3]` string (`parse`), read as
attributes or with `values()` / `get`. This class keeps that behaviour;
nothing else in the package uses it.

Values keep the type they were added with: a parsed or set value is
converted to it (an int may become a float, never the other way), and a
list stays a list of its first element's type.
"""

import json
import re

# 'name=value' or 'name=[v1,v2]' pairs of a --hparams string.
_PAIR = re.compile(r'\s*(\w+)\s*=\s*(\[[^\]]*\]|[^,]*)\s*(?:,|$)')


def _convert(name, value, like):
  """`value` as the type of `like` (the current value of hparam `name`)."""
  if like is None or value is None:
    return value
  if isinstance(like, bool):
    if isinstance(value, str):
      lowered = value.strip().lower()
      if lowered in ('true', '1'):
        return True
      if lowered in ('false', '0'):
        return False
      raise ValueError('hparam %s: %r is not a bool.' % (name, value))
    return bool(value)
  if isinstance(like, (list, tuple)):
    if isinstance(value, str):
      inner = value.strip().strip('[]').strip()
      value = [part.strip() for part in inner.split(',')] if inner else []
    element = like[0] if like else None
    return [_convert(name, v, element) for v in value]
  if isinstance(like, int):
    if isinstance(value, float) and not value.is_integer():
      raise ValueError('hparam %s is an int; got %r.' % (name, value))
    return int(float(value)) if isinstance(value, str) else int(value)
  if isinstance(like, float):
    return float(value)
  if isinstance(like, str):
    return str(value)
  return value


class HParams(object):
  """Named hyperparameters, read as attributes.

  Args:
    hparam_def: unused (TF 1.x's protocol buffer form is not supported;
      it must be None).
    model_structure: kept as `model_structure`, as TF 1.x did.
    **kwargs: the hyperparameters and their initial values.
  """

  def __init__(self, hparam_def=None, model_structure=None, **kwargs):
    if hparam_def is not None:
      raise NotImplementedError('HParams(hparam_def=...) is not supported; '
                                'pass the values as keyword arguments.')
    self._names = []
    self._model_structure = model_structure
    for name, value in kwargs.items():
      self.add_hparam(name, value)

  def add_hparam(self, name, value):
    """Adds hyperparameter `name`.

    As TF 1.x's: one that exists with the value None is replaced (programs
    add their flags over such defaults); ValueError if it has a value or
    the name is one of this class's own.
    """
    if hasattr(type(self), name) or getattr(self, name, None) is not None:
      raise ValueError('Hyperparameter name is reserved or exists: %r' % name)
    if name not in self._names:
      self._names.append(name)
    setattr(self, name, value)

  def set_hparam(self, name, value):
    """Sets `name` (which must exist) to `value`, in its type."""
    if name not in self._names:
      raise KeyError('Unknown hyperparameter %r; add it with add_hparam.' %
                     name)
    setattr(self, name, _convert(name, value, getattr(self, name)))

  def del_hparam(self, name):
    if name in self._names:
      self._names.remove(name)
      delattr(self, name)

  def parse(self, values):
    """Sets hyperparameters from 'a=1,b=[2,3],c=text'; returns self."""
    values = (values or '').strip()
    position = 0
    while position < len(values):
      match = _PAIR.match(values, position)
      if match is None or match.end() == position:
        raise ValueError('Could not parse hparams %r at %r.' %
                         (values, values[position:]))
      self.set_hparam(match.group(1), match.group(2).strip())
      position = match.end()
    return self

  def override_from_dict(self, values_dict):
    """Sets each (name, value) of `values_dict`; returns self."""
    for name, value in values_dict.items():
      self.set_hparam(name, value)
    return self

  def values(self):
    """{name: value} of every hyperparameter."""
    return {name: getattr(self, name) for name in self._names}

  def get(self, key, default=None):
    return getattr(self, key) if key in self._names else default

  def to_json(self, indent=None, separators=None, sort_keys=False):
    return json.dumps(self.values(), indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def parse_json(self, values_json):
    return self.override_from_dict(json.loads(values_json))

  @property
  def model_structure(self):
    return self._model_structure

  def __contains__(self, key):
    return key in self._names

  def __str__(self):
    return str(sorted(self.values().items()))

  def __repr__(self):
    return '%s(%s)' % (type(self).__name__, self.__str__())
