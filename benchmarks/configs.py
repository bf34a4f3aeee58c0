"""What the benchmark measures: the models, their sizes and the run lengths.

Both modes train models whose activations, not weights, fill the memory:
`quick_config()` (under 15 minutes on a 2-core CPU, plus about 20 for
the memory levers) runs ResNet-50 on
224x224 images and BERT-base at 128 tokens, batch 32, and the MNIST MLP,
with few steps and short timing windows; `full_config()` runs the same
models with longer windows, more memory rounds and the largest-batch
searches. Every number a benchmark uses comes from here, so a
reader can trace it in one hop.

Adding a model: a row in `_quick_models()` / `_full_models()` (and in
`window_steps`) for a known `family`; a new style of model code (say,
google-research/bert's modeling.py, Keras layers, tf-slim) is first a
builder function and an entry in `benchmarks.graphs.FAMILIES`.
"""

import dataclasses
from typing import Any, Tuple

# The variant name of TensorFlow's oneDNN bfloat16 rewrite of the float32
# graph (a session option), in results, reports and tables.
REWRITE = 'onednn_rewrite'


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """One benchmarked model.

  Attributes:
    name: key under `models` in results.json and the row of the tables.
    family: a key of `benchmarks.graphs.FAMILIES` ('resnet', 'bert',
      'mnist_mlp', ...): which model code builds the network.
    batch_size: batch of the peak-memory and throughput measurements.
    optimizer: name for `estimator_bf16.optimizers.registry.create_optimizer`; the usual
      one for the family (momentum for ResNet, BERT's AdamW, Adam for MLP).
    learning_rate: any sane value: the benchmark times steps, it does not
      need them to converge.
    resnet_depth: ResNet depth (18 or 50 here).
    image_size: side of the (square) input images.
    num_classes: width of the logits.
    bert_preset: `estimator_bf16.models.bert.BertConfig.preset` name.
    seq_length: BERT tokens per example.
    vocab_size: BERT vocabulary; the real WordPiece size, since the embedding
      table is a large share of BERT's parameters and optimizer state.
    budget_mib: the CPU memory budget of the "largest batch that fits"
      search. It is set per model so the search stays within minutes here:
      filling a budget with activations costs compute in proportion.
    memory_batch: a second batch at which float32 and ours are measured
      for memory only (one traced step each, no timing); 0 for none.
      BERT-base's is 64, the batch the seed user needs and the one at which
      its activations, not its float32 optimizer state, fill the memory.
  """
  name: str
  family: str
  batch_size: int
  optimizer: str
  learning_rate: float = 1e-3
  resnet_depth: int = 18
  image_size: int = 28
  num_classes: int = 10
  bert_preset: str = 'small'
  seq_length: int = 128
  vocab_size: int = 30522
  budget_mib: int = 256
  memory_batch: int = 0


# A ResNet-style net small enough to compile with XLA eight times in minutes.
XLA_RESNET18_64PX = ModelSpec('resnet18_64px', 'resnet', batch_size=32,
                              optimizer='momentum', resnet_depth=18,
                              image_size=64, num_classes=10)


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
  """Run lengths and budgets of one benchmark mode.

  Attributes:
    mode: 'quick' or 'full'.
    models: the `ModelSpec`s measured in both precisions.
    warmup_steps: untimed steps before the first window (graph
      optimisation, allocator growth, oneDNN primitive creation).
    window_steps: steps per timed window, per model name (throughput is the
      median over windows).
    windows: timed windows per precision; precisions alternate.
    model_windows: (model name, windows) for models timed in more windows
      than `windows`: those with short steps whose paired ratios spread by
      several percent from window to window (the small nets, the BERT-mini
      style).
    memory_rounds: peak-memory measurements per variant, in alternating
      order; the median is reported (`runner.memory_rounds`).
    batch_tolerance: the search stops when the fitting and failing batches
      are within this fraction of each other.
    max_search_measurements: at most this many measurements per search
      besides the peak at the benchmark batch (each runs two steps at about
      the largest batch, the costliest part of the whole benchmark); 0
      skips the largest-batch searches.
    overhead_model: name of the model of the wrapper-overhead benchmark.
    overhead_batch_size: its batch.
    overhead_window_steps: its steps per window.
    overhead_windows: timed windows per variant in that benchmark (many
      one-step windows: it resolves a difference of a few percent).
    build_overhead_models: names of the models whose model_fn call is
      timed at graph-build time; empty means all.
    build_overhead_calls: timed calls per variant there.
    adafactor_model: name of the model of the Adafactor comparison; '' picks
      the first BERT (its embedding table makes optimizer state matter).
    keras_batch_size: batch of the Keras comparison (MNIST MLP).
    accumulation_runs: (model name, effective batch, K) of the gradient
      accumulation comparison (`benchmarks.levers`): K micro-batches
      against B/K alone and B at once, in bfloat16.
    recompute_runs: (model name, batch) of the recompute comparison.
    both_levers_run: (model name, effective batch, K) measured with both
      levers and compared with the planner's float32 peak at that batch.
    fit_runs: (model name, batch, K) on which the planner is checked
      against the measured step for every lever combination
      (`benchmarks.levers.plan_accuracy`, the section 'fit').
    xla_recompute_runs: (model name, batch) compiled by XLA with and
      without recompute (the section 'xla_recompute').
    xla_planner_runs: (model name or `ModelSpec`, batch) compiled by XLA
      per lever combination and precision, beside the plan (the section
      'xla_planner').
    keras_window_steps: its steps per window.
    convergence_steps: (MNIST MLP steps, BERT steps) of the parity runs.
    convergence_bert_preset: BERT size of the parity run (synthetic task).
    tpu_plans: full-size models the planner answers the "what batch fits a
      v2 / v3 core" question for, besides the benchmarked ones; planning
      builds graphs but never runs them, so they may be far larger than
      this CPU can train (each costs two graph builds, ~a minute for
      BERT-base here).
  """
  mode: str
  models: Tuple[ModelSpec, ...]
  warmup_steps: int = 3
  window_steps: Tuple[Tuple[str, int], ...] = ()
  windows: int = 5
  model_windows: Tuple[Tuple[str, int], ...] = ()
  memory_rounds: int = 3
  batch_tolerance: float = 0.08
  max_search_measurements: int = 6
  overhead_model: str = 'mnist_mlp'
  overhead_batch_size: int = 512
  overhead_window_steps: int = 1
  overhead_windows: int = 400
  build_overhead_models: Tuple[str, ...] = ()
  build_overhead_calls: int = 5
  adafactor_model: str = ''
  keras_batch_size: int = 256
  # Micro-batches where activations, not BERT-base's 1.3 GiB of float32
  # weights and AdamW slots, make most of the peak: the accumulators (one
  # float32 copy of the weights) are then a small part of it.
  accumulation_runs: Tuple[Tuple[str, int, int], ...] = (
      ('bert_base_seq128', 128, 4), ('resnet50_224px', 64, 4))
  # BERT-base at its memory batch (64, the seed user's); ResNet-50 at 32.
  recompute_runs: Tuple[Tuple[str, int], ...] = (
      ('bert_base_seq128', 64), ('resnet50_224px', 32))
  both_levers_run: Tuple[str, int, int] = ('bert_base_seq128', 256, 8)
  # The benchmark models at their batch; K=4 keeps micro-batches of 8 or
  # more, where activations are still a fair part of the step.
  fit_runs: Tuple[Tuple[str, int, int], ...] = (
      ('bert_base_seq128', 32, 4), ('resnet50_224px', 32, 4),
      ('bert_style_mini_seq128', 32, 4), ('keras_style_64px', 64, 4),
      ('slim_style_64px', 64, 4))
  keras_window_steps: int = 40
  convergence_steps: Tuple[int, int] = (300, 150)
  convergence_bert_preset: str = 'tiny'
  tpu_plans: Tuple[ModelSpec, ...] = ()
  # XLA's buffer assignment of the compiled step (benchmarks/xla_levers.py):
  # recompute on and off (model, batch, precision), and the planner per
  # lever combination (model, batch). The full-size models run in float32
  # at small batches: XLA's CPU backend computes bfloat16 products in
  # float32 anyway, and its bfloat16 ResNet-50 step at 32 did not finish
  # in 26 minutes here; in float32 at 8 a step takes about 100 s.
  xla_recompute_runs: Tuple[Tuple[str, int, str], ...] = (
      ('bert_base_seq128', 16, 'float32'), ('resnet50_224px', 8, 'float32'))
  # The MNIST MLP, the BERT-style mini model and a ResNet-18 at 64 px: the
  # reference models, at sizes whose XLA builds take a minute or less here
  # (eight builds each).
  xla_planner_runs: Tuple[Tuple[Any, int], ...] = (
      ('mnist_mlp', 256), ('bert_style_mini_seq128', 32),
      (XLA_RESNET18_64PX, 32))

  def steps_per_window(self, name):
    return dict(self.window_steps).get(name, 5)

  def windows_for(self, name):
    return dict(self.model_windows).get(name, self.windows)

  def model(self, name):
    for spec in self.models:
      if spec.name == name:
        return spec
    raise KeyError('No benchmarked model named %r; have %s.' %
                   (name, ', '.join(m.name for m in self.models)))


# The questions users ask about TPUs are about full-size models: ResNet-50 on
# 224x224 ImageNet and BERT-base at 128 tokens, per core.
RESNET50_224PX = ModelSpec('resnet50_224px', 'resnet', batch_size=0,
                           optimizer='momentum', resnet_depth=50,
                           image_size=224, num_classes=1000)
BERT_BASE_SEQ128 = ModelSpec('bert_base_seq128', 'bert', batch_size=0,
                             optimizer='adamw', bert_preset='base',
                             seq_length=128, num_classes=2)


# BERT-base at 128 tokens, batch 32, trained with BERT's AdamW: the
# benchmark's BERT in both modes; its memory is also measured at batch 64.
BERT_BASE_BATCH32 = ModelSpec('bert_base_seq128', 'bert', batch_size=32,
                              optimizer='adamw', bert_preset='base',
                              seq_length=128, num_classes=2,
                              budget_mib=8192, memory_batch=64)


# The model with a Keras version (benchmarks.keras_baseline).
KERAS_MODEL = 'mnist_mlp'

# The models whose windows are short enough to time many of them (see
# `model_windows`): the small nets, whose steps take milliseconds here, and
# the BERT-mini style (about 0.4 s a step), whose ratio to the rewrite is a
# few percent from 1: four windows gave it an IQR of 0.93-1.07.
_MANY_WINDOWS = (KERAS_MODEL, 'keras_style_64px', 'slim_style_64px',
                 'bert_style_mini_seq128')


def _quick_models():
  """The full-mode sizes: ResNet-50 at 224x224, BERT-base at 128 tokens."""
  return (
      ModelSpec('resnet50_224px', 'resnet', batch_size=32,
                optimizer='momentum', resnet_depth=50, image_size=224,
                num_classes=1000, budget_mib=8192),
      BERT_BASE_BATCH32,
      ModelSpec('mnist_mlp', 'mnist_mlp', batch_size=256, optimizer='adam',
                budget_mib=64),
  ) + _style_models()


def _style_models():
  """One row per code style (estimator_bf16/models/styles), in quick and full mode alike."""
  return (
      ModelSpec('bert_style_mini_seq128', 'bert_style', batch_size=32,
                optimizer='adam', seq_length=128, num_classes=2,
                vocab_size=8192, budget_mib=2048),
      ModelSpec('keras_style_64px', 'keras_style', batch_size=64,
                optimizer='adam', image_size=64, num_classes=4,
                budget_mib=1024),
      ModelSpec('slim_style_64px', 'slim_style', batch_size=64,
                optimizer='adam', image_size=64, num_classes=4,
                budget_mib=1024),
  )


def _full_models():
  return (
      ModelSpec('resnet50_224px', 'resnet', batch_size=32,
                optimizer='momentum', resnet_depth=50, image_size=224,
                num_classes=1000, budget_mib=8192),
      BERT_BASE_BATCH32,
      ModelSpec('mnist_mlp', 'mnist_mlp', batch_size=256, optimizer='adam',
                budget_mib=256),
  ) + _style_models()


def quick_config():
  """Under 15 minutes on a 2-core CPU (and 20 for the levers): full sizes."""
  return BenchmarkConfig(
      mode='quick', models=_quick_models(),
      # One-step windows for ResNet-50 and BERT-base (seconds per step
      # here), interleaved with the other variants' windows, rather than
      # fewer, longer ones.
      # The small nets run about 15 ms a step here: their windows are
      # long enough (a few tenths of a second) that a scheduling hiccup
      # does not decide a ratio.
      window_steps=(('resnet50_224px', 1), ('bert_base_seq128', 1),
                    ('mnist_mlp', 100), ('bert_style_mini_seq128', 2),
                    ('keras_style_64px', 24), ('slim_style_64px', 24)),
      warmup_steps=2, windows=4, max_search_measurements=0,
      # A window of a small net takes a third of a second, one of the
      # BERT-mini style about 0.8 s: ten of them cost 7 to 15 s a model
      # more than four and narrow its ratios' noise to about +-1% (+-3%
      # with four), what telling 0.97 from 1.0 needs.
      model_windows=tuple((name, 10) for name in _MANY_WINDOWS),
      # The judged memory (live tensors) moves by a few MiB at most between
      # rounds; more rounds only show how the allocator's peak moves (full
      # mode).
      memory_rounds=1,
      overhead_windows=300,
      # Large graphs take seconds to build, and this machine's noise is as
      # large as the wrapper's cost there: the MLP and a BERT-mini-sized
      # google-research-style BERT.
      build_overhead_models=('mnist_mlp', 'bert_style_mini_seq128'),
      build_overhead_calls=3,
      convergence_steps=(300, 150), convergence_bert_preset='tiny')


def full_config():
  """The sizes the issue names; an hour or more on a 2-core CPU."""
  return BenchmarkConfig(
      mode='full', models=_full_models(),
      window_steps=(('resnet50_224px', 2), ('bert_base_seq128', 2),
                    ('mnist_mlp', 100), ('bert_style_mini_seq128', 4),
                    ('keras_style_64px', 10), ('slim_style_64px', 10)),
      windows=7, max_search_measurements=4, overhead_windows=1000,
      model_windows=tuple((name, 21) for name in _MANY_WINDOWS),
      build_overhead_calls=7, convergence_steps=(1000, 400),
      convergence_bert_preset='mini',
      tpu_plans=(RESNET50_224PX, BERT_BASE_SEQ128))


# Not in either mode, but a quick one to profile (benchmarks.profile): the
# BERT code at BERT-mini's sizes.
BERT_MINI_BATCH32 = ModelSpec('bert_mini_seq128', 'bert', batch_size=32,
                              optimizer='adamw', bert_preset='mini',
                              seq_length=128, num_classes=2,
                              budget_mib=2048)


# Not in either mode, like BERT-mini: the model_fn of tensorflow/tpu's
# mnist_tpu.py at its default batch (1024) and optimizer (plain SGD), for
# benchmarks.head_to_head and benchmarks.profile.
MNIST_TPU_BATCH1024 = ModelSpec('mnist_tpu_1024', 'mnist_tpu_style',
                                batch_size=1024, optimizer='sgd',
                                learning_rate=0.05, budget_mib=512)


def find_model(name):
  """The `ModelSpec` called `name` in either mode, BERT-mini's or mnist_tpu's.

  Raises:
    KeyError: naming the known models.
  """
  known = {}
  for spec in (_full_models() + _quick_models() +
               (BERT_MINI_BATCH32, MNIST_TPU_BATCH1024)):
    known.setdefault(spec.name, spec)
  if name not in known:
    raise KeyError('No benchmark model named %r; have %s.' %
                   (name, ', '.join(sorted(known))))
  return known[name]


def for_emulated_bfloat16(config):
  """`config` with the least timing that still gives every speed figure.

  Without AVX512-BF16 or AMX, TensorFlow emulates bfloat16 on float32
  copies: a bfloat16 step of ResNet-50 at 224x224 then takes minutes on 2
  cores, and the report judges no speed there (`report.EMULATED_NOTE`).
  Every section gets one warm-up step, and each model and the Keras
  comparison one timing window; sizes, memory rounds and the wrapper
  overhead's and kernel probe's windows stay, so every figure is still
  produced (a ratio from one window has no interquartile range).

  Args:
    config: a `BenchmarkConfig`.

  Returns:
    A copy of `config` with `warmup_steps=1`, `windows=1` and no
    per-model window counts.
  """
  return dataclasses.replace(config, warmup_steps=1, windows=1,
                             model_windows=())


def get_config(mode):
  """Returns the `BenchmarkConfig` of `mode` ('quick' or 'full')."""
  if mode not in ('quick', 'full'):
    raise ValueError("mode must be 'quick' or 'full', got %r." % (mode,))
  return quick_config() if mode == 'quick' else full_config()
