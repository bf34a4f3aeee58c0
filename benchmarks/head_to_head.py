r"""Ours against TensorFlow's oneDNN bfloat16 rewrite, in many windows.

    python -m benchmarks.head_to_head --model=resnet50_224px --windows=40

The quick benchmark gives each large model a few one-step windows, enough
for a ratio far from 1 but not for one close to it, where the noise of a
shared machine decides the sign. This runs only the two variants of one
benchmark model (a `configs.find_model` name), ours (bfloat16 through
`eb.wrap_model_fn`) and the rewrite of the float32 graph, in alternating
windows (`throughput.alternating_windows`), and prints the median ratio
ours / rewrite with its interquartile range over the rounds.
"""

import os

os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import dataclasses
import json

import tensorflow as tf

from benchmarks import configs
from benchmarks.configs import REWRITE
from benchmarks import graphs
from benchmarks import throughput

OURS = 'bfloat16'


def compare(spec, *, windows, window_steps=1, warmup_steps=2):
  """Times ours and the rewrite on `spec` in alternating windows.

  Args:
    spec: a `configs.ModelSpec` with its batch size set.
    windows: timed windows per variant (rounds).
    window_steps: training steps per window.
    warmup_steps: untimed steps of each variant first.

  Returns:
    `throughput.summarize(rates, OURS, REWRITE)`: the medians, 'ratio'
    (ours / rewrite) and 'ratio_iqr'.
  """
  steps = {precision: graphs.build_train_step(spec, precision,
                                              spec.batch_size)
           for precision in ('float32', OURS)}
  rates = graphs.time_train_steps(
      {OURS: steps[OURS], REWRITE: steps['float32']},
      session_configs={REWRITE: graphs.onednn_rewrite_config()},
      warmup_steps=warmup_steps, window_steps=window_steps, windows=windows)
  return throughput.summarize(rates, OURS, REWRITE)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', required=True,
                      help='A benchmark model name (benchmarks.configs.'
                      'find_model), e.g. resnet50_224px.')
  parser.add_argument('--batch_size', type=int, default=0,
                      help="Examples per step; 0 keeps the benchmark "
                      "model's (configs.find_model).")
  parser.add_argument('--windows', type=int, default=40,
                      help='Timed windows per variant (>= 2).')
  parser.add_argument('--window_steps', type=int, default=1,
                      help='Training steps per window (>= 1).')
  parser.add_argument('--out', help='JSON file to write.')
  args = parser.parse_args()
  if args.windows < 2 or args.window_steps < 1:
    parser.error('--windows must be >= 2 and --window_steps >= 1.')
  tf.get_logger().setLevel('ERROR')
  try:
    spec = configs.find_model(args.model)
  except KeyError as e:
    parser.error(e.args[0])
  if args.batch_size:
    spec = dataclasses.replace(spec, batch_size=args.batch_size)
  if not spec.batch_size:
    parser.error('%s has no benchmark batch size; give --batch_size.' %
                 args.model)
  result = compare(spec, windows=args.windows,
                   window_steps=args.window_steps)
  q1, q3 = result['ratio_iqr']
  print('%s, batch %d, %d windows of %d step(s): ours %.2f, rewrite %.2f '
        'examples/sec; ours / rewrite %.3f (IQR %.3f-%.3f)' % (
            spec.name, spec.batch_size, args.windows, args.window_steps,
            result[OURS + '_examples_per_sec'],
            result[REWRITE + '_examples_per_sec'], result['ratio'], q1, q3))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(dict(result, model=spec.name, batch_size=spec.batch_size),
                f, indent=2)


if __name__ == '__main__':
  main()
