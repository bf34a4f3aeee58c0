"""Raw kernel speed: one matmul and one convolution, bfloat16 against float32.

Whether bfloat16 trains faster on a CPU is decided here, below any model:
with AVX512-BF16 or AMX, oneDNN runs bfloat16 matmuls natively (about twice
the float32 rate); with AVX2 alone, TensorFlow converts the operands to
float32 and back, so bfloat16 can only be slower. Measured the same way as
the models (alternating windows), so the two can be read together.
"""

import tensorflow as tf

from benchmarks import throughput


def _graph(kind, dtype, size):
  """A graph running one op of `kind` in `dtype`; returns (graph, fetch)."""
  graph = tf.Graph()
  with graph.as_default():
    if kind == 'matmul':
      shapes = ([size, size], [size, size])
    else:  # a ResNet-style 3x3 convolution, 128 channels
      shapes = ([32, size // 32, size // 32, 128], [3, 3, 128, 128])
    a, b = (tf.Variable(tf.random.stateless_normal(s, [1, i]), name='x%d' % i)
            for i, s in enumerate(shapes))
    a, b = tf.cast(a, dtype), tf.cast(b, dtype)
    # Inputs are cast once at initialisation, not timed: the op alone is.
    a, b = (tf.Variable(t, trainable=False) for t in (a, b))
    if kind == 'matmul':
      out = tf.matmul(a, b)
    else:
      out = tf.nn.conv2d(a, b, strides=1, padding='SAME')
    # A scalar fetch: the op runs, its result is not copied out.
    fetch = tf.reduce_sum(tf.cast(out[:1], tf.float32))
  return graph, fetch


def kernel_speed(kind='matmul', size=2048, warmup_steps=2, window_steps=3,
                 windows=5):
  """bfloat16 over float32 speed of one op, alternating in one process.

  Args:
    kind: 'matmul' ([size, size] x [size, size]) or 'conv2d'
      (32 x size/32 x size/32 x 128 images, 3x3x128x128 filter).
    size: see `kind`.
    warmup_steps, window_steps, windows: see
      `throughput.alternating_windows`.

  Returns:
    dict: 'kind', 'size', 'speed_ratio' (bfloat16 runs per second over
    float32's, median of paired windows) and its 'speed_ratio_iqr'.
  """
  sessions, variants = [], {}
  try:
    for name, dtype in (('float32', tf.float32), ('bfloat16', tf.bfloat16)):
      graph, fetch = _graph(kind, dtype, size)
      session = tf.compat.v1.Session(graph=graph)
      sessions.append(session)
      with graph.as_default():
        # One at a time, in creation order: the cast copies read the
        # random variables.
        for variable in tf.compat.v1.global_variables():
          session.run(variable.initializer)
      variants[name] = (lambda s=session, f=fetch: s.run(f), 1)
    rates = throughput.alternating_windows(
        variants, warmup_steps=warmup_steps, window_steps=window_steps,
        windows=windows)
  finally:
    for session in sessions:
      session.close()
  summary = throughput.summarize(rates, 'bfloat16', 'float32')
  return {'kind': kind, 'size': size, 'speed_ratio': summary['ratio'],
          'speed_ratio_iqr': summary['ratio_iqr']}
