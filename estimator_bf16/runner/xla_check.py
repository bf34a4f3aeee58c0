"""`check --xla`: the program's TRAIN step compiled by XLA, beside its plan.

After `check` has stopped the program at its first TRAIN graph, the same
model_fn and input_fn are built again the way TPUEstimator builds them on a
TPU (`params['use_tpu'] = True`, inside a device loop) and compiled by XLA
on this CPU (`memory.xla_step`). The memory planner plans the same step, so
the report can put the planner's figure beside XLA's own
(`report_lines`).
"""

import dataclasses
from typing import Optional

import estimator_bf16 as eb
from estimator_bf16.memory import xla_step
from estimator_bf16.platform.tpu import MiB
from estimator_bf16.precision import policy

# Steps per compiled loop (input batches stacked into its arguments). One
# step's buffers do not depend on how many steps the loop runs.
XLA_LOOP_STEPS = 2
# Steps run by default: none. The loop's trip count is fed at run time (as
# TPUEstimator's loop reads it from a variable), so a run of 0 steps
# compiles it and gets its buffer assignment; XLA's CPU steps of a large
# bfloat16 model take minutes each (ResNet-18 at 224 px, batch 64: four
# steps ran over 13 minutes after a 30-s compile). `--xla_steps` runs some.
XLA_STEPS = 0


@dataclasses.dataclass
class XlaCheck:
  """The XLA build of a program's step and its plan.

  Attributes:
    step: the `xla_step.XlaStep`.
    batch_size: int, the batch per core of one update.
    planned_bytes: int, the planner's bytes for the same step, or None.
    plan_error: why there is no plan, or None.
    iterations_per_loop: the program's own steps per device loop, or None.
    precision, gradient_accumulation_steps, recompute: the levers compiled
      (the command's, or with `--fit` the chosen row's); precision is a
      `Precision`.
  """
  step: xla_step.XlaStep
  batch_size: int
  planned_bytes: Optional[int]
  plan_error: Optional[str]
  iterations_per_loop: Optional[int]
  precision: policy.Precision = policy.Precision('bfloat16')
  gradient_accumulation_steps: int = 1
  recompute: bool = False


def update_batch(train_graph, result):
  """The batch per core of one update, as the program's estimator had it.

  With host accumulation the runner gave the model_fn a micro-batch; the
  TPU loop takes the update's batch and splits it itself.
  """
  batch = train_graph.batch_size
  if not batch:
    raise ValueError('the TRAIN graph has no static batch size; a TPU needs '
                     'one: batch with drop_remainder=True.')
  if result.micro_batches:
    batch *= result.gradient_accumulation_steps
  return batch


def levers_of(result):
  """(precision, K, recompute) to compile: `--fit`'s choice, else the run's.

  The precision is a `Precision`, the run's or the fit option's.
  """
  chosen = result.fit_plans.chosen if result.fit_plans is not None else None
  if chosen is not None:
    return (chosen.precision, chosen.gradient_accumulation_steps,
            chosen.recompute)
  return (result.precision, result.gradient_accumulation_steps,
          result.recompute)


def xla_check(train_graph, result, steps=XLA_STEPS):
  """Builds and compiles the program's step with XLA (runs `steps`); plans it.

  Args:
    train_graph: a `runner.TrainGraph` (from check mode).
    result: the `runner.RunResult` of the same run (its precision and
      levers are the build's).
    steps: int >= 0, training steps the compiled loop runs after compiling.

  Returns:
    An `XlaCheck`.

  Raises:
    ValueError: the program's `train` got no input_fn, or its batch is not
      static.
    xla_step.XlaCompileError: XLA cannot compile the step (one line).
  """
  if train_graph.input_fn is None:
    raise ValueError('the program built its TRAIN graph outside `train`, so '
                     'there is no input_fn to feed the XLA build.')
  batch = update_batch(train_graph, result)
  precision, accumulation, recompute = levers_of(result)
  step = xla_step.train_loop_on_xla(
      train_graph.model_fn, train_graph.input_fn, batch_size=batch,
      params=train_graph.params, config=train_graph.config,
      iterations_per_loop=XLA_LOOP_STEPS, steps=steps, precision=precision,
      gradient_accumulation_steps=accumulation, recompute=recompute)
  planned = plan_error = None
  if train_graph.features is not None:
    try:
      plan = eb.memory_plan(
          train_graph.model_fn, features=train_graph.features,
          labels=train_graph.labels, precision=precision,
          params=train_graph.params,
          gradient_accumulation_steps=accumulation, recompute=recompute,
          compiled=True)
      planned = plan.step_bytes(batch)
    except Exception as e:  # pylint: disable=broad-except
      plan_error = '%s: %s' % (type(e).__name__, str(e).splitlines()[0])
  return XlaCheck(step=step, batch_size=batch, planned_bytes=planned,
                  plan_error=plan_error,
                  iterations_per_loop=train_graph.iterations_per_loop,
                  precision=precision,
                  gradient_accumulation_steps=accumulation, recompute=recompute)


def report_lines(result):
  """What `check --xla` adds: XLA's bytes for one step, beside the plan."""
  if result.xla_error is not None:
    return ['XLA step: PROBLEM, %s' % result.xla_error]
  check = result.xla
  if check is None:
    return []
  step = check.step
  own = ('' if check.iterations_per_loop is None else
         '; the program runs %d per loop' % check.iterations_per_loop)
  levers = [check.precision]
  if check.gradient_accumulation_steps > 1:
    levers.append('accumulate %d' % check.gradient_accumulation_steps)
  if check.recompute:
    levers.append('recompute')
  lines = [
      'XLA step (the TRAIN step compiled by XLA on this CPU, inside a device '
      'loop as on a TPU: %d steps per loop%s; batch %d per core; %s):' % (
          step.iterations_per_loop, own, check.batch_size,
          ' + '.join(levers)),
      '  %.1f MiB per step: the buffer assignment\'s %.1f MiB total, less '
      '%.1f MiB of variables passed in (their new values stay counted: a TPU '
      'holds them once) and %.1f MiB of the loop\'s other input batches' % (
          step.step_bytes / MiB, step.total_bytes / MiB,
          step.variable_bytes / MiB,
          (step.total_bytes - step.variable_bytes - step.step_bytes)
          / MiB)]
  if check.planned_bytes:
    lines.append('  planned as XLA compiles it: %.1f MiB (%+.1f%% of XLA\'s '
                 'figure)' % (
        check.planned_bytes / MiB,
        100.0 * (check.planned_bytes / step.step_bytes - 1)))
  elif check.plan_error:
    lines.append('  planned: not available (%s)' % check.plan_error)
  products = step.product_dtypes or {}
  if check.precision.bfloat16 and sum(products.values()):
    in_bf16 = products.get('bf16', 0)
    lines.append(
        '  XLA computed %d of its %d matmuls and convolutions in bfloat16 '
        'here%s' % (in_bf16, sum(products.values()),
                    '' if in_bf16 == sum(products.values()) else
                    ", the rest in float32 (XLA's CPU backend converts "
                    'their bfloat16 operands to float32; a TPU multiplies in '
                    'bfloat16), so a TPU holds less than this figure'))
  if step.steps:
    ran = '%d steps ran: loss %.4g, global_step %d.' % (
        step.steps, step.loss, step.global_step)
  else:
    ran = ('compiled only, no step ran (--xla_steps=N runs N steps here, '
           'minutes each for a large bfloat16 model).')
  lines.append('  %s XLA on a CPU does not pad to TPU tiles or schedule as a '
               'TPU does.' % ran)
  return lines
