"""Picks the backend for the installed TensorFlow; fails early if none fits.

* TensorFlow 2.15.x has tf.estimator: `make_tpu_estimator` returns the real
  TPUEstimator (the only path to a Cloud TPU).
* TensorFlow 2.16+ removed tf.estimator: `make_tpu_estimator` returns
  `estimator_bf16.compat.TPUEstimator`, which runs on the CPU/GPU only.
"""

import importlib.metadata

SUPPORTED = ('TensorFlow 2.15.x (tf.estimator and TPUEstimator, CPU and '
             'Cloud TPU) or TensorFlow 2.16+ (estimator_bf16.compat, CPU/GPU '
             'only)')
ESTIMATOR_BACKEND = 'tf_estimator'
COMPAT_BACKEND = 'compat'
BACKENDS = (ESTIMATOR_BACKEND, COMPAT_BACKEND)
# What `EstimatorOptions(backend=...)` takes besides a backend's name: the
# installed TensorFlow's own (the compat one under a strategy).
AUTO_BACKEND = 'auto'


def installed_tf_version():
  """(major, minor) of the installed TensorFlow, read without importing it;
  (0, 0) if it is not installed or its version is unreadable."""
  try:
    version = importlib.metadata.version('tensorflow')
  except importlib.metadata.PackageNotFoundError:
    return (0, 0)
  try:
    return tuple(int(part) for part in version.split('.')[:2])
  except ValueError:
    return (0, 0)


def tf_version(tf):
  """(major, minor) of a TensorFlow module; (0, 0) if unreadable."""
  version = getattr(tf, '__version__', '0')
  try:
    major, minor = (int(part) for part in version.split('.')[:2])
  except ValueError:
    return 0, 0
  return major, minor


def check_tensorflow():
  """Returns the backend name for this TensorFlow, or raises ImportError.

  Returns:
    `'tf_estimator'` on TensorFlow 2.15.x, `'compat'` on 2.16 and later.

  Raises:
    ImportError: TensorFlow is missing or older than 2.15, or it is 2.15 but
      the tensorflow-estimator package (tf.compat.v1.estimator.tpu) is
      missing.
  """
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError('estimator_bf16 needs %s; TensorFlow could not be '
                      'imported: %s. Install it with `pip install '
                      '"tensorflow>=2.15"`.' % (SUPPORTED, e)) from e
  version = tf_version(tf)
  if version < (2, 15):
    raise ImportError(
        'estimator_bf16 supports %s; found TensorFlow %s, and it is too old. '
        'Use `pip install "tensorflow>=2.15"`.' %
        (SUPPORTED, getattr(tf, '__version__', '?')))
  if version >= (2, 16):
    return COMPAT_BACKEND
  try:
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator
  except (AttributeError, ImportError) as e:
    raise ImportError('estimator_bf16 needs %s; on TensorFlow 2.15 that '
                      'means tensorflow-estimator installed, and '
                      'tf.compat.v1.estimator.tpu is missing: %s' %
                      (SUPPORTED, e)) from e
  del estimator
  return ESTIMATOR_BACKEND
