"""Turns results.json into the Markdown tables and the loss-curve picture.

Every number printed here is read from the results dict; nothing is typed
in. `targets` holds the issue's targets and checks each against the
results.
"""

import json
import os

MiB = 2.0**20


def _fmt(value, spec='%.2f', missing='n/a'):
  return missing if value is None else spec % value


def _models_of(results, family):
  return [(name, model) for name, model in results.get('models', {}).items()
          if model['spec']['family'] == family]


def targets(results):
  """The issue's targets with the measured value of each.

  Returns:
    list of dicts: 'target' (text), 'measured' (text), 'met' (bool or None
    when not measured).
  """
  rows = []

  def add(target, values, check):
    values = [(label, value) for label, value in values if value is not None]
    measured = '; '.join('%s %.2f' % item for item in values) or 'n/a'
    met = all(check(v) for _, v in values) if values else None
    rows.append({'target': target, 'measured': measured, 'met': met})

  deep = (_models_of(results, 'resnet') + _models_of(results, 'bert'))
  add('peak step memory bf16/fp32 <= 0.60 (ResNet, BERT), at the largest '
      'float32 batch in the budget',
      [(name, m['ratios']['memory_at_float32_max_batch'])
       for name, m in deep], lambda v: v <= 0.60)
  add('largest batch in a budget bf16/fp32 >= 1.7x',
      [(name, m['ratios']['max_batch'])
       for name, m in results.get('models', {}).items()],
      lambda v: v >= 1.7)
  add('throughput bf16/fp32 >= 1.5x (BERT)',
      [(name, m['ratios']['throughput'])
       for name, m in _models_of(results, 'bert')], lambda v: v >= 1.5)
  add('throughput bf16/fp32 >= 1.0x (ResNet)',
      [(name, m['ratios']['throughput'])
       for name, m in _models_of(results, 'resnet')], lambda v: v >= 1.0)
  over = results.get('overhead')
  if over:
    add('wrapper step time / hand-written <= 1.02',
        [(over['model'], over['step_time_ratio'])], lambda v: v <= 1.02)
    rows.append({'target': 'wrapper adds no ops besides casts',
                 'measured': 'extra non-cast ops: %s' % (
                     over['extra_ops_besides_casts'] or 'none'),
                 'met': not over['extra_ops_besides_casts']})
  keras = results.get('keras_mixed_bfloat16')
  if keras:
    add('throughput ours / Keras mixed_bfloat16 >= 1.0',
        [('mnist_mlp', keras['throughput_ratio'])], lambda v: v >= 1.0)
  planner = results.get('planner')
  if planner and planner['relative_error'] is not None:
    add('planner within 15% of the measured peak (worst case)',
        [(planner['worst_case'], planner['relative_error'])],
        lambda v: abs(v) <= 0.15)
  return rows


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
  lines = [
      '| model | precision | batch | peak step MiB | persistent MiB | '
      'examples/s | max batch in budget [first failing] (planner) | TPU v2 '
      '/ v3 core batch, own optimizer (Adafactor) |',
      '|---|---|---:|---:|---:|---:|---:|---:|']
  for name, model in results.get('models', {}).items():
    for precision in ('float32', 'bfloat16'):
      row = model[precision]
      plan = row['planner']
      tpu, ada = plan['tpu_max_batch_per_core'], plan[
          'tpu_max_batch_per_core_adafactor']
      failing = row['max_batch_search']['smallest_failing_batch']
      lines.append('| %s | %s | %d | %.1f | %.1f | %s | %d [%s] in %d MiB '
                   '(%s) | %d / %d (%d / %d) |' % (
                       name, precision, model['spec']['batch_size'],
                       row['peak_step_bytes'] / MiB,
                       row['memory']['persistent_bytes'] / MiB,
                       _fmt(row['examples_per_sec'], '%.1f'),
                       row['max_batch'], _fmt(failing, '%d', 'none'),
                       model['budget_bytes'] // MiB,
                       plan.get('max_batch_in_budget'), tpu['v2'],
                       tpu['v3'], ada['v2'], ada['v3']))
  lines += ['', '| model | memory bf16/fp32 at batch (largest fp32 '
            'batch) | activations+transients bf16/fp32 (same) | throughput '
            'bf16/fp32 (IQR) | max batch bf16/fp32 | planner v2-core batch '
            'bf16/fp32 |', '|---|---:|---:|---:|---:|---:|']
  for name, model in results.get('models', {}).items():
    r = model['ratios']
    lines.append('| %s | %s (%s) | %s (%s) | %s (%s-%s) | %s | %s |' % (
        name, _fmt(r['memory']), _fmt(r['memory_at_float32_max_batch']),
        _fmt(r['transient_memory']),
        _fmt(r['transient_memory_at_float32_max_batch']),
        _fmt(r['throughput']), _fmt(r['throughput_iqr'][0]),
        _fmt(r['throughput_iqr'][1]), _fmt(r['max_batch']),
        _fmt(r['planner_max_batch_v2'])))
  return lines


def _other_tables(results):
  lines = []
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
              '%d vs %d, casts %d vs %d, other extra ops: %s.' % (
                  over['model'], over['batch_size'],
                  over['timed_steps_each'], over['step_time_ratio'],
                  over['step_time_ratio_iqr'][0],
                  over['step_time_ratio_iqr'][1], over['total_time_ratio'],
                  over['wrapped_ops'],
                  over['hand_written_ops'], over['wrapped_casts'],
                  over['hand_written_casts'],
                  over['extra_ops_besides_casts'] or 'none')]
  keras = results.get('keras_mixed_bfloat16')
  if keras:
    lines += ['', '**Against Keras mixed_bfloat16** (MNIST MLP, batch %d): '
              'throughput ours/Keras %.2f (IQR %.2f-%.2f), peak memory '
              'ours/Keras %.2f (%.1f vs %.1f MiB); Keras\'s own bf16/fp32: '
              'throughput %.2f, memory %.2f.' % (
                  keras['batch_size'], keras['throughput_ratio'],
                  keras['throughput_ratio_iqr'][0],
                  keras['throughput_ratio_iqr'][1], keras['memory_ratio'],
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
  rows = [row for row in targets(results) if row['met'] is not None]
  if rows:
    lines += ['', '| target | measured | met |', '|---|---|---|']
    for row in rows:
      lines.append('| %s | %s | %s |' % (
          row['target'], row['measured'], 'yes' if row['met'] else 'no'))
  if results.get('models'):
    lines += [''] + _model_table(results)
  lines += _other_tables(results)
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
    for precision in ('float32', 'bfloat16'):
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


def write_outputs(results, out_dir):
  """Writes results.json, results.md and convergence.png into `out_dir`.

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
  return table
