"""Does this CPU compute bfloat16 natively, and saying so once.

TensorFlow runs bfloat16 ops through oneDNN's native kernels only on CPUs
with bfloat16 arithmetic: AVX512-BF16 or AMX on x86 (`avx512_bf16`,
`amx_bf16` in /proc/cpuinfo), BF16 on Arm (`bf16` in its `Features`), and
only while oneDNN is on (TF_ENABLE_ONEDNN_OPTS, on by default on Linux).
Elsewhere its kernels convert bfloat16 to float32, compute, and convert
back: a local bfloat16 run is then slower than float32 (users report
"mixed precision made my CPU 50x slower", tensorflow#45441, #59050). It
still checks what matters before a TPU job: dtypes, the audit, the
numerics. `warn_if_emulated` says that once per process, and what the
package does about it: ops whose emulated bfloat16 kernels are slow compute
in float32 from bfloat16 inputs (`estimator_bf16.autocast.cpu_kernels`).
"""

import collections
import os
import platform
import threading

from absl import logging

# Flags (x86 `flags`, Arm `Features`) that mean bfloat16 arithmetic.
NATIVE_BFLOAT16_FLAGS = ('avx512_bf16', 'amx_bf16', 'bf16')
# Where Linux describes the CPU; a module constant so tests can point it
# at a fake file.
CPUINFO_PATH = '/proc/cpuinfo'

EMULATED_MESSAGE = (
    'bfloat16 is emulated on this CPU (%s): the ops whose emulated bfloat16 '
    'kernels are slow here (conv gradients, einsum, depthwise conv) compute '
    'in float32 from bfloat16 inputs, rounded to bfloat16, so a bfloat16 '
    'step costs about what a float32 one does (--kernels=bfloat16 runs '
    "TensorFlow's own kernels instead); a TPU, or a CPU with AVX512-BF16/AMX, "
    'shows the speed of bfloat16.')
EMULATED_MESSAGE_OWN_KERNELS = (
    "bfloat16 is emulated on this CPU (%s) and --kernels=bfloat16 keeps "
    "TensorFlow's own bfloat16 kernels: expect conv gradients and einsums "
    'several times slower than float32.')

Bfloat16Support = collections.namedtuple('Bfloat16Support',
                                       ['native', 'flags', 'reason'])
Bfloat16Support.__doc__ = """What this machine does with bfloat16.

Attributes:
  native: True if TensorFlow runs native bfloat16 kernels here, False if it
    emulates them, None if unknown (no /proc/cpuinfo, e.g. macOS).
  flags: the bfloat16 flags the CPU has, sorted.
  reason: one phrase saying why, for messages.
"""

_lock = threading.Lock()
_said = False


def cpu_flags(cpuinfo=None):
  """The first CPU's flags (x86 `flags` or Arm `Features`), or None.

  Args:
    cpuinfo: path of a /proc/cpuinfo-format file; None: `CPUINFO_PATH`.

  Returns:
    A frozenset of flag names, or None if the file cannot be read or has no
    flags line.
  """
  try:
    with open(cpuinfo or CPUINFO_PATH) as lines:
      for line in lines:
        key, _, value = line.partition(':')
        if key.strip() in ('flags', 'Features'):
          return frozenset(value.split())
  except OSError:
    pass
  return None


def _onednn_enabled():
  """Whether TensorFlow's oneDNN kernels are on in this process."""
  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  try:
    from tensorflow.python.util import _pywrap_util_port
    return bool(_pywrap_util_port.IsMklEnabled())
  except (ImportError, AttributeError):
    return os.environ.get('TF_ENABLE_ONEDNN_OPTS', '1') not in ('0', 'false')


def bfloat16_support(cpuinfo=None, onednn_enabled=None):
  """Whether TensorFlow computes bfloat16 natively here.

  Args:
    cpuinfo: path of a /proc/cpuinfo-format file; None: `CPUINFO_PATH`.
    onednn_enabled: whether oneDNN is on; None asks TensorFlow.

  Returns:
    A `Bfloat16Support`.
  """
  flags = cpu_flags(cpuinfo)
  if flags is None:
    return Bfloat16Support(None, (), 'CPU flags unknown on %s' % (
        platform.system() or 'this system'))
  native = tuple(sorted(flags & set(NATIVE_BFLOAT16_FLAGS)))
  if not native:
    return Bfloat16Support(False, native, 'no AVX512-BF16/AMX')
  if onednn_enabled is None:
    onednn_enabled = _onednn_enabled()
  if not onednn_enabled:
    return Bfloat16Support(False, native, 'it has %s, but oneDNN is off '
                         '(TF_ENABLE_ONEDNN_OPTS=0)' % ' and '.join(native))
  return Bfloat16Support(True, native, 'it has %s' % ' and '.join(native))


def emulated_kernels(cpuinfo=None):
  """True if TensorFlow runs emulated bfloat16 kernels here.

  That is a CPU without bfloat16 arithmetic, or one with it while oneDNN is
  off (`TF_ENABLE_ONEDNN_OPTS=0`): either way Eigen's kernels convert
  bfloat16 to float32 copies. False on a native CPU, and where the CPU is
  unknown.
  """
  return bfloat16_support(cpuinfo).native is False


def native_bfloat16(cpuinfo=None):
  """True if this CPU has bfloat16 arithmetic (whatever oneDNN's setting)."""
  return bool((cpu_flags(cpuinfo) or frozenset()) &
              set(NATIVE_BFLOAT16_FLAGS))


def warn_if_emulated(cpuinfo=None, onednn_enabled=None, kernels='auto'):
  """Logs `EMULATED_MESSAGE` once per process if bfloat16 is emulated here.

  Callers ask only for runs that compute in bfloat16: a float32 run has
  nothing to hear.

  Args:
    cpuinfo, onednn_enabled: as in `bfloat16_support`.
    kernels: 'auto' or 'bfloat16' (`EMULATED_MESSAGE_OWN_KERNELS`), as
      `eb.wrap_model_fn` gets it.

  Returns:
    The message logged by this call, or None.
  """
  global _said
  support = bfloat16_support(cpuinfo, onednn_enabled)
  if support.native is not False:
    return None
  with _lock:
    if _said:
      return None
    _said = True
  message = (EMULATED_MESSAGE_OWN_KERNELS if kernels == 'bfloat16'
             else EMULATED_MESSAGE) % support.reason
  logging.warning(message)
  return message
