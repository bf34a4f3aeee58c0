"""The reports of `python -m estimator_bf16 run` and `check`.

`run` ends with one short report (precision, bfloat16 share of matmul/conv
FLOPs, audit problems, measured peak step memory, a stop by SIGTERM and the
checkpoint it left). `check` prints the audit
of the program's TRAIN graph and a memory plan: the batch per TPU v2 / v3
core in each precision, with Adam and with Adafactor (the plans are
`planning.py`'s; this module only formats them).
"""

from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.platform.tpu import MiB
from estimator_bf16.memory import fit as fit_lib
from estimator_bf16.memory import peak as peak_lib
from estimator_bf16.runner import fit_report
from estimator_bf16.runner import xla_check

def _problem_lines(problems):
  if not problems:
    return ['audit: no problems']
  lines = ['audit: %d problem(s)' % len(problems)]
  lines += ['  - ' + problem for problem in problems]
  return lines


# How many of the largest float32 matmul/conv ops the report names.
_REMAINDER_SHOWN = 3


def _flop_lines(reports, precision):
  """The bfloat16 share, and in a bfloat16 run what is still float32."""
  if not reports:
    return ['bfloat16 share of matmul/conv FLOPs: no TRAIN graph was built']
  report = reports[-1]
  total = sum(report.flops_by_dtype.values())
  lines = ['bfloat16 share of matmul/conv FLOPs: %.1f%% of %.3g per step '
           '(TRAIN graph, forward and backward)' % (
               100 * report.bfloat16_flop_share, total)]
  if (not precision.bfloat16 or not total or
      not report.largest_float32_ops):
    return lines
  lines.append('float32 remainder: %.1f%% of those FLOPs; the largest:' %
               (100 * (1 - report.bfloat16_flop_share)))
  for name, op_type, flops, where in (
      report.largest_float32_ops[:_REMAINDER_SHOWN]):
    lines.append('  %s (%s, %.1f%%)%s' % (
        name, op_type, 100 * flops / total,
        ' made at ' + where if where else ''))
  return lines


def kernels_lines(result):
  """What this CPU computed in float32 in place of slow bfloat16 kernels.

  Nothing for a run without a bfloat16 TRAIN graph, or with --kernels=bfloat16
  and nothing substituted.
  """
  if not result.reports or not result.precision.bfloat16:
    return []
  substituted = result.reports[-1].cpu_substituted_ops
  kind = cpu_kernels.cpu_kind()
  if not substituted:
    if result.kernels == 'bfloat16':
      return ["CPU kernels: TensorFlow's own bfloat16 kernels (--kernels="
              "bfloat16)"]
    return []
  ops = ', '.join('%s x%d' % (op_type, count)
                  for op_type, count in sorted(substituted.items()))
  return ['CPU kernels: %d ops computed in float32 from bfloat16 inputs, '
          'rounded to bfloat16, because their bfloat16 kernels are slow on '
          'this CPU (%s bfloat16): %s. The audit and FLOP share count them '
          'as bfloat16, as a TPU runs them; --kernels=bfloat16 keeps '
          "TensorFlow's own kernels." % (sum(substituted.values()), kind, ops)]


def _tf1_line(result):
  return 'TF 1.x API: %s (%s)' % ('on' if result.tf1 else 'off',
                                  result.tf1_reason)


def levers_line(result):
  """One line naming the memory levers a run used."""
  parts = []
  steps = result.gradient_accumulation_steps
  if steps > 1:
    batches = ', '.join('train_batch_size %d = %d x %d' % (batch, steps, micro)
                        for batch, micro in result.micro_batches)
    if not batches and result.estimators:
      batches = "an Estimator's input_fn batch is the micro-batch"
    parts.append('gradient accumulation K=%d%s' % (
        steps, ' (%s)' % batches if batches else ''))
  if result.recompute:
    parts.append('recompute on')
  return 'memory levers: %s' % ('; '.join(parts) or 'none')


def fit_measured_bytes(result):
  """The measured step `run --fit` compares: the first `train` call's,
  whose TRAIN graph was the one planned (0 if not measured)."""
  peaks = result.train_peak_tensor_bytes
  return peaks[0] if peaks else 0


def fit_run_lines(result):
  """`run --fit`: the levers chosen, and measured vs planned vs budget."""
  fitted, chosen = result.fit, result.fit.chosen
  peak = fit_measured_bytes(result)
  measured = ('%.1f MiB' % (peak / MiB) if peak else
              'not measured (%s)' % _unmeasured_reason(result))
  if peak and len(result.train_peak_tensor_bytes) > 1:
    measured += " (the first train call's step: the one planned)"
  verdict = ''
  if peak:
    over = peak - fitted.budget_bytes
    verdict = (': within the budget' if over <= 0 else
               ': OVER the budget by %.1f MiB' % (over / MiB))
  return ['fit: %s, chosen for %.1f MiB per core (cost %.2f)' % (
      fit_report.describe(chosen), fitted.budget_bytes / MiB, chosen.cost),
          'peak step tensors: measured %s | planned %.1f MiB | budget %.1f '
          'MiB%s' % (measured, chosen.planned_bytes / MiB,
                     fitted.budget_bytes / MiB, verdict)]


def fit_passed(result, fit_requested=False):
  """False when `--fit` found nothing that fits, or (`fit_requested`)
  could not plan at all; True otherwise."""
  if result.fit_plans is not None:
    return result.fit_plans.chosen is not None
  return not fit_requested


def report_json(result, budget_bytes=None, exit_code=None):
  """The exit report as JSON-ready data (`--report=PATH`).

  Keys: 'program', 'precision', 'exit_code', 'peak_step_bytes' (the
  measured peak of a training step's tensors, what the plan and budget are
  compared with; with --memory or `run --fit`, else None),
  'peak_allocator_bytes' (the CPU allocator's peak of the same step),
  'planned_peak_bytes' and 'budget_bytes' (with --fit, else None),
  'bfloat16_flop_share' (of the last TRAIN graph, None without one),
  'levers' ({'precision', 'gradient_accumulation_steps', 'recompute',
  'kernels'}: the run's, or with `check --fit` the chosen ones), 'seed'
  (`run --seed`, else None),
  'cpu_substituted_ops' ({op type: count} of the last TRAIN graph's ops
  computed in float32 for slow bfloat16 CPU kernels), 'problems' (audit),
  'train_steps' (global steps each `train` call advanced, in order),
  'evaluations' (each `evaluate` call's scalar results, {metric: [value,
  dtype name]}), 'plan_made' and 'plan_error' (`check`: whether the memory
  plan was made, else why not),
  'xla_step_bytes', 'xla_total_bytes', 'xla_planned_bytes',
  'xla_product_dtypes' (HLO type: matmuls and convolutions) and 'xla_error'
  (with `check --xla`, else None: `runner.xla_check`), and with --fit 'fit'
  (every option). `exit_code` is the command's when
  given (a check that found nothing fitting exits 1), else the program's.
  """
  fitted = result.fit_plans or result.fit
  levers = {'precision': result.precision,
            'gradient_accumulation_steps': result.gradient_accumulation_steps,
            'recompute': result.recompute, 'kernels': result.kernels}
  data = {
      'program': result.program, 'precision': result.precision,
      'exit_code': result.exit_code if exit_code is None else exit_code,
      'peak_step_bytes': result.peak_tensor_bytes or None,
      'peak_allocator_bytes': result.peak_bytes or None,
      'planned_peak_bytes': None, 'budget_bytes': budget_bytes,
      'bfloat16_flop_share': (result.reports[-1].bfloat16_flop_share
                              if result.reports else None),
      'levers': levers, 'seed': result.seed,
      'problems': list(result.problems),
      'train_steps': list(result.train_steps),
      'evaluations': list(result.evaluations),
      'plan_made': (bool(result.plans) or result.fit_plans is not None) and (
          result.plan_error is None),
      'plan_error': result.plan_error,
      'cpu_substituted_ops': (dict(result.reports[-1].cpu_substituted_ops)
                              if result.reports else {}),
  }
  data['xla_error'] = result.xla_error
  data['xla_step_bytes'] = data['xla_total_bytes'] = None
  data['xla_planned_bytes'] = None
  data['xla_product_dtypes'] = None
  if result.xla is not None:
    data['xla_step_bytes'] = result.xla.step.step_bytes
    data['xla_total_bytes'] = result.xla.step.total_bytes
    data['xla_planned_bytes'] = result.xla.planned_bytes
    data['xla_product_dtypes'] = result.xla.step.product_dtypes
  if result.fit is not None:
    data['peak_step_bytes'] = fit_measured_bytes(result) or None
  if fitted is not None:
    summary = fit_report.report_dict(fitted)
    data['fit'] = summary
    data['budget_bytes'] = fitted.budget_bytes
    data['planned_peak_bytes'] = summary['planned_peak_bytes']
    if summary['levers'] is not None:
      data['levers'] = summary['levers']
  return data


def _unmeasured_reason(result):
  """Why `--memory` measured nothing: one clause."""
  if not peak_lib.allocator_stats_enabled():
    return ('the CPU allocator keeps no statistics: %s=%s was not set before '
            'TensorFlow loaded' % peak_lib.ALLOCATOR_ENV)
  needed = peak_lib.TRACED_CALL + 1
  if not result.train_steps:
    return ('the program never called train; it measures session run %d of '
            'a train call' % needed)
  return ('it measures session run %d of a train call, and the longest call '
          'ran %d steps' % (needed, max(result.train_steps)))


def train_step_lines(result):
  """The training steps run, and a warning line when there were none."""
  if not result.train_steps:
    return ['training steps run: 0 (the program never called train)']
  total = sum(result.train_steps)
  calls = len(result.train_steps)
  lines = ['training steps run: %d%s' % (
      total, ' in %d train calls' % calls if calls > 1 else '')]
  idle = [str(i + 1) for i, steps in enumerate(result.train_steps)
          if steps == 0]
  if idle:
    what = ('no training step ran' if total == 0 else
            'train call %s of %d ran no step' % (', '.join(idle), calls))
    lines.append('warning: %s: the train input was empty, or model_dir '
                 'already held a checkpoint at max_steps (a rerun of a '
                 'finished run)' % what)
  return lines


def evaluation_lines(result):
  """The last evaluation's results, with their dtypes."""
  if not result.evaluations:
    return []
  last = result.evaluations[-1]
  shown = ', '.join(
      '%s %s (%s)' % (key, ('%.4g' % value) if isinstance(value, float)
                      else value, dtype)
      for key, (value, dtype) in sorted(last.items()))
  calls = len(result.evaluations)
  return ['evaluation%s: %s' % (' (the last of %d)' % calls if calls > 1
                                else '', shown or 'no scalar results')]


def format_run_report(result):
  """The report `run` prints when the program ends.

  Args:
    result: a `runner.RunResult`.

  Returns:
    str, a few lines ending with a newline.
  """
  lines = ['', 'estimator_bf16 run: %s' % result.program,
           'precision: %s' % result.precision, _tf1_line(result),
           levers_line(result)]
  if result.estimators == 0 and result.error is not None:
    # It may have tried (a refusal of TPUEstimator(use_tpu=True) comes
    # from inside the constructor): the failed line below says why.
    lines.append('nothing ran in %s: the program stopped before an '
                 'Estimator or TPUEstimator was built.' % result.precision)
  elif result.estimators == 0:
    lines.append('the program built no Estimator or TPUEstimator, so '
                 'nothing ran in %s.' % result.precision)
  else:
    lines.append('estimators built: %d; TRAIN graphs audited: %d' % (
        result.estimators, len(result.reports)))
    lines += _flop_lines(result.reports, result.precision)
    lines += kernels_lines(result)
    lines += _problem_lines(result.problems)
    lines += train_step_lines(result)
    lines += evaluation_lines(result)
  if result.local_resolvers:
    lines.append('TPU resolver: local stand-in (no TPU named or attached)')
  if result.peak_bytes:
    lines.append('peak training-step memory (CPU allocator, measured): '
                 '%.1f MiB' % (result.peak_bytes / MiB))
  if result.peak_tensor_bytes:
    lines.append("peak training-step tensors (measured: variables and the "
                 "step's tensors at their own size, as planned): %.1f MiB" %
                 (result.peak_tensor_bytes / MiB))
  elif result.memory and result.fit is None:
    lines.append('peak training-step memory: not measured (%s)' %
                 _unmeasured_reason(result))
  if result.fit is not None:
    lines += fit_run_lines(result)
  if result.stopped_by:
    lines.append('stopped by %s during training, after the current step; '
                 'newest checkpoint: %s (the same command resumes from it)' %
                 (result.stopped_by, result.stop_checkpoint or 'none'))
  if result.reason:
    lines.append('failed: %s' % result.reason)
  lines.append('exit code: %d' % result.exit_code)
  return '\n'.join(lines) + '\n'


def _plan_table(plans):
  header = ('%-9s %-10s %10s %10s %12s %9s %9s' % (
      'precision', 'optimizer', 'params MiB', 'slots MiB', 'MiB/example',
      'v2 core', 'v3 core'))
  lines = [header, '-' * len(header)]
  for (precision, optimizer), plan in fit_lib.sorted_plans(plans):
    cores = plan.max_batch_per_core()
    lines.append('%-9s %-10s %10.2f %10.2f %12.4f %9d %9d' % (
        precision, optimizer, plan.parameter_bytes / MiB,
        plan.slot_bytes / MiB, plan.bytes_per_example / MiB, cores['v2'],
        cores['v3']))
  return lines


def check_passed(result):
  """True when `check` found a TRAIN graph without audit problems, and
  planned its memory (`plan_error`) and compiled it with XLA
  (`xla_error`) if asked."""
  return (result.train_graph is not None and result.error is None and
          not result.problems and result.plan_error is None and
          result.xla_error is None)


def plan_problem_line(result, limit=240):
  """One line naming why the memory plan could not be made, or None.

  A plan that fails is a problem of the check, not a footnote: the
  exception's first line (TensorFlow's messages run on), cut at `limit`.
  """
  if result.plan_error is None:
    return None
  lines = [line.strip() for line in str(result.plan_error).splitlines()]
  reason = next((line for line in lines if line), 'no reason given')
  if len(reason) > limit:
    reason = reason[:limit - 3] + '...'
  return 'memory plan: PROBLEM, it could not be made: %s' % reason


def format_check_report(result, fit_requested=False, command='check'):
  """What `check` prints: the audit, then the memory plan.

  Args:
    result: a `runner.RunResult` from a check-mode run.
    fit_requested: `--fit` was given: a plan that cannot be made fails.
    command: what the header says ran: 'check', or for a `run --fit` that
      trained nothing 'run --fit (planning, nothing trained)'.

  Returns:
    str, ending with a newline.
  """
  lines = ['', 'estimator_bf16 %s: %s (TRAIN graph in %s)' % (
      command, result.program, result.precision), _tf1_line(result),
           levers_line(result)]
  if result.train_graph is None:
    if result.error is not None:
      lines.append('the program failed before its TRAIN graph was built '
                   '(exit code %d); its traceback is above.' %
                   result.exit_code)
      if result.reason:
        lines.append('failed: %s' % result.reason)
    elif result.estimators == 0:
      lines.append('the program built no Estimator or TPUEstimator: there '
                   'is no TRAIN graph to check.')
    else:
      lines.append('the program never called train: there is no TRAIN '
                   'graph to check.')
    return '\n'.join(lines) + '\n'
  lines += _flop_lines(result.reports, result.precision)
  lines += kernels_lines(result)
  lines += _problem_lines(result.problems)
  lines.append('')
  if result.fit_plans is not None:
    lines += fit_report.fit_lines(result.fit_plans)
  elif result.plans:
    lines.append('memory plan: largest batch per TPU core (v2: 8 GiB, v3: 16 '
                 'GiB HBM), for one training step')
    lines += _plan_table(result.plans)
    if result.gradient_accumulation_steps > 1:
      lines.append('With gradient accumulation K=%d: batches are per update '
                   '(K micro-batches), MiB/example per micro-batch example, '
                   'and slots include the float32 accumulators.' %
                   result.gradient_accumulation_steps)
    lines.append('Estimates without XLA fusion or padding: leave headroom. '
                 + fit_report.BOARD_LINE)
  else:
    lines.append(plan_problem_line(result) or 'memory plan: not available')
  lines += xla_check.report_lines(result)
  passed = check_passed(result) and fit_passed(result, fit_requested)
  lines.append('result: %s' % ('OK' if passed else 'FAILED'))
  return '\n'.join(lines) + '\n'
