"""Temporary attribute swaps shared by nested users, undone by the last one.

Autocast, the numeric guard, the memory levers, the program runner, the TPU
resolver stand-in, the TF 1.x shapes of `estimator_bf16 run`, the hidden
deprecation notices, the compat backend's `install()` and the tf-slim repair
all replace attributes of modules or classes they do not own, and must put
the originals back when their last user is done, even if users nest or
several threads enter at once. `Patcher` is the one mechanism they share.

An apply function reads what it replaces when it runs, never at import:
whatever is in place then (TensorFlow's own function, or a stand-in someone
else installed) is what its replacement defers to and what the undo puts
back.

A swap is process-wide: every thread sees the replacement while any user is
active. Whoever installs one must make the replacement decide per thread
(autocast reads thread-local state and acts only on threads that entered
it); the Patcher only counts users safely across threads.
"""

import contextlib
import threading

# An undo entry's original value when the owner had no attribute of its own
# under that name: undoing deletes the attribute again.
MISSING = object()


def restore(undo):
  """Undoes the changes an undo list records, newest first.

  Args:
    undo: a list of entries, each `(owner, attribute name, original value)`,
      restored with `setattr` (or deleted when the original is `MISSING`),
      or a function of no arguments that undoes one change itself (for
      changes `setattr` cannot undo, e.g. a `sys.modules` entry).
  """
  for entry in reversed(undo):
    if callable(entry):
      entry()
      continue
    owner, name, original = entry
    if original is MISSING:
      delattr(owner, name)
    else:
      setattr(owner, name, original)


class Patcher(object):
  """Applies a set of swaps for the outermost user; reentrant.

  The user count is kept under a lock, so threads may start and stop
  concurrently; the swaps themselves are process-wide (see the module doc).
  Use `active()` around a block, or `start()` / `stop()` for a user whose
  lifetime is not a block (each `start()` needs exactly one `stop()`).

  Args:
    apply: a function that performs the swaps and returns the undo list
      (see `restore`); called when the first user starts. If it raises, it
      must have undone what it changed (`restore` on its partial list);
      the Patcher then counts no user. The undo list is restored when the
      last user stops.
  """

  def __init__(self, apply):
    self._apply = apply
    self._lock = threading.RLock()
    self._depth = 0
    self._undo = []
    self._users = ()

  def start(self):
    """Counts a user; the first one applies the swaps."""
    with self._lock:
      if self._depth == 0:
        self._undo = self._apply()
      self._depth += 1

  def stop(self):
    """Uncounts a user; the last one undoes the swaps."""
    with self._lock:
      if self._depth == 0:
        raise RuntimeError('Patcher.stop() without a matching start().')
      self._depth -= 1
      if self._depth == 0:
        undo, self._undo = self._undo, []
        restore(undo)

  @property
  def started(self):
    """True while at least one user is counted (the swaps are in force)."""
    return self._depth > 0

  @property
  def users(self):
    """The objects given to the `active()` blocks now running, oldest first.

    A tuple, replaced (never changed in place) when a block starts or ends,
    so a replacement may read it without the lock.
    """
    return self._users

  @contextlib.contextmanager
  def active(self, user=None):
    """The swaps are in force inside; restored also when the body raises.

    Args:
      user: an object the replacements find in `users` while the block
        runs (e.g. the run a patched constructor serves); None adds none.
        It is matched by identity on exit, and each block removes only its
        own entry, so the same object may enter nested blocks.
    """
    if user is not None:
      with self._lock:
        self._users = self._users + (user,)
    self.start()
    try:
      yield
    finally:
      self.stop()
      if user is not None:
        with self._lock:
          self._users = _without_newest(self._users, user)


def _without_newest(users, user):
  """`users` less its newest entry that is `user` (by identity).

  One entry per block: a user that entered twice (nested blocks given the
  same object) stays listed until its outer block ends.
  """
  for index in range(len(users) - 1, -1, -1):
    if users[index] is user:
      return users[:index] + users[index + 1:]
  return users
