"""The memory levers beyond bfloat16, measured side by side.

Gradient accumulation: one update of an effective batch B made of K
micro-batches of B/K, against B/K alone (what fits without the lever) and
against B at once (what the lever stands in for). Recompute: the same step
with and without recomputing activations in backprop. All variants are
bfloat16 through `eb.wrap_model_fn`, built by `graphs.build_train_step`;
peaks come from `step_memory.measure_step_memory` (one variant at a time,
so the allocator holds one session's memory), speeds from alternating
windows in one process (`graphs.time_train_steps`).

An accumulated update runs K session calls (`graphs.run_update`), as
`accumulation.AccumulationHook` does under an Estimator, so its
examples/sec includes what those extra calls cost.
"""

from benchmarks import graphs
from benchmarks import planning
from benchmarks import step_memory
from benchmarks import throughput
from estimator_bf16.precision import policy

_PRECISION = 'bfloat16'


def _ratio(top, bottom):
  return float(top) / bottom if bottom else None


def _memory(step):
  measured = step_memory.measure_step_memory(step)
  return {key: measured[key] for key in (
      'batch_size', 'peak_step_bytes', 'peak_tensor_bytes',
      'persistent_bytes', 'parameter_bytes', 'slot_bytes', 'state_bytes')}


def accumulation_comparison(spec, batch_size, steps, *, warmup_steps,
                            window_steps, windows):
  """Effective batch `batch_size` as `steps` micro-batches, against both ends.

  Args:
    spec: a `configs.ModelSpec`.
    batch_size: B, the effective batch.
    steps: K, micro-batches per update.
    warmup_steps, window_steps, windows: of the timed windows (updates).

  Returns:
    dict: 'model', 'effective_batch', 'micro_batch', 'steps', 'memory'
    ({'micro', 'accumulated', 'big'}: `_memory` of each), 'speed' (the
    examples/sec of each variant and the paired ratios of accumulated to
    micro and to big), and the judged ratios 'peak_ratio_to_micro',
    'peak_ratio_to_big' (allocator peaks) and 'speed_ratio_to_micro',
    'speed_ratio_to_big'.
  """
  micro = batch_size // steps
  built = {
      'micro': lambda: graphs.build_train_step(spec, _PRECISION, micro),
      'accumulated': lambda: graphs.build_train_step(
          spec, _PRECISION, batch_size, gradient_accumulation_steps=steps),
      'big': lambda: graphs.build_train_step(spec, _PRECISION, batch_size),
  }
  memory = {name: _memory(build()) for name, build in built.items()}
  rates = graphs.time_train_steps(
      {name: build() for name, build in built.items()},
      warmup_steps=warmup_steps, window_steps=window_steps, windows=windows)
  to_micro = throughput.summarize(rates, 'accumulated', 'micro')
  to_big = throughput.summarize(rates, 'accumulated', 'big')
  peak = {name: m['peak_step_bytes'] for name, m in memory.items()}
  return {
      'model': spec.name, 'precision': _PRECISION,
      'effective_batch': batch_size, 'micro_batch': micro, 'steps': steps,
      'memory': memory,
      'speed': {'accumulated_vs_micro': to_micro,
                'accumulated_vs_big': to_big},
      'peak_ratio_to_micro': _ratio(peak['accumulated'], peak['micro']),
      'peak_ratio_to_big': _ratio(peak['accumulated'], peak['big']),
      'speed_ratio_to_micro': to_micro['ratio'],
      'speed_ratio_to_big': to_big['ratio'],
  }


def recompute_comparison(spec, batch_size, *, warmup_steps, window_steps,
                         windows):
  """One bfloat16 step with and without recompute.

  Returns:
    dict: 'model', 'batch_size', 'memory' ({'plain', 'recompute'}),
    'peak_ratio' and 'tensor_peak_ratio' (recompute / plain), 'speed'
    (paired windows) and 'step_time_ratio' (recompute / plain seconds per
    step, the inverse of the examples/sec ratio).
  """
  built = {
      'plain': lambda: graphs.build_train_step(spec, _PRECISION, batch_size),
      'recompute': lambda: graphs.build_train_step(
          spec, _PRECISION, batch_size, recompute=True),
  }
  memory = {name: _memory(build()) for name, build in built.items()}
  rates = graphs.time_train_steps(
      {name: build() for name, build in built.items()},
      warmup_steps=warmup_steps, window_steps=window_steps, windows=windows)
  speed = throughput.summarize(rates, 'recompute', 'plain')
  return {
      'model': spec.name, 'precision': _PRECISION, 'batch_size': batch_size,
      'memory': memory,
      'peak_ratio': _ratio(memory['recompute']['peak_step_bytes'],
                           memory['plain']['peak_step_bytes']),
      'tensor_peak_ratio': _ratio(memory['recompute']['peak_tensor_bytes'],
                                  memory['plain']['peak_tensor_bytes']),
      'speed': speed,
      'step_time_ratio': _ratio(1.0, speed['ratio']),
  }


def both_levers(spec, batch_size, steps, float32_planned_bytes):
  """Peak of effective `batch_size` with accumulation and recompute together.

  Args:
    spec: a `configs.ModelSpec`.
    batch_size: the effective batch (e.g. BERT-base's 256).
    steps: K.
    float32_planned_bytes: the planner's float32 peak at `batch_size`
      (too large to measure here), the figure it is compared with.

  Returns:
    dict: 'memory' (`_memory` of the measured step), 'float32_planned_bytes'
    and 'ratio_to_float32' (measured / planned float32).
  """
  memory = _memory(graphs.build_train_step(
      spec, _PRECISION, batch_size, gradient_accumulation_steps=steps,
      recompute=True))
  return {'model': spec.name, 'effective_batch': batch_size,
          'micro_batch': batch_size // steps, 'steps': steps,
          'memory': memory, 'float32_planned_bytes': int(float32_planned_bytes),
          'ratio_to_float32': _ratio(memory['peak_step_bytes'],
                                     float32_planned_bytes)}


# The lever combinations the planner is checked on: (name, K, recompute).
LEVER_COMBINATIONS = (('plain', 1, False), ('accumulate', None, False),
                      ('recompute', 1, True), ('both', None, True))


def plan_accuracy(spec, batch_size, steps, cpu_upcast):
  """The planner against the measured step, for every lever combination.

  Each combination's step is built and measured alone (the peak of its
  tensors, `peak.live_tensor_peak` plus variables: what the planner
  plans), then planned from the same model_fn.

  Args:
    spec: a `configs.ModelSpec`.
    batch_size: the batch of one update.
    steps: K of the combinations with accumulation.
    cpu_upcast: plan this CPU's float32 copies for bfloat16 matmuls (a CPU
      without AVX512-BF16 or AMX).

  Returns:
    list of dicts, one per precision and combination: 'model',
    'precision', 'levers' (a `LEVER_COMBINATIONS` name), 'batch_size',
    'steps', 'recompute', 'measured_bytes', 'planned_bytes' and
    'relative_error' (planned / measured - 1).
  """
  rows = []
  for precision in policy.PRECISIONS:
    for name, k, recompute in LEVER_COMBINATIONS:
      k = k or steps
      measured = step_memory.measure_step_memory(graphs.build_train_step(
          spec, precision, batch_size, gradient_accumulation_steps=k,
          recompute=recompute))['peak_tensor_bytes']
      planned = planning.plan_model(
          spec, precision, gradient_accumulation_steps=k,
          recompute=recompute).step_bytes(batch_size, upcast=cpu_upcast)
      rows.append({'model': spec.name, 'precision': precision,
                   'levers': name, 'batch_size': batch_size, 'steps': k,
                   'recompute': recompute, 'measured_bytes': int(measured),
                   'planned_bytes': int(planned),
                   'relative_error': planning.relative_error(planned,
                                                             measured)})
  return rows
