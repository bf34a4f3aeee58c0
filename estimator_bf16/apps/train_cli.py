r"""Trains, evaluates and exports a reference model in float32 or bfloat16.

    python -m estimator_bf16.apps.train_cli --model=mnist_mlp --precision=bfloat16 \
        --model_dir=runs/mnist_bf16

Without --data_dir each model reads built-in data (scikit-learn's digits for
the MNIST nets, synthetic data for ResNet and BERT) at small default sizes.
On a Cloud TPU add --use_tpu --tpu=NAME and a gs:// --model_dir/--data_dir;
the code is the same. The loop lives in `estimator_bf16/apps/training.py`; the per-model
defaults of unset flags in `estimator_bf16/apps/registry.py` (`DEFAULTS`).

Data parallel: --distribute=mirrored uses the local GPUs (or, with
--cpu_devices=N, N logical CPU devices); --distribute=multi_worker runs one
process per host, described by TF_CONFIG (`python -m estimator_bf16.apps.launch
--workers=2 -- python -m estimator_bf16.apps.train_cli ...` writes it on one machine). See
docs/distribute.md.

Rerunning the same command resumes from the last checkpoint. On SIGTERM the
run writes a checkpoint and exits with status 143, on a first Ctrl-C
(SIGINT) the same with 130 (a second Ctrl-C stops at once); bad data, a NaN/Inf
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
from estimator_bf16.apps import registry
from estimator_bf16.apps import train_options
from estimator_bf16.apps import training
from estimator_bf16.distribute import strategies
from estimator_bf16.models import bert
from estimator_bf16.optimizers import registry as optimizers
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import quiet

# Stopped by a signal after writing a checkpoint: the usual 128 + signal.
PREEMPTED_EXIT_STATUS = 128 + signal.SIGTERM
INTERRUPTED_EXIT_STATUS = 128 + signal.SIGINT
_OPTION_FIELDS = {field.name: field
                  for field in dataclasses.fields(train_options.TrainOptions)}


def _default(name):
  """The default of `TrainOptions`' field `name` (None if none)."""
  field = _OPTION_FIELDS[name]
  return None if field.default is dataclasses.MISSING else field.default


def define_flags(flag_values=flags.FLAGS):
  """Defines the flags of this program on `flag_values` (call once).

  Each flag's default is its `train_options.TrainOptions` field's default
  (None for the required --model and --model_dir): one source for both.
  """
  f = flag_values

  def string(name, help_text):
    flags.DEFINE_string(name, _default(name), help_text, flag_values=f)

  def integer(name, help_text, lower_bound=1):
    flags.DEFINE_integer(name, _default(name), help_text,
                         lower_bound=lower_bound, flag_values=f)

  def real(name, help_text, **kwargs):
    flags.DEFINE_float(name, _default(name), help_text, flag_values=f,
                       **kwargs)

  def boolean(name, help_text):
    flags.DEFINE_bool(name, _default(name), help_text, flag_values=f)

  def enum(name, choices, help_text):
    flags.DEFINE_enum(name, _default(name), choices, help_text,
                      flag_values=f)

  enum('model', registry.MODELS, 'Model family.')
  enum('precision', eb.PRECISIONS,
       'Compute precision; variables stay float32 either way.')
  string('model_dir', 'Checkpoints, summaries and the export.')
  string('data_dir', 'TFRecords of a real data set; unset: built-in data '
         '(digits or synthetic).')
  string('dataset', 'One of registry.DATASETS[model]; unset: the real one '
         'with --data_dir, else the built-in one.')
  integer('train_steps', 'Training steps (global, not per core).')
  integer('eval_steps', 'Eval batches; unset: the whole eval split.')
  integer('train_batch_size', 'Global training batch.')
  integer('eval_batch_size', 'Global eval batch.')
  integer('save_checkpoints_steps', 'Checkpoint every N steps.')
  integer('keep_checkpoint_max', 'Checkpoints kept.')
  boolean('use_tpu', 'Run on a Cloud TPU.')
  string('tpu', "TPU name or address ('local' on a TPU VM).")
  string('tpu_zone', 'GCE zone of the TPU.')
  string('gcp_project', 'GCP project of the TPU.')
  integer('iterations_per_loop', 'Steps per TPU loop.')
  integer('num_shards', 'TPU cores (8 on a v2-8 or v3-8).')
  enum('distribute', strategies.KINDS,
       "Data parallelism on CPUs/GPUs: mirrored (this process's devices) or "
       'multi_worker (hosts, TF_CONFIG); unset: one device.')
  integer('cpu_devices', 'With --distribute=mirrored: split the CPU into N '
          'logical devices (to try replicas without GPUs).')
  real('worker_timeout_secs', 'With --distribute=multi_worker: a task that '
       'waits this long for another fails, naming it.', lower_bound=1.0)
  enum('optimizer', optimizers.OPTIMIZERS,
       'Optimizer; unset: the model default.')
  real('learning_rate', 'Peak learning rate.')
  real('weight_decay', 'L2 coefficient (AdamW: decay rate).')
  integer('warmup_steps', 'Linear warm-up steps.', lower_bound=0)
  integer('resnet_depth', 'ResNet depth: 18, 34, 50, 101 or 152.')
  integer('image_size', 'Square image side.')
  integer('num_classes', 'Classes (BERT: labels).')
  enum('bert_preset', bert.PRESETS, 'BERT size preset.')
  integer('seq_length', 'BERT sequence length.')
  integer('vocab_size', 'BERT vocabulary size.')
  integer('seed', 'Seed of initialisation and data order.', lower_bound=0)
  integer('log_every_steps', 'Off a terminal, log the step of total, loss, '
          'examples/sec and time left at multiples of this (and at the '
          'first and last step); on a terminal a progress bar shows them.')
  boolean('export', 'Export a float32 SavedModel.')
  boolean('numeric_guard', 'Stop with the step and tensor named when the '
          'loss or a gradient is NaN/Inf, before that update is applied '
          '(local runs).')
  boolean('skip_corrupt_records', 'Skip the unreadable rest of a corrupt or '
          'truncated TFRecord file, counting such files on stderr, instead '
          'of failing.')
  integer('activation_stats_steps', 'Every N steps, measure max |x| and the '
          'underflow share of each bfloat16 activation (debug; 0: off).',
          lower_bound=0)
  integer('accumulate', 'Gradient accumulation: each update applies the '
          'mean gradient of N micro-batches of train_batch_size / N; '
          'train_steps counts updates.')
  boolean('recompute', 'Recompute activations during backprop instead of '
          'keeping them: a lower peak for about one more forward pass.')
  # Read before TensorFlow loads (estimator_bf16.platform.quiet), so it is
  # no TrainOptions field.
  flags.DEFINE_bool('verbose', False, quiet.VERBOSE_HELP, flag_values=f)
  flags.mark_flags_as_required(['model', 'model_dir'], flag_values=f)


def options_from_flags(flag_values=flags.FLAGS):
  """Returns the `train_options.TrainOptions` the parsed flags describe."""
  names = [field.name
           for field in dataclasses.fields(train_options.TrainOptions)]
  return train_options.TrainOptions(**{name: flag_values[name].value
                                       for name in names})


def main(argv):
  if len(argv) > 1:
    raise app.UsageError('Unexpected arguments: %s' % ' '.join(argv[1:]))
  try:
    # Checks every option before TensorFlow builds anything.
    # TensorFlow's deprecation notices (dozens, for the TPUEstimator API
    # this command is built on) go too: nothing a user can act on.
    with quiet.tensorflow_logs_once(hide_info=not flags.FLAGS.verbose), \
        quiet.deprecation_notices_hidden():
      result = training.run(train_options.prepare(options_from_flags()))
  except KeyboardInterrupt:
    # Ctrl-C outside training, or a second one: stopped at once.
    print('interrupted: stopped at once; rerun the same command to resume '
          'from the last checkpoint written.', file=sys.stderr)
    sys.exit(INTERRUPTED_EXIT_STATUS)
  except train_options.OptionError as e:
    # The message alone: it names the flag, and a usage dump of every flag
    # would bury it.
    sys.exit('error: %s' % e)
  except training.FAILURES as e:
    # A clear message, not a traceback: the data, the numbers or model_dir
    # need fixing, not the program.
    sys.exit('error: %s' % e)
  if result['preempted']:
    # Not done: a supervisor that restarts on a non-zero status resumes it.
    sys.exit(INTERRUPTED_EXIT_STATUS if result['stopped_by'] == 'SIGINT'
             else PREEMPTED_EXIT_STATUS)
  print(json.dumps({key: result[key] for key in
                    ('eval', 'examples_per_sec', 'train_seconds',
                     'export_dir')}, indent=2, sort_keys=True))


def run(argv=None):
  """Console entry point (`estimator-bf16-train`)."""
  if eb.BACKEND == backend_lib.COMPAT_BACKEND:
    # TensorFlow 2.16+: the reference models name tf.estimator (ModeKeys,
    # TPUEstimatorSpec); this program opts in to the stand-in explicitly.
    eb.compat.install()
  define_flags()
  _help_names_this_program()
  try:
    app.run(main, argv=argv)
  except SystemExit as e:
    # absl ends --help with status 1; asking for help is no failure.
    if e.code == 1 and _HELP_FLAGS & set(sys.argv if argv is None else argv):
      raise SystemExit(0) from None
    raise


_HELP_FLAGS = frozenset(['--help', '-help', '--helpshort', '--helpfull',
                         '-?'])


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
