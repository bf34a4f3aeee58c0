"""`python -m estimator_bf16 run|check [OPTIONS] PROGRAM.py [PROGRAM ARGS...]`.

Also installed as the console script `estimator-bf16`. Options go before
PROGRAM; everything after it is the program's own command line, passed on
verbatim (even arguments that look like ours, such as a program's own
`--precision`).

Environment variables are set here before TensorFlow reads them, which is
later than its import: `TF_USE_LEGACY_KERAS=1` on TensorFlow 2.16+ (read
when `tf.keras` is first used; legacy programs use tf.keras 2 and
tf.compat.v1.layers), with `--memory` `TF_CPU_ALLOCATOR_USE_BFC=true`
(read when the CPU allocator is made; the peak is read from its
statistics), and with `--xla` the dump flags XLA reads at its first compile.
A variable already set is left as it is.
"""

import argparse
import functools
import json
import os
import sys
import textwrap

from estimator_bf16.autocast import cpu_kernels
from estimator_bf16.estimator import options as options_lib
from estimator_bf16.memory import fit as fit_lib
from estimator_bf16.memory import xla_dump
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import cpu_bfloat16
from estimator_bf16.platform import quiet
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.precision import policy
from estimator_bf16.runner import fit_report
from estimator_bf16.runner import fit_run
from estimator_bf16.runner import planning as planning_lib
from estimator_bf16.runner import program as runner
from estimator_bf16.runner import report as run_report
from estimator_bf16.runner import xla_check
from estimator_bf16.safety import audit as audit_lib

EXIT_USAGE = 2
EXIT_CHECK_FAILED = 1
EXIT_INTERRUPTED = 130  # What a shell reports for a process Ctrl-C ended.

# The package's other programs, listed under `--help` so that they can be
# found from the one command a user knows: (module for `python -m`, what it
# does, its console script or None).
OTHER_PROGRAMS = (
    ('estimator_bf16.apps.train_cli',
     'train, evaluate and export a reference model', 'estimator-bf16-train'),
    ('estimator_bf16.apps.demo', 'the float32 vs bfloat16 demo', None),
    ('estimator_bf16.apps.ckpt', 'inspect or convert a checkpoint', None),
    ('estimator_bf16.apps.digits_cli',
     "write scikit-learn's digits as MNIST TFRecords", None),
    ('estimator_bf16.apps.launch',
     'run a command as a local multi-worker job', None),
    ('estimator_bf16.apps.tpu_submit', 'submit training to a Cloud TPU',
     'tpu-submit'),
)


def _other_programs_text():
  """`OTHER_PROGRAMS` as --help's closing paragraph, wrapped at 79 columns."""
  lines = ['other programs of the package (python -m MODULE --help):']
  for module, what, script in OTHER_PROGRAMS:
    if script:
      what += ' (also `%s`)' % script
    lines.extend(textwrap.wrap(
        what, width=79, initial_indent='  %-32s' % module,
        subsequent_indent=' ' * 34, break_on_hyphens=False))
  return '\n'.join(lines)


def build_parser():
  """The `estimator_bf16 run|check` parser, built on call (not at import)."""
  parser = argparse.ArgumentParser(
      prog='estimator_bf16', allow_abbrev=False,
      description=textwrap.fill(
          'Run an unmodified Estimator/TPUEstimator program in bfloat16 '
          '(run), or check its TRAIN graph and memory without training '
          '(check).', width=79),
      # Raw, so that the list of programs keeps its columns.
      epilog=_other_programs_text(),
      formatter_class=argparse.RawDescriptionHelpFormatter)
  commands = parser.add_subparsers(dest='command', required=True)
  devices = list(tpu_facts.TPU_DEVICE_BYTES)
  for name, help_text in (
      ('run', 'run PROGRAM as `python PROGRAM ARGS` would, with every '
       'Estimator in --precision; print a short report at exit'),
      ('check', 'build the TRAIN graph of PROGRAM (stopping at its first '
       'train call), print the audit and the memory plan; exit 1 on '
       'problems')):
    command = commands.add_parser(name, help=help_text, description=help_text,
                                  allow_abbrev=False)
    # None: not given. The program runs in bfloat16, and --fit plans
    # float32's rows beside bfloat16's; a --precision given limits the
    # fit to that precision.
    command.add_argument('--precision', default=None,
                         help='bfloat16 (default) or float32 (runs the '
                         'program unchanged, for a parity run); with '
                         '--fit, only that precision is planned')
    command.add_argument('--audit', default=options_lib.WRAP_DEFAULTS.audit,
                         help='strict (default: a precision mistake in the '
                         'TRAIN graph stops the program), warn, or off')
    command.add_argument('--exclude',
                         default=','.join(options_lib.WRAP_DEFAULTS.exclude),
                         help='comma-separated feature keys never cast')
    command.add_argument('--tf1', action=argparse.BooleanOptionalAction,
                         default=None,
                         help='run PROGRAM with the TF 1.x API '
                         '(`import tensorflow as tf` is tf.compat.v1 plus '
                         'a mapped tf.contrib); default: detected from its '
                         'source')
    command.add_argument('--tf1_path', action='append', default=[],
                         metavar='FOLDER',
                         help='a folder of more TF 1.x modules the program '
                         'imports (its own folder always counts); repeatable')
    # Read before TensorFlow loads (estimator_bf16.platform.quiet).
    command.add_argument('--verbose', action='store_true',
                         help=quiet.VERBOSE_HELP)
    command.add_argument(
        '--accumulate', type=int, metavar='K',
        default=options_lib.WRAP_DEFAULTS.gradient_accumulation_steps,
        help='gradient accumulation: each update applies the mean gradient '
        'of K micro-batches of train_batch_size / K (default 1: off)')
    command.add_argument('--recompute', action='store_true',
                         default=options_lib.WRAP_DEFAULTS.recompute,
                         help='recompute activations during backprop instead '
                         'of keeping them: a lower peak for about one more '
                         'forward pass')
    command.add_argument(
        '--kernels', choices=cpu_kernels.KERNEL_CHOICES,
        default=options_lib.WRAP_DEFAULTS.kernels,
        help="'auto' (default): ops whose bfloat16 kernel is slow on this "
        'CPU compute in float32 from bfloat16 inputs, rounded to bfloat16 '
        "(never on a TPU); 'bfloat16': TensorFlow's own bfloat16 kernels")
    command.add_argument('--report', metavar='PATH',
                         help='also write the exit report as JSON to PATH')
    command.add_argument(
        '--fit', action='store_true',
        help=('plan every combination of precision, --accumulate and '
              '--recompute for the batch, mark the cheapest that fits '
              '--device or --memory_budget; exit 1 if none does'
              if name == 'check' else
              'plan the step (the program runs up to its first train call) '
              'for this machine, where it trains, then run it with the '
              'cheapest levers that fit --device or --memory_budget, '
              'measuring the step; exit 1 without training if none fits'))
    command.add_argument('--device', metavar='DEVICE',
                         help='with --fit: the memory of one core or chip '
                         'of %s or %s' % (', '.join(devices[:-1]),
                                          devices[-1]))
    command.add_argument('--memory_budget', metavar='SIZE',
                         help='with --fit: memory per core, in bytes or '
                         'e.g. 512MiB, 8GiB')
    if name == 'run':
      command.add_argument('--memory', action='store_true',
                           help='measure the peak memory of a training step')
      command.add_argument(
          '--seed', type=int, metavar='N',
          help="graph-level random seed of every Estimator (its RunConfig's "
          "tf_random_seed, over the program's own): runs in either "
          'precision then draw the same random input data')
    else:
      command.add_argument(
          '--xla', action='store_true',
          help='also compile the TRAIN step with XLA on this CPU, inside a '
          "device loop as on a TPU (use_tpu=True), and print XLA's bytes "
          'for one step beside the plan')
      command.add_argument(
          '--xla_steps', type=int, default=xla_check.XLA_STEPS, metavar='N',
          help='with --xla: also run N training steps of the compiled loop '
          '(default %d: compile only; on a CPU, XLA takes minutes per step '
          'of a large bfloat16 model)' % xla_check.XLA_STEPS)
    command.add_argument('program', metavar='PROGRAM.py')
    command.add_argument('program_args', nargs=argparse.REMAINDER,
                         metavar='ARGS', help="the program's own arguments")
  return parser


def _error(message):
  print('estimator_bf16: error: %s' % message, file=sys.stderr)
  return EXIT_USAGE


def _interrupted(planning):
  print('estimator_bf16: stopped by Ctrl-C%s.' % (
      ' while planning; nothing was trained' if planning else ''),
        file=sys.stderr)
  return EXIT_INTERRUPTED


def _misplaced_options(args, program_flags):
  """Our options given after PROGRAM.py that the program does not define."""
  parser = build_parser()
  command = next(a for a in parser._actions  # pylint: disable=protected-access
                 if isinstance(a, argparse._SubParsersAction)  # pylint: disable=protected-access
                 ).choices[args.command]
  ours = [option for action in command._actions  # pylint: disable=protected-access
          for option in action.option_strings if option.startswith('--')]
  found = []
  for option in ours:
    if option == '--help' or option[2:] in program_flags:
      continue
    if any(arg == option or arg.startswith(option + '=')
           for arg in args.program_args):
      found.append(option)
  return found


def _fit_budget(args):
  """The --fit budget in bytes, or the one-line reason it is not valid."""
  if not args.fit:
    return '--device and --memory_budget go with --fit.'
  if (args.device is None) == (args.memory_budget is None):
    return ('--fit needs exactly one of --device (%s) and --memory_budget '
            '(e.g. 8GiB).' % ', '.join(fit_lib.DEVICE_BYTES))
  if args.accumulate != 1 or args.recompute:
    return ('--fit chooses --accumulate and --recompute itself; drop them, '
            'or drop --fit to check the levers you give.')
  try:
    if args.device is not None:
      return fit_lib.device_bytes(args.device)
    return fit_lib.parse_size(args.memory_budget)
  except ValueError as e:
    return '--%s: %s' % ('device' if args.device else 'memory_budget', e)


def _write_report(path, data):
  """Writes `data` as JSON to `path`; a failure is one line on stderr."""
  try:
    with open(path, 'w') as out:
      json.dump(data, out, indent=2, sort_keys=True)
  except OSError as e:
    print('estimator_bf16: error: --report %s: %s' % (path, e.strerror or e),
          file=sys.stderr)


def _set_environment(args):
  if backend_lib.installed_tf_version() >= (2, 16):
    os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  if getattr(args, 'memory', False) or (args.command == 'run' and args.fit):
    os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
  if getattr(args, 'xla', False):
    # XLA reads its flags at its first compile: ask for the dump its
    # buffer assignment is read from before the program can compile.
    xla_dump.enable()


def main(argv=None):
  """Runs the command line; returns the exit code.

  `run` returns the program's own exit code; with --fit, 1 without
  training when nothing fits, the plan fails or (--audit=strict) the TRAIN
  graph has audit problems. `check` returns 0 when the TRAIN graph was
  built without audit problems (and, with --fit, something fits), 1
  otherwise. A bad command line (unknown precision, missing program, a bad
  --device or --memory_budget) returns 2 before anything runs.
  """
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    args = build_parser().parse_args(argv)
  except SystemExit as e:  # argparse printed the usage (or --help).
    return e.code if isinstance(e.code, int) else EXIT_USAGE
  try:
    # Parsed once: everything below, the runner included, gets the value.
    precision_given = args.precision is not None
    args.precision = policy.parse_precision(
        args.precision or policy.DEFAULT_PRECISION)
  except ValueError as e:
    return _error('--%s' % e)
  problem = _option_problem(args)
  if problem:
    return _error(problem)
  # Before TensorFlow reads them (see the module docstring).
  _set_environment(args)
  budget = None
  if args.fit or args.device or args.memory_budget:
    budget = _fit_budget(args)
    if isinstance(budget, str):
      return _error(budget)
  if not os.path.isfile(args.program):
    return _error('%s: no such file (give the Python program to run).' %
                  args.program)
  try:
    options = options_lib.WrapOptions(
        audit=args.audit,
        exclude=tuple(key for key in args.exclude.split(',') if key),
        gradient_accumulation_steps=args.accumulate,
        recompute=args.recompute, kernels=args.kernels)
  except ValueError as e:
    return _error(str(e))
  # One line before the program starts: bfloat16 is emulated on this CPU,
  # and what the run does about it (nothing on a native CPU).
  if args.precision.bfloat16:
    cpu_bfloat16.warn_if_emulated(kernels=args.kernels)

  check = args.command == 'check'
  # A --precision given wins over the fit: only its rows are planned.
  precisions = ((args.precision,) if precision_given else policy.PRECISIONS)
  if budget is not None and not check:
    return _run_fit(args, budget, precisions, options)
  plan_fn = _plan_fn(args, budget, precisions, check, options)
  xla_fn = None
  if getattr(args, 'xla', False):
    xla_fn = functools.partial(xla_check.xla_check, steps=args.xla_steps)
  try:
    result = runner.run_program(
        args.program, args.program_args, precision=args.precision,
        options=options, memory=getattr(args, 'memory', False), check=check,
        tf1=args.tf1, tf1_paths=tuple(args.tf1_path), plan_fn=plan_fn,
        xla_fn=xla_fn, seed=getattr(args, 'seed', None),
        verbose=args.verbose)
  except runner.ProgramError as e:
    return _error(str(e))
  except KeyboardInterrupt:
    # The program's own Ctrl-C is handled by the runner; this one came
    # outside it, in check mode while planning (minutes for BERT-base).
    return _interrupted(check)
  return _report(args, result, budget, check)


def _option_problem(args):
  """The one-line reason the options (beyond the precision) are not valid."""
  if args.audit not in audit_lib.AUDIT_MODES:
    return '--audit must be one of %s, got %r.' % (
        ', '.join(audit_lib.AUDIT_MODES), args.audit)
  if getattr(args, 'seed', None) is not None and args.seed < 0:
    return '--seed must be an integer >= 0, got %d.' % args.seed
  if args.accumulate < 1:
    return ('--accumulate must be an integer >= 1 (micro-batches per '
            'update), got %d.' % args.accumulate)
  xla_steps = getattr(args, 'xla_steps', xla_check.XLA_STEPS)
  if xla_steps != xla_check.XLA_STEPS and not args.xla:
    return '--xla_steps needs --xla.'
  if xla_steps < 0:
    return '--xla_steps must be an integer >= 0, got %d.' % xla_steps
  return None


def _plan_fn(args, budget, precisions, check, options):
  """What `run_program` plans with: the fit's table, `check`'s plan, or None.

  `check` plans with the levers of `options`, the run's `WrapOptions`.
  """
  if budget is not None:
    return functools.partial(
        planning_lib.fit_plans, budget_bytes=budget, precisions=precisions,
        tpu=(args.device or '').startswith('tpu-'))
  if check:
    return functools.partial(
        planning_lib.memory_plans,
        gradient_accumulation_steps=options.gradient_accumulation_steps,
        recompute=options.recompute)
  return None


def _report(args, result, budget, check):
  """Prints the report, writes --report; returns the command's exit code."""
  sys.stdout.flush()
  code = result.exit_code
  if check:
    passed = run_report.check_passed(result) and run_report.fit_passed(
        result, fit_requested=budget is not None)
    code = 0 if passed else EXIT_CHECK_FAILED
  if args.report:
    _write_report(args.report, run_report.report_json(result, budget, code))
  # One rule for both commands: stdout is the program's, as it would be
  # without the runner; everything estimator_bf16 says (the report, the
  # hints) is on stderr, after the program's own output. `--report` is
  # the machine-readable copy.
  if check:
    print(run_report.format_check_report(
        result, fit_requested=budget is not None), end='', file=sys.stderr,
          flush=True)
  else:
    print(run_report.format_run_report(result), end='', file=sys.stderr,
          flush=True)
  _explain_misplaced(args, result)
  return code


def _explain_misplaced(args, result):
  """One line per option of ours the program got and does not define.

  Whatever the exit code: a program started with `app.run` (TF 1.x
  `tf.app.run`) may accept unknown flags, so `--precision=float32` after
  PROGRAM.py trains, in bfloat16, and exits 0.
  """
  for option in _misplaced_options(args, result.program_flags):
    if result.program_flags:
      what = 'which does not define it, so it had no effect'
    else:
      # No absl flags: the program may read its own argv (argparse).
      what = 'which defines no absl flags (unless it reads argv itself, it ' \
             'had no effect)'
    print('estimator_bf16: warning: %s went to the program, %s: options of '
          '`%s` go before %s (everything after PROGRAM.py goes to the '
          'program).' % (option, what, args.command, args.program),
          file=sys.stderr)


def _run_fit(args, budget, precisions, options):
  """`run --fit`: plan, print the table, train with the choice, report."""

  def announce(planning):
    lines = [''] + fit_report.fit_lines(planning.fit_plans)
    lines.append('estimator_bf16 run --fit: running %s with %s' % (
        args.program, fit_report.describe(planning.fit_plans.chosen)))
    print('\n'.join(lines), file=sys.stderr, flush=True)

  try:
    planning, result = fit_run.run_with_fit(
        args.program, args.program_args, budget_bytes=budget,
        precisions=precisions, options=options, tf1=args.tf1,
        tf1_paths=tuple(args.tf1_path), on_choice=announce, seed=args.seed)
  except runner.ProgramError as e:
    return _error(str(e))
  except KeyboardInterrupt:
    # Between the program's two runs: planning, before any training.
    return _interrupted(True)
  sys.stdout.flush()
  final = result if result is not None else planning
  code = (result.exit_code if result is not None else
          planning.exit_code or EXIT_CHECK_FAILED)
  if args.report:
    _write_report(args.report, run_report.report_json(final, budget, code))
  if result is None:
    # Nothing trained: the plan's report says why (the program's failure,
    # audit problems, or the table and the advice when nothing fits).
    print(run_report.format_check_report(
        planning, True, command='run --fit (planning, nothing trained)'),
          end='', file=sys.stderr, flush=True)
    _explain_misplaced(args, planning)
    return code
  print(run_report.format_run_report(result), end='', file=sys.stderr,
        flush=True)
  _explain_misplaced(args, result)
  return result.exit_code
