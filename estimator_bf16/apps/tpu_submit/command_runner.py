"""Runs the planned commands, or only prints them under --dry-run."""

import os
import shlex
import subprocess
import sys


def note(message):
  """Prints advice that is not a command, so dry-run stdout stays runnable."""
  print('tpu_submit: note: ' + message, file=sys.stderr, flush=True)


class Runner:
  """Executes argv lists with their output streamed to the terminal.

  Attributes:
    dry_run: print each command (shell-quoted, one per line) instead.
    cwd: directory the commands run in; local paths in them are relative to
      it, which keeps the printed commands free of machine-specific paths.
  """

  def __init__(self, dry_run, cwd=None):
    self.dry_run = dry_run
    self.cwd = cwd

  def run(self, argv):
    """Runs `argv` (never through a shell) and returns its exit code."""
    line = shlex.join(argv)
    if self.dry_run:
      print(line, flush=True)
      return 0
    # Echo first so a long gcloud call is attributable in the streamed output.
    print('+ ' + line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    try:
      return subprocess.run(argv, cwd=self.cwd, check=False).returncode
    except OSError as e:
      print('tpu_submit: error: cannot run %s: %s' % (argv[0], e),
            file=sys.stderr)
      return 127

  def write_file(self, path, text):
    """Writes a generated file; under --dry-run prints it instead."""
    if self.dry_run:
      print('# %s:' % path)
      print(text, end='' if text.endswith('\n') else '\n', flush=True)
      return
    full_path = self.resolve(path)
    os.makedirs(os.path.dirname(full_path) or '.', exist_ok=True)
    with open(full_path, 'w') as f:
      f.write(text)

  def resolve(self, path):
    """The path as seen from this process (commands see it from `cwd`)."""
    return os.path.join(self.cwd or os.getcwd(), path)
