"""XLA's own memory figures: its dumped buffer assignment, read back.

XLA decides every buffer of a compiled module before it runs (its buffer
assignment) and, when asked to dump, writes that decision to a text file
ending in `buffer-assignment.txt`, one `allocation N: size S, <kinds>` line
per buffer and a `Total bytes used: S` summary. That is the figure a TPU
compile checks against the core's HBM, so it is the one this package
compares its plans with (`xla_step`).

XLA reads its flags (`XLA_FLAGS`) once per process, at its first compile.
`enable` therefore has to run before anything in the process compiles with
XLA; `estimator_bf16 check --xla` calls it before the program starts. Once
set, every later XLA compile of the process is dumped into one temporary
folder, removed when the process exits.
"""

import atexit
import dataclasses
import os
import re
import shutil
import tempfile
from typing import List, Tuple

_DUMP_FLAG = '--xla_dump_to='
_SUFFIX = 'buffer-assignment.txt'
_ALLOCATION = re.compile(r'^allocation (\d+): size (\d+), (.*):$')
_TOTAL = re.compile(r'^Total bytes used: (\d+)')
_PARAMETER_SHAPE = re.compile(r'parameter (\d+), shape \|([^|]*)\|')

_STATE = {'folder': None}


def _flag_folder(flags):
  """The folder a `--xla_dump_to=` in `flags` names, or None."""
  for flag in flags.split():
    if flag.startswith(_DUMP_FLAG):
      return flag[len(_DUMP_FLAG):]
  return None


def enable():
  """Asks XLA to dump what it compiles from now on; returns the folder.

  Adds `--xla_dump_to=<temporary folder> --xla_dump_hlo_as_text` to
  `XLA_FLAGS` unless the environment already names a dump folder (then
  that folder is used and kept). Takes effect only if no XLA compile has
  run in this process yet (see the module docstring); `new_assignments`
  says when it did not.

  Returns:
    str, the folder XLA dumps into.
  """
  if _STATE['folder'] is not None:
    return _STATE['folder']
  flags = os.environ.get('XLA_FLAGS', '')
  folder = _flag_folder(flags)
  if folder is None:
    folder = tempfile.mkdtemp(prefix='estimator_bf16_xla_')
    atexit.register(shutil.rmtree, folder, True)
    flags = ' '.join(
        f for f in (flags, _DUMP_FLAG + folder, '--xla_dump_hlo_as_text') if f)
    os.environ['XLA_FLAGS'] = flags
  _STATE['folder'] = folder
  return folder


def assignment_files(folder):
  """The buffer-assignment files in `folder`: {path: modification time}.

  The time counts: a module compiled again (the same graph in another
  process sharing the folder, e.g. a child of the test run) is dumped
  under the same name, over the older file.
  """
  if not os.path.isdir(folder):
    return {}
  found = {}
  for name in os.listdir(folder):
    if name.endswith(_SUFFIX):
      path = os.path.join(folder, name)
      try:
        found[path] = os.stat(path).st_mtime_ns
      except FileNotFoundError:
        continue
  return found


@dataclasses.dataclass
class Allocation:
  """One buffer of a compiled module.

  Attributes:
    size: int, bytes.
    kinds: str, what the dump says of it after the size ('parameter 0,
      shape |f32[8,64]| at ShapeIndex {}', 'maybe-live-out',
      'preallocated-temp', 'constant', 'thread-local', ...).
  """
  size: int
  kinds: str

  @property
  def parameter(self):
    """(number, XLA shape string) of an entry parameter, else None."""
    match = _PARAMETER_SHAPE.search(self.kinds)
    return (int(match.group(1)), match.group(2)) if match else None

  @property
  def live_out(self):
    """Holds (part of) the module's result."""
    return 'maybe-live-out' in self.kinds or 'output shape' in self.kinds


@dataclasses.dataclass
class BufferAssignment:
  """A parsed buffer-assignment dump.

  Attributes:
    path: str, the file.
    total_bytes: int, its `Total bytes used`: every allocation the
      module needs, parameters and results included.
    allocations: list of `Allocation`.
  """
  path: str
  total_bytes: int
  allocations: List[Allocation]

  def parameters(self) -> List[Tuple[int, str, int]]:
    """(number, shape string, bytes) of each entry parameter."""
    found = []
    for allocation in self.allocations:
      parameter = allocation.parameter
      if parameter is not None:
        found.append(parameter + (allocation.size,))
    return sorted(found)

  def takes(self, shapes):
    """Whether the entry parameters include every XLA shape in `shapes`.

    Args:
      shapes: list of str, e.g. ['f32[4,16,10]', 's32[4,16]'], repeats
        counted.
    """
    left = [shape for _, shape, _ in self.parameters()]
    for shape in shapes:
      if shape not in left:
        return False
      left.remove(shape)
    return True

  def result_copy_bytes(self):
    """Bytes of result buffers that are not parameters.

    In a training step these hold the variables' new values (and the few
    scalars the loop returns).
    """
    return sum(a.size for a in self.allocations
               if a.live_out and a.parameter is None)


def parse(path):
  """Reads one buffer-assignment dump.

  Args:
    path: str, a `*buffer-assignment.txt` file.

  Returns:
    A `BufferAssignment`.

  Raises:
    ValueError: the file has no `Total bytes used` line.
  """
  allocations = []
  total = None
  with open(path) as f:
    for line in f:
      match = _ALLOCATION.match(line)
      if match:
        allocations.append(Allocation(int(match.group(2)), match.group(3)))
        continue
      match = _TOTAL.match(line)
      if match:
        total = int(match.group(1))
        break  # The per-value listing after it is not needed.
  if total is None:
    raise ValueError('%s has no "Total bytes used" line: not an XLA buffer '
                     'assignment.' % path)
  return BufferAssignment(path, total, allocations)


# An instruction of the optimized module that multiplies: its result type
# and its opcode (`%dot.3 = f32[8,4]{1,0} dot(...)`); oneDNN's matmuls and
# convolutions are custom calls with those words in their target.
_PRODUCT = re.compile(r'= (\w+)\[[^\]]*\]\S*\s+(dot|convolution|custom-call)\(')
_PRODUCT_TARGET = re.compile(r'custom_call_target="[^"]*(matmul|conv)', re.I)
_ASSIGNMENT_SUFFIX = '-' + _SUFFIX


def product_dtypes(assignment_path):
  """Result types of the matmuls and convolutions XLA compiled.

  XLA dumps the optimized module beside its buffer assignment
  (`X.cpu_after_optimizations.txt` beside
  `X.cpu_after_optimizations-buffer-assignment.txt`). Its CPU backend
  computes a bfloat16 matmul from operands converted to float32, with a
  float32 result, where a TPU multiplies in bfloat16: this count says how
  far a bfloat16 step compiled here is from one compiled for a TPU.

  Args:
    assignment_path: str, a `*buffer-assignment.txt` file.

  Returns:
    {HLO type name ('f32', 'bf16', ...): count of dot, convolution and
    matmul/convolution custom-call instructions}, or None when the module
    was not dumped beside the assignment.
  """
  if not assignment_path.endswith(_ASSIGNMENT_SUFFIX):
    return None
  module = assignment_path[:-len(_ASSIGNMENT_SUFFIX)] + '.txt'
  if not os.path.isfile(module):
    return None
  counts = {}
  with open(module) as f:
    for line in f:
      match = _PRODUCT.search(line)
      if match is None:
        continue
      if (match.group(2) == 'custom-call' and
          not _PRODUCT_TARGET.search(line)):
        continue
      counts[match.group(1)] = counts.get(match.group(1), 0) + 1
  return counts


def new_assignments(folder, before):
  """The buffer assignments dumped into `folder` since `before` was taken.

  Args:
    folder: str, from `enable`.
    before: `assignment_files(folder)` taken before the compile.

  Returns:
    A list of `BufferAssignment`, largest total first.

  Raises:
    RuntimeError: nothing new was dumped, because XLA read its flags
      before `enable` ran.
  """
  added = sorted(path for path, written in assignment_files(folder).items()
                 if before.get(path) != written)
  if not added:
    raise RuntimeError(
        'XLA compiled without writing a buffer assignment: this process '
        'compiled with XLA before estimator_bf16.memory.xla_dump.enable() '
        'ran, and XLA reads its flags once. Call it (or set XLA_FLAGS='
        '"--xla_dump_to=DIR --xla_dump_hlo_as_text") before the first XLA '
        'compile.')
  parsed = []
  for path in added:
    try:
      parsed.append(parse(path))
    except (ValueError, OSError):
      # Another process's dump, still being written (or gone): not ours.
      continue
  return sorted(parsed, key=lambda a: a.total_bytes, reverse=True)
