"""Process-wide test set-up that must happen before TensorFlow is imported."""

import os

# The CPU allocator keeps the statistics that memory tests read only when the
# process starts with this set (see estimator_bf16/memory/peak.py).
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
# Quieter logs: TensorFlow's C++ info lines drown test output.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')


def pytest_configure(config):
  """absl flags (e.g. absltest's --test_tmpdir) are read in tests, not parsed
  by pytest: mark them parsed so they fall back to their defaults."""
  del config
  from absl import flags  # pylint: disable=g-import-not-at-top
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
