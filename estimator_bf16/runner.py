"""Runs an unmodified Estimator / TPUEstimator program in bfloat16.

    result = run_program('mnist_tpu.py', ['--use_tpu=false', ...],
                         precision='bfloat16')

The program runs as `__main__`, as `python PROGRAM.py ARGS` runs it:
`sys.argv`, `sys.path[0]` (the program's folder, so its sibling imports
resolve), absl flags and `app.run` behave the same. While it runs:

* every Estimator / TPUEstimator it constructs gets its model_fn wrapped with
  `eb.wrap_model_fn(model_fn, precision, audit, exclude)` and, in bfloat16,
  `params['precision']`;
* every input_fn given to such an estimator's `train` / `evaluate` /
  `predict` (also the calls `tf.estimator.train_and_evaluate` makes) is
  wrapped with `eb.wrap_input_fn`;
* `TPUClusterResolver('')` gets a local stand-in when no TPU is around
  (`estimator_bf16.tpu_resolver`);
* on TensorFlow 2.16+ the compat backend is installed first, so
  `tf.estimator` imports resolve;
* a TF 1.x program (`import tensorflow as tf` with `tf.flags`,
  `tf.contrib`, ...; `estimator_bf16.tf1.detect`, or forced with `tf1`)
  and the modules it imports from its folder and `tf1_paths` see
  `tensorflow` as TF 1.x (`estimator_bf16.tf1.Tf1Scope`); libraries keep
  the real module;
* a SIGTERM during such a `train` call (a preemptible VM's notice) stops
  training after the current step (TPU loop), the Estimator writes a
  checkpoint of that step as it closes, and the program ends there with
  exit code 143, without evaluating or exporting
  (`estimator_bf16.preemption`). A second SIGTERM exits at once.

Everything is put back when the program ends, also when it raises or exits.
With `precision='float32'` the graph is not changed: the model_fn is only
observed, to report its FLOP share, and params are left alone.
"""

import contextlib
import dataclasses
import functools
import inspect
import os
import runpy
import shutil
import signal
import sys
import tempfile
import threading
import traceback
from typing import Any, List, Optional
import weakref

from absl import flags
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16 import accumulation
from estimator_bf16 import levers as levers_lib
from estimator_bf16 import peak_memory as memory_lib
from estimator_bf16 import preemption
from estimator_bf16 import quiet
from estimator_bf16 import tpu_resolver
from estimator_bf16 import tf1 as tf1_lib

AUDIT_MODES = ('strict', 'warn', 'off')
_TRAIN = 'train'  # ModeKeys.TRAIN in both backends.
# TPUEstimator's own params; never passed on to the memory planner.
_TPU_PARAMS = ('batch_size', 'use_tpu', 'context', 'precision')


class ProgramError(ValueError):
  """The program cannot be run at all (missing file, bad options)."""


class _Preempted(BaseException):
  """Raised out of a `train` call that a signal stopped, to end the program.

  A BaseException, like SystemExit: the program's `except Exception` must
  not carry on into evaluation or export on a machine that is going away.
  """

  def __init__(self, signal_name, checkpoint):
    super().__init__(signal_name, checkpoint)
    self.signal_name = signal_name
    self.checkpoint = checkpoint


class _TrainGraphBuilt(BaseException):
  """Raised out of the first TRAIN model_fn call in check mode.

  A BaseException, like SystemExit: a program's `except Exception` around
  `train` must not swallow it.
  """


@dataclasses.dataclass
class TrainGraph:
  """The first TRAIN graph of the program, as `check` needs it.

  Attributes:
    model_fn: the program's own model_fn (unwrapped).
    params: the params it got, without TPUEstimator's own keys.
    features, labels: nests of `tf.TensorSpec` of one example (no batch
      dimension), as the input pipeline delivered them; labels may be None.
    variable_shapes: (name, shape list) of each trainable variable.
    batch_size: the batch the graph was built at, if static.
    use_tpu: whether its estimator trains on a TPU.
    accumulation_note: why the runner cannot split this estimator's batch
      into micro-batches (`--accumulate`), or None when it can.
  """
  model_fn: Any
  params: dict
  features: Any
  labels: Any
  variable_shapes: List[Any]
  batch_size: Optional[int]
  use_tpu: bool = False
  accumulation_note: Optional[str] = None


@dataclasses.dataclass
class RunResult:
  """What happened while the program ran.

  Attributes:
    program: the program path as given.
    precision: 'float32' or 'bfloat16'.
    exit_code: the program's exit code (0 when `check` stopped it at train).
    estimators: how many Estimators / TPUEstimators it constructed.
    reports: a `GraphReport` for each TRAIN graph built, in order.
    peak_bytes: measured allocator peak of a training step (`memory=True`),
      0 if not measured.
    peak_tensor_bytes: measured peak of the same step's tensors: variables
      plus what the step allocated, at the bytes each asked for
      (`peak_memory.live_tensor_peak`); what the planner plans. 0 if not
      measured. The largest over the program's `train` calls.
    train_peak_tensor_bytes: the same for each `train` call, in order.
    local_resolvers: how many empty-name TPU resolvers got the stand-in.
    train_graph: in check mode, the first TRAIN graph (None if none built).
    plans: in check mode, what `plan_fn` returned: {(precision, optimizer):
      MemoryPlan}, or with `check --fit` an `estimator_bf16.fit.FitResult`.
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
    micro_batches: for each TPUEstimator with K > 1, (train_batch_size as
      the program gave it, the micro-batch it trained at).
    fit: with `run --fit`, the `estimator_bf16.fit.FitResult` whose chosen
      levers this run trained with; else None.
  """
  program: str
  precision: str
  exit_code: int = 0
  estimators: int = 0
  reports: list = dataclasses.field(default_factory=list)
  peak_bytes: int = 0
  peak_tensor_bytes: int = 0
  train_peak_tensor_bytes: list = dataclasses.field(default_factory=list)
  local_resolvers: int = 0
  train_graph: Optional[TrainGraph] = None
  plans: Any = dataclasses.field(default_factory=dict)
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
  micro_batches: list = dataclasses.field(default_factory=list)
  fit: Any = None

  @property
  def problems(self):
    """Audit problems over all TRAIN graphs, each once, in order."""
    seen = []
    for report in self.reports:
      for problem in report.problems:
        if problem not in seen:
          seen.append(problem)
    return seen


def _estimator_classes():
  """(Estimator base, TPUEstimator) pairs of each backend importable here."""
  pairs = [(eb.compat.Estimator, eb.compat.TPUEstimator)]
  if eb.BACKEND == 'tf_estimator':
    # pylint: disable=g-import-not-at-top
    from tensorflow_estimator.python.estimator import estimator as tfe
    from tensorflow_estimator.python.estimator.tpu import tpu_estimator
    # pylint: enable=g-import-not-at-top
    pairs.append((tfe.Estimator, tpu_estimator.TPUEstimator))
  return pairs


def _spec_of_example(tensor):
  if not isinstance(tensor, tf.Tensor):
    raise TypeError('the memory plan needs dense features; got %r' % (tensor,))
  return tf.TensorSpec(tensor.shape[1:], tensor.dtype)


def _static_batch(features):
  for tensor in tf.nest.flatten(features):
    if isinstance(tensor, tf.Tensor) and tensor.shape.rank:
      return tensor.shape.as_list()[0]
  return None


class _Session(object):
  """The patches and bookkeeping of one program run."""

  def __init__(self, precision, audit, exclude, memory, check, result):
    self.steps = result.gradient_accumulation_steps
    self.recompute = result.recompute
    self.precision = precision
    self.audit = audit
    self.exclude = exclude
    self.memory = memory
    self.check = check
    self.result = result
    self.estimators = weakref.WeakSet()
    self.hooks = []
    self._local = threading.local()
    self._scratch = None

  def scratch_dir(self):
    """A fresh folder for check mode's model_dirs; see `close`."""
    if self._scratch is None:
      self._scratch = tempfile.mkdtemp(prefix='estimator_bf16_check_')
    return self._scratch

  def close(self):
    if self._scratch is not None:
      shutil.rmtree(self._scratch, ignore_errors=True)

  # The model_fn -----------------------------------------------------------

  def wrap_model_fn(self, model_fn, estimator_facts=None):
    """The program's model_fn, wrapped and observed.

    `estimator_facts` (keyword arguments of `TrainGraph`: `use_tpu`,
    `accumulation_note`) describe the estimator it was given to.

    Inside: `eb.wrap_model_fn` around a pass-through that remembers the raw
    loss (the wrapper's spec carries the float32 cast of it, and the report
    must say when the program's own loss was not float32). Outside: a
    function with all five Estimator arguments that, for a TRAIN graph,
    records `eb.check_graph`'s report and, in check mode, stops there.
    """
    raw = {}

    @functools.wraps(model_fn)
    def remember_loss(*args, **kwargs):
      spec = model_fn(*args, **kwargs)
      raw['loss'] = getattr(spec, 'loss', None)
      return spec

    # In check mode the session's own report is the audit: nothing raises
    # before it is printed with the plan.
    wrapped = eb.wrap_model_fn(remember_loss, self.precision,
                               audit='off' if self.check else self.audit,
                               exclude=self.exclude,
                               gradient_accumulation_steps=self.steps,
                               recompute=self.recompute)
    accepted = set(inspect.signature(wrapped).parameters)
    session = self

    def model_fn_in_precision(features, labels=None, mode=None, params=None,
                              config=None):
      if labels is not None and 'labels' not in accepted:
        raise ValueError('model_fn does not take labels, but the input_fn '
                         'returned labels.')
      kwargs = {k: v for k, v in (('labels', labels), ('mode', mode),
                                  ('params', params), ('config', config))
                if k in accepted}
      raw.clear()
      try:
        spec = wrapped(features, **kwargs)
      except eb.PrecisionError:
        session.record_train_graph(raw.get('loss'))
        raise
      if mode == _TRAIN:
        session.record_train_graph(raw.get('loss'))
        if session.check:
          session.result.train_graph = session.train_graph(
              model_fn, features, labels, params, estimator_facts or {})
          raise _TrainGraphBuilt()
      return spec

    model_fn_in_precision.__name__ = getattr(model_fn, '__name__', 'model_fn')
    model_fn_in_precision.__doc__ = getattr(model_fn, '__doc__', None)
    return model_fn_in_precision

  def train_graph(self, model_fn, features, labels, params, facts):
    """A `TrainGraph` of the graph being built; specs None if not dense."""
    try:
      feature_specs = tf.nest.map_structure(_spec_of_example, features)
      label_specs = (None if labels is None else
                     tf.nest.map_structure(_spec_of_example, labels))
    except TypeError as e:
      feature_specs = label_specs = None
      self.result.plan_error = str(e)
    return TrainGraph(
        model_fn=model_fn, features=feature_specs, labels=label_specs,
        params={k: v for k, v in dict(params or {}).items()
                if k not in _TPU_PARAMS},
        variable_shapes=[(v.op.name, v.shape.as_list())
                         for v in tf.compat.v1.trainable_variables()],
        batch_size=_static_batch(features), **facts)

  def record_train_graph(self, loss):
    self.result.reports.append(eb.check_graph(strict=False, loss=loss))

  # Estimator construction --------------------------------------------------

  def patched_init(self, original, tpu):
    """`__init__` that wraps the model_fn of the outermost constructor.

    TPUEstimator's constructor hides the model_fn inside its own TPU wrapper
    before it calls Estimator's, so the model_fn is caught by whichever
    patched constructor runs first; the inner one passes through.
    """
    session = self

    def __init__(estimator, *args, **kwargs):
      if getattr(session._local, 'constructing', False):
        return original(estimator, *args, **kwargs)
      bound = inspect.signature(original).bind(estimator, *args, **kwargs)
      arguments = bound.arguments
      if tpu and arguments.get('use_tpu', True):
        cluster = getattr(arguments.get('config'), 'cluster', None)
        if isinstance(cluster, tpu_resolver.LocalClusterResolver):
          raise ValueError(
              'TPUEstimator(use_tpu=True), but the program named no TPU: its '
              'TPUClusterResolver(%r) got the local stand-in. Pass the TPU '
              "name (e.g. --tpu=NAME, or 'local' on a TPU VM), or "
              '--use_tpu=false to run on this CPU.' % (cluster.requested,))
      if session.check:
        _scratch_model_dir(arguments, session.scratch_dir())
      if tpu and session.steps > 1:
        session.micro_batch(arguments)
      if arguments.get('model_fn') is not None:
        arguments['model_fn'] = session.wrap_model_fn(
            arguments['model_fn'], _estimator_facts(arguments, tpu))
      if session.precision != 'float32':
        params = dict(arguments.get('params') or {})
        params['precision'] = session.precision
        arguments['params'] = params
      session._local.constructing = True
      try:
        original(*bound.args, **bound.kwargs)
      finally:
        session._local.constructing = False
      session.estimators.add(estimator)
      session.result.estimators += 1

    return __init__

  def micro_batch(self, arguments):
    """TPUEstimator arguments: train_batch_size becomes the micro-batch.

    The program's `train_batch_size` stays the effective batch of an
    update (what `eb.make_tpu_estimator` does with
    `gradient_accumulation_steps`). A plain Estimator has no batch
    argument: its input_fn's batch is the micro-batch.
    """
    if arguments.get('use_tpu', True):
      raise ValueError(levers_lib.TPU_ACCUMULATION_MESSAGE % self.steps)
    batch = arguments.get('train_batch_size')
    if batch is None:
      return
    strategy = getattr(arguments.get('config'), 'train_distribute', None)
    replicas = strategy.num_replicas_in_sync if strategy is not None else 1
    micro = accumulation.micro_batch_size(batch, self.steps, replicas,
                                          'replicas of the strategy')
    arguments['train_batch_size'] = micro
    self.result.micro_batches.append((batch, micro))

  # train / evaluate / predict ---------------------------------------------

  def patched_entry(self, original, name):
    """`train` / `evaluate` / `predict` that wrap the input_fn.

    `train` also stops after the current step on SIGTERM and then ends the
    program (`_Preempted`), once the Estimator has saved that step.
    """
    session = self

    def entry(estimator, *args, **kwargs):
      if estimator not in session.estimators:
        return original(estimator, *args, **kwargs)
      bound = inspect.signature(original).bind(estimator, *args, **kwargs)
      arguments = bound.arguments
      arguments['input_fn'] = eb.wrap_input_fn(
          arguments['input_fn'], session.precision, exclude=session.exclude)
      if name != 'train':
        return original(*bound.args, **bound.kwargs)
      hooks = list(arguments.get('hooks') or [])
      if session.memory:
        hook = memory_lib.PeakMemoryHook()
        session.hooks.append(hook)
        hooks.append(hook)
      # SIGTERM and Ctrl-C are handled only while the program trains,
      # where stopping after the step saves work; elsewhere (evaluation,
      # export, between calls) the newest checkpoint is already complete
      # and the default action, an immediate exit, loses nothing. The
      # handlers are restored when the call returns or raises.
      stopper = preemption.stop_on_signals()
      arguments['hooks'] = hooks + [stopper.hook]
      with stopper:
        returned = original(*bound.args, **bound.kwargs)
      if stopper.requested:
        raise _Preempted(stopper.signal_name,
                         tf.train.latest_checkpoint(estimator.model_dir))
      return returned

    entry.__name__ = name
    return functools.update_wrapper(entry, original)

  @contextlib.contextmanager
  def patches(self):
    """Patches the estimator classes of every backend; undone on exit.

    Five points per backend, all on two classes: the constructors of the
    Estimator base class (plain and canned estimators hand their model_fn
    to it) and of TPUEstimator (which wraps the model_fn before the base
    sees it), and the base class's train / evaluate / predict, which
    TPUEstimator reaches through super() and `train_and_evaluate` calls:
    one patch per method covers every subclass and entry point.
    """
    undo = []
    try:
      for base, tpu in _estimator_classes():
        for owner, name, replacement in (
            (base, '__init__', lambda f: self.patched_init(f, tpu=False)),
            (tpu, '__init__', lambda f: self.patched_init(f, tpu=True)),
            (base, 'train', lambda f: self.patched_entry(f, 'train')),
            (base, 'evaluate', lambda f: self.patched_entry(f, 'evaluate')),
            (base, 'predict', lambda f: self.patched_entry(f, 'predict'))):
          original = vars(owner)[name]
          undo.append((owner, name, original))
          setattr(owner, name, replacement(original))
      yield
    finally:
      for owner, name, original in reversed(undo):
        setattr(owner, name, original)


def _estimator_facts(arguments, tpu):
  """`TrainGraph` facts about an estimator, from its constructor arguments."""
  use_tpu = bool(tpu and arguments.get('use_tpu', True))
  note = None
  if not tpu:
    note = ("a plain Estimator's input_fn sets its own batch, which the "
            'runner does not split into micro-batches')
  elif use_tpu:
    note = 'gradient accumulation needs use_tpu=False'
  elif arguments.get('train_batch_size') is None:
    note = 'the TPUEstimator has no train_batch_size to split'
  return {'use_tpu': use_tpu, 'accumulation_note': note}


def _scratch_model_dir(arguments, scratch):
  """Points an Estimator's constructor arguments at a scratch model_dir.

  `check` is a dry run: the TRAIN graph must be built whatever the
  program's model_dir holds (an Estimator skips `train` when a checkpoint
  there is already at max_steps), and nothing may be read or written
  there. The same folder goes to the `model_dir` argument and the config,
  which must agree.
  """
  model_dir = tempfile.mkdtemp(dir=scratch)
  if arguments.get('model_dir') is not None:
    arguments['model_dir'] = model_dir
  config = arguments.get('config')
  if config is not None:
    arguments['config'] = config.replace(model_dir=model_dir)
  elif arguments.get('model_dir') is None:
    arguments['model_dir'] = model_dir


def _check_options(program, precision, audit, exclude, tf1, tf1_paths,
                   gradient_accumulation_steps=1, recompute=False):
  try:
    eb.compute_dtype(precision)
  except ValueError as e:
    raise ProgramError('--precision: %s' % e)
  try:
    levers_lib.check_levers(gradient_accumulation_steps, recompute)
  except ValueError as e:
    raise ProgramError(str(e))
  if audit not in AUDIT_MODES:
    raise ProgramError('--audit must be one of %s, got %r.' %
                       (', '.join(AUDIT_MODES), audit))
  if isinstance(exclude, str) or not all(isinstance(k, str) for k in exclude):
    raise ProgramError('exclude must be a list of feature keys, got %r.' %
                       (exclude,))
  if tf1 not in (None, True, False):
    raise ProgramError('tf1 must be None (detect), True or False, got %r.' %
                       (tf1,))
  for folder in tf1_paths:
    if not os.path.isdir(folder):
      raise ProgramError('--tf1_path %s: no such folder.' % folder)
  if not os.path.exists(program):
    raise ProgramError('%s: no such file.' % program)
  if not os.path.isfile(program):
    raise ProgramError('%s is not a file: give the Python program to run.' %
                       program)


@contextlib.contextmanager
def _program_argv(program, args):
  """sys.argv and sys.path[0] as `python PROGRAM ARGS` sets them."""
  saved_argv, saved_path = sys.argv[:], sys.path[:]
  sys.argv = [program] + list(args)
  # Python puts the folder of the (symlink-resolved) script first on the
  # path, so the program's sibling modules import.
  folder = os.path.dirname(os.path.realpath(program))
  if sys.path:
    sys.path[0] = folder
  else:
    sys.path.append(folder)
  try:
    yield
  finally:
    sys.argv[:] = saved_argv
    sys.path[:] = saved_path


@contextlib.contextmanager
def _compat_backend():
  """Installs the compat backend on TensorFlow 2.16+ for the run."""
  installed_here = eb.BACKEND == 'compat' and not eb.compat.installed()
  if installed_here:
    eb.compat.install()
  try:
    yield
  finally:
    if installed_here:
      eb.compat.uninstall()


def _folder_prefixes(folders):
  """Real paths of `folders` ending in a separator, for startswith tests."""
  return tuple(os.path.realpath(f) + os.sep for f in folders)


@contextlib.contextmanager
def _forget_program_state(folders, result):
  """Drops the absl flags and the modules of the program's folders afterwards.

  A process runs a program once; this lets a second run in the same process
  (tests, notebooks) import its sibling modules and define its flags again,
  as a fresh `python PROGRAM.py` would.
  """
  prefixes = _folder_prefixes(folders)
  flags_before, modules_before = set(flags.FLAGS), set(sys.modules)
  try:
    yield
  finally:
    result.program_flags = frozenset(set(flags.FLAGS) - flags_before)
    for name in result.program_flags:
      delattr(flags.FLAGS, name)
    for name in set(sys.modules) - modules_before:
      path = getattr(sys.modules[name], '__file__', None) or ''
      if os.path.realpath(path).startswith(prefixes):
        del sys.modules[name]


def _failure_reason(error, folders):
  """'Type: first line of the message (at file:line)', the line the
  innermost frame of the program's own code was at."""
  prefixes = _folder_prefixes(folders)
  where = None
  for frame, lineno in traceback.walk_tb(error.__traceback__):
    path = frame.f_code.co_filename
    if os.path.realpath(path).startswith(prefixes):
      where = '%s:%d' % (path, lineno)
  lines = str(error).strip().splitlines()
  return '%s%s%s' % (type(error).__name__, ': ' + lines[0] if lines else '',
                     ' (at %s)' % where if where else '')


def _exit_code(exit_exception):
  """The process exit code `sys.exit(code)` gives, as Python computes it."""
  code = exit_exception.code
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


def _program_traceback(error, program):
  """The traceback from the program's first frame on, as Python prints it."""
  tb = error.__traceback__
  start = tb
  while start is not None and start.tb_frame.f_code.co_filename != program:
    start = start.tb_next
  return ''.join(traceback.format_exception(type(error), error,
                                            start or tb))


def _tf1_scope(program, folders, tf1, result):
  """A `Tf1Scope` for a TF 1.x program (detected or forced), else None."""
  if tf1 is None:
    found = tf1_lib.detect(program, folders)
    result.tf1 = found.tf1
    result.tf1_reason = found.evidence or (
        'no TF 1.x API found in %d file(s)' % found.files)
  else:
    result.tf1 = tf1
    result.tf1_reason = '--tf1' if tf1 else '--no-tf1'
  return tf1_lib.Tf1Scope(folders) if result.tf1 else None


def run_program(program, args=(), precision='bfloat16', audit='strict',
                exclude=(), memory=False, check=False, plan_fn=None,
                tf1=None, tf1_paths=(), gradient_accumulation_steps=1,
                recompute=False):
  """Runs `program` as `__main__` with its Estimators in `precision`.

  Args:
    program: path of the Python program.
    args: its command-line arguments (what follows PROGRAM).
    precision: 'bfloat16', or 'float32' to run it unchanged.
    audit: 'strict', 'warn' or 'off' (see `eb.wrap_model_fn`).
    exclude: feature keys never cast.
    memory: measure the allocator peak of a training step (needs
      TF_CPU_ALLOCATOR_USE_BFC=true set before TensorFlow was imported).
    check: stop at the first TRAIN graph, before any training.
    plan_fn: in check mode, `plan_fn(train_graph) -> plans` run while the
      program's environment is still in place (its modules may need the
      compat backend); its result goes to `RunResult.plans`.
    tf1: run the program with the TF 1.x API (True), without (False), or
      decide from its source (None, `estimator_bf16.tf1.detect`).
    tf1_paths: more folders whose modules are the program's own TF 1.x
      code (its own folder always is).
    gradient_accumulation_steps: K >= 1; every TRAIN graph applies the mean
      gradient of K micro-batches per update, and a TPUEstimator's
      `train_batch_size` is divided by K (see `eb.make_tpu_estimator`).
    recompute: recompute activations during backprop.

  Returns:
    A `RunResult`. The program's traceback (if it raised) is printed to
    stderr, as Python prints it, and kept in `error`.

  Raises:
    ProgramError: the program is missing, or an option is bad; nothing ran.
  """
  _check_options(program, precision, audit, exclude, tf1, tf1_paths,
                 gradient_accumulation_steps, recompute)
  result = RunResult(program=program, precision=precision,
                     gradient_accumulation_steps=gradient_accumulation_steps,
                     recompute=recompute)
  session = _Session(precision, audit, tuple(exclude), memory, check, result)

  def count_resolver(stand_in):
    del stand_in
    result.local_resolvers += 1

  folders = [os.path.dirname(os.path.realpath(program))] + list(tf1_paths)
  with contextlib.ExitStack() as stack:
    stack.callback(session.close)
    stack.enter_context(quiet.tensorflow_logs_once())
    stack.enter_context(quiet.deprecation_notices_hidden())
    stack.enter_context(_compat_backend())
    stack.enter_context(tpu_resolver.substitute_empty_name(count_resolver))
    stack.enter_context(session.patches())
    stack.enter_context(_forget_program_state(folders, result))
    scope = _tf1_scope(program, folders, tf1, result)
    program_globals = {}
    if scope is not None:
      stack.enter_context(scope)
      program_globals['__builtins__'] = scope.builtins
      # TF 1.x had no eager mode: a program's own graph code outside the
      # Estimator (tf.placeholder, tf.Session) built into a default graph.
      # A fresh default graph gives it that on this thread, and is gone
      # with the run; the Estimator still builds graphs of its own.
      stack.enter_context(tf.Graph().as_default())
    stack.enter_context(_program_argv(program, args))
    try:
      runpy.run_path(program, init_globals=program_globals,
                     run_name='__main__')
    except _TrainGraphBuilt:
      result.exit_code = 0
    except _Preempted as e:
      # The status a process killed by the signal would have (143), as
      # the package's own training command exits.
      result.stopped_by = e.signal_name
      result.stop_checkpoint = e.checkpoint
      result.exit_code = 128 + signal.Signals[e.signal_name].value
    except SystemExit as e:
      result.exit_code = _exit_code(e)
    except tf1_lib.UnmappedContribError as e:
      # The message names the symbol and the program's line: the
      # traceback through the import machinery adds nothing.
      result.error = result.reason = '%s: %s' % (type(e).__name__, e)
      print(result.error, file=sys.stderr)
      result.exit_code = 1
    except KeyboardInterrupt:
      # Ctrl-C outside train, or a second one inside: stop at once, in one
      # line (the traceback is of wherever Python happened to be).
      result.error = ('KeyboardInterrupt: stopped at once by Ctrl-C; the '
                      'newest checkpoint is the last one written.')
      print(result.error, file=sys.stderr)
      result.exit_code = 130
    except BaseException as e:  # pylint: disable=broad-except
      # As Python does for an uncaught exception: traceback, status 1.
      result.error = _program_traceback(e, program)
      result.reason = _failure_reason(e, folders)
      print(result.error, end='', file=sys.stderr)
      result.exit_code = 1
    if (check and plan_fn is not None and result.train_graph is not None
        and result.train_graph.features is not None):
      try:
        result.plans = plan_fn(result.train_graph)
      except Exception as e:  # pylint: disable=broad-except
        result.plan_error = '%s: %s' % (type(e).__name__, e)
  result.peak_bytes = max([h.peak_bytes for h in session.hooks] or [0])
  result.train_peak_tensor_bytes = [h.tensor_peak_bytes
                                    for h in session.hooks]
  result.peak_tensor_bytes = max(result.train_peak_tensor_bytes or [0])
  return result
