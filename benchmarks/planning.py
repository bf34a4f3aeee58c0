"""The memory planner on the benchmarked models, checked against measurement.

`plan_model` asks `estimator_bf16.memory.planner.memory_plan` about the same
unmodified model_fn the benchmark trains; `plan_row` turns a plan into the
numbers results.json keeps; `relative_error` is estimate / measured - 1.
"""

from estimator_bf16.memory import planner
from benchmarks import graphs


def plan_model(spec, precision, optimizer=None, gradient_accumulation_steps=1,
               recompute=False, compiled=False, network_builder=None):
  """Returns the `MemoryPlan` of `spec`'s training step.

  Args:
    spec: a `configs.ModelSpec`.
    precision: 'float32' or 'bfloat16'.
    optimizer: overrides `spec.optimizer` (e.g. 'adafactor').
    gradient_accumulation_steps, recompute: the memory levers.
    compiled: plan the step as XLA compiles it (`eb.memory_plan`).
    network_builder: overrides the spec's network (`graphs.model_fn`).
  """
  features, labels = graphs.feature_specs(spec)
  return planner.memory_plan(
      graphs.model_fn(spec, optimizer, network_builder), features=features,
      labels=labels,
      precision=precision,
      gradient_accumulation_steps=gradient_accumulation_steps,
      recompute=recompute, compiled=compiled)


def plan_row(plan, budget_bytes=None, cpu_upcast=False):
  """The JSON-ready numbers of a plan.

  Args:
    plan: a `MemoryPlan`.
    budget_bytes: also answer "largest batch within this budget" (a CPU
      budget: `cpu_upcast` applies).
    cpu_upcast: this CPU computes bfloat16 matmuls in float32 temporaries.

  Returns:
    dict of byte counts, bytes per example, and 'tpu_max_batch_per_core'
    ({'v2': n, 'v3': n}); 'max_batch_in_budget' when a budget is given.
  """
  row = {
      'parameter_bytes': plan.parameter_bytes,
      'slot_bytes': plan.slot_bytes,
      'state_bytes': plan.state_bytes,
      'fixed_bytes': plan.fixed_bytes,
      'bytes_per_example': plan.bytes_per_example,
      'tpu_max_batch_per_core': plan.max_batch_per_core(),
  }
  if budget_bytes:
    row['max_batch_in_budget'] = plan.max_batch(budget_bytes,
                                                 upcast=cpu_upcast)
  return row


def validate(plan, cpu_upcast, *measured):
  """Planner estimates against measured peaks.

  Args:
    plan: a `MemoryPlan`.
    cpu_upcast: estimate for a CPU that upcasts bfloat16 matmuls.
    *measured: (name, batch, peak bytes) triples, e.g. ('at_batch', 32,
      peak); a zero batch is skipped.

  Returns:
    dict with 'step_bytes_<name>', 'relative_error_<name>' (the CPU
    estimate) and 'device_only_relative_error_<name>' (the estimate without
    CPU upcasting, as for a TPU).
  """
  row = {}
  for name, batch, peak in measured:
    if not batch or not peak:
      continue
    row['step_bytes_' + name] = plan.step_bytes(batch, upcast=cpu_upcast)
    row['relative_error_' + name] = relative_error(row['step_bytes_' + name],
                                                   peak)
    row['device_only_relative_error_' + name] = relative_error(
        plan.step_bytes(batch), peak)
  return row


def relative_error(estimate, measured):
  """estimate / measured - 1 (None if nothing was measured)."""
  return estimate / float(measured) - 1.0 if measured else None
