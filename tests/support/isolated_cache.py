"""A throw-away directory for a test module, holding the digits cache.

Tests that train on the built-in digits must not write into the user's
`~/.cache`; they point `ESTIMATOR_BF16_CACHE` at a temporary directory for
the module's lifetime.
"""

import os
import shutil
import tempfile
from unittest import mock


class IsolatedCache(object):
  """`start()` in setUpModule, `stop()` in tearDownModule.

  Attributes:
    root: the temporary directory (None before `start()`); the cache is its
      `cache/` subdirectory, and tests may put model_dirs beside it.
  """

  def __init__(self):
    self.root = None
    self._env = None

  def start(self):
    self.root = tempfile.mkdtemp()
    self._env = mock.patch.dict(
        os.environ, {'ESTIMATOR_BF16_CACHE': os.path.join(self.root, 'cache')})
    self._env.start()

  def stop(self):
    self._env.stop()
    shutil.rmtree(self.root, ignore_errors=True)
