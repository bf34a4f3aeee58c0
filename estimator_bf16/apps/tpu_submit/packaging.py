"""Builds the trainer package (an sdist of this repository) for the TPU host.

The package carries `estimator_bf16` (with its reference models), so
`python -m estimator_bf16.apps.train_cli` runs on the TPU VM or in the
Vertex AI container exactly as it does locally.
"""

import dataclasses
import os
import re
import sys
from typing import List, Optional

from estimator_bf16.apps.tpu_submit import validation

# Relative to the repository root, where every command runs (see Runner.cwd).
DEFAULT_WORK_DIR = os.path.join('build', 'tpu_submit')

_SETUP_FIELD_RE = r"""\b%s\s*=\s*['"]([^'"]+)['"]"""


@dataclasses.dataclass(frozen=True)
class Package:
  """The trainer archive and, if it still has to be built, how.

  Attributes:
    local_path: path used in commands (relative to the runner's cwd, or
      absolute for a user-given --package).
    file_name: base name, also its name on the TPU host and in the bucket.
    build_argv: command that produces `local_path`, or None if prebuilt.
  """
  local_path: str
  file_name: str
  build_argv: Optional[List[str]] = None


def repo_root():
  """The checkout holding setup.py, or None for an installed copy."""
  # This file is estimator_bf16/apps/tpu_submit/packaging.py.
  root = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir,
                                      os.pardir, os.pardir))
  return root if os.path.isfile(os.path.join(root, 'setup.py')) else None


def work_dir(flag_value):
  """Where generated files go: --work-dir, or build/tpu_submit in the repo."""
  return os.path.abspath(flag_value) if flag_value else DEFAULT_WORK_DIR


def _display_path(path, root):
  """Shortens `path` to be relative to the repo when it lives inside it."""
  if root and os.path.commonpath([root, os.path.abspath(path)]) == root:
    return os.path.relpath(path, root)
  return path


def plan(package_flag, out_dir, root):
  """Decides which archive to ship, without building anything yet.

  Args:
    package_flag: user-given --package path, or None to build one.
    out_dir: work directory (relative to `root`, or absolute).
    root: repository root from `repo_root()`, or None.

  Returns:
    A `Package`.

  Raises:
    validation.UsageError: a missing --package file, or nothing to build from.
  """
  if package_flag:
    path = os.path.abspath(package_flag)
    if not os.path.isfile(path):
      raise validation.UsageError(
          '--package=%s does not exist; build one with `python setup.py '
          'sdist` in the repository or drop --package to build it here.'
          % package_flag)
    if not path.endswith(('.tar.gz', '.whl')):
      raise validation.UsageError(
          '--package=%s must be an sdist (.tar.gz) or a wheel (.whl).'
          % package_flag)
    return Package(path, os.path.basename(path))
  if root is None:
    raise validation.UsageError(
        'no setup.py above estimator_bf16/ (an installed copy?); pass '
        '--package=PATH to an sdist built from the estimator_bf16 repository.')
  with open(os.path.join(root, 'setup.py')) as f:
    setup_text = f.read()
  fields = [re.search(_SETUP_FIELD_RE % k, setup_text)
            for k in ('name', 'version')]
  if not all(fields):
    raise validation.UsageError(
        'cannot read name/version from setup.py; pass --package=PATH.')
  file_name = '%s-%s.tar.gz' % (fields[0].group(1).replace('-', '_'),
                                fields[1].group(1))
  dist_dir = os.path.join(out_dir, 'dist')
  build_argv = [_display_path(sys.executable, root), 'setup.py', '--quiet',
                'sdist', '--dist-dir', dist_dir]
  return Package(os.path.join(dist_dir, file_name), file_name, build_argv)


def build(package, runner):
  """Builds the sdist if needed; returns an exit code (0 = ready to ship)."""
  if package.build_argv is None:
    return 0
  code = runner.run(package.build_argv)
  if code == 0 and not runner.dry_run and not os.path.isfile(
      runner.resolve(package.local_path)):
    print('tpu_submit: error: the build did not produce %s; check setup.py '
          'or pass --package=PATH.' % package.local_path, file=sys.stderr)
    return 1
  return code
