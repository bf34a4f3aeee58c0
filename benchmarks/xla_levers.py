"""The memory levers and the planner against XLA's own figures.

Each row compiles one model's TRAIN step with XLA on this CPU, inside a
device loop as TPUEstimator lays it out on a TPU (`memory.xla_step`), and
reads XLA's bytes for one step from its buffer assignment. Two tables:

  * `recompute_rows`: the same step with and without recompute, both
    compiled and kept open in one process: XLA's bytes, and the step time
    ratio over loops run turn about (the median of the rounds' ratios);
  * `planner_rows`: for each lever combination and precision, the
    planner's bytes for the step beside XLA's: planned as XLA compiles it
    (`compiled=True`, what `check --fit --device=tpu-*` plans) and as
    TensorFlow's executor runs it.

XLA's CPU compiler is the stand-in for a TPU compile: it fuses and assigns
buffers as XLA does, but keeps its own scheduler and pads nothing to TPU
tiles. Its buffer assignment also moves by a few percent between processes
for the same graph (seen on small models); within one process it repeats.
"""

import statistics

from benchmarks import graphs
from benchmarks import planning
from estimator_bf16.memory import xla_step
from estimator_bf16.precision import policy
from estimator_bf16.platform.tpu import MiB

# Steps per compiled loop, and the timed rounds of `recompute_rows`.
_LOOP_STEPS = 2
_LOOPS = 3

# The lever combinations of `planner_rows`: (name, K, recompute).
LEVER_COMBINATIONS = (('plain', 1, False), ('accumulate', 4, False),
                      ('recompute', 1, True), ('both', 4, True))


def xla_step_of(spec, precision, batch_size, steps=1, recompute=False,
                loop_steps=_LOOP_STEPS):
  """XLA's build of `spec`'s step at `batch_size` per core (`XlaStep`).

  Compiled only: the rows read its bytes, and XLA's CPU steps of a large
  model take minutes.
  """
  return xla_step.train_loop_on_xla(
      graphs.model_fn(spec), graphs.synthetic_input_fn(spec),
      batch_size=batch_size, iterations_per_loop=loop_steps, steps=0,
      precision=precision, gradient_accumulation_steps=steps,
      recompute=recompute)


def recompute_rows(spec, batch_size, precision='bfloat16', loop_steps=1,
                   rounds=_LOOPS):
  """Recompute's saving as XLA compiles the step, its cost side by side.

  Both steps are compiled and kept open in one process, then run turn
  about, one loop each per round, so that both see the same load; the time
  ratio is the median of the rounds' ratios.

  Args:
    spec: the model's `ModelSpec`.
    batch_size: int, per core.
    precision: of the step.
    loop_steps: steps per compiled loop: one for full-size models, whose
      step takes a minute or more on this CPU.
    rounds: int, timed loops of each step.

  Returns:
    dict: 'model', 'batch', 'precision', 'plain_mib', 'recompute_mib',
    'bytes_ratio' (recompute / plain), 'time_ratio' (seconds per step,
    recompute / plain), 'rounds'.
  """
  def compiled(recompute):
    return xla_step.CompiledLoop(
        graphs.model_fn(spec), graphs.synthetic_input_fn(spec),
        batch_size=batch_size, iterations_per_loop=loop_steps,
        precision=precision, recompute=recompute)

  with compiled(False) as plain, compiled(True) as recomputed:
    pairs = [(plain.run(), recomputed.run()) for _ in range(rounds)]
    plain_step = plain.step([plain.first_seconds] + [p for p, _ in pairs])
    recompute_step = recomputed.step(
        [recomputed.first_seconds] + [r for _, r in pairs])
  return {
      'model': spec.name, 'batch': batch_size, 'precision': precision,
      'plain_mib': plain_step.step_bytes / MiB,
      'recompute_mib': recompute_step.step_bytes / MiB,
      'bytes_ratio': recompute_step.step_bytes / plain_step.step_bytes,
      'time_ratio': statistics.median(r / p for p, r in pairs),
      'rounds': rounds,
  }


def planner_rows(spec, batch_size, precisions=policy.PRECISIONS,
                 combinations=LEVER_COMBINATIONS):
  """The planner's step bytes beside XLA's, per lever combination.

  Returns:
    list of dicts: 'model', 'batch', 'precision', 'levers', 'steps',
    'xla_mib', 'planned_mib' (compiled), 'error' (planned / XLA - 1),
    'executor_mib' and 'executor_error' (the executor's plan),
    'xla_products' ({HLO type: count} of XLA's matmuls and convolutions).
  """
  rows = []
  for precision in precisions:
    for name, steps, recompute in combinations:
      step = xla_step_of(spec, precision, batch_size, steps, recompute)
      planned = {compiled: planning.plan_model(
          spec, precision, gradient_accumulation_steps=steps,
          recompute=recompute, compiled=compiled).step_bytes(batch_size)
                 for compiled in (True, False)}
      rows.append({
          'model': spec.name, 'batch': batch_size, 'precision': precision,
          'levers': name, 'steps': steps, 'xla_mib': step.step_bytes / MiB,
          'planned_mib': planned[True] / MiB,
          'error': planned[True] / step.step_bytes - 1,
          'executor_mib': planned[False] / MiB,
          'executor_error': planned[False] / step.step_bytes - 1,
          'xla_products': step.product_dtypes})
  return rows
