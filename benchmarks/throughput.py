"""Training throughput, measured side by side.

This machine is shared, so its speed drifts while a benchmark runs. The
variants being compared therefore run in one process, alternating: round r
times one window of each variant, in the order A B in even rounds and B A in
odd ones, so a slow spell hits both alike. Each window is a few steps after
warm-up; a variant's examples/sec is the median over its windows, and a
ratio is the median over rounds of the ratio of that round's two windows.
"""

import statistics
import time


def _time_window(run_step, steps):
  start = time.perf_counter()
  for _ in range(steps):
    run_step()
  return time.perf_counter() - start


def alternating_windows(variants, *, warmup_steps, window_steps, windows):
  """Times variants in alternating windows.

  Args:
    variants: dict {name: (run_step, examples_per_step)}; `run_step()` runs
      one training step. Two or more variants.
    warmup_steps: untimed steps of each variant first.
    window_steps: steps per timed window.
    windows: timed windows per variant.

  Returns:
    dict {name: list of examples/sec, one per window, in round order}.
  """
  names = list(variants)
  for name in names:
    run_step, _ = variants[name]
    for _ in range(warmup_steps):
      run_step()
  rates = {name: [] for name in names}
  for round_index in range(windows):
    order = names if round_index % 2 == 0 else names[::-1]
    for name in order:
      run_step, examples = variants[name]
      seconds = _time_window(run_step, window_steps)
      rates[name].append(examples * window_steps / seconds)
  return rates


def summarize(rates, numerator, denominator):
  """Medians of two variants and their paired ratio.

  Args:
    rates: what `alternating_windows` returned.
    numerator: name of the variant on top of the ratio.
    denominator: name of the variant below.

  Returns:
    dict: '<name>_examples_per_sec' medians, 'ratio' (median of the
    per-round ratios), 'ratio_iqr' ((q1, q3) of those ratios, the noise of
    this machine) and 'windows' (the raw rates).
  """
  ratios = [a / b for a, b in zip(rates[numerator], rates[denominator])]
  quartiles = (statistics.quantiles(ratios, n=4) if len(ratios) >= 2
               else [ratios[0]] * 3)
  return {
      numerator + '_examples_per_sec': statistics.median(rates[numerator]),
      denominator + '_examples_per_sec': statistics.median(
          rates[denominator]),
      'ratio': statistics.median(ratios),
      'ratio_iqr': [quartiles[0], quartiles[2]],
      'windows': {name: rates[name] for name in (numerator, denominator)},
  }
