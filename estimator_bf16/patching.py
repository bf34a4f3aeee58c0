"""Temporary attribute swaps shared by nested users, undone by the last one.

Autocast and the numeric guard both replace functions while a model_fn runs
and must put the originals back when it returns or raises, even if wrapped
model_fns nest or several threads build model_fns at once.

A swap is process-wide: every thread sees the replacement while any user is
active. Whoever installs one must make the replacement decide per thread
(autocast reads thread-local state and acts only on threads that entered
it); the Patcher only counts users safely across threads.
"""

import contextlib
import threading


class Patcher(object):
  """Applies a set of swaps for the outermost user; reentrant.

  The user count is kept under a lock, so threads may enter and leave
  concurrently; the swaps themselves are process-wide (see the module doc).

  Args:
    apply: a function that performs the swaps and returns the undo list,
      `[(owner, attribute name, original value), ...]`; called when the
      outermost `active()` starts. The undo entries are restored with
      `setattr` in reverse order when it ends.
  """

  def __init__(self, apply):
    self._apply = apply
    self._lock = threading.RLock()
    self._depth = 0
    self._undo = []

  def _enter(self):
    with self._lock:
      self._depth += 1
      if self._depth == 1:
        self._undo = self._apply()

  def _exit(self):
    with self._lock:
      self._depth -= 1
      if self._depth == 0:
        undo, self._undo = self._undo, []
        for owner, name, original in reversed(undo):
          setattr(owner, name, original)

  @contextlib.contextmanager
  def active(self):
    """The swaps are in force inside; restored also when the body raises."""
    self._enter()
    try:
      yield
    finally:
      self._exit()
