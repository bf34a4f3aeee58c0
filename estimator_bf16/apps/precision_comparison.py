"""Reads what training runs wrote and compares float32 with bfloat16.

Used by the demo: the loss curve comes from the `train/loss` summaries the
head's host_call wrote into each model_dir, the other numbers from
`training.run` results and a `PeakMemoryHook`. Nothing here is typed in.
"""

import glob
import os

import numpy as np
import tensorflow as tf

from estimator_bf16.platform import cpu_bfloat16
from estimator_bf16.platform.tpu import MiB

LOSS_TAG = 'train/loss'

# (key in a summary row, label in the table, format)
_ROWS = (
    ('accuracy', 'eval accuracy', '%.4f'),
    ('eval_loss', 'eval loss', '%.4f'),
    ('final_train_loss', 'final train loss (mean, last 10%)', '%.4f'),
    ('examples_per_sec', 'examples/sec (training)', '%.0f'),
    ('peak_mib', 'peak training-step memory (MiB)', '%.1f'),
)


def read_scalars(model_dir, tag=LOSS_TAG):
  """Returns the scalar summaries `tag` written into `model_dir` itself.

  Args:
    model_dir: a model directory (its `eval*` subdirectories are skipped).
    tag: summary tag.

  Returns:
    (steps, values): int64 [N] and float64 [N] arrays sorted by step; if a
    step was written twice (a resumed run), the last value wins.
  """
  by_step = {}
  for path in sorted(glob.glob(os.path.join(model_dir, 'events.out.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.tag != tag:
          continue
        # v2 summaries store a tensor, v1 summaries a simple_value.
        number = (float(tf.make_ndarray(value.tensor))
                  if value.HasField('tensor') else value.simple_value)
        by_step[event.step] = number
  steps = np.array(sorted(by_step), dtype=np.int64)
  return steps, np.array([by_step[s] for s in steps], dtype=np.float64)


def summary_row(result, loss_values, peak_bytes):
  """Returns the numbers of one run for the table.

  Args:
    result: the dict `training.run` returned.
    loss_values: training losses in step order (`read_scalars`).
    peak_bytes: the allocator peak of a training step from a
      `PeakMemoryHook` (0 if not measured).

  Returns:
    dict with 'accuracy', 'eval_loss', 'final_train_loss',
    'examples_per_sec', 'peak_mib' (None where not measured) and
    'window_rates' (examples/sec of each timing window).
  """
  tail = max(1, len(loss_values) // 10)
  return {
      'accuracy': result['eval'].get('accuracy'),
      'eval_loss': result['eval'].get('loss'),
      'final_train_loss': (float(np.mean(loss_values[-tail:]))
                           if len(loss_values) else None),
      'examples_per_sec': result['examples_per_sec'],
      'peak_mib': peak_bytes / MiB if peak_bytes else None,
      'window_rates': list(result.get('window_rates') or []),
  }


# Fewer paired windows than this give no spread worth printing.
_MIN_WINDOWS = 3


def speed_spread(rows, base='float32', other='bfloat16'):
  """One line on how steady the speed ratio is, window by window.

  The two precisions train one after the other, so their timing windows
  are paired in order (window i of one with window i of the other) and the
  ratio of each pair taken; the line gives their median and interquartile
  range, and says when that range includes 1.00x (no speed difference
  beyond the machine's noise).

  Args:
    rows: dict {precision: `summary_row` dict}.
    base, other: the denominator and numerator precisions.

  Returns:
    str.
  """
  a, b = rows[base]['window_rates'], rows[other]['window_rates']
  count = min(len(a), len(b))
  if count < _MIN_WINDOWS:
    return ('examples/sec ratio: %d timing window(s), too few for a spread.'
            % count)
  ratios = np.array(b[:count]) / np.array(a[:count])
  low, median, high = np.percentile(ratios, [25, 50, 75])
  line = ('examples/sec %s/%s over %d paired timing windows: median %.2fx, '
          'interquartile range %.2fx-%.2fx' % (other, base, count, median,
                                              low, high))
  if low <= 1.0 <= high:
    line += ' (within noise: the range includes 1.00x)'
  return line + '.'


def _cell(fmt, value):
  return 'n/a' if value is None else fmt % value


def comparison_table(rows, base='float32', other='bfloat16'):
  """Formats a side-by-side table with an `other`/`base` ratio column.

  Args:
    rows: dict {precision: `summary_row` dict}.
    base: the precision in the denominator.
    other: the precision in the numerator.

  Returns:
    str, a fixed-width table, one metric per line.
  """
  header = ('metric', base, other, '%s/%s' % (other, base))
  lines = []
  for key, label, fmt in _ROWS:
    a, b = rows[base].get(key), rows[other].get(key)
    ratio = b / a if a and b is not None else None
    lines.append((label, _cell(fmt, a), _cell(fmt, b), _cell('%.2fx', ratio)))
  widths = [max(len(line[i]) for line in lines + [header]) for i in range(4)]

  def fmt_line(cells):
    return '  '.join([cells[0].ljust(widths[0])] +
                     [c.rjust(w) for c, w in zip(cells[1:], widths[1:])])

  rule = '-' * len(fmt_line(header))
  return '\n'.join([fmt_line(header), rule] + [fmt_line(l) for l in lines])


def cpu_bfloat16_note(cpuinfo=None):
  """Returns a sentence on whether this CPU computes bfloat16 natively.

  Without AVX512-BF16 or AMX, TensorFlow emulates bfloat16 math through
  float32, so local bfloat16 runs are slower (and save less memory) than on
  a TPU, whose matrix units take bfloat16 directly.
  """
  support = cpu_bfloat16.bfloat16_support(cpuinfo)
  if support.native is None:
    return 'CPU bfloat16 support: unknown (%s).' % support.reason
  if support.native:
    return 'This CPU has %s: bfloat16 matmuls run natively here.' % (
        ' and '.join(support.flags))
  return ('This CPU computes bfloat16 through float32 (%s), so the speed and '
          'memory ratios above are no guide to a TPU, where bfloat16 is '
          'native.' % support.reason)


def plot_loss_curves(curves, path, title='Training loss'):
  """Writes a PNG with one training-loss curve per precision.

  Args:
    curves: dict {label: (steps, values)}.
    path: output .png path.
    title: plot title.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')  # no display needed
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
  for label, (steps, values) in sorted(curves.items()):
    axes.plot(steps, values, label=label, linewidth=1.2, alpha=0.85)
  axes.set_yscale('log')
  axes.set_xlabel('step')
  axes.set_ylabel('cross-entropy (log scale)')
  axes.set_title(title)
  axes.grid(True, which='both', alpha=0.3)
  axes.legend()
  figure.tight_layout()
  figure.savefig(path)
  plt.close(figure)
