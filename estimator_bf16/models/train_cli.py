r"""Trains, evaluates and exports a reference model in float32 or bfloat16.

    python -m estimator_bf16.models.train_cli --model=mnist_mlp --precision=bfloat16 \
        --model_dir=runs/mnist_bf16

Without --data_dir each model reads built-in data (scikit-learn's digits for
the MNIST nets, synthetic data for ResNet and BERT) at small default sizes.
On a Cloud TPU add --use_tpu --tpu=NAME and a gs:// --model_dir/--data_dir;
the code is the same. The loop lives in `estimator_bf16/models/training.py`; the per-model
defaults of unset flags in `estimator_bf16/models/registry.py` (`DEFAULTS`).

Data parallel: --distribute=mirrored uses the local GPUs (or, with
--cpu_devices=N, N logical CPU devices); --distribute=multi_worker runs one
process per host, described by TF_CONFIG (`python -m estimator_bf16.launch
--workers=2 -- python -m estimator_bf16.models.train_cli ...` writes it on one machine). See
docs/distribute.md.

Rerunning the same command resumes from the last checkpoint. On SIGTERM the
run writes a checkpoint and exits with status 143; bad data, a NaN/Inf
(with --numeric_guard, the default) or an unusable --model_dir exit with
status 1 and a message naming the file, step or flag.
"""

import dataclasses
import json
import signal
import sys

from absl import app
from absl import flags

import estimator_bf16 as eb
from estimator_bf16.models import bert
from estimator_bf16.models import registry
from estimator_bf16.models import training
from estimator_bf16 import optimizers
from estimator_bf16 import strategies

# Stopped by SIGTERM after writing a checkpoint: the usual 128 + signal.
PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM


def define_flags(flag_values=flags.FLAGS):
  """Defines the flags of this program on `flag_values` (call once)."""
  f = flag_values

  def string(name, default, help_text):
    flags.DEFINE_string(name, default, help_text, flag_values=f)

  def integer(name, default, help_text, lower_bound=1):
    flags.DEFINE_integer(name, default, help_text, lower_bound=lower_bound,
                         flag_values=f)

  flags.DEFINE_enum('model', None, registry.MODELS, 'Model family.',
                    flag_values=f)
  flags.DEFINE_enum('precision', 'float32', eb.PRECISIONS,
                    'Compute precision; variables stay float32 either way.',
                    flag_values=f)
  string('model_dir', None, 'Checkpoints, summaries and the export.')
  string('data_dir', None, 'TFRecords of a real data set; unset: built-in '
         'data (digits or synthetic).')
  string('dataset', None, 'One of registry.DATASETS[model]; unset: the real '
         'one with --data_dir, else the built-in one.')
  integer('train_steps', None, 'Training steps (global, not per core).')
  integer('eval_steps', None, 'Eval batches; unset: the whole eval split.')
  integer('train_batch_size', None, 'Global training batch.')
  integer('eval_batch_size', None, 'Global eval batch.')
  integer('save_checkpoints_steps', None, 'Checkpoint every N steps.')
  integer('keep_checkpoint_max', 5, 'Checkpoints kept.')
  flags.DEFINE_bool('use_tpu', False, 'Run on a Cloud TPU.', flag_values=f)
  string('tpu', None, "TPU name or address ('local' on a TPU VM).")
  string('tpu_zone', None, 'GCE zone of the TPU.')
  string('gcp_project', None, 'GCP project of the TPU.')
  integer('iterations_per_loop', 100, 'Steps per TPU loop.')
  integer('num_shards', None, 'TPU cores (8 on a v2-8 or v3-8).')
  flags.DEFINE_enum('distribute', None, strategies.KINDS,
                    'Data parallelism on CPUs/GPUs: mirrored (this '
                    "process's devices) or multi_worker (hosts, TF_CONFIG); "
                    'unset: one device.', flag_values=f)
  integer('cpu_devices', None, 'With --distribute=mirrored: split the CPU '
          'into N logical devices (to try replicas without GPUs).')
  flags.DEFINE_float('worker_timeout_secs',
                     strategies.DEFAULT_TIMEOUT_SECONDS,
                     'With --distribute=multi_worker: a task that waits this '
                     'long for another fails, naming it.', lower_bound=1.0,
                     flag_values=f)
  flags.DEFINE_enum('optimizer', None, optimizers.OPTIMIZERS,
                    'Optimizer; unset: the model default.', flag_values=f)
  flags.DEFINE_float('learning_rate', None, 'Peak learning rate.',
                     flag_values=f)
  flags.DEFINE_float('weight_decay', None, 'L2 coefficient (AdamW: decay '
                     'rate).', flag_values=f)
  integer('warmup_steps', None, 'Linear warm-up steps.', lower_bound=0)
  integer('resnet_depth', None, 'ResNet depth: 18, 34, 50, 101 or 152.')
  integer('image_size', None, 'Square image side.')
  integer('num_classes', None, 'Classes (BERT: labels).')
  flags.DEFINE_enum('bert_preset', None, bert.PRESETS, 'BERT size preset.',
                    flag_values=f)
  integer('seq_length', None, 'BERT sequence length.')
  integer('vocab_size', None, 'BERT vocabulary size.')
  integer('seed', 0, 'Seed of initialisation and data order.', lower_bound=0)
  integer('log_every_steps', 100, 'Log the step and examples/sec this often.')
  flags.DEFINE_bool('export', True, 'Export a float32 SavedModel.',
                    flag_values=f)
  flags.DEFINE_bool('numeric_guard', True, 'Stop with the step and tensor '
                    'named when the loss or a gradient is NaN/Inf, before '
                    'that update is applied (local runs).', flag_values=f)
  flags.DEFINE_bool('skip_corrupt_records', False, 'Skip the unreadable '
                    'rest of a corrupt or truncated TFRecord file, counting '
                    'such files on stderr, instead of failing.',
                    flag_values=f)
  integer('activation_stats_steps', 0, 'Every N steps, measure max |x| and '
          'the underflow share of each bfloat16 activation (debug; 0: off).',
          lower_bound=0)
  flags.mark_flags_as_required(['model', 'model_dir'], flag_values=f)


def options_from_flags(flag_values=flags.FLAGS):
  """Returns the `training.TrainOptions` the parsed flags describe."""
  names = [field.name for field in dataclasses.fields(training.TrainOptions)]
  return training.TrainOptions(**{name: flag_values[name].value
                                   for name in names})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Unexpected arguments: %s' % ' '.join(argv[1:]))
  try:
    # Checks every option before TensorFlow builds anything.
    result = training.run(training.prepare(options_from_flags()))
  except training.OptionError as e:
    raise app.UsageError(str(e)) from e
  except training.FAILURES as e:
    # A clear message, not a traceback: the data, the numbers or model_dir
    # need fixing, not the program.
    sys.exit('error: %s' % e)
  if result['preempted']:
    # Not done: a supervisor that restarts on a non-zero status resumes it.
    sys.exit(PREEMPTED_EXIT_STATUS)
  print(json.dumps({key: result[key] for key in
                    ('eval', 'examples_per_sec', 'train_seconds',
                     'export_dir')}, indent=2, sort_keys=True))


def run(argv=None):
  """Console entry point (`estimator-bf16-train`)."""
  if eb.BACKEND == 'compat':
    # TensorFlow 2.16+: the reference models name tf.estimator (ModeKeys,
    # TPUEstimatorSpec); this program opts in to the stand-in explicitly.
    eb.compat.install()
  define_flags()
  _help_names_this_program()
  app.run(main, argv=argv)


def _help_names_this_program(flag_values=flags.FLAGS):
  """Makes --help list this program's flags and usage under any launcher.

  absl's --help shows the flags and docstring of the main module, found by
  `sys.argv[0]`. Run as `python -m`, that is this module; run as the
  `estimator-bf16-train` console script it is the generated launcher, which
  defines nothing, so --help would list no flag at all.
  """
  main_module = sys.modules['__main__']
  if main_module.__doc__ is None:
    main_module.__doc__ = __doc__
  for flag in flag_values.get_key_flags_for_module(__name__):
    flag_values.register_key_flag_for_module(sys.argv[0], flag)


if __name__ == '__main__':
  run()
