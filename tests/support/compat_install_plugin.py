"""pytest plugin for the newest-TensorFlow run: opt in to the compat backend.

`pytest -p tests.support.compat_install_plugin` calls `eb.compat.install()`
once for the session, the explicit opt-in a legacy user makes, so test
modules written against `tf.estimator` / `tf.compat.v1.estimator` run
unmodified on TensorFlow 2.16+. On TensorFlow 2.15 it does nothing: the real
tf.estimator stays. TensorFlow is imported in `pytest_configure`, after
tests/conftest.py has set the environment it must see first.
"""


def pytest_configure(config):
  del config
  import estimator_bf16 as eb  # pylint: disable=g-import-not-at-top
  if eb.BACKEND == 'compat':
    eb.compat.install()
