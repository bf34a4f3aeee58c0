"""A test module's scratch folder, and the cached results made in it.

Several test modules train once and let many tests read the result: the
runs live in a folder made by `setUpModule` and removed by
`tearDownModule`. pytest-xdist can leave a module and come back to it later
in the same worker, and `setUpModule` then makes a new folder, so a cache
of what was made in the old one must go with it. `ModuleScratch` holds the
folder and those caches together, so no module can forget one of them.
"""

import functools
import shutil
import tempfile


class ModuleScratch(object):
  """The folder of one test module's shared runs, and their caches.

  Usage: `_SCRATCH = ModuleScratch()`, `_SCRATCH.start()` in setUpModule,
  `_SCRATCH.stop()` in tearDownModule, `@_SCRATCH.cached` on the functions
  whose results name files under `_SCRATCH.root`.
  """

  def __init__(self):
    self.root = None
    self._caches = []

  def start(self):
    self.root = tempfile.mkdtemp()

  def stop(self):
    """Removes the folder and forgets every result cached in it."""
    if self.root is not None:
      shutil.rmtree(self.root, ignore_errors=True)
    self.root = None
    for cache in self._caches:
      cache.cache_clear()

  def cached(self, fn):
    """`functools.lru_cache(fn)`, cleared by `stop()`."""
    cache = functools.lru_cache(maxsize=None)(fn)
    self._caches.append(cache)
    return cache
