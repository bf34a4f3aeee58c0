"""Writes the corpus table: the rows as Markdown, into docs/corpus.md.

`markdown` makes the table of `corpus_checks.Row`s with the pass count and
the command that made it; `write_table` puts it below its mark in a file
(docs/corpus.md keeps its text around the tables), or as the whole file.
"""

import os

from scripts import corpus_checks
from scripts import corpus_programs

TABLE_MARK = '<!-- corpus table: scripts/corpus.py writes below -->'
# The table of the other repositories (`--source`), and where a table
# ends when text follows it: every mark starts with `_MARK_START`.
OTHERS_MARK = ('<!-- corpus table of other repositories: scripts/corpus.py '
               'writes below -->')
END_MARK = '<!-- corpus table end -->'
_MARK_START = '<!-- corpus table'


def markdown(rows, command):
  """The table, the pass count, and how it was made."""
  runnable = [r for r in rows if r.verdict()[0] in ('pass', 'fail')]
  passed = [r for r in runnable if r.verdict()[0] == 'pass']
  train_only = [r for r in rows if r.verdict()[0] == 'trains only']
  train_only_passed = [r for r in train_only if r.verdict()[1] == 'pass']
  # tensorflow/tpu's own table names no repository; others' tables do.
  tpu = corpus_programs.TPU
  with_source = any(r.source != tpu for r in rows)
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
      found = corpus_checks.row_metric_problems(row)
      metrics = 'match' if not found else '; '.join(found)
      if not found:
        metrics = ('match (same weights)'
                   if corpus_checks.same_weights_evaluated(row)
                   else 'match (fresh runs)')
    timing = ('%.2fx' % (row.bfloat16.seconds / row.float32.seconds)
              if row.bfloat16.ok and row.float32.ok and row.float32.seconds
              else '')
    lines.append(('| %s' % (row.source + ' | ') if with_source else '| ') +
                 '%s | `%s` | %s | %s | %s | %s | %s | %s | %s | %s | %s%s |'
                 % (row.commit, row.program.replace('models/', '', 1)
                    if row.source == tpu else row.program,
                    row.tensorflow, _cell(row.float32.short()
                                          if not row.note else '-'),
                    _cell(row.bfloat16.short() if not row.note else '-'),
                    corpus_checks.percent(report.get('bfloat16_flop_share'))
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
