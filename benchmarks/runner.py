"""Runs every benchmark of a mode and gathers results.json.

The order matters on a shared CPU with one process-wide allocator: memory
is measured while no other session is alive, and each model's two
precisions are timed side by side before the next model starts.
"""

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

from absl import logging

from benchmarks import configs
from benchmarks.configs import REWRITE
from benchmarks import convergence
from benchmarks import env as env_lib
from benchmarks import graphs
from benchmarks import kernel_table
from benchmarks import kernels
from benchmarks import levers
from benchmarks import overhead
from benchmarks import planning
from benchmarks import scaling
from benchmarks import step_memory
from benchmarks import throughput
from benchmarks import xla_levers
from estimator_bf16.memory import xla_dump
from estimator_bf16.precision import policy
from estimator_bf16.platform.tpu import MiB

PRECISIONS = policy.PRECISIONS
# float32, ours, and TensorFlow's oneDNN bfloat16 rewrite of the float32
# graph (the peer).
VARIANTS = PRECISIONS + (REWRITE,)
SECTIONS = ('kernels', 'kernel_table', 'models', 'tpu_plans', 'overhead', 'build_overhead',
            'keras', 'adafactor', 'convergence', 'scaling', 'levers', 'fit',
            'xla_recompute', 'xla_planner')


def _graph_row(report):
  return {'num_ops': report.num_ops, 'num_casts': report.num_casts,
          'bfloat16_flop_share': report.bfloat16_flop_share}


def _ratio(top, bottom):
  return top / float(bottom) if top and bottom else None


def measure_model(spec, config, cpu_upcast):
  """Memory, throughput and planner check of one model, every variant.

  The variants (`VARIANTS`): float32; ours (`eb.wrap_model_fn` and
  `eb.wrap_input_fn` in bfloat16); TensorFlow's oneDNN bfloat16 rewrite on
  the float32 graph (a session option, no code change). Memory is measured
  for each alone, in `config.memory_rounds` rounds (see `memory_rounds`),
  and for float32 and ours at `spec.memory_batch` too (`memory_at_batch`);
  all three are then timed in interleaved windows.

  Args:
    spec: a `configs.ModelSpec`.
    config: the `configs.BenchmarkConfig`.
    cpu_upcast: this CPU computes bfloat16 matmuls in float32 temporaries
      (no AVX512-BF16/AMX); the planner's CPU estimates then include them.

  Returns:
    dict with the spec, one entry per variant (peak_step_bytes,
    examples_per_sec, memory details; for the two precisions also the
    planner and, when searched, max_batch), 'ratios' and, with a
    `memory_batch`, 'memory_at_second_batch'.
  """
  result = {'spec': dataclasses.asdict(spec),
            'budget_bytes': spec.budget_mib * MiB}
  steps = {precision: graphs.build_train_step(spec, precision,
                                              spec.batch_size)
           for precision in PRECISIONS}
  memory = memory_rounds(steps, config.memory_rounds)
  second = memory_at_batch(spec, spec.memory_batch)
  if second:
    result['memory_at_second_batch'] = second
  for variant in VARIANTS:
    logging.info('%s %s at batch %d: live tensors peak %.1f MiB; allocator '
                 'peak %.1f MiB (median of %s)', spec.name, variant,
                 spec.batch_size,
                 memory[variant]['peak_tensor_bytes'] / MiB,
                 memory[variant]['peak_step_bytes'] / MiB,
                 ', '.join('%.1f' % (b / MiB) for b in
                           memory[variant]['peak_step_bytes_runs']))
  for precision in PRECISIONS:
    # float32 first: bfloat16 is also measured at float32's largest batch.
    row, at_fp32 = _measure_precision(
        spec, precision, config, cpu_upcast, steps[precision],
        memory[precision],
        result['float32']['max_batch'] if precision == 'bfloat16' else 0,
        (second or {}).get(precision))
    result[precision] = row
    if at_fp32:
      result['bfloat16_at_float32_max_batch'] = at_fp32
  rewrite = memory[REWRITE]
  result[REWRITE] = {'peak_step_bytes': rewrite['peak_step_bytes'],
                     'peak_tensor_bytes': rewrite['peak_tensor_bytes'],
                     'memory': rewrite,
                     'applied': rewrite_applied(memory)}
  rates = _throughput(spec, config, steps)
  result['throughput_windows'] = rates
  for variant in VARIANTS:
    result[variant]['examples_per_sec'] = statistics.median(rates[variant])
  versus_fp32 = throughput.summarize(rates, 'bfloat16', 'float32')
  rewrite_fp32 = throughput.summarize(rates, REWRITE, 'float32')
  versus_rewrite = throughput.summarize(rates, 'bfloat16', REWRITE)
  fp32, bf16 = result['float32'], result['bfloat16']
  at_fp32 = result.get('bfloat16_at_float32_max_batch') or {}
  fp32_at_max = (fp32['max_batch_search'] or {}).get('at_max_batch') or {}
  # The memory ratios compare live tensors (`peak.live_tensor_peak`);
  # the allocator's, which also count its chunking, are kept beside them.
  peak = lambda variant: result[variant]['peak_tensor_bytes']
  allocator = lambda variant: result[variant]['peak_step_bytes']
  transient = lambda variant: result[variant]['memory']['transient_bytes']
  result['ratios'] = {
      'memory': _ratio(peak('bfloat16'), peak('float32')),
      'rewrite_memory': _ratio(peak(REWRITE), peak('float32')),
      'memory_vs_rewrite': _ratio(peak('bfloat16'), peak(REWRITE)),
      'allocator_memory': _ratio(allocator('bfloat16'), allocator('float32')),
      'allocator_rewrite_memory': _ratio(allocator(REWRITE),
                                         allocator('float32')),
      'allocator_memory_vs_rewrite': _ratio(allocator('bfloat16'),
                                            allocator(REWRITE)),
      'transient_memory': _ratio(transient('bfloat16'),
                                 transient('float32')),
      'rewrite_transient_memory': _ratio(transient(REWRITE),
                                         transient('float32')),
      'memory_at_float32_max_batch': _ratio(
          at_fp32.get('peak_step_bytes'), fp32_at_max.get('peak_step_bytes')),
      'throughput': versus_fp32['ratio'],
      'throughput_iqr': versus_fp32['ratio_iqr'],
      'rewrite_throughput': rewrite_fp32['ratio'],
      'rewrite_throughput_iqr': rewrite_fp32['ratio_iqr'],
      'throughput_vs_rewrite': versus_rewrite['ratio'],
      'throughput_vs_rewrite_iqr': versus_rewrite['ratio_iqr'],
      'max_batch': _ratio(bf16['max_batch'], fp32['max_batch']),
      'planner_max_batch_v2': _ratio(
          bf16['planner']['tpu_max_batch_per_core']['v2'],
          fp32['planner']['tpu_max_batch_per_core']['v2']),
  }
  return result


def memory_rounds(steps, rounds):
  """Peak step memory of every variant, the median of `rounds` measurements.

  The live-tensor peak of a step moves by a few MiB at most (kernel
  temporaries count at their chunk size, see
  `peak.live_tensor_peak`). The allocator's moves far more: one
  process-wide CPU allocator serves every session, and how it splits its
  free chunks (it hands out a whole chunk up to twice the request) depends
  on what earlier sessions left, so the same step peaks several MiB apart
  after different ones. The variants are therefore measured in rounds, in
  the order of the timing windows (`throughput.window_order`: each variant
  follows each other one as evenly as the number of rounds allows), and
  each keeps the measurement with its median allocator peak; every
  allocator peak is kept in 'peak_step_bytes_runs'.

  Args:
    steps: {precision: `graphs.TrainStep`}; the rewrite runs the float32
      step in a session with `graphs.onednn_rewrite_config()`.
    rounds: measurements per variant (>= 1).

  Returns:
    {variant: the `step_memory.measure_step_memory` dict of its median
    peak, plus 'peak_step_bytes_runs'}.
  """
  runs = {variant: [] for variant in VARIANTS}
  for order in throughput.window_order(VARIANTS, rounds):
    for variant in order:
      runs[variant].append(step_memory.measure_step_memory(
          steps['float32' if variant == REWRITE else variant],
          graphs.onednn_rewrite_config() if variant == REWRITE else None))
  chosen = {}
  for variant, measured in runs.items():
    ordered = sorted(measured, key=lambda m: m['peak_step_bytes'])
    chosen[variant] = dict(ordered[(len(ordered) - 1) // 2])
    chosen[variant]['peak_step_bytes_runs'] = [
        m['peak_step_bytes'] for m in measured]
  return chosen


def rewrite_applied(memory):
  """Whether TensorFlow's rewrite changed the float32 graph it ran.

  The pass inserts casts into the graph it runs, and none on a CPU where
  TensorFlow does not enable it; the float32 graph may run casts of its own
  (BERT casts its integer mask to float), so the rewrite's executed casts
  are compared with float32's, not with zero.

  Args:
    memory: {variant: `step_memory.measure_step_memory` dict}, as
      `memory_rounds` returns.

  Returns:
    bool.
  """
  return (memory[REWRITE]['executed']['casts'] >
          memory['float32']['executed']['casts'])


def memory_at_batch(spec, batch):
  """Live-tensor peaks of float32 and ours at another batch (memory only).

  Args:
    spec: a `configs.ModelSpec`.
    batch: the batch; 0 measures nothing.

  Returns:
    None for batch 0, else a dict: 'batch_size', per precision the
    `step_memory.measure_step_memory` dict, and 'ratio' (bfloat16 over
    float32 live-tensor peaks).
  """
  if not batch:
    return None
  row = {'batch_size': batch}
  for precision in PRECISIONS:
    row[precision] = step_memory.measure_step_memory(
        graphs.build_train_step(spec, precision, batch))
    logging.info('%s %s at batch %d: live tensors peak %.1f MiB', spec.name,
                 precision, batch, row[precision]['peak_tensor_bytes'] / MiB)
  row['ratio'] = _ratio(row['bfloat16']['peak_tensor_bytes'],
                        row['float32']['peak_tensor_bytes'])
  return row


def _measure_precision(spec, precision, config, cpu_upcast, step, measured,
                       float32_max_batch, second=None):
  """Plans, the measured peak at the benchmark batch, the largest batch.

  The largest-batch search runs only with `config.max_search_measurements`
  (it runs steps at about the largest batch, the costliest part of all).

  Args:
    spec: the `configs.ModelSpec`.
    precision: 'float32' or 'bfloat16'.
    config: the `configs.BenchmarkConfig`.
    cpu_upcast: see `measure_model`.
    step: the benchmark-batch `graphs.TrainStep` of this precision.
    measured: its memory, from `memory_rounds`.
    float32_max_batch: float32's largest batch, to measure bfloat16 there
      too; 0 for none.
    second: this precision's measurement at `spec.memory_batch`
      (`memory_at_batch`), which the planner is checked against too; or
      None.

  Returns:
    (row for results.json, the measurement at `float32_max_batch` or None).
  """
  budget = spec.budget_mib * MiB
  plans = {optimizer: planning.plan_model(spec, precision, optimizer)
           for optimizer in (spec.optimizer, 'adafactor')}
  plan = plans[spec.optimizer]
  build = lambda batch: graphs.build_train_step(spec, precision, batch)
  search, at_fp32 = None, None
  if config.max_search_measurements:
    known = [measured]
    if float32_max_batch:
      # The memory ratio where activations weigh most within the budget;
      # it is also a point of the search.
      at_fp32 = step_memory.measure_step_memory(build(float32_max_batch))
      known.append(at_fp32)
    guess = plan.max_batch(budget, upcast=cpu_upcast)
    search = step_memory.max_batch_in_budget(
        build, budget, guess=guess, known=known,
        slope=(plan.step_bytes(guess + 100, upcast=cpu_upcast) -
               plan.step_bytes(guess, upcast=cpu_upcast)) / 100.0,
        tolerance=config.batch_tolerance,
        max_measurements=config.max_search_measurements)
    logging.info('%s %s: max batch %d in %d MiB', spec.name, precision,
                 search['max_batch'], spec.budget_mib)
  planned = planning.plan_row(plan, budget, cpu_upcast)
  planned['tpu_max_batch_per_core_adafactor'] = plans[
      'adafactor'].max_batch_per_core()
  planned['slot_bytes_adafactor'] = plans['adafactor'].slot_bytes
  planned.update(planning.validate(
      plan, cpu_upcast,
      ('at_batch', spec.batch_size, measured['peak_tensor_bytes']),
      ('at_max_batch', search and search['max_batch'],
       search and search['tensor_peak_at_max_batch']),
      ('at_second_batch', second and spec.memory_batch,
       second and second['peak_tensor_bytes'])))
  row = {'peak_step_bytes': measured['peak_step_bytes'],
         'peak_tensor_bytes': measured['peak_tensor_bytes'],
         'max_batch': search and search['max_batch'], 'memory': measured,
         'max_batch_search': search, 'planner': planned,
         'graph': _graph_row(step.report)}
  return row, at_fp32


def _throughput(spec, config, steps):
  """Times every variant of one model in interleaved windows.

  Args:
    spec: the `configs.ModelSpec`.
    config: the `configs.BenchmarkConfig`.
    steps: {precision: `graphs.TrainStep`}; the rewrite runs the float32
      one in a session of its own.

  Returns:
    {variant: examples/sec per window}, from
    `throughput.alternating_windows`.
  """
  return graphs.time_train_steps(
      {variant: steps['float32' if variant == REWRITE else variant]
       for variant in VARIANTS},
      session_configs={REWRITE: graphs.onednn_rewrite_config()},
      warmup_steps=config.warmup_steps,
      window_steps=config.steps_per_window(spec.name),
      windows=config.windows_for(spec.name))


def tpu_plans(specs):
  """The planner's per-core answers for full-size models (never run)."""
  rows = {}
  for spec in specs:
    rows[spec.name] = {
        precision: {optimizer: planning.plan_row(
            planning.plan_model(spec, precision, optimizer))
                    for optimizer in (spec.optimizer, 'adafactor')}
        for precision in PRECISIONS}
  return rows


def keras_comparison(config, out_dir):
  """Runs `benchmarks.keras_baseline` in its own process; returns its JSON."""
  path = os.path.join(out_dir, 'keras_baseline.json')
  command = [sys.executable, '-m', 'benchmarks.keras_baseline',
             '--batch_size=%d' % config.keras_batch_size,
             '--warmup_steps=%d' % config.warmup_steps,
             '--window_steps=%d' % config.keras_window_steps,
             # The MLP's windows: its steps take milliseconds here too.
             '--windows=%d' % config.windows_for(configs.KERAS_MODEL),
             '--out=' + path]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  environment = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [root] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
  subprocess.run(command, check=True, env=environment, cwd=root)
  with open(path) as results:
    return json.load(results)


def adafactor_comparison(spec, model_result):
  """Adafactor's optimizer state and step peak against the model's Adam(W).

  Slot bytes are the optimizer's actual slot variables in the built graph;
  peaks are measured in bfloat16 at the benchmark batch.
  """
  measured = step_memory.measure_step_memory(graphs.build_train_step(
      spec, 'bfloat16', spec.batch_size, optimizer='adafactor'))
  bf16 = model_result['bfloat16']
  adam_slots = bf16['memory']['slot_bytes']
  return {
      'model': spec.name, 'precision': 'bfloat16',
      'baseline_optimizer': spec.optimizer,
      'baseline_slot_bytes': adam_slots,
      'adafactor_slot_bytes': measured['slot_bytes'],
      'slot_bytes_ratio': _ratio(measured['slot_bytes'], adam_slots),
      'parameter_bytes': measured['parameter_bytes'],
      'baseline_peak_step_bytes': bf16['peak_step_bytes'],
      'adafactor_peak_step_bytes': measured['peak_step_bytes'],
      'peak_step_bytes_ratio': _ratio(measured['peak_step_bytes'],
                                      bf16['peak_step_bytes']),
      'batch_size': spec.batch_size,
  }


def run(config, out_dir, sections=SECTIONS):
  """Runs the chosen sections of `config`; returns the results dict."""
  step_memory.check_allocator_stats()
  if 'xla_recompute' in sections or 'xla_planner' in sections:
    # Before anything compiles with XLA: its flags are read once.
    xla_dump.enable()
  os.makedirs(out_dir, exist_ok=True)
  results = {'env': env_lib.describe(), 'mode': config.mode,
             'config': dataclasses.asdict(config), 'seconds': {}}
  started = time.perf_counter()

  def timed(name, fn, *args):
    start = time.perf_counter()
    logging.info('Benchmark section %s...', name)
    value = fn(*args)
    results['seconds'][name] = time.perf_counter() - start
    return value

  if 'kernels' in sections:
    results['kernels'] = timed('kernels', lambda: {
        kind: kernels.kernel_speed(kind, 2048,
                                   warmup_steps=config.warmup_steps)
        for kind in ('matmul', 'conv2d')})
  if 'kernel_table' in sections:
    # Each CPU kind this machine can run, in a child process whose
    # environment selects it (benchmarks/kernel_table.py).
    results['kernel_table'] = timed('kernel_table', lambda: [
        row for kind, env in kernel_table.kinds().items()
        for row in kernel_table.measure_kind(kind, env)])
  # TensorFlow's CPU kernels compute bfloat16 matmuls in float32 unless the
  # CPU has bfloat16 arithmetic; the planner's CPU estimates model that.
  cpu_upcast = results['env']['bfloat16_kernels_native'] is False
  if 'models' in sections:
    results['models'] = {
        spec.name: timed(spec.name, measure_model, spec, config, cpu_upcast)
        for spec in config.models}
  if 'tpu_plans' in sections and config.tpu_plans:
    results['tpu_plans'] = timed('tpu_plans', tpu_plans, config.tpu_plans)
  if 'overhead' in sections:
    spec = config.model(config.overhead_model)
    results['overhead'] = timed(
        'overhead', lambda: overhead.measure_overhead(
            spec, config.overhead_batch_size,
            warmup_steps=config.warmup_steps,
            window_steps=config.overhead_window_steps,
            windows=config.overhead_windows))
  if 'build_overhead' in sections:
    results['build_overhead'] = timed('build_overhead', lambda: {
        spec.name: overhead.measure_build_overhead(
            spec, spec.batch_size, calls=config.build_overhead_calls)
        for spec in config.models
        if spec.name in (config.build_overhead_models or
                         [m.name for m in config.models])})
  if 'keras' in sections:
    results['keras_mixed_bfloat16'] = timed('keras', keras_comparison,
                                            config, out_dir)
  if 'adafactor' in sections and 'models' in results:
    spec = (config.model(config.adafactor_model) if config.adafactor_model
            else next(s for s in config.models if s.family == 'bert'))
    results['adafactor'] = timed('adafactor', adafactor_comparison, spec,
                                 results['models'][spec.name])
  if 'convergence' in sections:
    steps = config.convergence_steps
    results['convergence'] = timed(
        'convergence', lambda: convergence.convergence_runs(
            out_dir, mnist_steps=steps[0], bert_steps=steps[1],
            bert_preset=config.convergence_bert_preset))
  if 'scaling' in sections:
    # 2 logical CPU devices against 1 (MirroredStrategy), side by side.
    results['scaling'] = timed('scaling', scaling.measure_scaling,
                               'bfloat16')
  if 'levers' in sections:
    results['levers'] = timed('levers', lever_comparisons, config)
  if 'fit' in sections:
    results['fit'] = timed('fit', lambda: [
        row for name, batch, steps in config.fit_runs
        for row in levers.plan_accuracy(config.model(name), batch, steps,
                                        cpu_upcast)])
  if 'xla_recompute' in sections:
    results['xla_recompute'] = timed('xla_recompute', lambda: [
        xla_levers.recompute_rows(config.model(name), batch, precision)
        for name, batch, precision in config.xla_recompute_runs])
  if 'xla_planner' in sections:
    results['xla_planner'] = timed('xla_planner', lambda: [
        row for model, batch in config.xla_planner_runs
        for row in xla_levers.planner_rows(
            config.model(model) if isinstance(model, str) else model,
            batch)])
  if 'models' in results:
    results['planner'] = planner_summary(results['models'])
  results['env']['load_average_end'] = env_lib.load_average()
  results['seconds']['total'] = time.perf_counter() - started
  return results


def lever_comparisons(config):
  """Accumulation and recompute side by side, and both at a large batch.

  Each comparison holds its own sessions only while it runs: two BERT-base
  steps at batch 128 side by side already take several GiB.
  """
  windows = max(3, config.windows - 1)
  accumulation = [
      levers.accumulation_comparison(
          config.model(name), batch, steps, warmup_steps=1, window_steps=1,
          windows=windows)
      for name, batch, steps in config.accumulation_runs]
  recompute = [
      levers.recompute_comparison(config.model(name), batch, warmup_steps=1,
                                  window_steps=1, windows=windows)
      for name, batch in config.recompute_runs]
  name, batch, steps = config.both_levers_run
  spec = config.model(name)
  float32_plan = planning.plan_model(spec, 'float32')
  both = levers.both_levers(spec, batch, steps,
                            float32_plan.step_bytes(batch))
  both['bfloat16_plan_bytes'] = planning.plan_model(
      spec, 'bfloat16', gradient_accumulation_steps=steps,
      recompute=True).step_bytes(batch)
  return {'accumulation': accumulation, 'recompute': recompute,
          'both': both}


def planner_summary(models):
  """The planner's errors against the measured peaks, worst one first."""
  errors = {}
  for name, result in models.items():
    for precision in PRECISIONS:
      planned = result[precision]['planner']
      for where in ('at_batch', 'at_max_batch', 'at_second_batch'):
        error = planned.get('relative_error_' + where)
        if error is not None:
          errors['%s/%s/%s' % (name, precision, where)] = error
  worst = max(errors, key=lambda key: abs(errors[key])) if errors else None
  return {'relative_error': errors.get(worst), 'worst_case': worst,
          'relative_errors': errors,
          'definition': 'estimated step bytes / measured peak step bytes - 1'}
