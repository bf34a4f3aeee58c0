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
run's metrics, float32, and close in value (docs/corpus.md). A program
whose float32 run fails is listed with its own reason and counts as not
runnable, not as a failure of bfloat16.

This file is the command line; the jobs are modules of their own:
`corpus_programs` reads the programs out of a git directory,
`corpus_runs` runs them, `corpus_checks` judges each row against the
target, and `corpus_table` writes the Markdown.
"""

import argparse
import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TF_LOG_LEVEL = 'TF_CPP_MIN_LOG_LEVEL'


def main(argv=None):
  """The command line: runs the sources given, writes the table.

  The import path and the environment are changed here, while main runs,
  and put back after: importing this module changes neither.
  """
  # Run as a file (`python scripts/corpus.py`, as docs/corpus.md does),
  # the import path starts at scripts/, not at the repository root that
  # `scripts.*`, `estimator_bf16` and `tests.support` (which corpus_data
  # imports when it writes JPEG records) are found under.
  sys.path.insert(0, _REPO_ROOT)
  # This process imports TensorFlow (with estimator_bf16) and writes
  # records with it: its C++ notes are noise. The programs' runs do not
  # inherit this (`corpus_runs` takes it out of their environment).
  quiet = _TF_LOG_LEVEL not in os.environ
  if quiet:
    os.environ[_TF_LOG_LEVEL] = '3'
  try:
    return _main(argv)
  finally:
    sys.path.remove(_REPO_ROOT)
    if quiet:
      os.environ.pop(_TF_LOG_LEVEL, None)


def _main(argv):
  """`main`, with the repository root on the import path."""
  # pylint: disable=g-import-not-at-top
  from scripts import corpus_checks
  from scripts import corpus_programs
  from scripts import corpus_runs
  from scripts import corpus_table
  # pylint: enable=g-import-not-at-top
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
  tpu = corpus_programs.TPU
  sources = []  # (name, git dir, commits)
  if args.repo:
    sources.append((tpu, args.repo, args.commits))
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
  mark = (corpus_table.TABLE_MARK if all(name == tpu for name, _, _ in sources)
          else corpus_table.OTHERS_MARK)
  pythons = []
  for python in args.python:
    # Absolute: the programs run from their own folders.
    found = shutil.which(python) if os.sep not in python else (
        os.path.abspath(python) if os.access(python, os.X_OK) else None)
    if found is None:
      parser.error('--python %s: not an executable' % python)
    pythons.append((found, corpus_runs.tensorflow_version(found)))
  work = args.work or tempfile.mkdtemp(prefix='corpus_')
  selected = [s for s in args.programs.split(',') if s]

  def log(line):
    print('corpus: ' + line, file=sys.stderr, flush=True)

  done = {}
  if args.resume:
    with open(args.resume) as f:
      for data in json.load(f):
        row = corpus_checks.row_from_dict(data)
        done[(row.commit, row.program, row.tensorflow)] = row
  # No machine paths: an absolute path keeps its last part only.
  command = 'python scripts/corpus.py ' + ' '.join(
      re.sub(r'(^|=)/[^@=]*/', r'\1.../', a)
      for a in (argv or sys.argv[1:]))
  rows = []  # corpus_checks.Row, in the order they ran

  def save(finished=()):
    """The table and the JSON of every row so far: an interrupted run
    keeps what it ran, and `--resume` goes on from it."""
    so_far = rows + list(finished)
    if args.json:
      with open(args.json, 'w') as f:
        json.dump([dataclasses.asdict(r) for r in so_far], f, indent=1)
    if args.out != '-':
      corpus_table.write_table(args.out,
                               corpus_table.markdown(so_far, command), mark)

  for name, git_dir, commits in sources:
    for commit in [c for c in commits.split(',') if c]:
      current = []

      def on_row(row, current=current):
        current.append(row)
        save(current)

      rows += corpus_runs.run_commit(git_dir, commit, pythons, work,
                                     selected, args.max_seconds, log, done,
                                     on_row, name)
  save()
  if args.out == '-':
    sys.stdout.write(corpus_table.markdown(rows, command))
  return 0


if __name__ == '__main__':
  sys.exit(main())
