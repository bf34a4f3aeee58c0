"""Runs the programs of the corpus under `estimator_bf16 run` and `check`.

`run_commit` runs every program of one commit (`corpus_programs` reads
them) on every interpreter given: in float32 (the reference: the program
as written, nothing cast), in bfloat16, in bfloat16 on the float32 run's
checkpoint, and `check` for the memory plan, each with the smallest
settings its recipe gives (`scripts/corpus_recipes.py`) and the records
`scripts/corpus_data.py` writes. It returns a `corpus_checks.Row` per
program and interpreter, which `corpus_checks` judges.
"""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

from scripts import corpus_checks
from scripts import corpus_data
from scripts import corpus_programs
from scripts import corpus_recipes

# Every `run` gets this graph-level seed (`run --seed`): the programs'
# fake-data modes draw their examples with unseeded ops, so without it the
# bfloat16 evaluation of the float32 checkpoint would see other data.
_SEED = 1
# Where an installed library's file sits: a failure's reason names the
# file from the library on, not this machine's interpreter folders.
_LIBRARY_PREFIX = re.compile(r'[^\s(]*/(?:site|dist)-packages/')
# On the programs' import path: they run `python -m estimator_bf16`.
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _reason(stderr):
  """The line of a failed run that says why, library paths shortened."""
  return _LIBRARY_PREFIX.sub('', _why(stderr))


def _why(stderr):
  """The line of a failed run that says why."""
  lines = [l.strip() for l in stderr.splitlines() if l.strip()]
  for line in reversed(lines):
    if line.startswith('failed: '):
      return line[len('failed: '):]
  for line in reversed(lines):
    if (re.match(r'^[\w.]+(Error|Exception|Exit)\b', line) or
        'FATAL Flags parsing error' in line):
      return line
  ours = re.compile(r'^(estimator_bf16|precision|TF 1\.x|memory levers|'
                    r'estimators built|exit code|the program built)')
  lines = [l for l in lines if not ours.match(l)]
  return lines[-1] if lines else ''


def run_one(python, command, program, flags, cwd, env, report_path,
            max_seconds):
  """Runs `python -m estimator_bf16 COMMAND ... PROGRAM FLAGS`."""
  args = [python, '-m', 'estimator_bf16'] + command + [
      '--report=' + report_path, program] + flags
  start = time.perf_counter()
  outcome = corpus_checks.Outcome()
  try:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=max_seconds, check=False)
  except subprocess.TimeoutExpired:
    outcome.exit_code, outcome.reason = -1, 'over %d s' % max_seconds
    outcome.seconds = time.perf_counter() - start
    return outcome
  outcome.seconds = time.perf_counter() - start
  outcome.exit_code = done.returncode
  if os.path.exists(report_path):
    with open(report_path) as f:
      outcome.report = json.load(f)
  if done.returncode:
    outcome.reason = _reason(done.stderr)[:300]
  with open(report_path + '.log', 'w') as f:
    f.write(done.stderr)
  return outcome


def tensorflow_version(python):
  """The TensorFlow version installed for interpreter `python`."""
  done = subprocess.run(
      [python, '-c', 'import importlib.metadata as m; '
       'print(m.version("tensorflow"))'], capture_output=True, text=True,
      check=False)
  return done.stdout.strip() or 'unknown'


def run_commit(git_dir, commit, pythons, work, selected, max_seconds, log,
               done=None, on_row=None, source=corpus_programs.TPU):
  """Every program of one commit on every interpreter; returns Rows.

  Args:
    source: the repository's name (owner/name): its program folders and
      recipes (`corpus_recipes.SOURCES`, `recipe_for`).
    done: {(commit[:8], program, TF version): Row} already run (`--resume`);
      those rows are taken as they are.
    on_row: fn(row), called after each row, e.g. to save progress.
  """
  where = corpus_recipes.source_for(source)
  tree = os.path.join(work, ('tree-%s-%s' % (source, commit)).replace(
      '/', '_'))
  shutil.rmtree(tree, ignore_errors=True)
  full = corpus_programs.extract(git_dir, commit, tree, where.folders)
  rows = []

  def take_done(key):
    """Keeps an earlier run's row for `key`; False if there is none."""
    if not done or key not in done:
      return False
    rows.append(done[key])
    if on_row is not None:
      on_row(done[key])
    return True

  for program in corpus_programs.find_programs(tree, where.folders,
                                               where.programs):
    if selected and not any(s in program for s in selected):
      # Not run now; an earlier run's rows of it stay in the table.
      for _, version in pythons:
        take_done((full[:8], program, version))
      continue
    recipe = corpus_recipes.recipe_for(program, full, source)
    for python, version in pythons:
      key = (full[:8], program, version)
      if take_done(key):
        continue
      row = corpus_checks.Row(*key, source=source)
      rows.append(row)
      if recipe is None or recipe.skip:
        row.note = (recipe.skip if recipe is not None else
                    'what it needs is not known here')
        log('%s %s TF %s: %s' % (row.commit, program, version, row.note))
      else:
        _run_row(row, recipe, tree, python, work, max_seconds, log,
                 where.folders)
      if on_row is not None:
        on_row(row)
  return rows


def _run_row(row, recipe, tree, python, work, max_seconds, log,
             folders=corpus_programs.TPU_FOLDERS):
  """Float32, bfloat16 and the plan of one program on one interpreter.

  The row's folder keeps each run's report and stderr (`NAME.json`,
  `NAME.json.log`); its model_dirs and data are deleted at the end, as
  three commits of ImageNet-sized checkpoints fill a disk.
  """
  scratch = tempfile.mkdtemp(prefix='corpus_', dir=work)
  try:
    _run_in(scratch, row, recipe, tree, python, max_seconds, log, folders)
  finally:
    for name in os.listdir(scratch):
      path = os.path.join(scratch, name)
      if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)


def _run_in(scratch, row, recipe, tree, python, max_seconds, log,
            folders=corpus_programs.TPU_FOLDERS):
  """`_run_row` in its folder `scratch`; `folders`: the repository's
  program folders, on the import path (the recipe's `paths` are under the
  first)."""
  data_dir = os.path.join(scratch, 'data')
  corpus_data.write_data(recipe.data, data_dir)
  program = os.path.join(tree, row.program)
  roots = [os.path.join(tree, f) if f else tree for f in folders]
  paths = roots + [os.path.join(roots[0], p) for p in recipe.paths]
  flags_known = corpus_programs.program_flags(program, paths)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [_REPO_ROOT]))
  # `corpus.main` quiets this process's TensorFlow, not the programs'.
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)

  def flags_for(name):
    model_dir = os.path.join(scratch, name)
    flags = [f.format(model_dir=model_dir, data_dir=data_dir)
             for f in recipe.flags]
    return [f for f in flags
            if corpus_programs.flag_name(f) in flags_known]

  cwd = os.path.dirname(program)

  def run_one_here(*args):
    """`run_one`, its reason without this machine's folders."""
    outcome = run_one(*args)
    outcome.reason = outcome.reason.replace(scratch, '<scratch>').replace(
        tree, '<repository>')
    return outcome

  def run_in(precision):
    """`run --precision=PRECISION` into the row's field of that name."""
    outcome = run_one_here(python, ['run', '--seed=%d' % _SEED,
                                    '--precision=' + precision], program,
                           flags_for(precision), cwd, env,
                           os.path.join(scratch, precision + '.json'),
                           max_seconds)
    setattr(row, precision, outcome)
    log('%s %s TF %s %s: %s (%.0f s)' % (row.commit, row.program,
                                         row.tensorflow, precision,
                                         outcome.short(), outcome.seconds))

  run_in('float32')
  if not row.float32.ok:
    return
  # `check` reads no run's output: it runs beside the bfloat16 runs (a
  # corpus row then costs three process times, not four, on two cores).
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    checking = pool.submit(run_one_here, python, ['check'], program,
                           flags_for('check'), cwd, env,
                           os.path.join(scratch, 'check.json'), max_seconds)
    run_in('bfloat16')
    if (row.bfloat16.ok and
        corpus_checks.last_evaluation(row.float32.report)):
      # The float32 run's checkpoint, evaluated in bfloat16: the program
      # finds its steps done and evaluates (or, with the recipe's
      # `eval_flags`, runs its evaluation mode). Two fresh runs differ by
      # more than the precision: TF 1.x's op seeds shift with the casts,
      # so they start from other weights (docs/limits.md).
      shutil.copytree(os.path.join(scratch, 'float32'),
                      os.path.join(scratch, 'same_weights'))
      eval_flags = [f for f in recipe.eval_flags
                    if corpus_programs.flag_name(f) in flags_known]
      row.same_weights = run_one_here(
          python, ['run', '--seed=%d' % _SEED, '--precision=bfloat16'],
          program, flags_for('same_weights') + eval_flags, cwd, env,
          os.path.join(scratch, 'same_weights.json'), max_seconds)
      log('%s %s TF %s bfloat16 on the float32 checkpoint: %s' % (
          row.commit, row.program, row.tensorflow, row.same_weights.short()))
    checked = checking.result()
  report = checked.report or {}
  if report.get('plan_made'):
    row.plan = 'OK'
  elif report.get('plan_error'):
    row.plan = 'PROBLEM: ' + report['plan_error']
  else:
    row.plan = 'none (check: %s)' % checked.short()
  log('%s %s TF %s check: %s' % (row.commit, row.program, row.tensorflow,
                                 row.plan))
