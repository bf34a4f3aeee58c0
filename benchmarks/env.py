"""The machine and software a benchmark ran on, for results.json.

bfloat16 speed on a CPU depends on its instructions: AVX512-BF16 and AMX
run bfloat16 matmuls natively, AVX2 alone does not. So the CPU flags, the
oneDNN setting and the load of this (shared) machine go with every result.
"""

import datetime
import os
import platform

import tensorflow as tf

from estimator_bf16.platform import cpu_bfloat16

# CPU flags that decide how fast bfloat16 (and float32) math can be.
_FLAGS_OF_INTEREST = ('avx', 'avx2', 'fma', 'f16c', 'avx512f', 'avx512bw',
                      'avx512_vnni', 'avx512_bf16', 'amx_tile', 'amx_bf16',
                      'amx_int8')


def cpu_info(path='/proc/cpuinfo'):
  """Returns (model name, set of flags) of the first CPU, or ('', set())."""
  try:
    with open(path) as cpuinfo:
      text = cpuinfo.read()
  except OSError:
    return platform.processor(), set()
  model, flags = '', set()
  for line in text.splitlines():
    key, _, value = line.partition(':')
    key = key.strip()
    if key == 'model name' and not model:
      model = value.strip()
    elif key == 'flags' and not flags:
      flags = set(value.split())
  return model, flags


def onednn_setting():
  """What TensorFlow does with oneDNN here, as a short description."""
  value = os.environ.get('TF_ENABLE_ONEDNN_OPTS')
  if value is None:
    # TensorFlow 2.9+ turns oneDNN on by default on Linux x86.
    return 'TF_ENABLE_ONEDNN_OPTS unset (oneDNN on by default)'
  return 'TF_ENABLE_ONEDNN_OPTS=%s' % value


def onednn_rewrite_active():
  """Whether TensorFlow's oneDNN bfloat16 rewrite acts on this CPU.

  The grappler pass `auto_mixed_precision_onednn_bfloat16` leaves the graph
  alone ("oneDNN BFloat16 support are only on platforms with AVX512") unless
  TensorFlow's own CPU check passes (AVX512F on TensorFlow 2.15), and it is
  part of oneDNN, so TF_ENABLE_ONEDNN_OPTS=0 turns it off too.
  """
  if os.environ.get('TF_ENABLE_ONEDNN_OPTS', '1').lower() in ('0', 'false'):
    return False
  # pylint: disable=g-import-not-at-top
  from tensorflow.python.util import _pywrap_utils
  # pylint: enable=g-import-not-at-top
  check = getattr(_pywrap_utils, 'IsBF16SupportedByOneDNNOnThisCPU', None)
  if check is not None:
    return bool(check())
  return 'avx512f' in cpu_info()[1]


def load_average():
  try:
    return list(os.getloadavg())
  except OSError:
    return None


def describe():
  """Returns a JSON-ready dict describing this machine and software."""
  model, flags = cpu_info()
  try:
    import keras  # pylint: disable=g-import-not-at-top
    keras_version = keras.__version__
  except ImportError:
    keras_version = None
  import numpy as np  # pylint: disable=g-import-not-at-top
  total_memory = None
  try:
    total_memory = (os.sysconf('SC_PAGE_SIZE') *
                    os.sysconf('SC_PHYS_PAGES'))
  except (ValueError, OSError):
    pass
  return {
      'date': datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%d %H:%M UTC'),
      'cpu': model,
      'cpu_count': os.cpu_count(),
      'memory_bytes': total_memory,
      'cpu_flags': {flag: flag in flags for flag in _FLAGS_OF_INTEREST},
      'native_bfloat16': bool({'avx512_bf16', 'amx_bf16'} & flags),
      # False also when oneDNN is off: then TensorFlow emulates bfloat16.
      'bfloat16_kernels_native': cpu_bfloat16.bfloat16_support().native,
      # Whether the peer, TensorFlow's oneDNN bfloat16 rewrite, acts here.
      'onednn_rewrite_active': onednn_rewrite_active(),
      'onednn': onednn_setting(),
      'tf_cpu_allocator_use_bfc': os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'),
      'tensorflow': tf.__version__,
      'keras': keras_version,
      'numpy': np.__version__,
      'python': platform.python_version(),
      'platform': platform.platform(),
      'load_average_start': load_average(),
  }
