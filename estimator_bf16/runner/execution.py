"""Runs a program file as `python PROGRAM.py ARGS` would, and undoes it after.

The pieces of `run_program` that concern the program as a script: its
`sys.argv` and `sys.path[0]`, the compat backend its `tf.estimator`
imports need on TensorFlow 2.16+, the TF 1.x scope of a TF 1.x program,
forgetting its absl flags and sibling modules afterwards, and `run_as_main`,
which executes it as `__main__` and turns how it ended (normal exit,
`sys.exit`, an exception, a stop by a signal or by check mode) into the
`RunResult`'s exit code, error and reason.
"""

import contextlib
import gc
import inspect
import os
import re
import runpy
import signal
import sys
import traceback

from absl import flags
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import shown_paths
from estimator_bf16.runner import results
from estimator_bf16.runner import run_state
from estimator_bf16.runner import tf1 as tf1_lib


@contextlib.contextmanager
def program_argv(program, args):
  """sys.argv and sys.path[0] as `python PROGRAM ARGS` sets them."""
  saved_argv, saved_path = sys.argv[:], sys.path[:]
  sys.argv = [program] + list(args)
  # Python puts the folder of the (symlink-resolved) script first on the
  # path, so the program's sibling modules import.
  folder = os.path.dirname(os.path.realpath(program))
  if sys.path:
    sys.path[0] = folder
  else:
    sys.path.append(folder)
  try:
    yield
  finally:
    sys.argv[:] = saved_argv
    sys.path[:] = saved_path


@contextlib.contextmanager
def compat_backend():
  """Installs the compat backend on TensorFlow 2.16+ for the run.

  The program's `tf.estimator` imports resolve only with it; a backend the
  caller installed stays, one installed here is uninstalled on exit.
  """
  installed_here = (eb.BACKEND == backend_lib.COMPAT_BACKEND and
                    not eb.compat.installed())
  if installed_here:
    eb.compat.install()
  try:
    yield
  finally:
    if installed_here:
      eb.compat.uninstall()


def _folder_prefixes(folders):
  """Real paths of `folders` ending in a separator, for startswith tests."""
  return tuple(os.path.realpath(f) + os.sep for f in folders)


@contextlib.contextmanager
def forget_program_state(folders, result):
  """Drops the absl flags and the modules of the program's folders afterwards.

  A process runs a program once; this lets a second run in the same process
  (tests, notebooks) import its sibling modules and define its flags again,
  as a fresh `python PROGRAM.py` would.
  """
  prefixes = _folder_prefixes(folders)
  flags_before, modules_before = set(flags.FLAGS), set(sys.modules)
  try:
    yield
  finally:
    result.program_flags = frozenset(set(flags.FLAGS) - flags_before)
    for name in result.program_flags:
      delattr(flags.FLAGS, name)
    for name in set(sys.modules) - modules_before:
      path = getattr(sys.modules[name], '__file__', None) or ''
      if os.path.realpath(path).startswith(prefixes):
        del sys.modules[name]


# A frame quoted inside an error's message, as autograph quotes the user
# code it converted: `File "/path/model.py", line 396, in call  *`.
_QUOTED_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _failure_reason(error, folders):
  """'Type: first line of the message (at file:line)', the line the
  innermost frame of the program's own code was at.

  Errors raised in code autograph converted (a Keras layer's `call` in
  graph mode) read 'in user code:', then the frames, then the error: the
  reason takes that last line, and the innermost quoted frame of the
  program's own files.
  """
  prefixes = _folder_prefixes(folders)
  where = None
  for frame, lineno in traceback.walk_tb(error.__traceback__):
    path = frame.f_code.co_filename
    if os.path.realpath(path).startswith(prefixes):
      where = shown_paths.shown_location(path, lineno)
  message = str(error).strip()
  lines = [line.strip() for line in message.splitlines() if line.strip()]
  headline = lines[0] if lines else ''
  if len(lines) > 1 and headline.endswith(':'):
    for path, lineno in _QUOTED_FRAME.findall(message):
      if os.path.realpath(path).startswith(prefixes):
        where = shown_paths.shown_location(path, int(lineno))
    headline = lines[-1]
    own_type = type(error).__name__ + ': '
    if headline.startswith(own_type):
      headline = headline[len(own_type):]
  return '%s%s%s' % (type(error).__name__,
                     ': ' + headline if headline else '',
                     ' (at %s)' % where if where else '')


def _exit_code(exit_exception):
  """The process exit code `sys.exit(code)` gives, as Python computes it."""
  code = exit_exception.code
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


# The TF 1.x scope's import hook sits between every `import` of the
# program's own modules and the module's code: frames of it say nothing
# about the failure, and put this package's file first.
_IMPORT_HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'tf1',
                            'scope.py')


def _program_traceback(error, program):
  """The traceback from the program's first frame on, as Python prints it,
  without the frames of the TF 1.x import hook (unless it raised)."""
  tb = error.__traceback__
  start = tb
  while start is not None and start.tb_frame.f_code.co_filename != program:
    start = start.tb_next
  shown = traceback.TracebackException(type(error), error, start or tb)
  frames = list(shown.stack)
  kept = [frame for frame in frames[:-1]
          if os.path.abspath(frame.filename) != _IMPORT_HOOK] + frames[-1:]
  if (isinstance(error, (ImportError, SyntaxError)) and kept and
      os.path.abspath(kept[-1].filename) == _IMPORT_HOOK):
    # The hook's `import` statement is where Python reports an import
    # failing: the program line that imported is the one to show last.
    kept.pop()
  shown.stack = traceback.StackSummary.from_list(kept)
  return ''.join(shown.format())


@contextlib.contextmanager
def tf1_default_graph():
  """Inside, this thread's default graph is a fresh one, as in TF 1.x.

  TF 1.x had no eager mode: a program's own graph code outside the
  Estimator (tf.placeholder, tf.Session) built into a default graph. On
  the way out, `predict` generators the program left suspended are closed
  first: a partly consumed `Estimator.predict` is suspended inside a graph
  context of its own, above this one on the stack, and unwinds it only
  when it is closed. Otherwise leaving this graph fails with "Nesting
  violated for default stack", in place of the program's own error.
  """
  graph = tf.Graph()
  with graph.as_default():
    try:
      yield graph
    finally:
      if tf.compat.v1.get_default_graph() is not graph:
        _close_suspended_predictions()


def _close_suspended_predictions():
  """Closes the `predict` generators still suspended (the run is over)."""
  gc.collect()  # Those only garbage held are closed by collecting it.
  for found in gc.get_objects():
    if (inspect.isgenerator(found) and found.gi_frame is not None and
        found.gi_code.co_name == 'predict'):
      found.close()


def tf1_scope(program, folders, tf1, result):
  """A `Tf1Scope` for a TF 1.x program (detected or forced), else None."""
  if tf1 is None:
    found = tf1_lib.detect(program, folders)
    result.tf1 = found.tf1
    result.tf1_reason = found.evidence or (
        'no TF 1.x API found in %d file(s)' % found.files)
  else:
    result.tf1 = tf1
    result.tf1_reason = '--tf1' if tf1 else '--no-tf1'
  return tf1_lib.Tf1Scope(folders) if result.tf1 else None


def run_as_main(program, init_globals, folders, result, verbose=False):
  """Runs `program` as `__main__`; records how it ended in `result`.

  Args:
    program: path of the Python program.
    init_globals: the globals it starts with (a TF 1.x program's
      `__builtins__`), or an empty dict.
    folders: the folders of the program's own code, for `reason`.
    result: the `RunResult` whose `exit_code`, `error`, `reason`,
      `stopped_by` and `stop_checkpoint` are set.
    verbose: also print the traceback of a `results.Refusal`.
  """
  try:
    runpy.run_path(program, init_globals=init_globals, run_name='__main__')
  except run_state.TrainGraphBuilt:
    result.exit_code = 0
  except run_state.Preempted as e:
    # The status a process killed by the signal would have (143), as
    # the package's own training command exits.
    result.stopped_by = e.signal_name
    result.stop_checkpoint = e.checkpoint
    result.exit_code = 128 + signal.Signals[e.signal_name].value
  except SystemExit as e:
    result.exit_code = _exit_code(e)
  except results.Refusal as e:
    # The package's own refusal (an unmapped tf.contrib symbol, a missing
    # TPU): the message names the cause and the way out; the traceback,
    # through the import machinery or this package, adds nothing unless
    # asked for.
    result.error = result.reason = '%s: %s' % (type(e).__name__, e)
    if verbose:
      print(''.join(traceback.format_exception(type(e), e, e.__traceback__)),
            end='', file=sys.stderr)
    print(result.error, file=sys.stderr)
    result.exit_code = 1
  except KeyboardInterrupt:
    # Ctrl-C outside train, or a second one inside: stop at once, in one
    # line (the traceback is of wherever Python happened to be).
    result.error = ('KeyboardInterrupt: stopped at once by Ctrl-C; the '
                    'newest checkpoint is the last one written.')
    print(result.error, file=sys.stderr)
    result.exit_code = 130
  except BaseException as e:  # pylint: disable=broad-except
    # As Python does for an uncaught exception: traceback, status 1.
    result.error = _program_traceback(e, program)
    result.reason = _failure_reason(e, folders)
    print(result.error, end='', file=sys.stderr)
    result.exit_code = 1
