"""The memory plans `check` and `--fit` make of a program's TRAIN graph.

`check` plans the program's own training step in each precision with the
optimizer states of Adam and Adafactor (`memory_plans`); `--fit` plans it
under every combination of the levers and chooses the cheapest that fits a
budget (`fit_plans`). The runner calls either on the TRAIN graph it caught
(`run_program(plan_fn=...)`); `report.py` prints what they return.
"""

import dataclasses

import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.memory import fit as fit_lib
from estimator_bf16.memory import slots as slots_lib
from estimator_bf16.platform import cpu_bfloat16
from estimator_bf16.platform import tpu as tpu_facts

PLAN_OPTIMIZERS = ('adam', 'adafactor')


def memory_plans(train_graph, precisions=eb.PRECISIONS,
                 optimizers=PLAN_OPTIMIZERS, gradient_accumulation_steps=1,
                 recompute=False):
  """Memory plans of the program's model_fn for each precision and optimizer.

  `eb.memory_plan` builds the model_fn's own training step (its own
  optimizer included) at two small batches. The optimizer's state is then
  set to what Adam or Adafactor keeps for the program's trainable
  variables; the transient part (activations, gradients, the bfloat16
  copies of the weights) stays the model_fn's own.

  Args:
    train_graph: a `runner.TrainGraph`.
    precisions: precisions to plan.
    optimizers: names from `PLAN_OPTIMIZERS`.
    gradient_accumulation_steps, recompute: the levers the run uses; with
      K > 1 the plans' batches are effective batches and the accumulators
      (one float32 copy of the trainable variables) count as slots.

  Returns:
    {(precision, optimizer): `eb.MemoryPlan`}.
  """
  plans = {}
  for precision in precisions:
    plan = eb.memory_plan(
        train_graph.model_fn, features=train_graph.features,
        labels=train_graph.labels, precision=precision,
        params=train_graph.params,
        gradient_accumulation_steps=gradient_accumulation_steps,
        recompute=recompute)
    for optimizer in optimizers:
      plans[(precision, optimizer)] = slots_lib.optimizer_plan(
          plan, optimizer, train_graph.variable_shapes)
  return plans


def fit_plans(train_graph, budget_bytes, precisions=eb.PRECISIONS,
              here=False, tpu=False):
  """`--fit`: every lever combination for the program's batch.

  Accumulation is left out where the runner cannot split the estimator's
  batch (`TrainGraph.accumulation_note`); on a TPU each step of the device
  loop splits its batch itself (`levers.device_accumulation`), so a TPU
  core's budget plans it too.

  Args:
    train_graph: a `runner.TrainGraph`; its static batch is the per-core
      batch of one update.
    budget_bytes: memory of one core.
    precisions: the precisions to consider (`--precision=float32` keeps
      float32 only).
    here: plan for training on this machine (`run --fit`): on a CPU that
      emulates bfloat16, with the float32 copies its matmuls make and the
      planner's wider margin there. False plans a TPU core (`check`).
    tpu: the budget is a TPU core's (`--device=tpu-*`): the step is
      planned as XLA compiles it for a TPU (`compiled`), with tensors
      padded to the TPU's tiles (`platform.tpu.TPU_TILE`).

  Returns:
    An `estimator_bf16.memory.fit.FitResult`.

  Raises:
    ValueError: the TRAIN graph's batch is not static.
  """
  if not train_graph.batch_size:
    raise ValueError('the TRAIN graph has no static batch size to fit; '
                     'batch with drop_remainder=True.')
  plans = fit_lib.lever_plans(train_graph.model_fn,
                              features=train_graph.features,
                              labels=train_graph.labels,
                              params=train_graph.params,
                              precisions=precisions,
                              tile=tpu_facts.TPU_TILE if tpu else None,
                              compiled=tpu)
  upcast = (here and not train_graph.use_tpu and
            cpu_bfloat16.emulated_kernels())
  images = any(spec.dtype.is_floating and (spec.shape.rank or 0) >= 3
               for spec in tf.nest.flatten(train_graph.features))
  result = fit_lib.fit(
      plans, train_graph.batch_size, budget_bytes,
      margin=(fit_lib.EMULATED_PLAN_MARGIN if upcast
              else fit_lib.PLAN_MARGIN),
      upcast=upcast,
      accumulation_note=train_graph.accumulation_note)
  return dataclasses.replace(result, image_input=images)
