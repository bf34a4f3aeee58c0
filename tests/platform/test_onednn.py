"""The bfloat16 kernels are accurate with oneDNN off and on, on every CPU.

TensorFlow picks oneDNN kernels for bfloat16 on x86 CPUs when
TF_ENABLE_ONEDNN_OPTS=1, its default on Linux; some releases returned empty
bfloat16 outputs from them (tensorflow#56680, #57888). Each setting runs in
its own process (`tests/support/onednn_child.py`), which runs every kernel under
test on bfloat16-representable inputs next to a float64 reference of the
same op on the same numbers.

The bounds follow from bfloat16's precision, not from one machine: 8
significant bits, so a correctly rounded result is within u = 2**-8 of the
exact one, relative. A kernel that accumulates in float32 and rounds once
stays within one ulp (2u) of the largest output. One that keeps partial
sums in bfloat16 (Eigen's convolution filter gradient does) adds a rounding
per partial sum; those errors add like a random walk, about u * sqrt(n) for
n terms. ReLU and max pooling only select inputs, so they are exact.

TensorFlow 2.15 rewrites bfloat16 ops to oneDNN only on CPUs with native
bfloat16 (AVX512-BF16 or AMX). There, oneDNN must have taken its own route
(oneDNN ops ran, results differ from the Eigen ones) and be within one ulp
everywhere. Elsewhere (an AVX2-only CPU) both settings run the same Eigen
kernels and must agree bit for bit; the native-route check skips, saying
why. docs/cpu.md has the measured errors of both routes.
"""

import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import tensorflow as tf

from estimator_bf16.platform.cpu_bfloat16 import native_bfloat16
from tests.support import paths

_REPO = paths.REPO
# Unit roundoff of bfloat16 (8 significant bits, round to nearest).
_U = 2.0**-8
# Terms summed into one output of each kernel (onednn_child.py's shapes):
# matmul 256-long dot products, its input gradient 128, conv2d 3*3*8, its
# input gradient 3*3*16, its filter gradient 4*16*16 (batch and pixels),
# average pooling 2*2, softmax's normaliser 128 classes. Batch norm's
# statistics are float32 in both routes (FusedBatchNormV3's U), so its
# output is one rounding.
_TERMS = {'matmul': 256, 'matmul_grad': 128, 'conv2d': 72,
          'conv2d_grad_input': 144, 'conv2d_grad_filter': 1024,
          'avg_pool': 4, 'softmax': 128, 'fused_batch_norm': 1,
          'relu': 0, 'max_pool': 0}
# oneDNN ops expected for the bfloat16 kernels on a CPU with native
# bfloat16 (TensorFlow 2.15's op names).
_NATIVE_OPS = ('_MklMatMul', '_MklNativeConv2D',
               '_MklNativeConv2DBackpropFilter',
               '_MklNativeConv2DBackpropInput')
# Four training steps of mnist_cnn move the eval loss by less than 0.01
# between the two settings.
_LOSS_TOLERANCE = 0.05


def _bound(name):
  """Largest allowed |error| / max |reference| of kernel `name`, any route."""
  terms = _TERMS[name]
  return 0.0 if terms == 0 else (2.0 + math.sqrt(terms)) * _U


def _run_child(onednn, cache_dir):
  env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=onednn, TF_CPP_MIN_LOG_LEVEL='2',
             ESTIMATOR_BF16_CACHE=cache_dir)
  done = subprocess.run([sys.executable, '-m', 'tests.support.onednn_child'],
                        cwd=_REPO, env=env, capture_output=True, text=True,
                        timeout=600)
  if done.returncode:
    raise AssertionError('TF_ENABLE_ONEDNN_OPTS=%s failed:\n%s' % (
        onednn, done.stderr[-3000:]))
  return json.loads(done.stdout)


def _errors(run):
  """{kernel: (max |bfloat16 - float64| / max |float64|, values, ref)}."""
  errors = {}
  for name, kernel in run['kernels'].items():
    values = np.asarray(kernel['values'], np.float64)
    reference = np.asarray(kernel['reference'], np.float64)
    scale = max(np.max(np.abs(reference)), 1e-30)
    errors[name] = (np.max(np.abs(values - reference)) / scale, values,
                    reference)
  return errors


@pytest.mark.slow
class OneDnnParityTest(tf.test.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    # Both settings once for all the checks below (a minute of the suite).
    with tempfile.TemporaryDirectory() as cache_dir:
      cls.runs = {'off': _run_child('0', cache_dir),
                  'on': _run_child('1', cache_dir)}

  def test_each_kernel_is_within_bfloat16_bounds_of_float64(self):
    runs = self.runs
    self.assertFalse(runs['off']['onednn'])
    self.assertTrue(runs['on']['onednn'])
    for setting, run in runs.items():
      self.assertCountEqual(run['kernels'], _TERMS)
      for name, (error, values, reference) in _errors(run).items():
        where = 'TF_ENABLE_ONEDNN_OPTS %s, %s' % (setting, name)
        self.assertEqual(values.size,
                         int(np.prod(run['kernels'][name]['shape'])), where)
        self.assertGreater(values.size, 0, where)
        self.assertTrue(np.all(np.isfinite(values)), where)
        # A wrong kernel (zeros, garbage) is off by about its own scale.
        self.assertGreater(np.max(np.abs(reference)), 0.1, where)
        self.assertLessEqual(error, _bound(name), '%s: error %.2fu > %.2fu' % (
            where, error / _U, _bound(name) / _U))
    print('bfloat16 kernel errors, in u = 2**-8 of the largest output '
          '(oneDNN off / on): %s' % ', '.join(
              '%s %.2f/%.2f' % (name, off[0] / _U, _errors(runs['on'])[name][0]
                                / _U)
              for name, off in sorted(_errors(runs['off']).items())))

  def test_onednn_takes_its_native_route_on_a_native_bfloat16_cpu(self):
    if not native_bfloat16():
      self.skipTest('This CPU has no AVX512-BF16/AMX: TensorFlow runs the '
                    'same Eigen bfloat16 kernels with oneDNN on and off, so '
                    'there is no native route to check here.')
    runs = self.runs
    self.assertContainsSubset(_NATIVE_OPS, runs['on']['onednn_ops'])
    self.assertEqual([], runs['off']['onednn_ops'])
    on, off = _errors(runs['on']), _errors(runs['off'])
    # oneDNN accumulates in float32 and rounds once: one ulp at most, on
    # every kernel, where Eigen's filter gradient needs the random walk.
    for name, (error, _, _) in on.items():
      self.assertLessEqual(error, 2 * _U, '%s: %.2fu' % (name, error / _U))
    differing = [name for name in on
                 if not np.array_equal(on[name][1], off[name][1])]
    self.assertIn('conv2d_grad_filter', differing)
    print('oneDNN ops with TF_ENABLE_ONEDNN_OPTS=1: %s; outputs differing '
          'from Eigen: %s' % (', '.join(runs['on']['onednn_ops']),
                              ', '.join(sorted(differing))))

  def test_settings_agree_bit_for_bit_without_native_bfloat16(self):
    if native_bfloat16():
      self.skipTest('This CPU has AVX512-BF16/AMX: oneDNN runs its own '
                    'bfloat16 kernels, checked against float64 above.')
    runs = self.runs
    for name, kernel in runs['off']['kernels'].items():
      self.assertEqual(kernel['values'], runs['on']['kernels'][name]['values'],
                       name)

  def test_training_steps_agree(self):
    runs = self.runs
    for run in runs.values():
      self.assertTrue(np.isfinite(run['eval']['loss']))
    self.assertEqual(runs['off']['eval']['global_step'],
                     runs['on']['eval']['global_step'])
    self.assertAllClose(runs['off']['eval']['loss'],
                        runs['on']['eval']['loss'], atol=_LOSS_TOLERANCE)


if __name__ == '__main__':
  tf.test.main()
