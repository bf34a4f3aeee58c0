"""Writes scikit-learn's digits as MNIST-format TFRecords.

    python -m estimator_bf16.apps.digits_cli --out_dir=data/digits

writes `train.tfrecords` and `test.tfrecords` (see `digits` for the
conversion); `--data_dir=data/digits` then trains on them.
"""

from absl import app
from absl import flags

from estimator_bf16.models import digits


def define_flags(flag_values=flags.FLAGS):
  """Defines this program's flags on `flag_values` (call once)."""
  flags.DEFINE_string('out_dir', None, 'Directory for the TFRecords.',
                      flag_values=flag_values)
  flags.DEFINE_integer('seed', 0, 'Seed of the train/test split.',
                       flag_values=flag_values)
  flags.mark_flag_as_required('out_dir', flag_values=flag_values)


def main(argv):
  del argv
  out_dir = flags.FLAGS.out_dir
  counts = digits.write_digits(out_dir, seed=flags.FLAGS.seed)
  print('Wrote %d train and %d test examples to %s' %
        (counts['train'], counts['test'], out_dir))


if __name__ == '__main__':
  define_flags()
  app.run(main)
