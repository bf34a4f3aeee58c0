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
one within the budget is chosen (`choice_key`). Adafactor is advice only:
it changes the user's optimizer.

This module computes: plans, options, the choice and the numbers behind
the advice, as dataclasses. The text `check --fit` prints and the 'fit'
entry of `--report` are made from them in `runner/fit_report.py`.
"""

import dataclasses
import re
from typing import Optional, Tuple

from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.platform.tpu import MiB
from estimator_bf16.memory import planner
from estimator_bf16.precision import policy

GiB = tpu_facts.GiB

# Memory of one core or chip of each TPU a fit plans for (platform/tpu.py).
DEVICE_BYTES = tpu_facts.TPU_DEVICE_BYTES

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
# tests/memory/test_planner.py, and within 15% where the CPU emulates bfloat16.
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
    precision: a `Precision`.
    gradient_accumulation_steps: K.
    recompute: bool.
    micro_batch: examples per micro-step per core (batch / K).
    planned_bytes: the planner's peak per core.
    cost: estimated time per example relative to plain bfloat16 (`COSTS`).
    fits: planned_bytes plus the fit's margin is within the budget.
  """
  precision: policy.Precision
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


@dataclasses.dataclass(frozen=True)
class FitResult:
  """Every option, and the chosen one.

  Attributes:
    batch_per_core: the batch of one update per core.
    budget_bytes: the memory of one core.
    options: every `Option`, in table order (`plan_order`, then K).
    chosen: the cheapest fitting option (`choice_key`), or None if nothing
      fits.
    plans: the {(precision, recompute): MemoryPlan} planned from.
    margin: the share of the plan added before comparing with the budget.
    upcast: whether the plans count a CPU's float32 copies for bfloat16
      matmuls (`MemoryPlan.step_bytes`).
    accumulation_note: None, or why gradient accumulation was left out.
    same_recompute: the precisions whose recompute plan cut nothing, so
      recompute was left out in them.
    image_input: the model reads images (spatial partitioning applies).
  """
  batch_per_core: int
  budget_bytes: int
  options: Tuple[Option, ...]
  chosen: Optional[Option]
  plans: Optional[dict] = None
  margin: float = PLAN_MARGIN
  upcast: bool = False
  accumulation_note: Optional[str] = None
  same_recompute: Tuple[str, ...] = ()
  image_input: bool = False

  @property
  def accumulation(self):
    """Whether accumulation was planned."""
    return self.accumulation_note is None

  @property
  def room_bytes(self):
    """The budget less the margin: what a plan must stay within to fit."""
    return self.budget_bytes / (1.0 + self.margin)


def plan_order(key):
  """The sort key of a plan's key, (precision, recompute or optimizer).

  Precisions in `PRECISIONS` order (float32 first), then the second part
  (recompute off before on; optimizers by name). The fit's options, its
  largest batches and `check`'s plan table all list plans in this order.
  """
  precision, second = key
  return (policy.PRECISIONS.index(
      policy.parse_precision(precision)), second)


def sorted_plans(plans):
  """`plans.items()` ({(precision, x): plan}) in `plan_order`."""
  return sorted(plans.items(), key=lambda item: plan_order(item[0]))


def choice_key(option):
  """How the fitting options rank; the choice is the lowest.

  The lowest cost; among equal costs, the fewest levers (no accumulation
  before accumulation, no recompute before recompute), then the largest
  micro-batch (fewest micro-steps), then the lowest peak.
  """
  return (option.cost, option.gradient_accumulation_steps > 1,
          option.recompute, option.gradient_accumulation_steps,
          option.planned_bytes)


def divisors(batch):
  """K values that keep the micro-batch whole: the divisors of `batch`."""
  return [k for k in range(1, batch + 1) if batch % k == 0]


def cost(precision, steps, recompute):
  """Estimated time per example relative to plain bfloat16 (`COSTS`).

  `precision` is a `Precision` (`fit` parses its plans' keys).
  """
  value = 1.0 if precision.bfloat16 else COSTS['float32']
  if recompute:
    value *= COSTS['recompute']
  if steps > 1:
    value *= COSTS['accumulation']
  return value


def fit(plans, batch_per_core, budget_bytes, *, margin=PLAN_MARGIN,
        upcast=False, accumulation_note=None):
  """Plans every lever combination for `batch_per_core`; picks one.

  Args:
    plans: {(precision, recompute): `MemoryPlan`} built without
      accumulation (see `lever_plans`); accumulation is planned from them
      (`MemoryPlan.with_accumulation`): the micro-batch's step plus one
      float32 copy of the trainable variables (the accumulators) and, for a
      plan compiled for a TPU, what its device loop holds besides.
    batch_per_core: int, examples per update per core.
    budget_bytes: int, memory of one core.
    margin: float >= 0; an option fits when `planned x (1 + margin)` is
      within the budget (`PLAN_MARGIN`: the planner's measured error).
    upcast: plan a CPU that computes bfloat16 matmuls in float32 copies
      (`MemoryPlan.step_bytes`); False for TPUs and native CPUs.
    accumulation_note: if not None, gradient accumulation cannot be
      applied (this says why): only K = 1 is planned.

  Returns:
    A `FitResult`. The choice is the fitting option lowest in `choice_key`.

  Raises:
    ValueError: a batch or budget that is not a positive integer, a
      negative margin, or a plan key whose precision is not one.
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
  plans = {(policy.parse_precision(precision), recompute): plan
           for (precision, recompute), plan in plans.items()}
  same_recompute = []
  for precision in map(policy.parse_precision,
                       policy.PRECISIONS):
    plain, recomputed = plans.get((precision, False)), plans.get(
        (precision, True))
    if plain is not None and recomputed is not None and (
        recomputed.lines == plain.lines and
        recomputed.upcast_lines == plain.upcast_lines):
      # Nothing was cut (too few ops on the path): the same step at a
      # higher cost is no option.
      del plans[(precision, True)]
      same_recompute.append(precision)
  options = []
  for (precision, recompute), plan in sorted_plans(plans):
    for steps in all_steps:
      micro = batch_per_core // steps
      planned = plan.with_accumulation(steps).step_bytes(batch_per_core,
                                                         upcast=upcast)
      options.append(Option(
          precision=precision, gradient_accumulation_steps=steps,
          recompute=recompute, micro_batch=micro, planned_bytes=planned,
          cost=cost(precision, steps, recompute),
          fits=planned * (1.0 + margin) <= budget_bytes))
  fitting = [o for o in options if o.fits]
  chosen = min(fitting, key=choice_key) if fitting else None
  return FitResult(batch_per_core=batch_per_core, budget_bytes=budget_bytes,
                   options=tuple(options), chosen=chosen, plans=plans,
                   margin=float(margin), upcast=upcast,
                   accumulation_note=accumulation_note,
                   same_recompute=tuple(same_recompute))


def lever_plans(model_fn, *, features, labels, params=None,
                precisions=policy.PRECISIONS, tile=None,
                compiled=False):
  """The plans `fit` needs: each precision with and without recompute.

  Args:
    model_fn, features, labels, params: as for `eb.memory_plan`.
    precisions: the precisions to plan.
    tile: None, or a TPU's tile (`platform.tpu.TPU_TILE`) for a TPU core's
      budget (`eb.memory_plan`).
    compiled: plan the step as XLA compiles it for a TPU
      (`eb.memory_plan`).

  Returns:
    {(precision, recompute): `MemoryPlan`}.
  """
  return {(precision, recompute): planner.memory_plan(
      model_fn, features=features, labels=labels, precision=precision,
      params=params, recompute=recompute, tile=tile, compiled=compiled)
          for precision in precisions for recompute in (False, True)}


def choose_levers(model_fn, *, features, labels, batch_per_core,
                  budget_bytes, params=None, margin=PLAN_MARGIN):
  """The cheapest levers under which `model_fn` trains `batch_per_core`.

  For programs that decide in code: plans the model_fn's own step
  (`lever_plans`) and returns `fit`'s `FitResult`; `.chosen` is None when
  nothing fits (then `over_budget` says what would).

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


@dataclasses.dataclass(frozen=True)
class TableGroup:
  """The options of one precision and recompute setting, as tabled.

  Within one group, from K = 2 on a larger K only lowers the peak at the
  same cost (K = 2 adds the accumulators, so it may plan above K = 1): the
  rows stop at the first K that fits when every larger K fits too.

  Attributes:
    shown: the options with a row of their own, K ascending.
    also_fit: the larger K after the last shown row, every one fitting
      (one summary line), or () when the rows did not stop early.
  """
  shown: Tuple[Option, ...]
  also_fit: Tuple[Option, ...] = ()


def table_groups(result):
  """`result.options` grouped for the table: a list of `TableGroup`."""
  groups = {}
  for option in result.options:
    groups.setdefault((option.precision, option.recompute), []).append(option)
  tabled = []
  for group in groups.values():
    shown, also_fit = tuple(group), ()
    for index, option in enumerate(group):
      rest = group[index + 1:]
      if option.fits and rest and all(o.fits for o in rest):
        shown, also_fit = tuple(group[:index + 1]), tuple(rest)
        break
    tabled.append(TableGroup(shown=shown, also_fit=also_fit))
  return tabled


@dataclasses.dataclass(frozen=True)
class LargestBatch:
  """The largest batch per core in the budget under some levers.

  Attributes:
    precision, recompute: the levers.
    accumulation: whether `batch` is a micro-batch next to the accumulators
      (any K); else the batch at K = 1.
    batch: examples per core (per micro-step with accumulation); 0 when
      not even one fits.
  """
  precision: policy.Precision
  recompute: bool
  accumulation: bool
  batch: int


def largest_batches(result):
  """The largest batch per core in the budget under each lever combination.

  Args:
    result: a `FitResult`.

  Returns:
    list of `LargestBatch` in `plan_order`: each precision with and without
    recompute at K = 1 and, where accumulation is planned, the largest
    micro-batch next to the accumulators (at K = 2 for a plan compiled for
    a TPU, whose device loop also holds the other micro-batches' input:
    each further one lowers it a little). The budget is less the margin,
    as in `fit`.
  """
  room = int(result.room_bytes)
  rows = []
  for (precision, recompute), plan in sorted_plans(result.plans):
    rows.append(LargestBatch(precision, recompute, False,
                             plan.max_batch(room, upcast=result.upcast)))
    if not result.accumulation:
      continue
    rows.append(LargestBatch(
        precision, recompute, True,
        plan.with_accumulation(2).max_batch(room, upcast=result.upcast) // 2))
  return rows


def smallest_option(result):
  """The option of `result` with the lowest planned peak."""
  return min(result.options, key=lambda o: o.planned_bytes)


@dataclasses.dataclass(frozen=True)
class BatchOverBudget:
  """One example per core fits, the batch does not.

  Attributes:
    batch_per_core: the batch that does not fit.
    largest_batch: the most examples per core that fit, with the levers
      below (the most of any plan).
    precision, recompute: the levers of `largest_batch`.
  """
  batch_per_core: int
  largest_batch: int
  precision: policy.Precision
  recompute: bool


@dataclasses.dataclass(frozen=True)
class ModelParallel:
  """Even one example per core does not fit: a split over cores.

  The model of the split: with `num_cores_per_replica=N` each core holds
  1/N of the weights, optimizer state and activations (layers or tensors
  split evenly) and the batch-independent transient part; that is the best
  case, which real partitionings approach for large layers.

  Attributes:
    one_example_bytes: the smallest plan's step at one example.
    budget_bytes, margin: the budget and the share of a plan kept free.
    persistent_bytes, slot_bytes: the smallest plan's weights and state,
      and its optimizer slots.
    per_core_bytes: ((cores per replica, bytes per core at one example),
      ...).
    image_input: spatial partitioning applies too.
  """
  one_example_bytes: float
  budget_bytes: int
  margin: float
  persistent_bytes: int
  slot_bytes: int
  per_core_bytes: Tuple[Tuple[int, float], ...]
  image_input: bool

  @property
  def room_bytes(self):
    """The budget less the margin."""
    return self.budget_bytes / (1.0 + self.margin)

  @property
  def state_over_budget(self):
    """The weights and optimizer state alone do not fit."""
    return self.persistent_bytes > self.room_bytes


def model_parallel(plan, budget_bytes, cores=(2, 4, 8), image_input=True,
                   margin=0.0, upcast=False):
  """What a split over cores gives when one example per core does not fit.

  Args:
    plan: the smallest `MemoryPlan` (usually bfloat16 with recompute).
    budget_bytes: memory of one core.
    cores: cores per replica to plan.
    image_input: the model reads images (spatial partitioning applies).
    margin, upcast: as for `fit`: the plan is compared with the budget
      less the margin, and counts a CPU's float32 copies with `upcast`.

  Returns:
    A `ModelParallel`.
  """
  one = plan.step_bytes(1, upcast=upcast)
  return ModelParallel(
      one_example_bytes=one, budget_bytes=budget_bytes, margin=margin,
      persistent_bytes=plan.persistent_bytes, slot_bytes=plan.slot_bytes,
      per_core_bytes=tuple((count, one / count) for count in cores),
      image_input=image_input)


def over_budget(result):
  """Why nothing fits, and what would: a smaller batch or more cores.

  Args:
    result: a `FitResult` whose `chosen` is None.

  Returns:
    A `BatchOverBudget` when one example per core fits some plan, else a
    `ModelParallel` for the smallest plan.
  """
  room = result.room_bytes
  smallest = min(result.plans.values(),
                 key=lambda p: p.step_bytes(1, upcast=result.upcast))
  if smallest.step_bytes(1, upcast=result.upcast) <= room:
    batch, (precision, recompute) = max(
        (p.max_batch(int(room), upcast=result.upcast), key)
        for key, p in result.plans.items())
    return BatchOverBudget(batch_per_core=result.batch_per_core,
                           largest_batch=batch, precision=precision,
                           recompute=recompute)
  return model_parallel(smallest, result.budget_bytes,
                        image_input=result.image_input,
                        margin=result.margin, upcast=result.upcast)
