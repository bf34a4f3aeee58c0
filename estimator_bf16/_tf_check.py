"""Fails early, with the supported versions, on a TensorFlow without Estimator."""

SUPPORTED = 'TensorFlow 2.15.x (the last release with tf.estimator)'


def check_tensorflow():
  """Raises ImportError if TensorFlow or its Estimator API cannot be used.

  Raises:
    ImportError: TensorFlow is missing, older than 2.15, or 2.16+ where
      `tf.estimator` (and with it TPUEstimator) was removed.
  """
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError('estimator_bf16 needs %s; TensorFlow could not be '
                      'imported: %s. Install it with `pip install '
                      '"tensorflow>=2.15,<2.16"`.' % (SUPPORTED, e)) from e
  version = getattr(tf, '__version__', '0')
  try:
    major, minor = (int(part) for part in version.split('.')[:2])
  except ValueError:
    major, minor = 0, 0
  if (major, minor) != (2, 15):
    reason = ('tf.estimator was removed in TensorFlow 2.16'
              if (major, minor) > (2, 15) else 'it is too old')
    raise ImportError(
        'estimator_bf16 supports %s; found TensorFlow %s, and %s. Use Python '
        '3.9-3.11 with `pip install "tensorflow>=2.15,<2.16"`.' %
        (SUPPORTED, version, reason))
  try:
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator
  except (AttributeError, ImportError) as e:
    raise ImportError('estimator_bf16 needs %s with tensorflow-estimator '
                      'installed; tf.compat.v1.estimator.tpu is missing: %s' %
                      (SUPPORTED, e)) from e
  del estimator
