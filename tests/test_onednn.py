"""The bfloat16 path gives the same answers with oneDNN off and on.

TensorFlow picks oneDNN (formerly MKL) kernels for bfloat16 on x86 CPUs
when TF_ENABLE_ONEDNN_OPTS=1, its default on Linux; some releases returned
empty bfloat16 outputs from them (tensorflow#56680, #57888). Each setting
runs in its own process (`tests/onednn_child.py`); the outputs must be
non-empty, finite, and close to each other.

TensorFlow 2.15 rewrites bfloat16 ops to oneDNN only on CPUs with native
bfloat16 (AVX512-BF16 or AMX); elsewhere (an AVX2-only CPU, say) both
settings run the same Eigen kernels and agree exactly. The test prints
which oneDNN ops ran, so a log shows which case a machine exercised.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Stated tolerances. The two libraries round bfloat16 products and sums
# differently (8 bits of mantissa: 2**-8 = 0.4% per rounding), so kernels
# agree to a few rounding steps relative to each tensor's largest value;
# measured worst case about 1%. Four training steps of mnist_cnn move the
# eval loss by less than 0.01 between them.
_KERNEL_TOLERANCE = 0.03
_LOSS_TOLERANCE = 0.05


def _run_child(onednn, cache_dir):
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, TF_CPP_MIN_LOG_LEVEL='2',
             ESTIMATOR_BF16_CACHE=cache_dir)
  done = subprocess.run([sys.executable, '-m', 'tests.onednn_child'],
                        cwd=_REPO, env=env, capture_output=True, text=True,
                        timeout=600)
  if done.returncode:
    raise AssertionError('TF_ENABLE_ONEDNN_OPTS=%s failed:\n%s' % (
        onednn, done.stderr[-3000:]))
  return json.loads(done.stdout)


@pytest.mark.slow
class OneDnnParityTest(tf.test.TestCase):

  def test_bfloat16_outputs_match_with_onednn_off_and_on(self):
    cache_dir = self.create_tempdir().full_path
    off = _run_child('0', cache_dir)
    on = _run_child('1', cache_dir)
    self.assertFalse(off['onednn'])
    self.assertTrue(on['onednn'])
    self.assertEqual(sorted(off['kernels']), sorted(on['kernels']))
    for name in off['kernels']:
      shapes = off['kernels'][name]['shape'], on['kernels'][name]['shape']
      self.assertEqual(shapes[0], shapes[1], name)
      values = [np.asarray(run['kernels'][name]['values'], np.float32)
                for run in (off, on)]
      for v in values:
        self.assertEqual(v.size, int(np.prod(shapes[0])), name)
        self.assertGreater(v.size, 0, name)
        self.assertTrue(np.all(np.isfinite(v)), name)
      scale = max(np.max(np.abs(values[0])), 1e-6)
      gap = np.max(np.abs(values[0] - values[1])) / scale
      self.assertLess(gap, _KERNEL_TOLERANCE, '%s: relative gap %.4f' % (
          name, gap))
    for run in (off, on):
      self.assertTrue(np.isfinite(run['eval']['loss']))
    self.assertEqual(off['eval']['global_step'], on['eval']['global_step'])
    self.assertAllClose(off['eval']['loss'], on['eval']['loss'],
                        atol=_LOSS_TOLERANCE)
    print('oneDNN ops in the bfloat16 graph with TF_ENABLE_ONEDNN_OPTS=1: %s'
          % (', '.join(on['onednn_ops']) or 'none (no native bfloat16 on '
             'this CPU)'))


if __name__ == '__main__':
  tf.test.main()
