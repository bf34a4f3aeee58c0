"""The TensorFlow version guard: which backend, or a clear error."""

import os
import subprocess
import sys
import textwrap

import pytest
from tests.support import paths

REPO = paths.REPO

# Loads platform/backend.py on its own, so a fake TensorFlow can be checked
# without the rest of the package (which needs a real one) being imported.
_CHECK_ONLY = textwrap.dedent("""
    import importlib.util, os
    path = os.path.join(%r, 'estimator_bf16', 'platform', 'backend.py')
    spec = importlib.util.spec_from_file_location('_tf_check', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print('backend=' + module.check_tensorflow())
    """) % REPO


def _run_with_fake_tensorflow(tmp_path, source, code='import estimator_bf16'):
  package = tmp_path / 'tensorflow'
  package.mkdir()
  (package / '__init__.py').write_text(textwrap.dedent(source))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  return subprocess.run([sys.executable, '-c', code], env=env,
                        capture_output=True, text=True, timeout=120,
                        check=False)


def test_too_old_version(tmp_path):
  result = _run_with_fake_tensorflow(tmp_path, "__version__ = '2.14.0'")
  assert result.returncode != 0
  assert 'ImportError' in result.stderr
  assert 'found TensorFlow 2.14.0' in result.stderr
  assert 'too old' in result.stderr
  assert 'TensorFlow 2.15.x' in result.stderr
  assert 'TensorFlow 2.16+' in result.stderr


@pytest.mark.parametrize('version', ['2.16.1', '2.21.0', '3.0.0'])
def test_newer_versions_use_the_compat_backend(tmp_path, version):
  # No tf.estimator in these fakes: 2.16+ must not need it.
  result = _run_with_fake_tensorflow(tmp_path, f"__version__ = '{version}'",
                                     code=_CHECK_ONLY)
  assert result.returncode == 0, result.stderr
  assert 'backend=compat' in result.stdout


def test_tf_215_uses_tf_estimator(tmp_path):
  result = _run_with_fake_tensorflow(tmp_path, """
      __version__ = '2.15.1'
      class _Tpu:
        TPUEstimator = object
      class _Estimator:
        tpu = _Tpu
      class _V1:
        estimator = _Estimator
      class compat:
        v1 = _V1
      """, code=_CHECK_ONLY)
  assert result.returncode == 0, result.stderr
  assert 'backend=tf_estimator' in result.stdout


def test_missing_estimator_package(tmp_path):
  result = _run_with_fake_tensorflow(tmp_path, """
      __version__ = '2.15.1'
      class _V1:
        @property
        def estimator(self):
          raise ImportError('No module named tensorflow_estimator')
      class compat:
        v1 = _V1()
      """)
  assert result.returncode != 0
  assert 'tensorflow-estimator' in result.stderr
  assert 'No module named tensorflow_estimator' in result.stderr
