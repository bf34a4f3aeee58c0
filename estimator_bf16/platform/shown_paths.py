"""How the package names a file of the user's in its messages.

Relative to the working folder when the file lies below it, as the user
typed it on the command line, with `./` in front of a bare file name so
that `./tpu_estimator.py:34` cannot be read as TensorFlow's own file of
that name; absolute otherwise.
"""

import os


def shown_path(path):
  """`path` as messages show it (see the module docstring).

  Args:
    path: str, a file path, absolute or relative to the working folder.

  Returns:
    str.
  """
  if path.startswith('<'):  # '<stdin>', '<string>': no file
    return path
  try:
    relative = os.path.relpath(path)
  except ValueError:  # another drive (Windows)
    return path
  if relative == os.pardir or relative.startswith(os.pardir + os.sep):
    return os.path.abspath(path)
  if os.sep not in relative:
    return os.curdir + os.sep + relative
  return relative


def shown_location(path, line):
  """'PATH:LINE' with `shown_path`."""
  return '%s:%s' % (shown_path(path), line)
