"""`run --fit`: plan the program's step, choose the levers, train with them.

    planning, result = fit_run.run_with_fit(
        'run_classifier.py', ['--do_train=true', ...],
        budget_bytes=fit_lib.parse_size('6GiB'))
    result.fit.chosen        # the levers it trained with
    result.peak_tensor_bytes # measured, to compare with the plan and budget

The program runs twice in this process. First as `check` runs it: up to
its first `train` call, with scratch model_dirs, so nothing is trained or
written; that gives the TRAIN graph, whose step is planned under every
lever combination (`planning.fit_plans`, for this machine). Then, if an
option fits, whole, with the cheapest one's precision, accumulation and
recompute, and with the step's memory measured (`memory/peak.py`). Whatever
the program prints before its first `train` call is therefore printed
twice.
"""

import dataclasses
import functools

from estimator_bf16.estimator import options as options_lib
from estimator_bf16.precision import policy
from estimator_bf16.runner import program as runner
from estimator_bf16.runner import planning as planning_lib


def run_with_fit(program, args=(), *, budget_bytes,
                 precisions=policy.PRECISIONS, options=None, tf1=None,
                 tf1_paths=(), on_choice=None, seed=None):
  """Runs `program` with the cheapest levers that fit `budget_bytes`.

  Args:
    program, args, tf1, tf1_paths, seed: as for `runner.run_program`.
    options: the `eb.WrapOptions` of both runs (audit, exclude, kernels),
      or None for its defaults; its levers are the fit's to choose, so they
      must be the defaults.
    budget_bytes: int, memory of one core (or of this CPU's process).
    precisions: the precisions the fit may choose from (names or
      `Precision`s), parsed once here; the last is the planning run's.
    on_choice: called with the planning `RunResult` (its `.fit_plans` is
      the `FitResult`) once an option is chosen, before training starts.

  Returns:
    (planning, result): the check-mode `RunResult` that planned, and the
    training run's `RunResult` (its `.fit` set), or None when nothing was
    trained: the program failed or never trained before the plan, its
    TRAIN graph has audit problems and the audit is 'strict', the plan
    failed, or nothing fits (`planning.fit_plans.chosen` is None).

  Raises:
    runner.ProgramError: the program is missing, or an option is bad.
  """
  try:
    precisions = tuple(policy.parse_precision(precision)
                       for precision in precisions)
  except ValueError as e:
    raise runner.ProgramError('--precision: %s' % e)
  try:
    options = options_lib.checked(options, options_lib.WrapOptions)
  except TypeError as e:
    raise runner.ProgramError(str(e))
  if options.gradient_accumulation_steps != 1 or options.recompute:
    raise runner.ProgramError(
        'the fit chooses gradient accumulation and recomputation itself; '
        'give options without them.')
  plan_fn = functools.partial(planning_lib.fit_plans, budget_bytes=budget_bytes,
                              precisions=precisions, here=True)
  planning = runner.run_program(
      program, args, precision=precisions[-1], options=options, check=True,
      plan_fn=plan_fn, tf1=tf1, tf1_paths=tf1_paths, seed=seed)
  fitted = planning.fit_plans
  if (planning.train_graph is None or planning.error is not None or
      (options.audit == 'strict' and planning.problems) or
      fitted is None or fitted.chosen is None):
    return planning, None
  if on_choice is not None:
    on_choice(planning)
  chosen = fitted.chosen
  result = runner.run_program(
      program, args, precision=chosen.precision,
      options=dataclasses.replace(
          options,
          gradient_accumulation_steps=chosen.gradient_accumulation_steps,
          recompute=chosen.recompute),
      memory=True, tf1=tf1, tf1_paths=tf1_paths, seed=seed)
  result.fit = fitted
  return planning, result
