"""The `--fit` text and `--report` data: what `memory.fit` computed, shown.

`memory.fit` plans and chooses (`FitResult`, `Option`, `TableGroup`,
`LargestBatch`, `BatchOverBudget`, `ModelParallel`); this module turns
those into the lines `check --fit` and `run --fit` print and the 'fit'
entry of the `--report` JSON.
"""

import dataclasses

from estimator_bf16.memory import fit as fit_lib
from estimator_bf16.platform.tpu import MiB

BOARD_LINE = ('A v2-8 / v3-8 board has 8 cores; the global batch is 8x the '
              'per-core batch.')


def describe(option):
  """An option's levers in words: 'bfloat16 + accumulate 4 x 64 + ...'."""
  parts = [option.precision]
  if option.gradient_accumulation_steps > 1:
    parts.append('accumulate %d x %d' % (option.gradient_accumulation_steps,
                                         option.micro_batch))
  if option.recompute:
    parts.append('recompute')
  return ' + '.join(parts)


def run_flags(option):
  """The `run` (and `tpu_submit tpu-vm run`) flags of a fit option."""
  flags = ['--precision=%s' % option.precision]
  if option.gradient_accumulation_steps > 1:
    flags.append('--accumulate=%d' % option.gradient_accumulation_steps)
  if option.recompute:
    flags.append('--recompute')
  return flags


def note_lines(result):
  """One line for each lever `fit` left out, saying why."""
  lines = []
  if result.accumulation_note is not None:
    lines.append('No gradient accumulation: %s.' % result.accumulation_note)
  for precision in result.same_recompute:
    lines.append('No recompute in %s: the network has too few ops to cut '
                 'into segments, so it plans the same.' % precision)
  return lines


def table_lines(result):
  """The options as a text table, the chosen one marked with '*'.

  Each group stops at its first K that fits when every larger K fits too
  (`fit.table_groups`); one line counts those.
  """
  header = '%-2s %-9s %5s %6s %9s %11s %6s %4s' % (
      '', 'precision', 'K', 'micro', 'recompute', 'planned MiB', 'cost',
      'fits')
  lines = [header, '-' * len(header)]
  for group in fit_lib.table_groups(result):
    for option in group.shown:
      lines.append('%-2s %-9s %5d %6d %9s %11.1f %6.2f %4s' % (
          '*' if option == result.chosen else '', option.precision,
          option.gradient_accumulation_steps, option.micro_batch,
          'on' if option.recompute else 'off', option.planned_bytes / MiB,
          option.cost, 'yes' if option.fits else 'no'))
    rest = group.also_fit
    if rest:
      lines.append('%-2s %s' % ('', '... and K = %d to %d (%.1f to %.1f '
                                'MiB) also fit' % (
                                    rest[0].gradient_accumulation_steps,
                                    rest[-1].gradient_accumulation_steps,
                                    rest[0].planned_bytes / MiB,
                                    rest[-1].planned_bytes / MiB)))
  return lines


def largest_batch_items(result):
  """`fit.largest_batches` as (description, batch) pairs, in order.

  The description names the levers ('bfloat16 + recompute',
  'float32 + accumulation'); the batch is an int, or 'K x N' for the
  micro-batch next to the accumulators (0 when not even one fits).
  """
  items = []
  for row in fit_lib.largest_batches(result):
    name = row.precision + (' + recompute' if row.recompute else '')
    if row.accumulation:
      items.append((name + ' + accumulation',
                    'K x %d' % row.batch if row.batch else 0))
    else:
      items.append((name, row.batch))
  return items


def model_parallel_lines(advice):
  """Advice when even one example per core does not fit.

  Args:
    advice: a `fit.ModelParallel` (`fit.model_parallel`).

  Returns:
    list of str.
  """
  lines = ['Even one example per core needs %.1f MiB with the smallest '
           'plan, over the %.1f MiB budget%s.' % (
               advice.one_example_bytes / MiB, advice.budget_bytes / MiB,
               ' less its %d%% margin (%.1f MiB)' % (
                   round(100 * advice.margin), advice.room_bytes / MiB)
               if advice.margin else '')]
  if advice.state_over_budget:
    lines.append('The weights and optimizer state alone take %.0f MiB '
                 '(slots %.0f MiB): Adafactor keeps rows + columns per '
                 'matrix instead of two full copies.' %
                 (advice.persistent_bytes / MiB, advice.slot_bytes / MiB))
  for count, per_core in advice.per_core_bytes:
    lines.append('num_cores_per_replica=%d (with computation_shape): about '
                 '%.1f MiB per core at one example.' % (count,
                                                        per_core / MiB))
  if advice.image_input:
    lines.append('Images can also be split over cores: input_partition_dims '
                 '(spatial partitioning).')
  return lines


def over_budget_lines(result):
  """Why nothing fits, and what would (`fit.over_budget`).

  Args:
    result: a `FitResult` whose `chosen` is None.

  Returns:
    list of str.
  """
  advice = fit_lib.over_budget(result)
  if isinstance(advice, fit_lib.ModelParallel):
    return model_parallel_lines(advice)
  return ['It is the batch of %d per core that does not fit: at most %d '
          'per core fits, with %s%s. On a TPU, TPUEstimator gives each '
          'core train_batch_size / cores, so more cores (a larger slice) '
          'take the same global batch.' % (
              advice.batch_per_core, advice.largest_batch, advice.precision,
              ' + recompute' if advice.recompute else '')]


def fit_lines(result):
  """The `check --fit` table, the choice, or the advice when none fits."""
  lines = ['fit: batch %d per core (the TRAIN graph\'s batch) in %.0f MiB; '
           'every combination of the levers, planned%s (fits: plan + %d%% '
           'margin within the budget; cost: time per example relative to '
           'plain bfloat16, from the benchmark):' % (
               result.batch_per_core, result.budget_bytes / MiB,
               ' with this CPU\'s float32 copies for bfloat16 matmuls'
               if result.upcast else '', round(100 * result.margin))]
  lines += table_lines(result)
  lines += note_lines(result)
  lines.append('largest batch per core in %.0f MiB: %s.' % (
      result.budget_bytes / MiB, '; '.join(
          '%s %s' % item for item in largest_batch_items(result))))
  if result.chosen is not None:
    flags = ' '.join(run_flags(result.chosen))
    lines.append('chosen: %s, planned %.1f MiB of %.1f MiB (cost %.2f).' % (
        describe(result.chosen), result.chosen.planned_bytes / MiB,
        result.budget_bytes / MiB, result.chosen.cost))
    lines.append('to train with it: estimator_bf16 run %s PROGRAM.py ..., or '
                 'on a TPU VM: tpu-submit tpu-vm run %s '
                 '--program=PROGRAM.py -- ...' % (flags, flags))
  else:
    best = fit_lib.smallest_option(result)
    lines.append('nothing fits: the smallest plan, %s, needs %.1f MiB '
                 '(%.1f MiB with the %d%% margin).' % (
                     describe(best), best.planned_bytes / MiB,
                     best.planned_bytes * (1 + result.margin) / MiB,
                     round(100 * result.margin)))
    lines += over_budget_lines(result)
  lines.append(BOARD_LINE)
  lines.append('Adafactor (advice: it changes your optimizer) keeps rows + '
               'columns of each matrix instead of two full Adam slots.')
  return lines


def report_dict(result):
  """JSON-ready summary of a `FitResult` (the 'fit' entry of `--report`)."""
  chosen = result.chosen
  return {
      'budget_bytes': result.budget_bytes,
      'batch_per_core': result.batch_per_core,
      'margin': result.margin, 'upcast': result.upcast,
      'notes': note_lines(result),
      'planned_peak_bytes': chosen.planned_bytes if chosen else None,
      'levers': chosen.levers if chosen else None,
      'options': [dict(dataclasses.asdict(o)) for o in result.options],
  }
