"""Training throughput, measured side by side.

This machine is shared, so its speed drifts while a benchmark runs. The
variants being compared therefore run in one process, alternating: each
round times one window of every variant, so a slow spell hits them alike.
Each window is a few steps after warm-up; a variant's examples/sec is the
median over its windows, and a ratio is the median over rounds of the ratio
of that round's two windows.

Which variant ran just before a window matters too. Sessions of one process
share the CPU's caches, TensorFlow's allocator and oneDNN's cache of
compiled kernels, and a window that follows another graph (a float32 one
before a bfloat16 one, say) can start colder than one that follows its own.
`window_order` therefore arranges the rounds, and the warm-up before them,
so that no variant is favoured by what ran before its windows.
"""

import statistics
import time


def _time_window(run_step, steps):
  start = time.perf_counter()
  for _ in range(steps):
    run_step()
  return time.perf_counter() - start


def window_order(names, windows):
  """The order of the windows: one list of all `names` per round.

  Two variants run A B, B A, A B, ...: each follows itself and the other
  equally often. Three run A B C, A C B, A B C, ...: none follows itself,
  and each follows each of the other two once every two rounds. (Reversing
  the whole order in odd rounds, A B C then C B A, would not do: A and C
  would follow themselves every other round and B never would, and C would
  never follow A.) The warm-up of `alternating_windows` runs in the order
  of round -1, `window_order(names, 2)[1]`, so the first timed window has a
  predecessor that keeps the counts even too.

  Args:
    names: the variants, two or three distinct names.
    windows: the number of rounds.

  Returns:
    list of `windows` lists, each a permutation of `names`.

  Raises:
    ValueError: not two or three names, or a name given twice. (The
      alternation above leaves some pairs of four variants never
      adjacent; timing four needs an order of its own.)
  """
  names = list(names)
  if len(names) not in (2, 3) or len(set(names)) != len(names):
    raise ValueError('window_order balances two or three distinct variants, '
                     'got %r.' % (names,))
  other = names[::-1] if len(names) == 2 else names[:1] + names[:0:-1]
  return [list(names if r % 2 == 0 else other) for r in range(windows)]


def alternating_windows(variants, *, warmup_steps, window_steps, windows):
  """Times variants in alternating windows.

  Args:
    variants: dict {name: (run_step, examples_per_step)}; `run_step()` runs
      one training step. Two or three variants (`window_order`).
    warmup_steps: untimed steps of each variant first.
    window_steps: steps per timed window.
    windows: timed windows per variant.

  Returns:
    dict {name: list of examples/sec, one per window, in round order}.
  """
  names = list(variants)
  # Warm up in the order of the round before the first, so the first
  # window's predecessor keeps `window_order`'s balance.
  for name in window_order(names, 2)[1]:
    run_step, _ = variants[name]
    for _ in range(warmup_steps):
      run_step()
  rates = {name: [] for name in names}
  for order in window_order(names, windows):
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
    this machine; None from a single round, which has no spread) and
    'windows' (the raw rates).
  """
  ratios = [a / b for a, b in zip(rates[numerator], rates[denominator])]
  iqr = None
  if len(ratios) >= 2:
    quartiles = statistics.quantiles(ratios, n=4)
    iqr = [quartiles[0], quartiles[2]]
  return {
      numerator + '_examples_per_sec': statistics.median(rates[numerator]),
      denominator + '_examples_per_sec': statistics.median(
          rates[denominator]),
      'ratio': statistics.median(ratios),
      'ratio_iqr': iqr,
      'windows': {name: rates[name] for name in (numerator, denominator)},
  }
