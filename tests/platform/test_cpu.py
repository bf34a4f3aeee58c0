"""estimator_bf16.platform.cpu_bfloat16: native bfloat16 detection and the once-per-process note.

Every test reads a fake cpuinfo, so the results do not depend on the
machine that runs them.
"""

import os
from unittest import mock

from absl.testing import parameterized
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.apps import cli
from estimator_bf16.platform import cpu_bfloat16
from estimator_bf16.runner import program as runner

_X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma {extra}

processor\t: 1
flags\t\t: fpu sse2 avx avx2 fma {extra}
"""
_ARM = """processor\t: 0
Features\t: fp asimd {extra}
CPU implementer\t: 0x41
"""


class CpuTest(tf.test.TestCase, parameterized.TestCase):

  def _cpuinfo(self, template, extra=''):
    path = os.path.join(self.create_tempdir().full_path, 'cpuinfo')
    with open(path, 'w') as f:
      f.write(template.format(extra=extra))
    return path

  @parameterized.named_parameters(
      ('avx2_only', _X86, '', False, ()),
      ('avx512_bf16', _X86, 'avx512f avx512_bf16', True, ('avx512_bf16',)),
      ('amx', _X86, 'amx_tile amx_bf16', True, ('amx_bf16',)),
      ('arm_bf16', _ARM, 'bf16 i8mm', True, ('bf16',)),
      ('arm_without', _ARM, 'sve', False, ()))
  def test_native_bfloat16_from_flags(self, template, extra, native, flags):
    path = self._cpuinfo(template, extra)
    self.assertEqual(cpu_bfloat16.native_bfloat16(path), native)
    support = cpu_bfloat16.bfloat16_support(path, onednn_enabled=True)
    self.assertEqual(support.native, native)
    self.assertEqual(support.flags, flags)

  def test_native_flags_with_onednn_off_is_emulated(self):
    path = self._cpuinfo(_X86, 'avx512_bf16')
    support = cpu_bfloat16.bfloat16_support(path, onednn_enabled=False)
    self.assertFalse(support.native)
    self.assertIn('TF_ENABLE_ONEDNN_OPTS=0', support.reason)

  def test_unreadable_cpuinfo_is_unknown_and_says_nothing(self):
    missing = os.path.join(self.create_tempdir().full_path, 'absent')
    self.assertIsNone(cpu_bfloat16.cpu_flags(missing))
    self.assertIsNone(cpu_bfloat16.bfloat16_support(missing).native)
    self.assertFalse(cpu_bfloat16.native_bfloat16(missing))
    with mock.patch.object(cpu_bfloat16, '_said', False):
      self.assertIsNone(cpu_bfloat16.warn_if_emulated(missing))

  def test_says_once_per_process_on_an_emulating_cpu(self):
    path = self._cpuinfo(_X86)
    with mock.patch.object(cpu_bfloat16, '_said', False), \
        mock.patch.object(cpu_bfloat16.logging, 'warning') as warning:
      message = cpu_bfloat16.warn_if_emulated(path)
      self.assertIsNone(cpu_bfloat16.warn_if_emulated(path))
    self.assertIn('compute in float32 from bfloat16 inputs', message)
    self.assertIn('no AVX512-BF16/AMX', message)
    warning.assert_called_once_with(message)

  def test_says_nothing_on_a_native_cpu(self):
    path = self._cpuinfo(_X86, 'avx512_bf16')
    with mock.patch.object(cpu_bfloat16, '_said', False), \
        mock.patch.object(cpu_bfloat16.logging, 'warning') as warning:
      self.assertIsNone(cpu_bfloat16.warn_if_emulated(path, onednn_enabled=True))
    warning.assert_not_called()

  @parameterized.parameters(('bfloat16', 1), ('float32', 0))
  def test_make_tpu_estimator_says_it(self, precision, times):
    fake = self._cpuinfo(_X86)
    with mock.patch.object(cpu_bfloat16, '_said', False), \
        mock.patch.object(cpu_bfloat16, 'CPUINFO_PATH', fake), \
        mock.patch.object(cpu_bfloat16.logging, 'warning') as warning:
      for _ in range(2):
        eb.make_tpu_estimator(lambda features, labels, mode, params: None,
                              model_dir=self.create_tempdir().full_path,
                              precision=precision, train_batch_size=8)
    self.assertEqual(warning.call_count, times)
    if times:
      self.assertIn('compute in float32 from bfloat16 inputs',
                    warning.call_args[0][0])

  def test_with_own_kernels_it_says_they_are_slow(self):
    path = self._cpuinfo(_X86)
    with mock.patch.object(cpu_bfloat16, '_said', False), \
        mock.patch.object(cpu_bfloat16.logging, 'warning'):
      message = cpu_bfloat16.warn_if_emulated(path, kernels='bfloat16')
    self.assertIn("keeps TensorFlow's own bfloat16 kernels", message)

  @parameterized.parameters(('bfloat16', 1), ('float32', 0))
  def test_run_says_it_before_the_program_starts(self, precision, times):
    fake = self._cpuinfo(_X86)
    program = self.create_tempfile('hello.py', 'print("the program ran")')
    said = []

    def warning(message, *args):
      del args
      said.append(message)

    def record_start(*args, **kwargs):
      said.append('program started')
      raise runner.ProgramError('stop here')

    with mock.patch.object(cpu_bfloat16, '_said', False), \
        mock.patch.object(cpu_bfloat16, 'CPUINFO_PATH', fake), \
        mock.patch.object(cpu_bfloat16.logging, 'warning', warning), \
        mock.patch.object(runner, 'run_program', record_start):
      code = cli.main(['run', '--precision=%s' % precision,
                       program.full_path])
    self.assertEqual(code, 2)
    self.assertLen(said, times + 1)
    self.assertEqual(said[-1], 'program started')
    if times:
      self.assertIn('bfloat16 is emulated on this CPU', said[0])
      self.assertNotIn('\n', said[0])


if __name__ == '__main__':
  tf.test.main()
