"""Fitting a batch to a memory budget: which levers, decided before running.

    result = eb.choose_levers(model_fn, features=..., labels=...,
                              batch_per_core=256,
                              budget_bytes=fit.device_bytes('tpu-v2'))
    result.chosen   # the cheapest Option that fits, or None

Every combination of the levers is planned from the memory planner's plans
of the program's own training step: the precision, gradient accumulation K
over the divisors of the per-core batch (micro-batches stay whole), and
recompute on or off. Each combination gets its planned peak per core and an
estimated step time relative to plain bfloat16 (`COSTS`), and the cheapest
one within the budget is chosen. Adafactor is advice only: it changes the
user's optimizer.
"""

import dataclasses
import re
from typing import Optional, Tuple

from estimator_bf16.platform import tpu
from estimator_bf16.memory import planner
from estimator_bf16.precision import policy as precision_lib

MiB = 2**20
GiB = tpu.GiB

# Memory of one core or chip of each TPU a fit plans for (platform/tpu.py).
DEVICE_BYTES = tpu.TPU_DEVICE_BYTES

# Step time per example relative to plain bfloat16: the cost model, with
# constants measured by the benchmark (scripts/benchmark.py, 2026-11-25/26,
# a 2-core AMD EPYC with AVX512-BF16, TensorFlow 2.15.1):
#   float32: bfloat16 ran 1.72x (BERT-base) and 1.66x (ResNet-50) faster;
#   recompute: 1.15-1.18x (BERT-base, batch 64) and 1.17-1.23x (ResNet-50,
#     batch 32) the step time over two runs, about one more forward pass;
#   accumulation: 0.91-1.00x (BERT-base) and 0.99-1.02x (ResNet-50) the
#     micro-batch's examples/s over two runs: about free per example.
COSTS = {'float32': 1.7, 'recompute': 1.2, 'accumulation': 1.0}

# What the plan may miss by: the planner is within 10% of the measured peak
# of the step's tensors in 39 of the 40 lever combinations of the
# benchmark's fit section (the worst: -10.2%, a 34 MiB conv net) and in
# tests/test_planner.py, and within 15% where the CPU emulates bfloat16.
# An option fits when its plan plus this margin is within the budget.
PLAN_MARGIN = 0.10
EMULATED_PLAN_MARGIN = 0.15

_SIZE = re.compile(r'^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?'
                   r'\s*$')
_UNITS = {None: 1, 'B': 1, 'KiB': 2**10, 'MiB': MiB, 'GiB': GiB,
          'TiB': 2**40, 'KB': 10**3, 'MB': 10**6, 'GB': 10**9, 'TB': 10**12}


def parse_size(text):
  """Bytes in `text`: '8589934592', '512MiB', '8GiB', '1.5GB'.

  Raises:
    ValueError: not a size, naming the forms accepted.
  """
  match = _SIZE.match(str(text))
  if not match:
    raise ValueError('%r is not a size: give bytes (8589934592) or a number '
                     'with a unit: B, KiB, MiB, GiB, TiB (powers of 2) or KB, '
                     'MB, GB, TB (powers of 10), e.g. 512MiB or 8GiB.' %
                     (text,))
  value = float(match.group(1)) * _UNITS[match.group(2)]
  if value < 1:
    raise ValueError('%r is not a positive size.' % (text,))
  return int(value)


def device_bytes(device):
  """Memory of one core or chip of `device` (a key of `DEVICE_BYTES`).

  Raises:
    ValueError: an unknown device, listing the choices.
  """
  if device not in DEVICE_BYTES:
    raise ValueError('Unknown device %r; choose one of %s.' %
                     (device, ', '.join(DEVICE_BYTES)))
  return DEVICE_BYTES[device]


@dataclasses.dataclass(frozen=True)
class Option:
  """One combination of levers for the program's per-core batch.

  Attributes:
    precision: 'float32' or 'bfloat16'.
    gradient_accumulation_steps: K.
    recompute: bool.
    micro_batch: examples per micro-step per core (batch / K).
    planned_bytes: the planner's peak per core.
    cost: estimated time per example relative to plain bfloat16 (`COSTS`).
    fits: planned_bytes plus the fit's margin is within the budget.
  """
  precision: str
  gradient_accumulation_steps: int
  recompute: bool
  micro_batch: int
  planned_bytes: int
  cost: float
  fits: bool

  @property
  def levers(self):
    """The JSON-ready levers of this option."""
    return {'precision': self.precision,
            'gradient_accumulation_steps': self.gradient_accumulation_steps,
            'recompute': self.recompute}

  def describe(self):
    parts = [self.precision]
    if self.gradient_accumulation_steps > 1:
      parts.append('accumulate %d x %d' % (self.gradient_accumulation_steps,
                                           self.micro_batch))
    if self.recompute:
      parts.append('recompute')
    return ' + '.join(parts)


@dataclasses.dataclass(frozen=True)
class FitResult:
  """Every option, and the chosen one.

  Attributes:
    batch_per_core: the batch of one update per core.
    budget_bytes: the memory of one core.
    options: every `Option`, in table order.
    chosen: the cheapest fitting option, or None if nothing fits.
    plans: the {(precision, recompute): MemoryPlan} planned from.
    margin: the share of the plan added before comparing with the budget.
    upcast: whether the plans count a CPU's float32 copies for bfloat16
      matmuls (`MemoryPlan.step_bytes`).
    notes: one line for each lever left out, saying why.
    accumulation: whether accumulation was planned.
    image_input: the model reads images (spatial partitioning applies).
  """
  batch_per_core: int
  budget_bytes: int
  options: Tuple[Option, ...]
  chosen: Optional[Option]
  plans: Optional[dict] = None
  margin: float = PLAN_MARGIN
  upcast: bool = False
  notes: Tuple[str, ...] = ()
  accumulation: bool = True
  image_input: bool = False

  @property
  def room_bytes(self):
    """The budget less the margin: what a plan must stay within to fit."""
    return self.budget_bytes / (1.0 + self.margin)


def divisors(batch):
  """K values that keep the micro-batch whole: the divisors of `batch`."""
  return [k for k in range(1, batch + 1) if batch % k == 0]


def _cost(precision, steps, recompute):
  cost = COSTS['float32'] if precision == 'float32' else 1.0
  if recompute:
    cost *= COSTS['recompute']
  if steps > 1:
    cost *= COSTS['accumulation']
  return cost


def fit(plans, batch_per_core, budget_bytes, *, margin=PLAN_MARGIN,
        upcast=False, accumulation_note=None):
  """Plans every lever combination for `batch_per_core`; picks one.

  Args:
    plans: {(precision, recompute): `MemoryPlan`} built without
      accumulation (see `lever_plans`); accumulation is planned from them:
      the micro-batch's step plus one float32 copy of the trainable
      variables (the accumulators).
    batch_per_core: int, examples per update per core.
    budget_bytes: int, memory of one core.
    margin: float >= 0; an option fits when `planned x (1 + margin)` is
      within the budget (`PLAN_MARGIN`: the planner's measured error).
    upcast: plan a CPU that computes bfloat16 matmuls in float32 copies
      (`MemoryPlan.step_bytes`); False for TPUs and native CPUs.
    accumulation_note: if not None, gradient accumulation cannot be
      applied (this says why): only K = 1 is planned.

  Returns:
    A `FitResult`. The choice is the lowest cost that fits; among equal
    costs, the fewest levers (no accumulation before accumulation), then
    the largest micro-batch (fewest micro-steps), then the lowest peak.

  Raises:
    ValueError: a batch or budget that is not a positive integer, or a
      negative margin.
  """
  for name, value in (('batch_per_core', batch_per_core),
                      ('budget_bytes', budget_bytes)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError('%s must be a positive integer, got %r.' %
                       (name, value))
  if isinstance(margin, bool) or not isinstance(margin, (int, float)) or (
      margin < 0):
    raise ValueError('margin must be a number >= 0, got %r.' % (margin,))
  all_steps = ([1] if accumulation_note is not None
               else divisors(batch_per_core))
  notes = []
  if accumulation_note is not None:
    notes.append('No gradient accumulation: %s.' % accumulation_note)
  plans = dict(plans)
  for precision in precision_lib.PRECISIONS:
    plain, recomputed = plans.get((precision, False)), plans.get(
        (precision, True))
    if plain is not None and recomputed is not None and (
        recomputed.lines == plain.lines and
        recomputed.upcast_lines == plain.upcast_lines):
      # Nothing was cut (too few ops on the path): the same step at a
      # higher cost is no option.
      del plans[(precision, True)]
      notes.append('No recompute in %s: the network has too few ops to cut '
                   'into segments, so it plans the same.' % precision)
  options = []
  for (precision, recompute), plan in sorted(
      plans.items(), key=lambda item: (
          precision_lib.PRECISIONS.index(item[0][0]), item[0][1])):
    for steps in all_steps:
      micro = batch_per_core // steps
      planned = plan.step_bytes(micro, upcast=upcast)
      if steps > 1:
        planned += plan.parameter_bytes
      options.append(Option(
          precision=precision, gradient_accumulation_steps=steps,
          recompute=recompute, micro_batch=micro, planned_bytes=planned,
          cost=_cost(precision, steps, recompute),
          fits=planned * (1.0 + margin) <= budget_bytes))
  fitting = [o for o in options if o.fits]
  chosen = min(fitting, key=lambda o: (
      o.cost, o.gradient_accumulation_steps > 1, o.recompute,
      o.gradient_accumulation_steps, o.planned_bytes)) if fitting else None
  return FitResult(batch_per_core=batch_per_core, budget_bytes=budget_bytes,
                   options=tuple(options), chosen=chosen, plans=dict(plans),
                   margin=float(margin), upcast=upcast, notes=tuple(notes),
                   accumulation=accumulation_note is None)


def lever_plans(model_fn, *, features, labels, params=None,
                precisions=precision_lib.PRECISIONS, tile=None):
  """The plans `fit` needs: each precision with and without recompute.

  Args:
    model_fn, features, labels, params: as for `eb.memory_plan`.
    precisions: the precisions to plan.
    tile: None, or a TPU's tile (`platform.tpu.TPU_TILE`) for a TPU core's
      budget (`eb.memory_plan`).

  Returns:
    {(precision, recompute): `MemoryPlan`}.
  """
  return {(precision, recompute): planner.memory_plan(
      model_fn, features=features, labels=labels, precision=precision,
      params=params, recompute=recompute, tile=tile)
          for precision in precisions for recompute in (False, True)}


def choose_levers(model_fn, *, features, labels, batch_per_core,
                  budget_bytes, params=None, margin=PLAN_MARGIN):
  """The cheapest levers under which `model_fn` trains `batch_per_core`.

  For programs that decide in code: plans the model_fn's own step
  (`lever_plans`) and returns `fit`'s `FitResult`; `.chosen` is None when
  nothing fits (then see `model_parallel_lines`).

  Args:
    model_fn: a legacy model_fn (its own optimizer).
    features, labels: specs of one example, as for `eb.memory_plan`.
    batch_per_core: int, examples per update per core.
    budget_bytes: int, memory of one core (`device_bytes`, `parse_size`).
    params: extra params for model_fn.
    margin: see `fit`.
  """
  plans = lever_plans(model_fn, features=features, labels=labels,
                      params=params)
  return fit(plans, batch_per_core, budget_bytes, margin=margin)


def largest_batches(result):
  """The largest batch per core in the budget under each lever combination.

  Args:
    result: a `FitResult`.

  Returns:
    list of (description, batch) in table order: each precision with and
    without recompute at K = 1 and, where accumulation is planned, the
    largest micro-batch next to the accumulators ('K x N': any K). 0 when
    not even one example fits. The budget is less the margin, as in `fit`.
  """
  room = int(result.room_bytes)
  rows = []
  for (precision, recompute), plan in sorted(
      result.plans.items(), key=lambda item: (
          precision_lib.PRECISIONS.index(item[0][0]), item[0][1])):
    name = precision + (' + recompute' if recompute else '')
    rows.append((name, plan.max_batch(room, upcast=result.upcast)))
    if not result.accumulation:
      continue
    micro = plan.max_batch(room - plan.parameter_bytes, upcast=result.upcast)
    rows.append((name + ' + accumulation', 'K x %d' % micro if micro else 0))
  return rows


def over_budget_lines(result):
  """Why nothing fits, and what would: a smaller batch or more cores.

  Args:
    result: a `FitResult` whose `chosen` is None.

  Returns:
    list of str.
  """
  room = result.room_bytes
  smallest = min(result.plans.values(),
                 key=lambda p: p.step_bytes(1, upcast=result.upcast))
  if smallest.step_bytes(1, upcast=result.upcast) <= room:
    best = max(((p.max_batch(int(room), upcast=result.upcast), key)
                for key, p in result.plans.items()))
    return ['It is the batch of %d per core that does not fit: at most %d '
            'per core fits, with %s%s. On a TPU, TPUEstimator gives each '
            'core train_batch_size / cores, so more cores (a larger slice) '
            'take the same global batch.' % (
                result.batch_per_core, best[0], best[1][0],
                ' + recompute' if best[1][1] else '')]
  return model_parallel_lines(smallest, result.budget_bytes,
                              image_input=result.image_input,
                              margin=result.margin, upcast=result.upcast)


def model_parallel_lines(plan, budget_bytes, cores=(2, 4, 8),
                         image_input=True, margin=0.0, upcast=False):
  """Advice when even one example per core does not fit.

  The model of the split: with `num_cores_per_replica=N` each core holds
  1/N of the weights, optimizer state and activations (layers or tensors
  split evenly) and the batch-independent transient part; that is the best
  case, which real partitionings approach for large layers.

  Args:
    plan: the smallest `MemoryPlan` (usually bfloat16 with recompute).
    budget_bytes: memory of one core.
    cores: cores per replica to plan.
    image_input: also name spatial partitioning (image models only).
    margin, upcast: as for `fit`: the plan is compared with the budget
      less the margin, and counts a CPU's float32 copies with `upcast`.

  Returns:
    list of str.
  """
  one = plan.step_bytes(1, upcast=upcast)
  room = budget_bytes / (1.0 + margin)
  lines = ['Even one example per core needs %.1f MiB with the smallest '
           'plan, over the %.1f MiB budget%s.' % (
               one / MiB, budget_bytes / MiB,
               ' less its %d%% margin (%.1f MiB)' % (round(100 * margin),
                                                     room / MiB)
               if margin else '')]
  if plan.persistent_bytes > room:
    lines.append('The weights and optimizer state alone take %.0f MiB '
                 '(slots %.0f MiB): Adafactor keeps rows + columns per '
                 'matrix instead of two full copies.' %
                 (plan.persistent_bytes / MiB, plan.slot_bytes / MiB))
  for count in cores:
    lines.append('num_cores_per_replica=%d (with computation_shape): about '
                 '%.1f MiB per core at one example.' % (count,
                                                        one / count / MiB))
  if image_input:
    lines.append('Images can also be split over cores: input_partition_dims '
                 '(spatial partitioning).')
  return lines


def table_lines(result):
  """The options as a text table, the chosen one marked with '*'.

  Within one precision and recompute setting, from K = 2 on a larger K
  only lowers the peak at the same cost (K = 2 adds the accumulators, so
  it may plan above K = 1). The rows stop at the first K that fits when
  every larger K fits too; one line counts those (`FitResult.options`
  keeps them all).
  """
  header = '%-2s %-9s %5s %6s %9s %11s %6s %4s' % (
      '', 'precision', 'K', 'micro', 'recompute', 'planned MiB', 'cost',
      'fits')
  lines = [header, '-' * len(header)]
  groups = {}
  for option in result.options:
    groups.setdefault((option.precision, option.recompute), []).append(option)
  for group in groups.values():
    for index, option in enumerate(group):
      lines.append('%-2s %-9s %5d %6d %9s %11.1f %6.2f %4s' % (
          '*' if option == result.chosen else '', option.precision,
          option.gradient_accumulation_steps, option.micro_batch,
          'on' if option.recompute else 'off', option.planned_bytes / MiB,
          option.cost, 'yes' if option.fits else 'no'))
      rest = group[index + 1:]
      if option.fits and rest and all(o.fits for o in rest):
        lines.append('%-2s %s' % ('', '... and K = %d to %d (%.1f to %.1f '
                                  'MiB) also fit' % (
                                      rest[0].gradient_accumulation_steps,
                                      rest[-1].gradient_accumulation_steps,
                                      rest[0].planned_bytes / MiB,
                                      rest[-1].planned_bytes / MiB)))
        break
  return lines


def report_dict(result):
  """JSON-ready summary of a `FitResult` (`--report`)."""
  chosen = result.chosen
  return {
      'budget_bytes': result.budget_bytes,
      'batch_per_core': result.batch_per_core,
      'margin': result.margin, 'upcast': result.upcast,
      'notes': list(result.notes),
      'planned_peak_bytes': chosen.planned_bytes if chosen else None,
      'levers': chosen.levers if chosen else None,
      'options': [dict(dataclasses.asdict(o)) for o in result.options],
  }

