r"""Benchmarks bfloat16 against float32: memory, speed, overhead, convergence.

    python scripts/benchmark.py --quick --out /tmp/bench   # minutes
    python scripts/benchmark.py --out /tmp/bench           # full sizes

Every model runs in float32, in bfloat16 through estimator_bf16, and under
TensorFlow's oneDNN bfloat16 rewrite of the float32 graph, side by side.
Writes DIR/results.json (every figure), DIR/results.md (the tables, printed
last), DIR/readme_block.md (the results block of docs/benchmarks.md;
`scripts/update_readme.py DIR` puts it in place) and DIR/convergence.png
(float32 vs bfloat16 loss curves). The method is in docs/benchmarks.md; the
logic in the `benchmarks` package.
"""

import os
import sys

# The CPU allocator keeps the statistics the memory benchmarks read only if
# this is set before TensorFlow is imported (estimator_bf16/memory/peak.py).
os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
# Run from a clone without installing: the repository root holds the
# packages this script uses.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse

from absl import logging


def parse_args(argv=None):
  """Defines and parses the flags."""
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--quick', action='store_true',
                      help='Full-size ResNet-50 and BERT-base, short runs '
                      '(under 15 minutes on 2 cores, plus about 20 for the '
                      'levers section).')
  parser.add_argument('--out', required=True,
                      help='Directory for results.json, results.md, PNG.')
  parser.add_argument('--sections', default='all',
                      help='Comma-separated subset of: kernels, '
                      'kernel_table, models, '
                      'tpu_plans, overhead, build_overhead, keras, '
                      'adafactor, convergence, scaling, levers, fit.')
  parser.add_argument('--time_emulated', action='store_true',
                      help='On a CPU without native bfloat16, time as many '
                      'windows as on a native one. By default each model '
                      'then gets one warm-up step and one window: the '
                      'peers (the oneDNN rewrite, Keras) run TensorFlow\'s '
                      'own emulated bfloat16 kernels, and their ResNet-50 '
                      'step takes minutes.')
  parser.add_argument('--verbose', action='store_true',
                      help="Also show TensorFlow's own INFO logs.")
  return parser.parse_args(argv)


def _sections(text, known):
  if text == 'all':
    return known
  chosen = tuple(s.strip() for s in text.split(',') if s.strip())
  unknown = [s for s in chosen if s not in known]
  if unknown:
    raise SystemExit('--sections: unknown %s; choose from %s.' % (
        ', '.join(unknown), ', '.join(known)))
  return chosen


def main(argv=None):
  args = parse_args(argv)
  # TensorFlow's C++ warnings (one per traced step) only when asked for;
  # read when TensorFlow loads, which is below.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '0' if args.verbose else '2')
  from benchmarks import configs
  from benchmarks import report
  from benchmarks import runner
  from estimator_bf16.platform import cpu_bfloat16
  sections = _sections(args.sections, runner.SECTIONS)
  # Progress lines (absl) at INFO; TensorFlow's Estimator chatter only when
  # asked for.
  logging.set_verbosity(logging.INFO)
  logging.use_absl_handler()
  if not args.verbose:
    import tensorflow as tf
    tf.get_logger().setLevel('ERROR')
  config = configs.get_config('quick' if args.quick else 'full')
  support = cpu_bfloat16.bfloat16_support()
  if support.native is False and not args.time_emulated:
    logging.warning(
        'bfloat16 is emulated on this CPU (%s): the peers run TensorFlow\'s '
        'own bfloat16 kernels, slow here, so each model gets one warm-up '
        'step and one timing window (--time_emulated times them all, and '
        'gives the bfloat16 / float32 step ratio of this package).',
        support.reason)
    config = configs.for_emulated_bfloat16(config)

  results = runner.run(config, args.out, sections)
  table = report.write_outputs(results, args.out)
  print('\nWrote results.json, results.md and the plot to %s\n' % args.out)
  print(table)


if __name__ == '__main__':
  main()
