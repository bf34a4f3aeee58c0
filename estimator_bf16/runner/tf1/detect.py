"""Is this a TF 1.x program? Read its source, and the modules it imports.

TF 1.x code says `import tensorflow as tf` and then uses names that TF 2's
`tensorflow` lacks but `tf.compat.v1` has (`tf.flags`, `tf.logging`,
`tf.train.Optimizer`, `tf.placeholder`), or `tf.contrib`, or imports
modules that only TF 1.x had (`from tensorflow.gfile import Exists`).
`detect` parses the program and, following its imports, the modules it
loads from the given folders (nothing is executed), and returns the first
such use it finds as the reason, e.g. `run_classifier.py:29: tf.flags`. A
program that imports `tensorflow.compat.v1 as tf` is TF 2 code using the
v1 API, and is left as it is, unless it reaches `tf.contrib` through it:
TensorFlow 1.15 had contrib there too, so such code is TF 1.x code.
"""

import ast
import dataclasses
import functools
import os
import types
from typing import Optional

import tensorflow as tf

_COMPAT_V1 = 'tensorflow.compat.v1'


@dataclasses.dataclass(frozen=True)
class Detection:
  """What `detect` found.

  Attributes:
    tf1: whether the program uses the TF 1.x API.
    evidence: 'file:line: tf.NAME' of the first TF 1.x use, or None.
    files: how many source files were read.
  """
  tf1: bool
  evidence: Optional[str]
  files: int


def _resolves(root, names):
  """True if root.names[0].names[1]... exists (stopping at a non-module)."""
  obj = root
  for name in names:
    try:
      obj = getattr(obj, name)
    except AttributeError:
      return False
    # Past the modules the rest is the object's own attributes; reading
    # them can run code (tf.flags.FLAGS parses sys.argv on first read).
    if not isinstance(obj, types.ModuleType):
      return True
  return True


def _is_tf1_only(names, cache):
  """True if tf.NAMES is TF 1.x API: contrib, or in compat.v1 only."""
  key = tuple(names)
  if key not in cache:
    cache[key] = names[0] == 'contrib' or (
        not _resolves(tf, names) and _resolves(tf.compat.v1, names))
  return cache[key]


@functools.lru_cache(maxsize=None)
def tf1_only_module(name):
  """True if only TF 1.x could import `tensorflow.NAME`.

  `contrib`, and the modules of `tf.compat.v1` that TF 2's `tensorflow`
  lacks (gfile, logging, flags, ...): TF 1.x made these importable (`from
  tensorflow.gfile import Exists`); TF 2 has them only as attributes of
  `tf.compat.v1`. Asked per name, as imports come: reading every name of
  `tf.compat.v1` would load its lazy modules (Keras, the Estimator).
  """
  if name == 'contrib':
    return True
  if name.startswith('_') or hasattr(tf, name):
    return False
  return isinstance(getattr(tf.compat.v1, name, None), types.ModuleType)


def _is_tf1_module(parts):
  """True if module `.`.join(parts) exists only in TF 1.x's `tensorflow`."""
  return (len(parts) > 1 and parts[0] == 'tensorflow' and
          tf1_only_module(parts[1]))


def _chain(node):
  """(root name, [attr, ...]) of `a.b.c`, or (None, None)."""
  names = []
  while isinstance(node, ast.Attribute):
    names.append(node.attr)
    node = node.value
  if isinstance(node, ast.Name):
    return node.id, names[::-1]
  return None, None


class _Reader(object):
  """Reads one file: its TF 1.x evidence and the module names it imports."""

  def __init__(self, path, cache):
    self.path = path
    self.cache = cache
    self.imports = []
    self.evidence = None
    self._found_at = None

  def _found(self, node, what):
    # ast.walk goes breadth first; the evidence is the first use by line.
    if self._found_at is None or node.lineno < self._found_at:
      self._found_at = node.lineno
      self.evidence = '%s:%d: %s' % (self.path, node.lineno, what)

  def read(self):
    try:
      with open(self.path, 'rb') as f:
        tree = ast.parse(f.read(), self.path)
    except (OSError, SyntaxError, ValueError):
      return self
    aliases = set()  # names bound to `tensorflow`
    v1_aliases = set()  # names bound to `tensorflow.compat.v1`
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for alias in node.names:
          # `import a.b.c` runs a, a.b and a.b.c.
          parts = alias.name.split('.')
          self.imports += ['.'.join(parts[:i + 1]) for i in range(len(parts))]
          if alias.name == 'tensorflow':
            aliases.add(alias.asname or 'tensorflow')
          elif alias.name == _COMPAT_V1 and alias.asname:
            v1_aliases.add(alias.asname)
          elif _is_tf1_module(parts):
            self._found(node, alias.name.replace('tensorflow', 'tf', 1))
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        parts = node.module.split('.')
        self.imports += ['.'.join(parts[:i + 1]) for i in range(len(parts))]
        self.imports += ['%s.%s' % (node.module, a.name) for a in node.names]
        if node.module == 'tensorflow.compat':
          v1_aliases.update(a.asname or a.name for a in node.names
                            if a.name == 'v1')
        if _is_tf1_module(parts) or (
            node.module == 'tensorflow' and
            any(a.name == 'contrib' for a in node.names)):
          self._found(node, 'from %s import %s' % (
              node.module, ', '.join(a.name for a in node.names)))
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute):
        root, names = _chain(node)
        if root in aliases and _is_tf1_only(names, self.cache):
          self._found(node, 'tf.' + '.'.join(names))
        elif root in v1_aliases and names[0] == 'contrib':
          # TF 1.15 had contrib under compat.v1 too (gpt2-ml's
          # `import tensorflow.compat.v1 as tf` then `tf.contrib.tpu`).
          self._found(node, 'tf.compat.v1.' + '.'.join(names))
    return self


def _module_file(name, folders):
  """The source file of module `name` under one of `folders`, or None."""
  relative = name.replace('.', os.sep)
  for folder in folders:
    for candidate in (os.path.join(folder, relative + '.py'),
                      os.path.join(folder, relative, '__init__.py')):
      if os.path.isfile(candidate):
        return candidate
  return None


def detect(program, folders):
  """Whether `program` (or a module it imports from `folders`) is TF 1.x.

  Args:
    program: path of the program.
    folders: folders its own modules are imported from (its own folder
      first).

  Returns:
    A `Detection`; its evidence is the first TF 1.x use in import order.
  """
  cache = {}
  queue, seen = [program], set()
  while queue:
    path = queue.pop(0)
    real = os.path.realpath(path)
    if real in seen:
      continue
    seen.add(real)
    reader = _Reader(path, cache).read()
    if reader.evidence is not None:
      return Detection(True, reader.evidence, len(seen))
    for name in reader.imports:
      found = _module_file(name, folders)
      if found is not None:
        queue.append(found)
  return Detection(False, None, len(seen))
