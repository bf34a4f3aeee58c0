"""The built wheel: only `estimator_bf16` installed, and its programs run.

Builds a wheel from a copy of the repository, installs it (without
dependencies) into a new virtualenv, and runs it from outside the
repository. Installing TensorFlow afresh would take minutes and the network,
so the new virtualenv reads the dependencies of the test's own interpreter
through a `.pth` line placed after its own site-packages; `estimator_bf16`
itself can only come from the wheel (the test's editable install is a hook
that a plain path entry does not run).
"""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_COPIED = shutil.ignore_patterns('.git', '.venv*', 'runs', 'build',
                                     'dist', '*.egg-info', '__pycache__',
                                     '.pytest_cache', '.hypothesis')
# Script: (text its --help prints, its exit status). The training program
# is an absl program, and absl's --help exits with status 1.
_CONSOLE_SCRIPTS = {
    'estimator-bf16': ('{run,check}', 0),
    'estimator-bf16-train': ('--model', 0),
    'tpu-submit': ('tpu-vm', 0),
}

pytestmark = pytest.mark.slow


def _run(argv, cwd, **kwargs):
  return subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                        timeout=600, check=False, **kwargs)


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
  """(wheel path, venv python, venv bin dir, a directory outside the repo)."""
  root = tmp_path_factory.mktemp('wheel')
  source = root / 'source'
  shutil.copytree(_REPO, source, ignore=_NOT_COPIED)
  wheels = root / 'wheels'
  built = _run([sys.executable, '-m', 'pip', 'wheel', '--no-deps',
                '--no-build-isolation', '--quiet', '-w', str(wheels),
                str(source)], cwd=str(root))
  assert built.returncode == 0, built.stderr
  (wheel,) = wheels.glob('estimator_bf16-*.whl')
  venv = root / 'venv'
  # No pip of its own (bootstrapping one takes seconds): the test's pip
  # installs into it.
  created = _run([sys.executable, '-m', 'venv', '--without-pip', str(venv)],
                 cwd=str(root))
  assert created.returncode == 0, created.stderr
  bin_dir = venv / 'bin'
  python = str(bin_dir / 'python')
  site = _run([python, '-c', 'import sysconfig; '
               'print(sysconfig.get_paths()["purelib"])'], cwd=str(root))
  with open(os.path.join(site.stdout.strip(), 'zz_test_deps.pth'), 'w') as f:
    f.write(sysconfig.get_paths()['purelib'] + '\n')
  install = _run([sys.executable, '-m', 'pip', '--python', python,
                  'install', '--quiet', '--no-deps', '--no-index', str(wheel)],
                 cwd=str(root))
  assert install.returncode == 0, install.stderr
  outside = root / 'elsewhere'
  outside.mkdir()
  return wheel, python, bin_dir, str(outside)


def test_the_wheel_holds_only_estimator_bf16(installed):
  wheel = installed[0]
  with zipfile.ZipFile(wheel) as archive:
    names = archive.namelist()
    tops = {name.split('/')[0] for name in names}
    info = next(t for t in tops if t.endswith('.dist-info'))
    top_level = archive.read(info + '/top_level.txt').decode().split()
  assert tops == {'estimator_bf16', info}
  assert top_level == ['estimator_bf16']
  # The reference models and the programs come along inside it.
  for module in ('estimator_bf16/apps/train_cli.py',
                 'estimator_bf16/models/styles/bert_style.py',
                 'estimator_bf16/apps/tpu_submit/main.py',
                 'estimator_bf16/compat/estimator.py'):
    assert module in names, module
  assert not any(name.startswith(('tests/', 'benchmarks/', 'scripts/'))
                 for name in names)


def test_imports_from_the_wheel_not_the_repository(installed):
  _, python, _, outside = installed
  result = _run([python, '-c',
                 'import estimator_bf16 as eb, estimator_bf16.apps.training; '
                 'print(eb.__file__); print(eb.BACKEND)'], cwd=outside)
  assert result.returncode == 0, result.stderr
  location = result.stdout.split()[0]
  assert os.path.dirname(os.path.dirname(python)) in location
  assert not location.startswith(_REPO)
  for name in ('models', 'scripts', 'benchmarks'):
    absent = _run([python, '-c', 'import %s' % name], cwd=outside)
    assert absent.returncode != 0, name
    assert 'ModuleNotFoundError' in absent.stderr, name


@pytest.mark.parametrize('script', sorted(_CONSOLE_SCRIPTS))
def test_console_script_help(installed, script):
  _, _, bin_dir, outside = installed
  text, status = _CONSOLE_SCRIPTS[script]
  result = _run([str(bin_dir / script), '--help'], cwd=outside)
  assert result.returncode == status, result.stderr
  assert text in result.stdout, result.stdout
