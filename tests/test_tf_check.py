"""Importing estimator_bf16 on an unsupported TensorFlow fails clearly."""

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_with_fake_tensorflow(tmp_path, source):
  package = tmp_path / 'tensorflow'
  package.mkdir()
  (package / '__init__.py').write_text(textwrap.dedent(source))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
  return subprocess.run([sys.executable, '-c', 'import estimator_bf16'],
                        env=env, capture_output=True, text=True, timeout=120,
                        check=False)


@pytest.mark.parametrize('version, reason', [
    ('2.16.1', 'tf.estimator was removed in TensorFlow 2.16'),
    ('2.21.0', 'tf.estimator was removed in TensorFlow 2.16'),
    ('2.14.0', 'too old'),
])
def test_unsupported_version(tmp_path, version, reason):
  result = _import_with_fake_tensorflow(tmp_path, f"__version__ = '{version}'")
  assert result.returncode != 0
  assert 'ImportError' in result.stderr
  assert f'found TensorFlow {version}' in result.stderr
  assert reason in result.stderr
  assert 'TensorFlow 2.15.x' in result.stderr


def test_missing_estimator_package(tmp_path):
  result = _import_with_fake_tensorflow(tmp_path, """
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
