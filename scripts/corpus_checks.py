"""Judges a corpus row: whether its bfloat16 run meets the target.

A `Row` holds one (commit, program, TensorFlow) and the `Outcome` of each
of its runs; its `verdict` says whether it passes. In bfloat16 the program
must exit 0, train its steps and evaluate, the audit find no problem,
>= `MIN_SHARE` of its matmul/conv FLOPs run in bfloat16, a memory plan be
made, and its eval metrics be the float32 run's, float32, and close in
value (`metric_problems`).
"""

import dataclasses
import math
import re
from typing import Optional

from estimator_bf16.precision import policy
from scripts import corpus_programs

# What a passing bfloat16 run must reach (the target).
MIN_SHARE = 0.95
# Eval metrics within this of the float32 run's: for shares (accuracy and
# the like, in [0, 1]) as a difference, else relative to the larger
# magnitude. Runs of four steps on a few random records move them by
# whole examples; this catches a metric computed wrongly, not noise.
METRIC_TOLERANCE = 0.25
_SHARE_METRICS = re.compile(r'acc|top_?\d|precision|recall|auc', re.I)
# COCO's average precision and recall (AP, AP50, APs, ARmax100, ...): shares
# too. Case matters: 'ap' and 'ar' start other names.
_COCO_SHARES = re.compile(r'^(AP|AR)')


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
  source: str = corpus_programs.TPU

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


def row_from_dict(data):
  """A Row from its `dataclasses.asdict` form (`--json`)."""
  outcomes = {name: Outcome(**data[name]) for name in
              policy.PRECISIONS + ('same_weights',) if name in data}
  fields = {k: v for k, v in data.items() if k not in outcomes}
  return Row(**fields, **outcomes)


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
    problems.append('bfloat16 share %s' % percent(share))
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
  if not same_weights_evaluated(row):
    return metric_problems(row.float32.report, report)
  return (metric_problems(row.float32.report, report, values=False) +
          metric_problems(row.float32.report, same))


def last_evaluation(report):
  """The last evaluation of a run's report (None if it has none)."""
  return ((report or {}).get('evaluations') or [None])[-1]


def same_weights_evaluated(row):
  """Whether the bfloat16 run on the float32 checkpoint evaluated exactly
  those weights: a program that trains `steps=N` more from a checkpoint
  (rather than up to `max_steps`) evaluated other ones."""
  same = last_evaluation(row.same_weights.report)
  reference = last_evaluation(row.float32.report)
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
  ours = last_evaluation(report)
  theirs = last_evaluation(reference)
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


def percent(share):
  """A share as '95.0%' ('n/a' for None)."""
  return 'n/a' if share is None else '%.1f%%' % (100 * share)
