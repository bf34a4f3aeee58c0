"""Runs an unmodified Estimator / TPUEstimator program in bfloat16.

    result = run_program('mnist_tpu.py', ['--use_tpu=false', ...],
                         precision='bfloat16')

The program runs as `__main__`, as `python PROGRAM.py ARGS` runs it:
`sys.argv`, `sys.path[0]` (the program's folder, so its sibling imports
resolve), absl flags and `app.run` behave the same. While it runs:

* every Estimator / TPUEstimator it constructs gets its model_fn wrapped with
  `eb.wrap_model_fn(model_fn, precision, options)` and, in bfloat16,
  `params['precision']`;
* every input_fn given to such an estimator's `train` / `evaluate` /
  `predict` (also the calls `tf.estimator.train_and_evaluate` makes) is
  wrapped with `eb.wrap_input_fn`;
* `TPUClusterResolver('')` gets a local stand-in when no TPU is around
  (`estimator_bf16.runner.tpu_resolver`);
* on TensorFlow 2.16+ the compat backend is installed first, so
  `tf.estimator` imports resolve;
* a TF 1.x program (`import tensorflow as tf` with `tf.flags`,
  `tf.contrib`, ...; `estimator_bf16.runner.tf1.detect`, or forced with `tf1`)
  and the modules it imports from its folder and `tf1_paths` see
  `tensorflow` as TF 1.x (`estimator_bf16.runner.tf1.Tf1Scope`); libraries keep
  the real module;
* a SIGTERM during such a `train` call (a preemptible VM's notice) stops
  training after the current step (TPU loop), the Estimator writes a
  checkpoint of that step as it closes, and the program ends there with
  exit code 143, without evaluating or exporting
  (`estimator_bf16.safety.preemption`). A second SIGTERM exits at once.

Everything is put back when the program ends, also when it raises or exits.
With `precision='float32'` the graph is not changed: the model_fn is only
observed, to report its FLOP share, and params are left alone.

The work is split by concern: `run_state` (the run's options and what its
model_fns record), `estimator_patches` (the patched Estimator classes),
`execution` (the program as a script), `results` (`RunResult`,
`TrainGraph`, `ProgramError`, re-exported here).
"""

import contextlib
import os

from estimator_bf16.estimator import options as options_lib
from estimator_bf16.memory import fit as fit_lib
from estimator_bf16.platform import quiet
from estimator_bf16.precision import policy
from estimator_bf16.runner import estimator_patches
from estimator_bf16.runner import execution
from estimator_bf16.runner import results
from estimator_bf16.runner import run_state
from estimator_bf16.runner import tpu_resolver

ProgramError = results.ProgramError
RunResult = results.RunResult
TrainGraph = results.TrainGraph


def _check_options(program, precision, options, tf1, tf1_paths, seed):
  """Raises `ProgramError` on a bad option.

  Returns:
    (the `Precision`, the `WrapOptions`: its defaults for None).
  """
  try:
    precision = policy.parse_precision(precision)
  except ValueError as e:
    raise ProgramError('--precision: %s' % e)
  try:
    options = options_lib.checked(options, options_lib.WrapOptions)
  except TypeError as e:
    raise ProgramError(str(e))
  if tf1 not in (None, True, False):
    raise ProgramError('tf1 must be None (detect), True or False, got %r.' %
                       (tf1,))
  for folder in tf1_paths:
    if not os.path.isdir(folder):
      raise ProgramError('--tf1_path %s: no such folder.' % folder)
  if not os.path.exists(program):
    raise ProgramError('%s: no such file.' % program)
  if not os.path.isfile(program):
    raise ProgramError('%s is not a file: give the Python program to run.' %
                       program)
  if seed is not None and (isinstance(seed, bool) or
                           not isinstance(seed, int) or seed < 0):
    raise ProgramError('--seed must be an integer >= 0, got %r.' % (seed,))
  return precision, options


def _plan(result, plan_fn):
  """Runs `plan_fn` on the caught TRAIN graph into `result`, or its error.

  The one place the two kinds of plan are told apart: a `--fit` result
  goes to `result.fit_plans`, memory plans to `result.plans`.
  """
  if result.train_graph is None or result.train_graph.features is None:
    return
  try:
    planned = plan_fn(result.train_graph)
  except Exception as e:  # pylint: disable=broad-except
    result.plan_error = '%s: %s' % (type(e).__name__, e)
    return
  if isinstance(planned, fit_lib.FitResult):
    result.fit_plans = planned
  else:
    result.plans = planned


def _compile(result, xla_fn):
  """Runs `xla_fn` on the caught TRAIN graph into `result.xla`.

  A failure's one-line reason goes to `result.xla_error` instead.
  """
  if result.train_graph is None:
    return
  try:
    result.xla = xla_fn(result.train_graph, result)
  except Exception as e:  # pylint: disable=broad-except
    result.xla_error = _first_line('%s: %s' % (type(e).__name__, e))


def _enter_run(stack, run, folders):
  """Puts the run's patches in place on `stack`, quiet logs first.

  Everything entered here is undone when `stack` closes, whatever way the
  program ends.
  """
  result = run.result

  def count_resolver(stand_in):
    del stand_in
    result.local_resolvers += 1

  stack.callback(run.close)
  stack.enter_context(quiet.tensorflow_logs_once())
  stack.enter_context(quiet.deprecation_notices_hidden())
  stack.enter_context(execution.compat_backend())
  stack.enter_context(tpu_resolver.substitute_empty_name(count_resolver))
  stack.enter_context(estimator_patches.patched_for(run))
  stack.enter_context(execution.forget_program_state(folders, result))


def _first_line(text, limit=300):
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  line = lines[0] if lines else text
  return line if len(line) <= limit else line[:limit - 3] + '...'


def run_program(program, args=(), precision=policy.DEFAULT_PRECISION,
                options=None, memory=False, check=False, plan_fn=None,
                tf1=None, tf1_paths=(), xla_fn=None, seed=None, verbose=False):
  """Runs `program` as `__main__` with its Estimators in `precision`.

  Args:
    program: path of the Python program.
    args: its command-line arguments (what follows PROGRAM).
    precision: 'bfloat16', or 'float32' to run it unchanged (or a
      `Precision`). Parsed here, once: the run's estimators, patches,
      `RunResult` and report get the `Precision`.
    options: the `eb.WrapOptions` every model_fn of the program is wrapped
      with (None: its defaults). With gradient accumulation (K > 1) a
      TPUEstimator's `train_batch_size` is divided by K, as
      `eb.make_tpu_estimator` does.
    memory: measure the allocator peak of a training step (needs
      TF_CPU_ALLOCATOR_USE_BFC=true set before TensorFlow was imported).
    check: stop at the first TRAIN graph, before any training.
    plan_fn: in check mode, `plan_fn(train_graph) -> plans` run while the
      program's environment is still in place (its modules may need the
      compat backend); its result goes to `RunResult.plans`, or to
      `RunResult.fit_plans` when it is a `memory.fit.FitResult`.
    tf1: run the program with the TF 1.x API (True), without (False), or
      decide from its source (None, `estimator_bf16.runner.tf1.detect`).
    tf1_paths: more folders whose modules are the program's own TF 1.x
      code (its own folder always is).
    xla_fn: in check mode, `xla_fn(train_graph, result) -> record` run
      after `plan_fn`, in the same environment (`check --xla`); its result
      goes to `RunResult.xla`, a failure's one-line reason to `xla_error`.
    seed: None, or an int >= 0 every Estimator gets as its RunConfig's
      `tf_random_seed` (over the program's), so runs in either precision
      draw the same unseeded random data. Op seeds follow the order ops are
      made in, so initializers made after a cast may still differ.
    verbose: a refusal of the package's own (`results.Refusal`) also
      prints its traceback; without it, one line.

  Returns:
    A `RunResult`. The program's traceback (if it raised) is printed to
    stderr, as Python prints it, and kept in `error`.

  Raises:
    ProgramError: the program is missing, or an option is bad (`options`
      not a `WrapOptions`; its fields were checked when it was made);
      nothing ran.
  """
  precision, options = _check_options(program, precision, options, tf1,
                                      tf1_paths, seed)
  result = RunResult(
      program=program, precision=precision,
      gradient_accumulation_steps=options.gradient_accumulation_steps,
      recompute=options.recompute, kernels=options.kernels, memory=memory,
      seed=seed)
  run = run_state.ProgramRun(options, memory, check, result)

  folders = [os.path.dirname(os.path.realpath(program))] + list(tf1_paths)
  with contextlib.ExitStack() as stack:
    _enter_run(stack, run, folders)
    scope = execution.tf1_scope(program, folders, tf1, result)
    program_globals = {}
    if scope is not None:
      stack.enter_context(scope)
      program_globals['__builtins__'] = scope.builtins
      # A fresh default graph for the program's own graph code on this
      # thread, gone with the run; the Estimator still builds graphs of
      # its own.
      stack.enter_context(execution.tf1_default_graph())
    stack.enter_context(execution.program_argv(program, args))
    execution.run_as_main(program, program_globals, folders, result,
                          verbose)
    if check and plan_fn is not None:
      _plan(result, plan_fn)
    if check and xla_fn is not None:
      _compile(result, xla_fn)
  result.train_steps = [h.steps for h in run.step_hooks]
  result.peak_bytes = max([h.peak_bytes for h in run.hooks] or [0])
  result.train_peak_tensor_bytes = [h.tensor_peak_bytes for h in run.hooks]
  result.peak_tensor_bytes = max(result.train_peak_tensor_bytes or [0])
  return result
