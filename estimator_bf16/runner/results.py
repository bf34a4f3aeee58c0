"""What a program run under the runner reports: `RunResult`, `TrainGraph`.

The records `run_program` returns (`RunResult`, with the first TRAIN graph
as a `TrainGraph` in check mode) and `ProgramError`, raised before anything
runs when the program or an option is bad. `run_report` prints them.
"""

import dataclasses
from typing import Any, List, Optional

from estimator_bf16.precision import policy


class Refusal(Exception):
  """A refusal of the package's own: its message is the whole story.

  The runner's refusals (a bad option, a missing TPU, an unmapped
  `tf.contrib` symbol) derive from this besides their usual type, so
  `run` and `check` recognise them by type, not by message: they print
  `Type: message` on one line, without the traceback through the
  package's internals, unless `--verbose` is given. Errors of the program
  itself keep their traceback.
  """


class ProgramError(Refusal, ValueError):
  """The program cannot be run at all (missing file, bad options)."""


class NoTpuError(Refusal, ValueError):
  """`TPUEstimator(use_tpu=True)` on a host with no TPU the program named."""


@dataclasses.dataclass
class TrainGraph:
  """The first TRAIN graph of the program, as `check` needs it.

  Attributes:
    model_fn: the program's own model_fn (unwrapped).
    params: the params it got, without TPUEstimator's own keys.
    features, labels: nests of `levers.batch_dim.ExampleSpec` of one
      example (shape without the batch, and where the batch goes), as the
      input pipeline delivered them; labels may be None.
    variable_shapes: (name, shape list) of each trainable variable.
    batch_size: the batch the graph was built at, if static.
    use_tpu: whether its estimator trains on a TPU.
    accumulation_note: why the runner cannot split this estimator's batch
      into micro-batches (`--accumulate`), or None when it can.
    input_fn: the input_fn the program passed to `train` (unwrapped), or
      None.
    config: the estimator's RunConfig, or None.
    iterations_per_loop: the TPUEstimator's steps per device loop, or None.
  """
  model_fn: Any
  params: dict
  features: Any
  labels: Any
  variable_shapes: List[Any]
  batch_size: Optional[int]
  use_tpu: bool = False
  accumulation_note: Optional[str] = None
  input_fn: Any = None
  config: Any = None
  iterations_per_loop: Optional[int] = None


@dataclasses.dataclass
class RunResult:
  """What happened while the program ran.

  Attributes:
    program: the program path as given.
    precision: the run's `Precision` (a name given here is parsed once,
      on construction).
    exit_code: the program's exit code (0 when `check` stopped it at train).
    estimators: how many Estimators / TPUEstimators it constructed.
    reports: a `GraphReport` for each TRAIN graph built, in order.
    peak_bytes: measured allocator peak of a training step (`memory=True`),
      0 if not measured.
    peak_tensor_bytes: measured peak of the same step's tensors: variables
      plus what the step allocated, at the bytes each asked for
      (`estimator_bf16.memory.peak.live_tensor_peak`); what the planner
      plans. 0 if not measured. The largest over the program's `train`
      calls.
    train_peak_tensor_bytes: the same for each `train` call, in order.
    local_resolvers: how many empty-name TPU resolvers got the stand-in.
    train_graph: in check mode, the first TRAIN graph (None if none built).
    plans: in check mode, the memory plans `plan_fn` returned:
      {(precision, optimizer): MemoryPlan}.
    fit_plans: in check mode with `--fit`, the
      `estimator_bf16.memory.fit.FitResult` `plan_fn` returned instead.
    plan_error: why the plans are missing, if they are.
    error: the exception that ended the program, formatted, if any.
    stopped_by: the signal that stopped training and ended the program
      ('SIGTERM'), or None.
    stop_checkpoint: the newest checkpoint of the stopped estimator's
      model_dir after the stop (the one a rerun restores), or None.
    reason: for a program that raised, one line: the exception's type and
      message, and the program's line it came from.
    program_flags: names of the absl flags the program defined.
    tf1: whether the program ran with the TF 1.x API.
    tf1_reason: why: the first TF 1.x use found ('file:line: tf.flags'),
      the option that forced it, or what was read without finding one.
    gradient_accumulation_steps: K, micro-batches per update.
    recompute: whether activations were recomputed in backprop.
    kernels: 'auto' or 'bfloat16', as the run's `WrapOptions` held.
    seed: the graph-level seed every Estimator got (`run --seed`), or None.
    micro_batches: for each TPUEstimator with K > 1, (train_batch_size as
      the program gave it, the micro-batch it trained at).
    fit: with `run --fit`, the `estimator_bf16.memory.fit.FitResult` whose
      chosen levers this run trained with; else None.
    xla: with `check --xla`, a `runner.xla_check.XlaCheck`; else None.
    xla_error: with `check --xla`, why the XLA step could not be built or
      compiled (one line), else None.
    memory: whether the step's memory was to be measured (`--memory`).
    train_steps: global steps each `train` call advanced, in order (empty
      when the program never trained).
    evaluations: what each `evaluate` call returned, in order: {metric:
      [value, dtype name]} of its scalar results.
  """
  program: str
  precision: policy.Precision
  exit_code: int = 0
  estimators: int = 0
  reports: list = dataclasses.field(default_factory=list)
  peak_bytes: int = 0
  peak_tensor_bytes: int = 0
  train_peak_tensor_bytes: list = dataclasses.field(default_factory=list)
  local_resolvers: int = 0
  train_graph: Optional[TrainGraph] = None
  plans: Any = dataclasses.field(default_factory=dict)
  fit_plans: Any = None
  plan_error: Optional[str] = None
  error: Optional[str] = None
  stopped_by: Optional[str] = None
  stop_checkpoint: Optional[str] = None
  reason: Optional[str] = None
  program_flags: frozenset = frozenset()
  tf1: bool = False
  tf1_reason: Optional[str] = None
  gradient_accumulation_steps: int = 1
  recompute: bool = False
  kernels: str = 'auto'
  seed: Optional[int] = None
  micro_batches: list = dataclasses.field(default_factory=list)
  fit: Any = None
  xla: Any = None
  xla_error: Optional[str] = None
  memory: bool = False
  train_steps: list = dataclasses.field(default_factory=list)
  evaluations: list = dataclasses.field(default_factory=list)

  def __post_init__(self):
    # `run_program` hands over a `Precision`, kept as it is.
    self.precision = policy.parse_precision(self.precision)

  @property
  def problems(self):
    """Audit problems over all TRAIN graphs, each once, in order."""
    seen = []
    for report in self.reports:
      for problem in report.problems:
        if problem not in seen:
          seen.append(problem)
    return seen
