r"""Runs public TPUEstimator programs, unmodified, under `estimator_bf16 run`.

For each commit of a repository of TPUEstimator programs (tensorflow/tpu),
each program that builds a TPUEstimator and each TensorFlow (a Python
interpreter per virtualenv), the program runs under `run` in float32 (the
reference: the program as written, nothing cast) and in bfloat16, with the
smallest settings its recipe gives (`scripts/corpus_recipes.py`): a few
training steps, one evaluation, tiny batches, and the program's null input
or a few records this script writes in the format it reads. `check` then
plans the step's memory. The table goes to a Markdown file:

    python scripts/corpus.py --repo PATH_TO_TPU_GIT_DIR \
        --commits HEAD,862434aa,1fe0a9b8 \
        --python .venv/bin/python --python .venv-tf-latest/bin/python \
        --out docs/corpus.md

`--repo` is a git directory (a clone, or `git clone --bare`); each commit's
`models/` folder is read from it blob by blob, so no checkout changes and
nothing is downloaded. Other repositories come with `--source
OWNER/NAME=GIT_DIR@COMMIT[,COMMIT]` (repeated): each is read at its
commits, under the program folders `corpus_recipes.SOURCES` gives it (the
whole tree by default), and its recipes are keyed `OWNER/NAME:PATH`; their
table goes below its own mark in docs/corpus.md. It is not part of `make
test`: it needs the repositories, and runs for an hour or more.
`--programs` picks programs by a substring of their path, `--max_seconds`
bounds each run.

A program passes when, in bfloat16: it exits 0, trained its steps and
evaluated, the audit found no problem, >= 95% of its matmul/conv FLOPs ran
in bfloat16, a memory plan was made, and its eval metrics are the float32
run's metrics, float32, and close in value (docs/corpus.md). A program whose float32 run fails is listed with its own reason and
counts as not runnable, not as a failure of bfloat16.
"""

import argparse
import concurrent.futures
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

# This script writes records with TensorFlow: its own C++ notes are noise.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO_ROOT)

from estimator_bf16.precision import policy  # pylint: disable=g-import-not-at-top,wrong-import-position
from scripts import corpus_data  # pylint: disable=g-import-not-at-top,wrong-import-position
from scripts import corpus_recipes  # pylint: disable=g-import-not-at-top,wrong-import-position

# What a passing bfloat16 run must reach (the target).
MIN_SHARE = 0.95
# Eval metrics within this of the float32 run's: for shares (accuracy and
# the like, in [0, 1]) as a difference, else relative to the larger
# magnitude. Runs of four steps on a few random records move them by
# whole examples; this catches a metric computed wrongly, not noise.
METRIC_TOLERANCE = 0.25
# Every `run` gets this graph-level seed (`run --seed`): the programs'
# fake-data modes draw their examples with unseeded ops, so without it the
# bfloat16 evaluation of the float32 checkpoint would see other data.
_SEED = 1
# The repository `--repo` names.
TPU = 'tensorflow/tpu'
# Its program folders, the default where a caller names none.
_TPU_FOLDERS = corpus_recipes.source_for(TPU).folders
_SHARE_METRICS = re.compile(r'acc|top_?\d|precision|recall|auc', re.I)
# COCO's average precision and recall (AP, AP50, APs, ARmax100, ...): shares
# too. Case matters: 'ap' and 'ar' start other names.
_COCO_SHARES = re.compile(r'^(AP|AR)')
# Where an installed library's file sits: a failure's reason names the
# file from the library on, not this machine's interpreter folders.
_LIBRARY_PREFIX = re.compile(r'[^\s(]*/(?:site|dist)-packages/')
_PROGRAM_MARKERS = ('TPUEstimator(',)
_MAIN_MARKERS = ('app.run(', "__name__ == '__main__'",
                 '__name__ == "__main__"')


@dataclasses.dataclass
class Outcome:
  """One run of one program: how it ended and what its report said."""
  exit_code: Optional[int] = None
  seconds: float = 0.0
  reason: str = ''
  report: Optional[dict] = None

  @property
  def ok(self):
    return self.exit_code == 0 and self.report is not None

  def short(self):
    if self.exit_code is None:
      return 'not run'
    if self.ok:
      return 'OK'
    return 'exit %s: %s' % (self.exit_code, self.reason or 'no reason given')


@dataclasses.dataclass
class Row:
  """One (commit, program, TensorFlow) of the table."""
  commit: str
  program: str
  tensorflow: str
  float32: Outcome = dataclasses.field(default_factory=Outcome)
  bfloat16: Outcome = dataclasses.field(default_factory=Outcome)
  same_weights: Outcome = dataclasses.field(default_factory=Outcome)
  plan: str = ''
  note: str = ''
  # The repository (owner/name); rows of JSON written before there were
  # several are tensorflow/tpu's.
  source: str = TPU

  def verdict(self):
    """(kind, why): kind is 'pass' or 'fail' for rows the target counts,
    'trains only' (the program never evaluates), 'not runnable' (its
    float32 run fails) or 'no recipe'."""
    if self.note:
      return 'no recipe', self.note
    if not self.float32.ok:
      return 'not runnable', 'float32: ' + self.float32.short()
    problems = bfloat16_problems(self)
    if not (self.float32.report or {}).get('evaluations'):
      problems = [p for p in problems if p != 'no evaluation']
      return ('trains only', ('fail: ' + '; '.join(problems)) if problems
              else 'pass')
    return ('fail', '; '.join(problems)) if problems else ('pass', '')


def bfloat16_problems(row):
  """Why the bfloat16 run of `row` does not meet the target (empty: it does)."""
  out = row.bfloat16
  if not out.ok:
    return ['bfloat16: ' + out.short()]
  report = out.report
  problems = []
  if not sum(report.get('train_steps') or []):
    problems.append('no training step ran')
  if report.get('problems'):
    problems.append('audit: %s' % report['problems'][0][:200])
  share = report.get('bfloat16_flop_share')
  if share is None or share < MIN_SHARE:
    problems.append('bfloat16 share %s' % _percent(share))
  if not row.plan.startswith('OK'):
    problems.append('memory plan: %s' % (row.plan or 'none'))
  problems += row_metric_problems(row)
  return problems


def row_metric_problems(row):
  """The bfloat16 evaluation against float32's: names and dtypes from the
  bfloat16 run, values from the bfloat16 evaluation of the float32 run's
  own checkpoint when there is one (the same weights: only the precision
  differs), else from the bfloat16 run."""
  report = row.bfloat16.report or {}
  same = row.same_weights.report
  if not _same_weights_evaluated(row):
    return metric_problems(row.float32.report, report)
  return (metric_problems(row.float32.report, report, values=False) +
          metric_problems(row.float32.report, same))


def _last_evaluation(report):
  return ((report or {}).get('evaluations') or [None])[-1]


def _same_weights_evaluated(row):
  """Whether the bfloat16 run on the float32 checkpoint evaluated exactly
  those weights: a program that trains `steps=N` more from a checkpoint
  (rather than up to `max_steps`) evaluated other ones."""
  same = _last_evaluation(row.same_weights.report)
  reference = _last_evaluation(row.float32.report)
  if same is None or reference is None:
    return False
  return (same.get('global_step') == reference.get('global_step') and
          not sum(row.same_weights.report.get('train_steps') or []))


def metric_problems(reference, report, values=True):
  """A bfloat16 run's last evaluation against the float32 run's.

  Args:
    reference: the float32 run's report.
    report: the bfloat16 run's.
    values: also compare the values (within `METRIC_TOLERANCE`).
  """
  ours = _last_evaluation(report)
  theirs = _last_evaluation(reference)
  if ours is None:
    return ['no evaluation']
  if theirs is None:
    return []
  problems = []
  if sorted(ours) != sorted(theirs):
    problems.append('eval metrics %s, float32 gave %s' % (sorted(ours),
                                                          sorted(theirs)))
  for key in sorted(set(ours) & set(theirs)):
    (value, dtype), (expected, expected_dtype) = ours[key], theirs[key]
    if dtype != expected_dtype:
      problems.append('eval %s is %s (float32 run: %s)' % (key, dtype,
                                                           expected_dtype))
    if key == 'global_step' or not values:
      continue
    share = _SHARE_METRICS.search(key) or _COCO_SHARES.match(key)
    scale = 1.0 if share else max(abs(value), abs(expected), 1e-6)
    # Written so that NaN (a diverged run) is never within tolerance.
    if not (math.isfinite(value) and
            abs(value - expected) <= METRIC_TOLERANCE * scale):
      problems.append('eval %s %.4g (float32 run: %.4g)' % (key, value,
                                                           expected))
  return problems


def _percent(share):
  return 'n/a' if share is None else '%.1f%%' % (100 * share)


def extract(git_dir, commit, dest, folders=_TPU_FOLDERS):
  """`folders` of `commit` into `dest` ('' is the whole tree); returns the
  full commit hash.

  Blob by blob (`git cat-file --batch`), so a snapshot whose largest
  files are absent (notebooks, images) still yields the programs.
  """
  full = subprocess.run(['git', '--git-dir', git_dir, 'rev-parse', commit],
                        check=True, capture_output=True, text=True
                        ).stdout.strip()
  listing = subprocess.run(
      ['git', '--git-dir', git_dir, 'ls-tree', '-r', '-z', full, '--'] +
      ([] if '' in folders else list(folders)), check=True,
      capture_output=True).stdout.decode().split('\0')
  blobs = []
  for entry in filter(None, listing):
    meta, path = entry.split('\t', 1)
    mode, kind, sha = meta.split()
    if kind == 'blob' and mode != '120000':
      blobs.append((sha, path))
  done = subprocess.run(['git', '--git-dir', git_dir, 'cat-file', '--batch'],
                        input=''.join(sha + '\n' for sha, _ in blobs).encode(),
                        check=True, capture_output=True).stdout
  offset = 0
  for sha, path in blobs:
    end = done.index(b'\n', offset)
    header = done[offset:end].split()
    offset = end + 1
    if len(header) < 3 or header[1] != b'blob':  # 'SHA missing'
      continue
    size = int(header[2])
    target = os.path.join(dest, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, 'wb') as f:
      f.write(done[offset:offset + size])
    offset += size + 1
  return full


def find_programs(root, folders=_TPU_FOLDERS, extra=()):
  """Paths (relative to `root`) of programs that build a TPUEstimator,
  under `folders` ('' is all of `root`), and the `extra` paths that exist
  (programs whose TPUEstimator is built by a module they import)."""
  found = [p for p in extra if os.path.isfile(os.path.join(root, p))]
  walks = [os.walk(os.path.join(root, f) if f else root) for f in folders]
  for folder, _, files in (w for walk in walks for w in walk):
    for name in sorted(files):
      if not name.endswith('.py') or name.endswith('_test.py'):
        continue
      path = os.path.join(folder, name)
      with open(path, errors='replace') as f:
        text = f.read()
      if (any(m in text for m in _PROGRAM_MARKERS) and
          any(m in text for m in _MAIN_MARKERS)):
        found.append(os.path.relpath(path, root))
  return sorted(set(found))


_DEFINE = re.compile(r'DEFINE_\w+\(\s*(?:name\s*=\s*)?[\'"](\w+)[\'"]|'
                     r'add_argument\(\s*[\'"]--([\w-]+)[\'"]')
_IMPORT = re.compile(r'^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ()]+)|'
                     r'import\s+([\w.]+))', re.M)


def _module_files(name, folders):
  """Files that `import name` may load from `folders`."""
  relative = name.replace('.', os.sep)
  for folder in folders:
    for candidate in (relative + '.py', os.path.join(relative, '__init__.py')):
      path = os.path.join(folder, candidate)
      if os.path.isfile(path):
        yield path


def program_flags(program, folders):
  """Flag names DEFINE_* calls define in `program` and what it imports.

  A static reading: the program's imports (and theirs) that resolve to
  files in `folders` (its own folder, the repository's `models/`, and the
  recipe's extra paths) are scanned. Flags that other programs define are
  not the program's, and absl refuses them.
  """
  names, seen, queue = set(), set(), [program]
  while queue:
    path = queue.pop()
    if path in seen:
      continue
    seen.add(path)
    with open(path, errors='replace') as f:
      text = f.read()
    names.update(a or b for a, b in _DEFINE.findall(text))
    here = [os.path.dirname(path)] + list(folders)
    for module, imported, plain in _IMPORT.findall(text):
      candidates = [plain] if plain else [module] + [
          module + '.' + n.strip() for n in imported.strip('()').split(',')
          if n.strip()]
      for name in candidates:
        queue.extend(_module_files(name, here))
  return names


def _flag_name(flag):
  return flag.lstrip('-').split('=', 1)[0]


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
  outcome = Outcome()
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
  done = subprocess.run(
      [python, '-c', 'import importlib.metadata as m; '
       'print(m.version("tensorflow"))'], capture_output=True, text=True,
      check=False)
  return done.stdout.strip() or 'unknown'


def run_commit(git_dir, commit, pythons, work, selected, max_seconds, log,
               done=None, on_row=None, source=TPU):
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
  full = extract(git_dir, commit, tree, where.folders)
  rows = []

  def take_done(key):
    """Keeps an earlier run's row for `key`; False if there is none."""
    if not done or key not in done:
      return False
    rows.append(done[key])
    if on_row is not None:
      on_row(done[key])
    return True

  for program in find_programs(tree, where.folders, where.programs):
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
      row = Row(*key, source=source)
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


def _row_from_dict(data):
  """A Row from its `dataclasses.asdict` form (`--json`)."""
  outcomes = {name: Outcome(**data[name]) for name in
              policy.PRECISIONS + ('same_weights',) if name in data}
  fields = {k: v for k, v in data.items() if k not in outcomes}
  return Row(**fields, **outcomes)


def _run_row(row, recipe, tree, python, work, max_seconds, log,
             folders=_TPU_FOLDERS):
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
            folders=_TPU_FOLDERS):
  """`_run_row` in its folder `scratch`; `folders`: the repository's
  program folders, on the import path (the recipe's `paths` are under the
  first)."""
  data_dir = os.path.join(scratch, 'data')
  corpus_data.write_data(recipe.data, data_dir)
  program = os.path.join(tree, row.program)
  roots = [os.path.join(tree, f) if f else tree for f in folders]
  paths = roots + [os.path.join(roots[0], p) for p in recipe.paths]
  flags_known = program_flags(program, paths)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [_REPO_ROOT]))
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)

  def flags_for(name):
    model_dir = os.path.join(scratch, name)
    flags = [f.format(model_dir=model_dir, data_dir=data_dir)
             for f in recipe.flags]
    return [f for f in flags if _flag_name(f) in flags_known]

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
    if row.bfloat16.ok and _last_evaluation(row.float32.report):
      # The float32 run's checkpoint, evaluated in bfloat16: the program
      # finds its steps done and evaluates (or, with the recipe's
      # `eval_flags`, runs its evaluation mode). Two fresh runs differ by
      # more than the precision: TF 1.x's op seeds shift with the casts,
      # so they start from other weights (README, Known limits).
      shutil.copytree(os.path.join(scratch, 'float32'),
                      os.path.join(scratch, 'same_weights'))
      eval_flags = [f for f in recipe.eval_flags
                    if _flag_name(f) in flags_known]
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


def markdown(rows, command):
  """The table, the pass count, and how it was made."""
  runnable = [r for r in rows if r.verdict()[0] in ('pass', 'fail')]
  passed = [r for r in runnable if r.verdict()[0] == 'pass']
  train_only = [r for r in rows if r.verdict()[0] == 'trains only']
  train_only_passed = [r for r in train_only if r.verdict()[1] == 'pass']
  # tensorflow/tpu's own table names no repository; others' tables do.
  with_source = any(r.source != TPU for r in rows)
  lines = [
      '| %scommit | program | TF | float32 | bfloat16 | bf16 share | audit | '
      'memory plan | eval metrics | time bf16/f32 | verdict |' % (
          'repository | ' if with_source else ''),
      '| %s--- | --- | --- | --- | --- | ---: | --- | --- | --- | ---: | --- |'
      % ('--- | ' if with_source else '')]
  for row in rows:
    verdict, why = row.verdict()
    report = row.bfloat16.report or {}
    audit = ('no problems' if row.bfloat16.ok and not report.get('problems')
             else ('%d problem(s)' % len(report['problems'])
                   if report.get('problems') else ''))
    metrics = ''
    if row.bfloat16.ok and row.float32.ok:
      found = row_metric_problems(row)
      metrics = 'match' if not found else '; '.join(found)
      if not found:
        metrics = ('match (same weights)' if _same_weights_evaluated(row)
                   else 'match (fresh runs)')
    timing = ('%.2fx' % (row.bfloat16.seconds / row.float32.seconds)
              if row.bfloat16.ok and row.float32.ok and row.float32.seconds
              else '')
    lines.append(('| %s' % (row.source + ' | ') if with_source else '| ') +
                 '%s | `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %s%s |'
                 % (row.commit, row.program.replace('models/', '', 1)
                    if row.source == TPU else row.program,
                    row.tensorflow, _cell(row.float32.short()
                                          if not row.note else '-'),
                    _cell(row.bfloat16.short() if not row.note else '-'),
                    _percent(report.get('bfloat16_flop_share'))
                    if row.bfloat16.ok else '', audit, _cell(row.plan),
                    _cell(metrics), timing, verdict,
                    ': ' + _cell(why) if why else ''))
  not_runnable = [r for r in rows if r.verdict()[0] == 'not runnable']
  head = ['Passed: **%d of %d** (program, commit, TensorFlow) rows that '
          'train and evaluate in float32; of %d more that train only (no '
          'evaluation), %d pass the rest; %d do not run in plain float32 '
          'and %d have no recipe (each with its reason).' % (
              len(passed), len(runnable), len(train_only),
              len(train_only_passed), len(not_runnable),
              len(rows) - len(runnable) - len(train_only) -
              len(not_runnable)), '',
          'Made by:', '', '```text', command, '```', '']
  return '\n'.join(head + lines) + '\n'


TABLE_MARK = '<!-- corpus table: scripts/corpus.py writes below -->'
# The table of the other repositories (`--source`), and where a table
# ends when text follows it: every mark starts with `_MARK_START`.
OTHERS_MARK = ('<!-- corpus table of other repositories: scripts/corpus.py '
               'writes below -->')
END_MARK = '<!-- corpus table end -->'
_MARK_START = '<!-- corpus table'


def write_table(path, text, mark=TABLE_MARK):
  """Writes the table to `path`: below `mark` when the file has it
  (docs/corpus.md keeps its text above), up to the next mark or the end,
  else as the whole file."""
  head, tail = '', ''
  if os.path.exists(path):
    with open(path) as f:
      old = f.read()
    if mark in old:
      end = old.index(mark) + len(mark)
      head = old[:end] + '\n\n'
      following = old.find(_MARK_START, end)
      if following >= 0:
        tail = '\n' + old[following:]
  with open(path, 'w') as f:
    f.write(head + text + tail)


def _cell(text):
  return str(text).replace('|', '\\|').replace('\n', ' ')[:240]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--repo', default='',
                      help='git directory of tensorflow/tpu (or a clone)')
  parser.add_argument('--commits', default='HEAD',
                      help='comma-separated commits of --repo (default HEAD)')
  parser.add_argument('--source', action='append', default=[],
                      help='OWNER/NAME=GIT_DIR[@COMMIT[,COMMIT...]]: another '
                      'repository and its commits (default HEAD); repeat '
                      'for each')
  parser.add_argument('--python', action='append', required=True,
                      help='an interpreter with estimator_bf16 installed; '
                      'repeat for each TensorFlow')
  parser.add_argument('--programs', default='',
                      help='comma-separated substrings of program paths')
  parser.add_argument('--out', default='-', help='Markdown file, or -')
  parser.add_argument('--json', default='', help='also write rows as JSON '
                      '(after each row)')
  parser.add_argument('--resume', default='',
                      help='a --json file of an earlier run: its rows are '
                      'kept, not run again')
  parser.add_argument('--work', default='',
                      help='scratch folder (default: a temporary one)')
  parser.add_argument('--max_seconds', type=int, default=900)
  args = parser.parse_args(argv)
  sources = []  # (name, git dir, commits)
  if args.repo:
    sources.append((TPU, args.repo, args.commits))
  for given in args.source:
    name, _, where = given.partition('=')
    git_dir, _, commits = where.partition('@')
    if not name or not git_dir:
      parser.error('--source %s: not OWNER/NAME=GIT_DIR[@COMMITS]' % given)
    sources.append((name, git_dir, commits or 'HEAD'))
  if not sources:
    parser.error('give --repo or --source')
  for name, git_dir, _ in sources:
    if not os.path.isdir(git_dir):
      parser.error('%s: %s: no such folder' % (name, git_dir))
  mark = (TABLE_MARK if all(name == TPU for name, _, _ in sources)
          else OTHERS_MARK)
  pythons = []
  for python in args.python:
    # Absolute: the programs run from their own folders.
    found = shutil.which(python) if os.sep not in python else (
        os.path.abspath(python) if os.access(python, os.X_OK) else None)
    if found is None:
      parser.error('--python %s: not an executable' % python)
    pythons.append((found, tensorflow_version(found)))
  work = args.work or tempfile.mkdtemp(prefix='corpus_')
  selected = [s for s in args.programs.split(',') if s]

  def log(line):
    print('corpus: ' + line, file=sys.stderr, flush=True)

  done = {}
  if args.resume:
    with open(args.resume) as f:
      for data in json.load(f):
        row = _row_from_dict(data)
        done[(row.commit, row.program, row.tensorflow)] = row
  # No machine paths: an absolute path keeps its last part only.
  command = 'python scripts/corpus.py ' + ' '.join(
      re.sub(r'(^|=)/[^@=]*/', r'\1.../', a)
      for a in (argv or sys.argv[1:]))
  rows: List[Row] = []

  def save(finished=()):
    """The table and the JSON of every row so far: an interrupted run
    keeps what it ran, and `--resume` goes on from it."""
    so_far = rows + list(finished)
    if args.json:
      with open(args.json, 'w') as f:
        json.dump([dataclasses.asdict(r) for r in so_far], f, indent=1)
    if args.out != '-':
      write_table(args.out, markdown(so_far, command), mark)

  for name, git_dir, commits in sources:
    for commit in [c for c in commits.split(',') if c]:
      current = []

      def on_row(row, current=current):
        current.append(row)
        save(current)

      rows += run_commit(git_dir, commit, pythons, work, selected,
                         args.max_seconds, log, done, on_row, name)
  save()
  if args.out == '-':
    sys.stdout.write(markdown(rows, command))
  return 0


if __name__ == '__main__':
  sys.exit(main())
