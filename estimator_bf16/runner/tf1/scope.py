"""Which modules see TF 1.x `tensorflow`: the program's own, and no others.

A TF 1.x program says `import tensorflow as tf` and means the 1.x API.
Replacing `sys.modules['tensorflow']` would hand that API to tf-slim,
absl, TensorFlow's own modules and this package too. Instead, the modules
of the program's folders get a `__builtins__` of their own whose
`__import__` answers `tensorflow` (and `tensorflow.contrib...`) with
`module.Tf1Module`; Python looks `__import__` up in the builtins of the
importing module, so every other module imports the real TensorFlow. The
same builtins dict marks their frames for TF 1.x shapes
(`module.v1_shapes_for`).

`Tf1Scope(folders)`, used as a context manager:
  * `builtins`: the dict to run the program's `__main__` with;
  * a finder on `sys.meta_path` that gives the same builtins to every
    module imported from a file under `folders` (not from site-packages or
    this package), and to a module from anywhere else outside the Python
    installation whose own source is TF 1.x code (`detect`): programs
    share such modules through `PYTHONPATH` (tensorflow/tpu's
    `models/common`, `models/hyperparameters`);
  * TF 1.x shapes for those modules.
All of it is undone on exit.
"""

import builtins as builtins_module
import importlib.abc
import importlib.machinery
import os
import sys

import estimator_bf16 as eb
from estimator_bf16.runner.tf1.detect import detect as detect_tf1
from estimator_bf16.runner.tf1.detect import tf1_only_module
from estimator_bf16.runner.tf1 import module as module_lib

# The installed package's folder (not this subpackage's): its code is never
# the program's.
_PACKAGE_DIR = os.path.abspath(eb.__path__[0])
# Installed libraries can sit under a program's folder (a virtualenv next
# to the program); they keep the real TensorFlow.
_LIBRARY_DIRS = ('site-packages', 'dist-packages')
# The Python installation (and virtualenv) running the program: the
# standard library and whatever is installed, never the program's code.
_INSTALLATION_DIRS = tuple(sorted({
    os.path.realpath(p) + os.sep for p in (
        sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)}))


def _tf1_target(tf1, name, fromlist):
  """What `import NAME` gives TF 1.x code; None to import it for real.

  `tensorflow` itself, and the modules TF 1.x had under it that TF 2 has
  not (`tensorflow.contrib...`, `tensorflow.gfile`), come from `tf1`; so
  does `tensorflow.compat` (`tf1.compat.v1` is `tf1`, the rest of it is
  TensorFlow's), as TF 1.15 code reaches `tf.contrib` through
  `tensorflow.compat.v1`. Everything else (`tensorflow.python...`,
  `tensorflow.compat.v2...`) is imported for real.
  """
  parts = name.split('.')
  if parts[0] != 'tensorflow':
    return None
  if len(parts) > 1 and not tf1_only_module(parts[1]) and not (
      parts[1:3] in (['compat'], ['compat', 'v1'])):
    return None
  node = tf1
  # Walk the whole path even for a plain `import tensorflow.contrib.x`, so
  # an unmapped module fails on the import line.
  for part in parts[1:]:
    node = getattr(node, part)
  return node if fromlist else tf1


def _make_builtins(tf1):
  real_import = builtins_module.__import__

  def tf1_import(name, globals=None, locals=None, fromlist=(), level=0):  # pylint: disable=redefined-builtin
    if level == 0:
      target = _tf1_target(tf1, name, fromlist)
      if target is not None:
        return target
    return real_import(name, globals, locals, fromlist, level)

  names = dict(vars(builtins_module))
  names['__import__'] = tf1_import
  return names


class _Tf1Loader(importlib.machinery.SourceFileLoader):
  """Loads a source module with the TF 1.x builtins."""

  tf1_builtins = None  # set per instance

  def exec_module(self, module):
    module.__dict__['__builtins__'] = self.tf1_builtins
    super().exec_module(module)


class _Tf1Finder(importlib.abc.MetaPathFinder):
  """Finds modules as Python does; those under the folders load as TF 1.x."""

  def __init__(self, scope):
    self._scope = scope

  def find_spec(self, fullname, path, target=None):
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if (spec is None or type(spec.loader) is not  # pylint: disable=unidiomatic-typecheck
        importlib.machinery.SourceFileLoader or
        not self._scope.covers(spec.origin)):
      return None
    loader = _Tf1Loader(fullname, spec.origin)
    loader.tf1_builtins = self._scope.builtins
    spec.loader = loader
    return spec


class Tf1Scope(object):
  """TF 1.x `tensorflow` for the modules under `folders`; see module doc.

  Args:
    folders: directories whose Python files are TF 1.x code.
  """

  def __init__(self, folders):
    self.folders = tuple(os.path.realpath(f) + os.sep for f in folders)
    self.tf1 = module_lib.Tf1Module()
    self.builtins = _make_builtins(self.tf1)
    self._finder = _Tf1Finder(self)
    self._shapes = None
    self._read = {}  # path outside `folders` -> whether it is TF 1.x code

  def covers(self, path):
    """True if the file at `path` is TF 1.x code of this scope."""
    if not path:
      return False
    path = os.path.realpath(path)
    if path.startswith(_PACKAGE_DIR + os.sep):
      return False
    if any(part in _LIBRARY_DIRS for part in path.split(os.sep)):
      return False
    if path.startswith(self.folders):
      return True
    if (path.startswith(_INSTALLATION_DIRS) or not path.endswith('.py') or
        not os.path.isfile(path)):
      return False
    if path not in self._read:
      # Only this file's own uses count: a module that imports
      # `tensorflow.compat.v1 as tf`, or no TensorFlow, is left alone.
      try:
        self._read[path] = detect_tf1(path, ()).tf1
      except (SyntaxError, UnicodeDecodeError, OSError):
        self._read[path] = False  # Python fails on it as it would anyway
    return self._read[path]

  def __enter__(self):
    self._shapes = module_lib.v1_shapes_for(self.builtins)
    self._shapes.__enter__()
    sys.meta_path.insert(0, self._finder)
    return self

  def __exit__(self, *exc_info):
    try:
      sys.meta_path.remove(self._finder)
    finally:
      self._shapes.__exit__(*exc_info)
    return False
