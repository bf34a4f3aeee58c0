"""Turns results.json into the Markdown tables and the loss-curve picture.

Every number printed here is read from the results dict; nothing is typed
in. `targets` holds the issue's targets and checks each against the
results.
"""

import json
import os

from benchmarks import kernel_table
from benchmarks.configs import REWRITE
from estimator_bf16.precision import op_lists
from estimator_bf16.precision import policy
from estimator_bf16.platform.tpu import MiB



def _fmt(value, spec='%.2f', missing='n/a'):
  return missing if value is None else spec % value


EMULATED_NOTE = (
    'This CPU has no native bfloat16 (no AVX512-BF16/AMX, or oneDNN off): '
    'TensorFlow emulates bfloat16 on float32 copies here, so bfloat16 speed '
    'is not measurable on it and the speed targets are not judged. Every '
    'other figure (memory, graphs, planner, convergence, build cost) is.')

REWRITE_INACTIVE_NOTE = (
    "TensorFlow's oneDNN bfloat16 rewrite did not act on this CPU (it needs "
    'AVX512F and oneDNN on): its columns are the float32 graph again, and '
    'the targets against it are not judged here.')
_VARIANT_LABELS = (('float32', 'fp32'), ('bfloat16', 'ours'),
                   (REWRITE, 'TF rewrite'))


def _iqr_text(spread):
  """' (IQR q1-q3)' of a timed ratio, or '' when it has none.

  A ratio from a single window (a CPU that emulates bfloat16 gets one,
  `configs.for_emulated_bfloat16`) has no spread: `throughput.summarize`
  gives None.
  """
  return ' (IQR %.2f-%.2f)' % tuple(spread) if spread else ''


def _native(results):
  return bool(results['env'].get('bfloat16_kernels_native',
                                  results['env'].get('native_bfloat16')))


def _rewrite_applied(results):
  """False if the rewrite acted on no model (None without models).

  The environment's answer (`env.onednn_rewrite_active`, TensorFlow's own
  CPU check) decides when it says no; otherwise any model on which the
  rewrite changed the graph (`runner.rewrite_applied`) does.
  """
  models = results.get('models') or {}
  if not models:
    return None
  if results['env'].get('onednn_rewrite_active') is False:
    return False
  return any(m[REWRITE].get('applied', True) for m in models.values())


def _notes(results):
  """Markdown lines saying which figures this CPU could not produce."""
  lines = []
  if not _native(results):
    lines += ['', EMULATED_NOTE]
  if _rewrite_applied(results) is False:
    lines += ['', REWRITE_INACTIVE_NOTE]
  return lines


def targets(results):
  """The issue's targets with the measured value of each.

  Speed targets are judged only on a CPU with native bfloat16: elsewhere
  TensorFlow emulates it, and their 'met' is None with the reason.

  Returns:
    list of dicts: 'target' (text), 'measured' (text), 'met' (bool, or None
    when not measured or not measurable here), 'within_noise' (the labels
    of a missed timed target whose interquartile range reaches it).
  """
  rows = []
  native = _native(results)
  rewrite_ran = _rewrite_applied(results) is not False

  def add(target, values, check, speed=False, peer=False, spreads=None):
    values = [(label, value) for label, value in values if value is not None]
    spreads = dict(spreads or ())
    # A timed ratio carries the interquartile range of its paired windows:
    # on a shared machine, 0.98 with an IQR of 0.95-1.02 is a tie.
    measured = '; '.join(
        '%s %.2f' % (label, value) + (
            _iqr_text(spreads.get(label)))
        for label, value in values) or 'n/a'
    met = all(check(v) for _, v in values) if values else None
    # A miss whose own IQR reaches the target is a tie on this machine,
    # not a ranking: the verdict stays 'no', and the row names it.
    within_noise = [
        label for label, value in values
        if not check(value) and spreads.get(label) and
        any(check(end) for end in spreads[label])]
    if speed and not native and values:
      measured += ' (bfloat16 emulated here: not judged)'
      met = None
    elif peer and not rewrite_ran and values:
      measured += ' (TF rewrite inactive on this CPU: not judged)'
      met = None
    rows.append({'target': target, 'measured': measured, 'met': met,
                 'within_noise': within_noise if met is False else []})

  models = results.get('models', {})
  ratio = lambda key, family=None: [
      (name, m['ratios'].get(key)) for name, m in models.items()
      if family is None or m['spec']['family'] == family]
  add('throughput bf16/fp32 >= 1.6x (BERT)', ratio('throughput', 'bert'),
      lambda v: v >= 1.6, speed=True,
      spreads=ratio('throughput_iqr', 'bert'))
  add('throughput bf16/fp32 >= 1.3x (ResNet)', ratio('throughput', 'resnet'),
      lambda v: v >= 1.3, speed=True,
      spreads=ratio('throughput_iqr', 'resnet'))
  add('peak step memory bf16/fp32 <= 0.60 (ResNet, BERT, at the benchmark '
      'batch)', ratio('memory', 'resnet') + ratio('memory', 'bert'),
      lambda v: v <= 0.60)
  second = [(m['spec']['name'], m['memory_at_second_batch'])
            for m in models.values() if m.get('memory_at_second_batch')]
  if second:
    add('peak step memory bf16/fp32 <= 0.60 (at the second batch: %s)' % (
        ', '.join('%s batch %d' % (name, row['batch_size'])
                  for name, row in second)),
        [(name, row['ratio']) for name, row in second], lambda v: v <= 0.60)
  add('throughput ours / TF oneDNN rewrite >= 1.0 (every model)',
      ratio('throughput_vs_rewrite'), lambda v: v >= 1.0, speed=True,
      peer=True, spreads=ratio('throughput_vs_rewrite_iqr'))
  add('peak step memory ours / TF oneDNN rewrite <= 1.0 (every model)',
      ratio('memory_vs_rewrite'), lambda v: v <= 1.0, peer=True)
  over = results.get('overhead')
  if over:
    add('wrapper step time / hand-written <= 1.01',
        [(over['model'], over['step_time_ratio'])], lambda v: v <= 1.01)
    rows.append({'target': 'wrapper adds no ops besides casts',
                 'measured': 'extra non-cast ops: %s%s' % (
                     over['extra_ops_besides_casts'] or 'none',
                     _replaced(over)),
                 'met': not over['extra_ops_besides_casts'],
                 'within_noise': []})
  keras = results.get('keras_mixed_bfloat16')
  if keras:
    add('throughput ours / Keras mixed_bfloat16 >= 1.0',
        [(keras.get('model', 'mnist_mlp'), keras['throughput_ratio'])],
        lambda v: v >= 1.0, speed=True,
        spreads=[(keras.get('model', 'mnist_mlp'),
                  keras.get('throughput_ratio_iqr'))])
  lever = results.get('levers')
  if lever:
    _lever_targets(add, lever)
  fit_rows = results.get('fit')
  if fit_rows:
    limit = 0.10 if native else 0.15
    worst = max(fit_rows, key=lambda r: abs(r['relative_error']))
    add('planner within %d%% of the measured step tensors, every lever '
        'combination (worst case of %d)' % (round(100 * limit),
                                            len(fit_rows)),
        [('%s/%s/%s' % (worst['model'], worst['precision'], worst['levers']),
          worst['relative_error'])], lambda v: abs(v) <= limit)
  planner = results.get('planner')
  if planner and planner['relative_error'] is not None:
    add('planner within 10% of the measured peak (worst case)',
        [(planner['worst_case'], planner['relative_error'])],
        lambda v: abs(v) <= 0.10)
  return rows


def _lever_targets(add, lever):
  """The memory levers' targets (benchmarks.levers), one row each."""
  accumulation = lever.get('accumulation', [])
  label = lambda run: '%s B=%d K=%d' % (run['model'], run['effective_batch'],
                                        run['steps'])
  add('accumulation: peak at B in K micro-batches <= 1.15x peak at B/K',
      [(label(r), r['peak_ratio_to_micro']) for r in accumulation],
      lambda v: v <= 1.15)
  add('accumulation: examples/s >= 0.95x that of B/K',
      [(label(r), r['speed_ratio_to_micro']) for r in accumulation],
      lambda v: v >= 0.95, speed=True,
      spreads=[(label(r), r['speed']['accumulated_vs_micro']['ratio_iqr'])
               for r in accumulation])
  limits = {'bert': (0.6, 1.35), 'resnet': (0.7, 1.4)}
  for family, (peak, time) in limits.items():
    runs = [r for r in lever.get('recompute', [])
            if r['model'].startswith(family)]
    if not runs:
      continue
    name = lambda run: '%s batch %d' % (run['model'], run['batch_size'])
    add('recompute: peak <= %.2fx (%s)' % (peak, family),
        [(name(r), r['peak_ratio']) for r in runs], lambda v, p=peak: v <= p)
    add('recompute: step time <= %.2fx (%s)' % (time, family),
        [(name(r), r['step_time_ratio']) for r in runs],
        lambda v, t=time: v <= t, speed=True)
  both = lever.get('both')
  if both:
    add('both levers: peak at B=%d <= 0.3x the float32 peak at B=%d '
        '(planned)' % (both['effective_batch'], both['effective_batch']),
        [(both['model'], both['ratio_to_float32'])], lambda v: v <= 0.3)


def fit_lines(results):
  """The planner per lever combination, for results.md (empty without)."""
  rows = results.get('fit')
  if not rows:
    return []
  lines = ['', '**The planner per lever combination** (peak of the step\'s '
           'tensors, measured and planned; K micro-batches of batch / K):',
           '', '| model | batch | precision | levers | K | measured MiB | '
           'planned MiB | error |', '| --- | --- | --- | --- | --- | --- | '
           '--- | --- |']
  for row in rows:
    lines.append('| %s | %d | %s | %s | %d | %.0f | %.0f | %+.1f%% |' % (
        row['model'], row['batch_size'], row['precision'], row['levers'],
        row['steps'], row['measured_bytes'] / MiB,
        row['planned_bytes'] / MiB, 100 * row['relative_error']))
  return lines


def _table(title, columns, rows):
  """A titled markdown table: `rows` are lists of cell strings."""
  lines = ['', title, '', '| %s |' % ' | '.join(columns),
           '|%s' % (' --- |' * len(columns))]
  return lines + ['| %s |' % ' | '.join(cells) for cells in rows]


def xla_lines(results):
  """The XLA tables for results.md (empty without the sections)."""
  lines = []
  rows = results.get('xla_recompute')
  if rows:
    lines += _table(
        '**Recompute as XLA compiles the step** (XLA\'s bytes for one step '
        'from its buffer assignment, compiled on this CPU inside a device '
        'loop; time ratio: the two steps run turn about, one loop each per '
        'round after the compiling one, the median of the rounds\' ratios):',
        ['model', 'batch', 'precision', 'plain MiB', 'recompute MiB',
         'bytes ratio', 'time ratio'],
        [[row['model'], '%d' % row['batch'], row['precision'],
          '%.0f' % row['plain_mib'], '%.0f' % row['recompute_mib'],
          '%.2fx' % row['bytes_ratio'], '%.2fx' % row['time_ratio']]
         for row in rows])
  rows = results.get('xla_planner')
  if rows:
    lines += _table(
        '**The planner against XLA** (bytes of one step; planned as XLA '
        'compiles the step, `compiled=True`, and as TensorFlow\'s executor '
        'runs it; error = planned / XLA - 1; K micro-batches of batch / K; '
        'XLA bf16 products: its matmuls and convolutions computed in '
        'bfloat16, of all):',
        ['model', 'batch', 'precision', 'levers', 'K', 'XLA MiB',
         'planned MiB', 'error', 'executor plan MiB', 'its error',
         'XLA bf16 products'],
        [[row['model'], '%d' % row['batch'], row['precision'],
          row['levers'], '%d' % row['steps'], '%.0f' % row['xla_mib'],
          '%.0f' % row['planned_mib'], '%+.1f%%' % (100 * row['error']),
          _fmt(row.get('executor_mib'), '%.0f', '-'),
          _fmt(None if row.get('executor_error') is None
               else 100 * row['executor_error'], '%+.1f%%', '-'),
          _products(row.get('xla_products'))]
         for row in rows])
  return lines


def _products(counts):
  """'bf16 of all' for a {HLO type: count} of XLA's products, or '-'."""
  if not counts:
    return '-'
  return '%d of %d' % (counts.get('bf16', 0), sum(counts.values()))


def lever_lines(results):
  """The levers' tables for results.md (empty without the section)."""
  lever = results.get('levers')
  if not lever:
    return []
  lines = ['', '**Gradient accumulation** (bfloat16; peak = CPU allocator, '
           'examples/s paired in one process):', '',
           '| model | B | K | peak B/K MiB | peak K x B/K MiB | peak B MiB | '
           'peak ratio to B/K | examples/s ratio to B/K | to B |',
           '| --- | --- | --- | --- | --- | --- | --- | --- | --- |']
  for run in lever.get('accumulation', []):
    memory = run['memory']
    lines.append('| %s | %d | %d | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f |'
                 % (run['model'], run['effective_batch'], run['steps'],
                    memory['micro']['peak_step_bytes'] / MiB,
                    memory['accumulated']['peak_step_bytes'] / MiB,
                    memory['big']['peak_step_bytes'] / MiB,
                    run['peak_ratio_to_micro'], run['speed_ratio_to_micro'],
                    run['speed_ratio_to_big']))
  lines += ['', '**Recompute** (bfloat16):', '',
            '| model | batch | peak off MiB | peak on MiB | peak ratio | '
            'step time ratio |', '| --- | --- | --- | --- | --- | --- |']
  for run in lever.get('recompute', []):
    memory = run['memory']
    lines.append('| %s | %d | %.0f | %.0f | %.2f | %.2f |' % (
        run['model'], run['batch_size'],
        memory['plain']['peak_step_bytes'] / MiB,
        memory['recompute']['peak_step_bytes'] / MiB, run['peak_ratio'],
        run['step_time_ratio']))
  both = lever.get('both')
  if both:
    lines += ['', '**Both levers**, %s at effective batch %d (K=%d, '
              'recompute, bfloat16): measured peak %.0f MiB (planned %.0f), '
              'against the planner\'s float32 peak at batch %d without '
              'levers, %.0f MiB: ratio %.2f.' % (
                  both['model'], both['effective_batch'], both['steps'],
                  both['memory']['peak_step_bytes'] / MiB,
                  both['bfloat16_plan_bytes'] / MiB,
                  both['effective_batch'],
                  both['float32_planned_bytes'] / MiB,
                  both['ratio_to_float32'])]
  return lines


def comparison_table(results):
  """The side-by-side table: every model, every variant, ours over peers.

  Returns:
    list of Markdown lines (empty without models).
  """
  models = results.get('models', {})
  if not models:
    return []
  keras = results.get('keras_mixed_bfloat16') or {}
  lines = [
      '| model | batch | bf16 FLOP share (ours) | examples/s fp32 / ours / '
      'TF rewrite | throughput ours/fp32 | TF rewrite/fp32 | **ours/TF '
      'rewrite** | peak step MiB (live tensors) fp32 / ours / TF rewrite | '
      'memory ours/fp32 '
      '| TF rewrite/fp32 | **ours/TF rewrite** | ours/Keras mixed_bfloat16 '
      '(throughput, memory) |',
      '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for name, model in models.items():
    r = model['ratios']
    rates = ' / '.join(_fmt(model[v].get('examples_per_sec'), '%.1f')
                       for v, _ in _VARIANT_LABELS)
    peaks = ' / '.join('%.0f' % (model[v]['peak_tensor_bytes'] / MiB)
                       for v, _ in _VARIANT_LABELS)
    versus_keras = 'no Keras version'
    if keras.get('model') == name:
      versus_keras = '%s, %s' % (_fmt(keras['throughput_ratio']),
                                 _fmt(keras['memory_ratio']))
    share = (model['bfloat16'].get('graph') or {}).get('bfloat16_flop_share')
    lines.append('| %s | %d | %s | %s | %s | %s | **%s** | %s | %s | %s | '
                 '**%s** | %s |' % (
                     name, model['spec']['batch_size'],
                     _fmt(share, '%.3f'),
                     rates,
                     _fmt(r['throughput']), _fmt(r['rewrite_throughput']),
                     _fmt(r['throughput_vs_rewrite']), peaks,
                     _fmt(r['memory']), _fmt(r['rewrite_memory']),
                     _fmt(r['memory_vs_rewrite']), versus_keras))
  return lines


def _targets_table(results):
  lines = ['| target | measured | met |', '|---|---|---|']
  for row in targets(results):
    verdict = {True: 'yes', False: 'no', None: '-'}[row['met']]
    if row['within_noise']:
      verdict += ' (within its IQR: %s)' % ', '.join(row['within_noise'])
    lines.append('| %s | %s | %s |' % (row['target'], row['measured'],
                                       verdict))
  return lines


def readme_block(results):
  """The results block: environment, side-by-side table, targets.

  `scripts/update_readme.py` splices this between the markers of
  docs/benchmarks.md ("At a glance").
  """
  env = results['env']
  command = 'scripts/benchmark.py%s --out DIR' % (
      ' --quick' if results['mode'] == 'quick' else '')
  lines = ['Generated from the results.json of `%s` by '
           '`scripts/update_readme.py`:' % command]
  lines += [''] + _env_lines(env)
  lines += _notes(results)
  lines += [''] + comparison_table(results) + [''] + _targets_table(results)
  lines += _second_batch_lines(results)
  lines += ['', 'Memory is the training step\'s peak of live tensor bytes, '
            'variables included (the CPU allocator\'s peak, which also '
            'counts the slack of its chunks and moves by several MiB '
            'between sessions, is in results.md). Ratios come from '
            'interleaved timing windows on a shared machine; absolute '
            'examples/sec are not comparable between runs. Wall time %.0f '
            's.' % results['seconds']['total']]
  return '\n'.join(lines) + '\n'


def _replaced(over):
  """'; computed another way: ...' for the overhead's replaced ops, or ''."""
  replaced = over.get('replaced_ops')
  if not replaced:
    return ''
  return '; computed another way: %s' % ', '.join(
      '%s (%d)' % (change, count) for change, count in sorted(replaced.items()))


def _build_overhead_line(build):
  return ('**Graph-build cost of a wrapped model_fn call** (fastest of %s '
          'calls each): %s.' % (
              '/'.join(str(b['calls']) for b in build.values()),
              '; '.join(
                  '%s: wrapped bfloat16 %.0f ms, hand-written bfloat16 %.0f '
                  'ms, float32 %.0f ms: the wrapper adds %+.0f ms per call '
                  '(%+.0f ms over float32)' % (
                      name, 1e3 * b['wrapped_bfloat16_seconds'],
                      1e3 * b['hand_written_bfloat16_seconds'],
                      1e3 * b['float32_seconds'],
                      1e3 * b['wrapper_seconds_per_call'],
                      1e3 * b['wrapped_minus_float32_seconds_per_call'])
                  for name, b in build.items())))


def _env_lines(env):
  flags = env['cpu_flags']
  present = [f for f, on in sorted(flags.items()) if on]
  absent = [f for f, on in sorted(flags.items()) if not on]
  load = env.get('load_average_start'), env.get('load_average_end')
  return [
      '- date: %s' % env['date'],
      '- CPU: %s, %s cores, %.0f GiB' % (
          env['cpu'], env['cpu_count'], (env['memory_bytes'] or 0) / 2.0**30),
      '- CPU flags present: %s; absent: %s' % (', '.join(present) or '-',
                                               ', '.join(absent) or '-'),
      '- TensorFlow %s, Keras %s, Python %s; %s' % (
          env['tensorflow'], env['keras'], env['python'], env['onednn']),
      '- load average (1, 5, 15 min) at start %s, at end %s' % tuple(
          '/'.join('%.1f' % x for x in l) if l else 'n/a' for l in load),
  ]


def _model_table(results):
  """Per model and variant: memory, speed, the planner, what ran."""
  lines = [
      '| model | variant | batch | peak step MiB: live tensors | allocator '
      '(each round) | persistent MiB | examples/s | casts run per step (MiB '
      'written) | max batch in budget [first failing] | planner: TPU v2 / '
      'v3 core batch, own optimizer (Adafactor) |',
      '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|']
  for name, model in results.get('models', {}).items():
    for variant, label in _VARIANT_LABELS:
      row = model[variant]
      executed = row['memory'].get('executed') or {}
      search = row.get('max_batch_search')
      searched = 'not searched'
      if search:
        searched = '%d [%s] in %d MiB' % (
            search['max_batch'],
            _fmt(search['smallest_failing_batch'], '%d', 'none'),
            model['budget_bytes'] // MiB)
      planned = '-'
      if 'planner' in row:
        tpu, ada = (row['planner']['tpu_max_batch_per_core'],
                    row['planner']['tpu_max_batch_per_core_adafactor'])
        planned = '%d / %d (%d / %d)' % (tpu['v2'], tpu['v3'], ada['v2'],
                                         ada['v3'])
      rounds = row['memory'].get('peak_step_bytes_runs') or [
          row['peak_step_bytes']]
      lines.append('| %s | %s | %d | %.1f | %.1f (%s) | %.1f | %s | %s '
                   '(%.1f) | %s | %s |'
                   % (name, label, model['spec']['batch_size'],
                      row['peak_tensor_bytes'] / MiB,
                      row['peak_step_bytes'] / MiB,
                      ', '.join('%.0f' % (b / MiB) for b in rounds),
                      row['memory']['persistent_bytes'] / MiB,
                      _fmt(row.get('examples_per_sec'), '%.1f'),
                      executed.get('casts', 'n/a'),
                      executed.get('cast_bytes', 0) / MiB, searched,
                      planned))
  return lines


def _second_batch_lines(results):
  """A line on the models also measured at a second batch (memory only)."""
  parts = []
  for name, model in results.get('models', {}).items():
    row = model.get('memory_at_second_batch')
    if not row:
      continue
    errors = []
    for precision, label in _VARIANT_LABELS[:2]:
      error = model[precision]['planner'].get('relative_error_at_second_batch')
      errors.append('%s %s' % (label, _fmt(
          None if error is None else 100 * error, '%+.1f%%')))
    errors = ', '.join(errors)
    parts.append('%s at batch %d: fp32 %.0f MiB, ours %.0f MiB, ratio %s '
                 '(planner error: %s)' % (
                     name, row['batch_size'],
                     row['float32']['peak_tensor_bytes'] / MiB,
                     row['bfloat16']['peak_tensor_bytes'] / MiB,
                     _fmt(row['ratio']), errors))
  if not parts:
    return []
  return ['', '**Memory at a second batch** (live tensors, float32 and ours '
          'only, one traced step each): %s.' % '; '.join(parts)]


def kernel_table_lines(results):
  """The per-op kernel table, one row per CPU kind and op (or nothing)."""
  rows = results.get('kernel_table')
  if not rows:
    return []
  lines = ['', '**Kernel table** (ms per op, median of alternating windows; '
           '"substituted" is bfloat16 in, the float32 op, bfloat16 out; '
           '"slow" when bfloat16 / substituted > %.2f; "listed": in '
           '`op_lists.CPU_SLOW_BFLOAT16_OPS`):' % kernel_table.SLOW_RATIO, '',
           '| CPU kind | op | float32 | bfloat16 | substituted | bf16/fp32 | '
           'bf16/subst | slow | listed |',
           '| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |']
  for row in rows:
    listed = row['op_type'] in op_lists.CPU_SLOW_BFLOAT16_OPS.get(
        row['kind'], ()) and not row['case'].startswith('Gelu')
    lines.append('| %s | %s | %.3f | %.3f | %.3f | %.2fx | %.2fx | %s | %s |'
                 % (row['kind'], row['case'], row['float32_ms'],
                    row['bfloat16_ms'], row['substituted_ms'], row['ratio'],
                    row['bfloat16_ms'] / row['substituted_ms'],
                    'yes' if row['slow'] else '', 'yes' if listed else ''))
  kinds = {row['kind'] for row in rows}
  for kind in ('native', 'emulated'):
    if kind not in kinds:
      lines.append('| %s | not measured (this CPU cannot run it) | | | | | | '
                   '| |' % kind)
  return lines


def _other_tables(results):
  lines = _second_batch_lines(results)
  lines += kernel_table_lines(results)
  probes = results.get('kernels')
  if probes:
    lines += ['', '**Kernels** (bfloat16 speed over float32, same process, '
              'alternating): %s.' % '; '.join(
                  '%s %d: %.2f (IQR %.2f-%.2f)' % (
                      k['kind'], k['size'], k['speed_ratio'],
                      k['speed_ratio_iqr'][0], k['speed_ratio_iqr'][1])
                  for k in probes.values())]
  over = results.get('overhead')
  if over:
    lines += ['', '**Wrapper overhead** (%s, batch %d, bfloat16, %d '
              'alternating steps each): step time wrapped / hand-written '
              '%.3f (median; IQR %.3f-%.3f; ratio of total times %.3f); ops '
              '%d vs %d, casts %d vs %d, other extra ops: %s' % (
                  over['model'], over['batch_size'],
                  over['timed_steps_each'], over['step_time_ratio'],
                  over['step_time_ratio_iqr'][0],
                  over['step_time_ratio_iqr'][1], over['total_time_ratio'],
                  over['wrapped_ops'],
                  over['hand_written_ops'], over['wrapped_casts'],
                  over['hand_written_casts'],
                  over['extra_ops_besides_casts'] or 'none') +
              _replaced(over) + '.']
  build = results.get('build_overhead')
  if build:
    lines += ['', _build_overhead_line(build)]
  scale = results.get('scaling')
  if scale:
    lines += ['', '**Scaling, 2 logical CPU devices vs 1** (MirroredStrategy, '
              '%s, batch %d per replica): %.0f vs %.0f examples/s, speedup '
              '%.2fx (IQR %.2f-%.2f), efficiency %.2f. %s' % (
                  scale['precision'], scale['per_replica_batch'],
                  scale['two_devices_examples_per_sec'],
                  scale['one_device_examples_per_sec'], scale['speedup'],
                  scale['speedup_iqr'][0], scale['speedup_iqr'][1],
                  scale['scaling_efficiency'], scale['note'])]
  keras = results.get('keras_mixed_bfloat16')
  if keras:
    lines += ['', '**Against Keras mixed_bfloat16** (MNIST MLP, batch %d): '
              'throughput ours/Keras %.2f%s, peak memory '
              'ours/Keras %.2f (%.1f vs %.1f MiB); Keras\'s own bf16/fp32: '
              'throughput %.2f, memory %.2f.' % (
                  keras['batch_size'], keras['throughput_ratio'],
                  _iqr_text(keras.get('throughput_ratio_iqr')),
                  keras['memory_ratio'],
                  keras['ours_bfloat16']['peak_step_bytes'] / MiB,
                  keras['keras_mixed_bfloat16']['peak_step_bytes'] / MiB,
                  keras['keras_bfloat16_over_float32_throughput'],
                  keras['keras_bfloat16_over_float32_memory'])]
  ada = results.get('adafactor')
  if ada:
    lines += ['', '**Adafactor vs %s** (%s, bfloat16, batch %d): optimizer '
              'state %.1f vs %.1f MiB (ratio %.4f; parameters %.1f MiB); peak '
              'step %.1f vs %.1f MiB (ratio %.2f).' % (
                  ada['baseline_optimizer'], ada['model'], ada['batch_size'],
                  ada['adafactor_slot_bytes'] / MiB,
                  ada['baseline_slot_bytes'] / MiB, ada['slot_bytes_ratio'],
                  ada['parameter_bytes'] / MiB,
                  ada['adafactor_peak_step_bytes'] / MiB,
                  ada['baseline_peak_step_bytes'] / MiB,
                  ada['peak_step_bytes_ratio'])]
  for task, runs in results.get('convergence', {}).items():
    lines += ['', '**Convergence, %s** (%d steps, same seed): eval accuracy '
              'fp32 %s / bf16 %s, eval loss %s / %s, final train loss %s / '
              '%s.' % (task, runs['steps'],
                       _fmt(runs['float32']['eval_accuracy'], '%.4f'),
                       _fmt(runs['bfloat16']['eval_accuracy'], '%.4f'),
                       _fmt(runs['float32']['eval_loss'], '%.4f'),
                       _fmt(runs['bfloat16']['eval_loss'], '%.4f'),
                       _fmt(runs['float32']['final_train_loss'], '%.4f'),
                       _fmt(runs['bfloat16']['final_train_loss'], '%.4f'))]
  for name, plans in results.get('tpu_plans', {}).items():
    cells = []
    for precision, by_optimizer in plans.items():
      for optimizer, row in by_optimizer.items():
        cells.append('%s/%s v2 %d, v3 %d' % (
            precision, optimizer, row['tpu_max_batch_per_core']['v2'],
            row['tpu_max_batch_per_core']['v3']))
    lines += ['', '**Planner, %s** (largest batch per TPU core): %s.' % (
        name, '; '.join(cells))]
  return lines


def markdown(results):
  """Returns results.md: environment, targets, per-model and other tables."""
  lines = ['# estimator_bf16 benchmarks (%s mode)' % results['mode'], '']
  lines += _env_lines(results['env'])
  lines += _notes(results)
  if results.get('models'):
    lines += [''] + comparison_table(results)
  lines += [''] + _targets_table(results)
  if results.get('models'):
    lines += [''] + _model_table(results)
  lines += _other_tables(results)
  lines += lever_lines(results)
  lines += fit_lines(results)
  lines += xla_lines(results)
  lines += ['', 'Wall time %.0f s.' % results['seconds']['total']]
  return '\n'.join(lines) + '\n'


def plot_convergence(convergence, path):
  """Writes a PNG with one panel of fp32 vs bf16 loss curves per task."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')  # files only, no display
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  tasks = list(convergence)
  figure, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4),
                              dpi=100, squeeze=False)
  for axis, task in zip(axes[0], tasks):
    for precision in policy.PRECISIONS:
      curve = convergence[task][precision]['loss_curve']
      axis.plot(curve['steps'], curve['loss'], label=precision,
                linewidth=1.2, alpha=0.85)
    axis.set_yscale('log')
    axis.set_xlabel('step')
    axis.set_ylabel('training loss (log scale)')
    axis.set_title('%s, same seed' % task)
    axis.grid(True, which='both', alpha=0.3)
    axis.legend()
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  figure.savefig(path)
  plt.close(figure)


README_BLOCK = 'readme_block.md'


def write_outputs(results, out_dir):
  """Writes results.json, results.md, readme_block.md, convergence.png.

  Adds 'targets' (and 'convergence_plot' when there are curves) to
  `results` first, so the JSON carries what the table shows.

  Returns:
    str, the Markdown of results.md.
  """
  os.makedirs(out_dir, exist_ok=True)
  if results.get('convergence'):
    plot_convergence(results['convergence'],
                     os.path.join(out_dir, 'convergence.png'))
    results['convergence_plot'] = 'convergence.png'
  results['targets'] = targets(results)
  with open(os.path.join(out_dir, 'results.json'), 'w') as out:
    json.dump(results, out, indent=2, sort_keys=True)
  table = markdown(results)
  with open(os.path.join(out_dir, 'results.md'), 'w') as out:
    out.write(table)
  with open(os.path.join(out_dir, README_BLOCK), 'w') as out:
    out.write(readme_block(results))
  return table
