"""The package's commands start quiet: TensorFlow's C++ log lines off.

TensorFlow prints its C++ log lines (cuDNN/cuFFT/cuBLAS "Unable to
register" errors on every CPU machine, oneDNN and CPU-feature notes, gRPC
connection retries of a multi-worker start) from the moment its library
loads, which is when `import estimator_bf16` imports it: the only moment to
choose is before that, so the package's `__init__` calls `quiet_commands()`
first. It acts only when the process is one of this package's commands
(`python -m estimator_bf16...`, `estimator-bf16`, `estimator-bf16-train`,
`tpu-submit`), never for a program that imports the package, and only sets
`TF_CPP_MIN_LOG_LEVEL` when it is unset; `--verbose` on the command line
keeps TensorFlow's own output. Python errors, the commands' own messages
and a program's own logging are untouched. The tasks of a launched
multi-worker job inherit the setting.

TensorFlow 2.16+ also writes a few lines straight to file descriptor 2
while its libraries load, before any log level applies ("WARNING: All log
messages before absl::InitializeLog() is called ...", the oneDNN note,
"cudart_stub.cc ... Could not find cuda drivers", each twice).
`loading_noise_hidden()` filters descriptor 2 for the duration of that
import only, for the same commands.

`tensorflow_logs_once()` keeps TensorFlow's Python log lines from being
printed twice (by its own handler and again by absl's root handler).
"""

import contextlib
import logging
import os
import re
import subprocess
import sys

from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import patching

VERBOSE_FLAG = '--verbose'
VERBOSE_HELP = ("Show TensorFlow's own C++ log lines, which the package's "
                'commands hide by default.')
_CONSOLE_SCRIPTS = frozenset(['estimator-bf16', 'estimator-bf16-train',
                              'tpu-submit'])
_PACKAGE = 'estimator_bf16'
# 3 hides C++ INFO, WARNING and ERROR lines (the cuDNN registration lines
# are ERRORs); failures still reach the user as Python exceptions.
_QUIET_LEVEL = '3'
_VERBOSE_LEVEL = '0'


def is_package_command(argv):
  """True if `argv` (the interpreter's command line) runs a command of ours."""
  if not argv:
    return False
  # A console script runs as `python SCRIPT ARGS`: the interpreter's own
  # command line names the script second.
  if any(os.path.basename(arg) in _CONSOLE_SCRIPTS for arg in argv[:2]):
    return True
  for index, arg in enumerate(argv[:-1]):
    if arg == '-m':
      module = argv[index + 1]
      return module == _PACKAGE or module.startswith(_PACKAGE + '.')
  return False


def _command_line(argv):
  """`argv`, or the interpreter's full command line when it is None."""
  return list(getattr(sys, 'orig_argv', sys.argv) if argv is None else argv)


def _hides_noise(argv):
  """True in a command of this package run without `--verbose`."""
  argv = _command_line(argv)
  return is_package_command(argv) and VERBOSE_FLAG not in argv


def quiet_commands(argv=None, environ=None):
  """Sets TF_CPP_MIN_LOG_LEVEL for our commands; see the module doc.

  Args:
    argv: the interpreter's full command line (default `sys.orig_argv`).
    environ: the environment to change (default `os.environ`).

  Returns:
    True if the level was set here.
  """
  argv = _command_line(argv)
  environ = os.environ if environ is None else environ
  if not is_package_command(argv) or 'TF_CPP_MIN_LOG_LEVEL' in environ:
    return False
  # With --verbose the level is set too ('0', TensorFlow's default), so the
  # commands this one starts (a launcher's tasks) stay verbose as well.
  environ['TF_CPP_MIN_LOG_LEVEL'] = (
      _VERBOSE_LEVEL if VERBOSE_FLAG in argv else _QUIET_LEVEL)
  return True


# What TensorFlow's C++ side writes to descriptor 2 while it loads, in
# absl's format ('I0000 00:00:1795.29 29524 port.cc:153] ...'): INFO and
# WARNING lines, the pre-initialization notice, and the cuDNN / cuFFT /
# cuBLAS "Unable to register" errors of CPU-only machines. Fatal lines and
# anything else (Python's own warnings included) pass.
LOAD_NOISE = re.compile(
    rb'^(WARNING: All log messages before absl::InitializeLog\(\)'
    rb'|[IW]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] '
    rb'|E\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] Unable to register )')


# The filter runs in a process of its own: while TensorFlow's libraries
# load, this process holds Python's lock, so a thread here could not drain
# the pipe (a writer of more than a pipe's buffer would block for good),
# and lines still in the pipe when a library aborts the process would be
# lost. A separate process drains it whatever this one does, and passes on
# everything it read after this one dies.
_FILTER_PROGRAM = (
    'import os, re, sys\n'
    'drop = re.compile(sys.argv[1].encode("latin-1"))\n'
    'for line in sys.stdin.buffer:\n'
    '  if not drop.match(line):\n'
    '    os.write(1, line)\n')


@contextlib.contextmanager
def descriptor_filtered(drop_pattern, fd=2):
  """Inside, lines written to `fd` that `drop_pattern` matches vanish.

  C++ code writes to the descriptor itself, below `sys.stderr`, so the
  filter sits there: `fd` becomes a pipe into a small filter process that
  copies each line to the original descriptor unless the pattern matches
  its start. On exit `fd` is the original again and the filter has passed
  on every line written before (it is waited for, up to 10 s: a child
  process still holding the pipe keeps it open).

  Args:
    drop_pattern: bytes, a regular expression (`re.match`).
    fd: the descriptor, 2 (stderr) by default.

  Yields:
    None.
  """
  try:
    saved = os.dup(fd)
  except OSError:  # no such descriptor: nothing to filter
    yield
    return
  try:
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    try:
      process = subprocess.Popen(
          [sys.executable, '-c', _FILTER_PROGRAM,
           drop_pattern.decode('latin-1')],
          stdin=read_end, stdout=saved, stderr=saved, close_fds=True)
    finally:
      os.close(read_end)
    os.dup2(write_end, fd)
    os.close(write_end)
  except OSError:  # no pipe or no filter process: unfiltered, as before
    os.close(saved)
    yield
    return
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, fd)  # the pipe's last writer here closes: the filter ends
    os.close(saved)
    try:
      process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass  # it ends when the other holders of the pipe close it


@contextlib.contextmanager
def loading_noise_hidden(argv=None):
  """Inside, TensorFlow's loading lines are dropped from descriptor 2.

  Acts as `quiet_commands` does: only in a command of this package,
  without `--verbose`, and only while TensorFlow has not loaded yet; and
  only for TensorFlow 2.16+ (2.15's loading lines obey its log level), so
  that no filter process starts where there is nothing to filter.

  Args:
    argv: the interpreter's full command line (default `sys.orig_argv`).
  """
  if (not _hides_noise(argv) or 'tensorflow' in sys.modules or
      backend_lib.installed_tf_version() < (2, 16)):
    yield
    return
  with descriptor_filtered(LOAD_NOISE.pattern):
    yield


@contextlib.contextmanager
def compile_noise_hidden(argv=None):
  """Inside, XLA's first-compile lines are dropped from descriptor 2.

  XLA logs through absl, not TensorFlow's C++ logging, so the log level of
  `quiet_commands` does not reach it: the first compile of a process
  prints "WARNING: All log messages before absl::InitializeLog() ..." and
  "Compiled cluster using XLA!" on TensorFlow 2.15 too. Acts as
  `loading_noise_hidden` does (a command of this package, no `--verbose`),
  around the run that compiles.

  Args:
    argv: the interpreter's full command line (default `sys.orig_argv`).
  """
  if not _hides_noise(argv):
    yield
    return
  with descriptor_filtered(LOAD_NOISE.pattern):
    yield


@contextlib.contextmanager
def tensorflow_logs_once(hide_info=False):
  """Inside, each TensorFlow Python log line is printed once, not twice.

  TensorFlow gives its 'tensorflow' logger a handler of its own when it is
  imported before any root handler exists; absl's `app.run` then adds one to
  the root logger, and every record is printed by both. While this is
  active the 'tensorflow' logger does not pass records on to the root
  logger when it has a handler of its own.

  Args:
    hide_info: also hide TensorFlow's INFO lines (configuration dumps,
      step counters), for a command of ours that reports progress itself;
      its warnings and errors still show.

  Yields:
    None; the logger's `propagate` and level are put back on exit.
  """
  logger = logging.getLogger('tensorflow')
  previous = logger.propagate, logger.level
  if logger.handlers:
    logger.propagate = False
  if hide_info:
    logger.setLevel(logging.WARNING)
  try:
    yield
  finally:
    logger.propagate = previous[0]
    logger.setLevel(previous[1])


@contextlib.contextmanager
def deprecation_notices_hidden(argv=None):
  """Inside, TensorFlow's deprecation notices are not printed, for our commands.

  A TF 1.x-era program run by `python -m estimator_bf16 run` calls dozens of
  deprecated APIs on purpose (it is the code the package exists for), and
  TensorFlow prints three lines for each ("... is deprecated ... Use
  tf.keras instead.") plus Keras's `UserWarning`s for `tf.layers`: nothing
  the user can act on, and it buries the program's own output. Acts only
  when the process is one of this package's commands without `--verbose`
  (as `quiet_commands`). TensorFlow keeps its switch in a module global,
  so this is process-wide while active; it is put back when the last
  user leaves (a `patching.Patcher`), also when the body raises.

  Args:
    argv: the interpreter's full command line (default `sys.orig_argv`).
  """
  if not _hides_noise(argv):
    yield
    return
  import warnings  # pylint: disable=g-import-not-at-top
  with _DEPRECATION_PATCHER.active(), warnings.catch_warnings():
    warnings.filterwarnings('ignore', message=r'.*is deprecated',
                            category=UserWarning)
    yield


def _hide_deprecation_notices():
  """Turns TensorFlow's deprecation switch off; the Patcher's apply."""
  # Imported here: this module is loaded before TensorFlow (module doc).
  # pylint: disable=g-import-not-at-top,protected-access
  from tensorflow.python.util import deprecation
  from tensorflow.python.util import module_wrapper
  undo = [(deprecation, '_PRINT_DEPRECATION_WARNINGS',
           deprecation._PRINT_DEPRECATION_WARNINGS),
          (module_wrapper, '_PER_MODULE_WARNING_LIMIT',
           module_wrapper._PER_MODULE_WARNING_LIMIT)]
  deprecation._PRINT_DEPRECATION_WARNINGS = False
  # The API modules' own notice ("The name tf.estimator.tpu.TPUConfig is
  # deprecated", one per module) has a switch of its own: its count.
  module_wrapper._PER_MODULE_WARNING_LIMIT = 0
  # pylint: enable=g-import-not-at-top,protected-access
  return undo


_DEPRECATION_PATCHER = patching.Patcher(_hide_deprecation_notices)


@contextlib.contextmanager
def tensorflow_info_hidden():
  """Inside, TensorFlow's Python INFO lines are not printed.

  For graphs a command builds only to measure them, not to train (the
  memory planner builds a model_fn twice per plan): a model_fn's own
  `tf.compat.v1.logging.info` calls (google-research/bert lists every
  trainable variable, 200 lines) would print once per build. Warnings and
  errors still show. The 'tensorflow' logger is process-wide; its level is
  put back on exit.
  """
  logger = logging.getLogger('tensorflow')
  previous = logger.level
  if logger.getEffectiveLevel() < logging.WARNING:
    logger.setLevel(logging.WARNING)
  try:
    yield
  finally:
    logger.setLevel(previous)
