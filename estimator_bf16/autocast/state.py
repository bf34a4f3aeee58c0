"""Autocast's per-thread state and TensorFlow's own op-creation functions.

Holds the one `threading.local` every autocast module reads (which modes
this thread entered, whether autocast is making its own ops, the casts made
so far, a cache of trainable variable names) and the three functions
autocast stands in for, read when its swap is applied (`contexts`), so that
the rules can still create ops the way they were created before:
TensorFlow's own functions, or whatever stand-in was installed at that
time.
"""

import threading

from tensorflow.python.framework import op_def_library
from tensorflow.python.framework import tensor_conversion_registry
from tensorflow.python.ops import cond_v2

# Mode names, weakest first. 'float32_list' applies the float32 list (and
# unifies the mixed inputs that its float32 results cause); 'bfloat16' applies
# every rule; 'off' (keep_float32) suspends both.
_RANK = {'float32_list': 1, 'bfloat16': 2}

# The module attributes autocast replaces, by name, with their owners; and
# what each held when the swap was applied, while it is in force (empty
# otherwise). Process-wide, like the swap itself.
SWAPPED = ((op_def_library, '_apply_op_helper'),
           (tensor_conversion_registry, 'convert'),
           (cond_v2, 'cond_v2'))
_REPLACED = {}


def remember_replaced(name, function):
  """Records what the swap of `name` (see `SWAPPED`) replaced."""
  _REPLACED[name] = function


def forget_replaced():
  """Drops the records once the swap is undone (the undo's last step)."""
  _REPLACED.clear()


def _before_swap(owner, name):
  """What `owner.name` held before autocast's swap; outside it, what it holds."""
  function = _REPLACED.get(name)
  return getattr(owner, name) if function is None else function


def original_apply_op(*args, **kwargs):
  """`op_def_library._apply_op_helper` as it was before autocast's swap."""
  return _before_swap(op_def_library, '_apply_op_helper')(*args, **kwargs)


def original_convert(*args, **kwargs):
  """`tensor_conversion_registry.convert` as it was before autocast's swap."""
  return _before_swap(tensor_conversion_registry, 'convert')(*args, **kwargs)


def original_cond_v2(*args, **kwargs):
  """`cond_v2.cond_v2` (what `tf.cond` builds with control flow v2) as it
  was before autocast's swap."""
  return _before_swap(cond_v2, 'cond_v2')(*args, **kwargs)


class _ThreadState(threading.local):
  """What autocast knows on one thread; other threads see a fresh one."""

  def __init__(self):
    super().__init__()
    self.modes = []      # the stack of entered contexts, innermost last
    self.busy = False    # True while autocast makes its own ops
    self.casts = {}      # (tensor ref, dtype, context id) -> cast tensor
    self.trainable = (None, -1, frozenset())  # graph, count, variable op names
    # True inside recast_weights_at_any_batch: the weight recast ignores
    # weights.RECAST_MIN_ROWS.
    self.recast_at_any_batch = False
    # 'auto': slow bfloat16 CPU kernels are substituted (cpu_kernels);
    # 'bfloat16': TensorFlow's own bfloat16 kernels everywhere.
    self.kernels = 'auto'

  def mode(self):
    """The rules in force: the strongest mode since the innermost 'off'."""
    best = None
    for mode in reversed(self.modes):
      if mode == 'off':
        break
      if best is None or _RANK[mode] > _RANK[best]:
        best = mode
    return best

  def forget_graph(self):
    """Drops the casts and variable names cached for the graph being built."""
    self.casts = {}
    self.trainable = (None, -1, frozenset())


STATE = _ThreadState()
