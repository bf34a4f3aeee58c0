"""Per-op kernel speed, bfloat16 against float32, on the CPU at hand.

The source of `estimator_bf16/autocast/cpu_kernels.py`: for each op type the
reference models and public programs use (conv and matmul forward and
gradients, einsum, pooling and its gradient, elementwise ops and their
gradients, batch norm, softmax), one op is built on inputs resident in
variables, in float32 and in bfloat16, and the two are run alternately in
one process, with a third form: what substitution builds (bfloat16 inputs
cast to float32, the float32 op, its result rounded to bfloat16). A
bfloat16 kernel is slow here when that form, casts included, beats it by
more than `SLOW_RATIO`.

The CPU kind decides which kernels run: with AVX512-BF16/AMX and oneDNN on,
TensorFlow 2.15 runs oneDNN's native bfloat16 kernels; without them (an
AVX2 CPU), or with `TF_ENABLE_ONEDNN_OPTS=0`, it runs Eigen's kernels,
which convert bfloat16 to float32 and back element by element. `measure`
runs in the current process; `measure_kind` in a child process whose
environment selects the kind, so that a native machine can measure the
emulated kernels too (see `kinds`).
"""

import json
import os
import statistics
import subprocess
import sys
import time

# The forms each op is timed in: float32, bfloat16, and substituted
# (bfloat16 inputs cast to float32, the float32 op, its result cast back).
VARIANTS = ('float32', 'bfloat16', 'substituted')
# A bfloat16 kernel is slow when its substituted form, casts included, is
# faster by more than this factor (a margin over the timing noise).
SLOW_RATIO = 1.15


def _conv_shapes(batch):
  # The reference case: 28x28x32 -> 64 channels, 3x3, SAME.
  return [batch, 28, 28, 32], [3, 3, 32, 64], [batch, 28, 28, 64]


def _cases():
  """{name: (op type, builder(tf, dtype, variable) -> op to run)}."""
  # Imported here: the parent process of `measure_kind` never loads it.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def conv2d(dtype, var):
    x, w, _ = _conv_shapes(16)
    return tf.nn.conv2d(var(x, dtype), var(w, dtype), 1, 'SAME')

  def conv2d_backprop_input(dtype, var):
    x, w, y = _conv_shapes(16)
    return tf.raw_ops.Conv2DBackpropInput(
        input_sizes=x, filter=var(w, dtype), out_backprop=var(y, dtype),
        strides=[1, 1, 1, 1], padding='SAME')

  def conv2d_backprop_filter(dtype, var):
    x, w, y = _conv_shapes(16)
    return tf.raw_ops.Conv2DBackpropFilter(
        input=var(x, dtype), filter_sizes=w, out_backprop=var(y, dtype),
        strides=[1, 1, 1, 1], padding='SAME')

  def depthwise(dtype, var):
    return tf.nn.depthwise_conv2d(var([16, 28, 28, 64], dtype),
                                  var([3, 3, 64, 1], dtype), [1, 1, 1, 1],
                                  'SAME')

  def depthwise_backprop_input(dtype, var):
    return tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=[16, 28, 28, 64], filter=var([3, 3, 64, 1], dtype),
        out_backprop=var([16, 28, 28, 64], dtype), strides=[1, 1, 1, 1],
        padding='SAME')

  def depthwise_backprop_filter(dtype, var):
    return tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=var([16, 28, 28, 64], dtype), filter_sizes=[3, 3, 64, 1],
        out_backprop=var([16, 28, 28, 64], dtype), strides=[1, 1, 1, 1],
        padding='SAME')

  def matmul(dtype, var):
    return tf.matmul(var([1024, 768], dtype), var([768, 768], dtype))

  def batch_matmul(dtype, var):
    return tf.matmul(var([48, 128, 64], dtype), var([48, 64, 128], dtype))

  def einsum(dtype, var):
    return tf.einsum('bsh,hd->bsd', var([8, 128, 768], dtype),
                     var([768, 768], dtype))

  act = [16, 28, 28, 64]

  def unary(fn):
    return lambda dtype, var: fn(var(act, dtype))

  def binary(fn):
    return lambda dtype, var: fn(var(act, dtype), var(act, dtype))

  def max_pool(dtype, var):
    return tf.nn.max_pool2d(var(act, dtype), 2, 2, 'SAME')

  def max_pool_grad(dtype, var):
    return tf.raw_ops.MaxPoolGrad(
        orig_input=var(act, dtype),
        orig_output=var([16, 14, 14, 64], dtype),
        grad=var([16, 14, 14, 64], dtype), ksize=[1, 2, 2, 1],
        strides=[1, 2, 2, 1], padding='SAME')

  def avg_pool(dtype, var):
    return tf.nn.avg_pool2d(var(act, dtype), 2, 2, 'SAME')

  def avg_pool_grad(dtype, var):
    return tf.raw_ops.AvgPoolGrad(
        orig_input_shape=act, grad=var([16, 14, 14, 64], dtype),
        ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding='SAME')

  def bias_add(dtype, var):
    return tf.nn.bias_add(var(act, dtype), var([64], dtype))

  def bias_add_grad(dtype, var):
    return tf.raw_ops.BiasAddGrad(out_backprop=var(act, dtype))

  def batch_norm(dtype, var):
    return tf.raw_ops.FusedBatchNormV3(
        x=var(act, dtype), scale=var([64], tf.float32),
        offset=var([64], tf.float32), mean=tf.zeros([0]),
        variance=tf.zeros([0]), is_training=True)[0]

  def batch_norm_grad(dtype, var):
    return tf.raw_ops.FusedBatchNormGradV3(
        y_backprop=var(act, dtype), x=var(act, dtype),
        scale=var([64], tf.float32), reserve_space_1=var([64], tf.float32),
        reserve_space_2=var([64], tf.float32),
        reserve_space_3=var([64], tf.float32), is_training=True)[0]

  def softmax(dtype, var):
    return tf.nn.softmax(var([1024, 1000], dtype))

  def gelu(dtype, var):
    return tf.nn.gelu(var([8, 128, 3072], dtype), approximate=True)

  return {
      'Conv2D': ('Conv2D', conv2d),
      'Conv2DBackpropInput': ('Conv2DBackpropInput', conv2d_backprop_input),
      'Conv2DBackpropFilter': ('Conv2DBackpropFilter',
                               conv2d_backprop_filter),
      'DepthwiseConv2dNative': ('DepthwiseConv2dNative', depthwise),
      'DepthwiseConv2dNativeBackpropInput': (
          'DepthwiseConv2dNativeBackpropInput', depthwise_backprop_input),
      'DepthwiseConv2dNativeBackpropFilter': (
          'DepthwiseConv2dNativeBackpropFilter', depthwise_backprop_filter),
      'MatMul': ('MatMul', matmul),
      'BatchMatMulV2': ('BatchMatMulV2', batch_matmul),
      'Einsum': ('Einsum', einsum),
      'MaxPool': ('MaxPool', max_pool),
      'MaxPoolGrad': ('MaxPoolGrad', max_pool_grad),
      'AvgPool': ('AvgPool', avg_pool),
      'AvgPoolGrad': ('AvgPoolGrad', avg_pool_grad),
      'Relu': ('Relu', unary(tf.nn.relu)),
      'ReluGrad': ('ReluGrad', binary(lambda g, x: tf.raw_ops.ReluGrad(
          gradients=g, features=x))),
      'Tanh': ('Tanh', unary(tf.tanh)),
      'TanhGrad': ('TanhGrad', binary(lambda y, dy: tf.raw_ops.TanhGrad(
          y=y, dy=dy))),
      'Sigmoid': ('Sigmoid', unary(tf.sigmoid)),
      'Mul': ('Mul', binary(tf.multiply)),
      'AddV2': ('AddV2', binary(tf.add)),
      'BiasAdd': ('BiasAdd', bias_add),
      'BiasAddGrad': ('BiasAddGrad', bias_add_grad),
      'FusedBatchNormV3': ('FusedBatchNormV3', batch_norm),
      'FusedBatchNormGradV3': ('FusedBatchNormGradV3', batch_norm_grad),
      'Softmax': ('Softmax', softmax),
      'Gelu (tanh form)': ('Tanh', gelu),
  }


def _time_variants(tf, build, runs, rounds):
  """Median seconds per run of the op in each `VARIANTS` form."""
  graph = tf.Graph()
  with graph.as_default():
    variables = []

    def var(shape, dtype):
      # A non-trainable variable holds the input: read each run, not folded.
      value = tf.random.stateless_uniform(shape, [len(variables), 7], -1, 1)
      variables.append(tf.Variable(tf.cast(value, dtype), trainable=False))
      return variables[-1]

    def bfloat16_var_read_as_float32(shape, dtype):
      del dtype  # stored bfloat16, computed in float32
      return tf.cast(var(shape, tf.bfloat16), tf.float32)

    ops = {
        'float32': build(tf.float32, var).op,
        'bfloat16': build(tf.bfloat16, var).op,
        # What substitution builds: bfloat16 in, float32 op, bfloat16 out.
        'substituted': tf.cast(build(tf.float32, bfloat16_var_read_as_float32),
                               tf.bfloat16).op,
    }
    init = tf.compat.v1.global_variables_initializer()
  times = {name: [] for name in VARIANTS}
  config = tf.compat.v1.ConfigProto()
  # The ops as built: grappler would fold or fuse a lone op on constants.
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  with tf.compat.v1.Session(graph=graph, config=config) as session:
    session.run(init)
    for name in times:
      session.run(ops[name])   # warm-up: kernel creation, oneDNN primitives
    for _ in range(rounds):
      for name in times:
        start = time.perf_counter()
        for _ in range(runs):
          session.run(ops[name])
        times[name].append((time.perf_counter() - start) / runs)
  return {name: statistics.median(value) for name, value in times.items()}


def measure(names=None, runs=5, rounds=5):
  """Times each case in this process.

  Args:
    names: case names (keys of the table); None: all.
    runs: runs of one op per timing window.
    rounds: alternating float32/bfloat16 windows per case.

  Returns:
    A list of dicts: 'case', 'op_type', 'float32_ms', 'bfloat16_ms',
    'substituted_ms', 'ratio' (bfloat16 time / float32 time), 'slow'
    (bfloat16 time > `SLOW_RATIO` x the substituted time).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  rows = []
  for case, (op_type, build) in _cases().items():
    if names and case not in names:
      continue
    seconds = _time_variants(tf, build, runs, rounds)
    rows.append({
        'case': case, 'op_type': op_type,
        'float32_ms': 1e3 * seconds['float32'],
        'bfloat16_ms': 1e3 * seconds['bfloat16'],
        'substituted_ms': 1e3 * seconds['substituted'],
        'ratio': seconds['bfloat16'] / seconds['float32'],
        'slow': seconds['bfloat16'] > SLOW_RATIO * seconds['substituted']})
  return rows


def kinds():
  """{kind: environment overrides} measurable on this machine.

  `'emulated'` (Eigen's kernels, what an AVX2 CPU runs) is measurable
  everywhere with oneDNN off; `'native'` only on a CPU with AVX512-BF16 or
  AMX, with oneDNN on.
  """
  from estimator_bf16.platform import cpu_bfloat16  # pylint: disable=g-import-not-at-top
  found = {'emulated': {'TF_ENABLE_ONEDNN_OPTS': '0'}}
  if cpu_bfloat16.native_bfloat16():
    found['native'] = {'TF_ENABLE_ONEDNN_OPTS': '1'}
  return found


def measure_kind(kind, env, runs=5, rounds=5, timeout=900):
  """`measure` in a child process with `env` added to the environment."""
  child_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', **env)
  code = ('import json, sys; from benchmarks import kernel_table; '
          'print(json.dumps(kernel_table.measure(runs=%d, rounds=%d)))'
          % (runs, rounds))
  output = subprocess.run([sys.executable, '-c', code], env=child_env,
                          check=True, capture_output=True, text=True,
                          timeout=timeout,
                          cwd=os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))).stdout
  rows = json.loads(output.strip().splitlines()[-1])
  for row in rows:
    row['kind'] = kind
  return rows


if __name__ == '__main__':
  for row in measure():
    print('%-38s %9.3f %9.3f %9.3f %6.2fx%s' % (
        row['case'], row['float32_ms'], row['bfloat16_ms'],
        row['substituted_ms'], row['ratio'],
        '  slow' if row['slow'] else ''))
