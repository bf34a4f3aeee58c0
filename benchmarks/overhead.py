"""What the wrapper costs: `eb.wrap_model_fn` against hand-written bfloat16.

Two costs: per training step (`measure_overhead`), and per model_fn call
at graph-build time (`measure_build_overhead`), where the wrapper's
patching and audit run.

The reference is the tensorflow/tpu way (`resnet_main.py`): the user edits
the model_fn so the network is built under `tf.compat.v1.tpu.bfloat16_scope`
on inputs cast by hand, and casts the logits back to float32 by hand. The
contender is the same, unmodified model_fn wrapped by `eb.wrap_model_fn`.
Both get float32 images from the same input pipeline and the same head, so
any difference in graph or step time is the wrapper's.

A difference of a few percent drowns in this shared machine's noise unless
the two alternate at a fine grain: the default configs time single steps,
wrapped and hand-written in turn, hundreds of times.
"""

import collections
import gc
import statistics
import time

import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.precision import op_lists
from benchmarks import graphs
from benchmarks import throughput


def hand_written_network_builder(spec):
  """Returns `builder(params) -> network_fn` with tensorflow/tpu-style casts."""
  network_builder = graphs.network_fn_builder(spec)

  def builder(params):
    network_fn = network_builder(params)

    def bfloat16_network(inputs, is_training):
      if isinstance(inputs, tf.Tensor) and inputs.dtype == tf.float32:
        inputs = tf.cast(inputs, tf.bfloat16)  # ids (BERT) are never cast
      with tf.compat.v1.tpu.bfloat16_scope():
        logits = network_fn(inputs, is_training)
      return tf.cast(logits, tf.float32)

    return bfloat16_network

  return builder


def op_counts(graph):
  """{op type: count} of a graph."""
  return collections.Counter(op.type for op in graph.get_operations())


# Ops autocast computes another way rather than adds: a select of zeros on
# bfloat16 becomes a multiply by the mask.
_REPLACES = {'MulNoNan': tuple(sorted(op_lists.ZERO_SELECT_OPS))}


def compare_graphs(wrapped, hand_written):
  """Op counts of both graphs and what the wrapped one has in addition.

  Args:
    wrapped: `tf.Graph` of the wrapped model.
    hand_written: `tf.Graph` of the hand-written model.

  Returns:
    dict: 'wrapped_ops', 'hand_written_ops', 'wrapped_casts',
    'hand_written_casts', 'replaced_ops' ({'Old -> New': count}: ops of
    the hand-written graph that the wrapped one computes as another op,
    matched one for one), and 'extra_ops_besides_casts' ({op type: how many
    more the wrapped graph has, beyond those replacements}, Cast excluded;
    empty when the wrapper adds nothing but casts).
  """
  a, b = op_counts(wrapped), op_counts(hand_written)
  extra, replaced = {}, {}
  for kind in a:
    more = a[kind] - b[kind]
    if kind == 'Cast' or more <= 0:
      continue
    for old in _REPLACES.get(kind, ()):
      fewer = min(more, b[old] - a[old])
      if fewer > 0:
        replaced['%s -> %s' % (old, kind)] = fewer
        more -= fewer
    if more > 0:
      extra[kind] = more
  return {'wrapped_ops': sum(a.values()), 'hand_written_ops': sum(b.values()),
          'wrapped_casts': a['Cast'], 'hand_written_casts': b['Cast'],
          'replaced_ops': replaced, 'extra_ops_besides_casts': extra}


def measure_overhead(spec, batch_size, *, warmup_steps, window_steps,
                     windows):
  """Step time and graphs of wrapped vs hand-written bfloat16 training.

  Args:
    spec: a `configs.ModelSpec`.
    batch_size: examples per step.
    warmup_steps, window_steps, windows: see
      `throughput.alternating_windows`.

  Returns:
    dict: 'model', 'batch_size', 'step_time_ratio' (wrapped over
    hand-written, the median of paired windows), 'step_time_ratio_iqr',
    'total_time_ratio' (all wrapped windows over all hand-written ones), the
    `compare_graphs` counts, and both variants' examples/sec.
  """
  wrapped = graphs.build_train_step(spec, 'bfloat16', batch_size,
                                    wrap_input=False)
  hand_written = graphs.build_train_step(
      spec, 'bfloat16', batch_size, wrap_model=False, wrap_input=False,
      model_fn_override=graphs.model_fn(
          spec, network_builder=hand_written_network_builder(spec)))
  rates = graphs.time_train_steps(
      {'wrapped': wrapped, 'hand_written': hand_written},
      warmup_steps=warmup_steps, window_steps=window_steps, windows=windows)
  # Step time is the inverse of throughput: hand-written rate over wrapped.
  summary = throughput.summarize(rates, 'hand_written', 'wrapped')
  totals = {name: sum(1.0 / rate for rate in rates[name]) for name in rates}
  result = {'model': spec.name, 'batch_size': batch_size,
            'step_time_ratio': summary['ratio'],
            'step_time_ratio_iqr': summary['ratio_iqr'],
            'total_time_ratio': totals['wrapped'] / totals['hand_written'],
            'timed_steps_each': window_steps * windows,
            'wrapped_examples_per_sec': summary['wrapped_examples_per_sec'],
            'hand_written_examples_per_sec':
                summary['hand_written_examples_per_sec'],
            'wrapped_bfloat16_flop_share':
                wrapped.report.bfloat16_flop_share,
            'hand_written_bfloat16_flop_share':
                hand_written.report.bfloat16_flop_share}
  result.update(compare_graphs(wrapped.graph, hand_written.graph))
  return result


BUILD_VARIANTS = ('float32', 'hand_written_bfloat16', 'wrapped_bfloat16')


def _model_fn_call_seconds(spec, batch_size, variant):
  """Seconds one call of `variant`'s model_fn takes to build TRAIN ops.

  Only the call is timed, in a fresh graph on placeholder features (float32
  images or int32 ids, as the input pipeline would give them): graph
  creation and the features are the same for every variant.
  """
  if variant == 'wrapped_bfloat16':
    fn = eb.wrap_model_fn(graphs.model_fn(spec), 'bfloat16')
  elif variant == 'hand_written_bfloat16':
    fn = graphs.model_fn(spec,
                         network_builder=hand_written_network_builder(spec))
  else:
    fn = graphs.model_fn(spec)
  precision = 'float32' if variant == 'float32' else 'bfloat16'
  params = {'batch_size': batch_size, 'precision': precision,
            'use_tpu': False}
  with tf.Graph().as_default():
    tf.compat.v1.set_random_seed(1)
    feature_spec, label_spec = graphs.feature_specs(spec)
    features = {name: tf.compat.v1.placeholder(s.dtype, [batch_size] +
                                               s.shape.as_list(), name=name)
                for name, s in feature_spec.items()}
    labels = tf.compat.v1.placeholder(label_spec.dtype, [batch_size])
    # The previous graphs' garbage is collected now, not inside the call.
    gc.collect()
    start = time.perf_counter()
    fn(features, labels, tf.estimator.ModeKeys.TRAIN, params, None)
    return time.perf_counter() - start


def measure_build_overhead(spec, batch_size, *, calls):
  """What a wrapped model_fn call costs at graph-build time.

  Builds the TRAIN graph of `spec` with the plain float32 model_fn, the
  hand-written bfloat16 one (tensorflow/tpu style) and the unmodified one
  under `eb.wrap_model_fn(..., 'bfloat16')`, in turn, `calls` times each
  (interleaved, so a slow spell of the shared machine hits all alike).

  Args:
    spec: a `configs.ModelSpec`.
    batch_size: static batch of the placeholders.
    calls: calls per variant (the first of each is a warm-up, not counted:
      it imports and traces what later calls reuse).

  A build is CPU work that a busy machine can only slow down, so each
  variant's figure is its fastest call; the medians are kept alongside.

  Returns:
    dict: 'model', 'calls' (counted per variant), '<variant>_seconds' (the
    fastest call), '<variant>_median_seconds', 'seconds' (every call),
    'wrapper_seconds_per_call' (wrapped minus hand-written
    bfloat16: the wrapper's own machinery, patching and audit), and
    'wrapped_minus_float32_seconds_per_call' (what a user pays over the
    float32 build: the wrapper plus the casts it adds), with the ratios
    'wrapped_over_hand_written' and 'wrapped_over_float32'.
  """
  times = {variant: [] for variant in BUILD_VARIANTS}
  # What is alive now (earlier sections' graphs and results) is set aside
  # from the collector, so the collection before each call walks only the
  # graphs made here: a full one takes 0.4 s with two BERT-base graphs
  # alive, longer than the MLP's build, and the section ran a minute.
  gc.collect()
  gc.freeze()
  try:
    for round_index in range(calls + 1):
      order = (BUILD_VARIANTS if round_index % 2 == 0
               else BUILD_VARIANTS[::-1])
      for variant in order:
        seconds = _model_fn_call_seconds(spec, batch_size, variant)
        if round_index:
          times[variant].append(seconds)
  finally:
    gc.unfreeze()
  fastest = {variant: min(values) for variant, values in times.items()}
  wrapped = fastest['wrapped_bfloat16']
  result = {
      'model': spec.name, 'batch_size': batch_size, 'calls': calls,
      'wrapper_seconds_per_call': wrapped - fastest['hand_written_bfloat16'],
      'wrapped_minus_float32_seconds_per_call': wrapped - fastest['float32'],
      'wrapped_over_hand_written': wrapped / fastest['hand_written_bfloat16'],
      'wrapped_over_float32': wrapped / fastest['float32'],
      'seconds': times,
  }
  for variant, values in times.items():
    result[variant + '_seconds'] = fastest[variant]
    result[variant + '_median_seconds'] = statistics.median(values)
  return result
