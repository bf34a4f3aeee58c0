"""How long `check --xla --fit` takes on a ResNet at a user's scale.

    .venv/bin/python -m benchmarks.check_time [--resnet_depth=18]
        [--image_size=224] [--batch=64] [--runs=1]

A user runs `check --precision=bfloat16 --xla --fit --device=tpu-v2` before
booking a TPU, so its wait is part of the product (target: five minutes on
a CPU with native bfloat16). This times that command, in a child process
as the user runs it, on the package's own TPUEstimator program
(`estimator_bf16/apps/train_cli.py --model=resnet`, synthetic images) and
prints the seconds of each run and their median. The command plans the
step under every lever combination, then builds the chosen step inside a
device loop and compiles it with XLA (no XLA step runs: see `check
--xla_steps`).
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = os.path.join('estimator_bf16', 'apps', 'train_cli.py')
CHECK_FLAGS = ('--precision=bfloat16', '--xla', '--fit', '--device=tpu-v2')


def command(model_dir, *, resnet_depth, image_size, batch):
  """The argv of the timed command (run from the repository's folder)."""
  return [sys.executable, '-m', 'estimator_bf16', 'check', *CHECK_FLAGS,
          PROGRAM, '--model=resnet', '--resnet_depth=%d' % resnet_depth,
          '--image_size=%d' % image_size, '--train_batch_size=%d' % batch,
          '--model_dir=' + model_dir]


# Lines of a failed command's stderr shown with its exit code: the
# command's own one-line reason and what led to it.
FAILURE_TAIL_LINES = 15


def time_command(argv, cwd=_REPO):
  """Runs `argv` once; returns {'seconds', 'exit_code', 'result', 'tail'}.

  'result' is the command's last `result:` line (the check's verdict), or
  None; 'tail' its last FAILURE_TAIL_LINES lines of stderr. stdout and
  stderr are kept from the terminal.
  """
  start = time.perf_counter()
  done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True,
                        check=False)
  seconds = time.perf_counter() - start
  results = [line for line in done.stderr.splitlines()
             if line.startswith('result:')]
  return {'seconds': seconds, 'exit_code': done.returncode,
          'result': results[-1] if results else None,
          'tail': done.stderr.splitlines()[-FAILURE_TAIL_LINES:]}


FLAGS = flags.FLAGS
flags.DEFINE_integer('resnet_depth', 18, 'ResNet depth (18, 34, 50, ...).')
flags.DEFINE_integer('image_size', 224, 'Image side in pixels.')
flags.DEFINE_integer('batch', 64, 'Train batch per core.')
flags.DEFINE_integer('runs', 1, 'Timed runs (the median is printed).')


def main(argv):
  del argv
  if FLAGS.runs < 1:
    raise app.UsageError('--runs must be >= 1, got %d.' % FLAGS.runs)
  times = []
  for run in range(FLAGS.runs):
    with tempfile.TemporaryDirectory() as model_dir:
      timed = time_command(command(
          model_dir, resnet_depth=FLAGS.resnet_depth,
          image_size=FLAGS.image_size, batch=FLAGS.batch))
    print('run %d: %.1f s, exit %d, %s' % (run + 1, timed['seconds'],
                                           timed['exit_code'],
                                           timed['result']), flush=True)
    if timed['exit_code']:
      print('the command failed; the end of what it printed:\n' +
            '\n'.join('  ' + line for line in timed['tail']),
            file=sys.stderr)
      return 1
    times.append(timed['seconds'])
  print('check %s on ResNet-%d, %d px, batch %d: median %.1f s of %d run(s)'
        % (' '.join(CHECK_FLAGS), FLAGS.resnet_depth, FLAGS.image_size,
           FLAGS.batch, statistics.median(times), len(times)))
  return 0


if __name__ == '__main__':
  app.run(main)
