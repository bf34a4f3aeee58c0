"""Patches the Estimator classes so a program's estimators run in a run's way.

While `patched_for(run)` is active, every Estimator / TPUEstimator the
program constructs gets its model_fn from `run.wrap_model_fn` (and, in
bfloat16, `params['precision']`; in check mode a scratch model_dir; with
gradient accumulation a TPUEstimator's micro-batch), and its `train` /
`evaluate` / `predict` get the input_fn wrapped with `eb.wrap_input_fn`.
`train` also measures the step's memory peak when asked, and stops after
the current step on SIGTERM, ending the program (`run_state.Preempted`).

The classes are patched once, by a `patching.Patcher` shared by nested and
concurrent runs, and put back when the last run exits. The replacements
find their run at call time: a constructor serves the newest active run,
and an entry point serves the run that constructed the estimator (others
pass through to the original).
"""

import contextlib
import functools
import inspect
import tempfile
import threading

import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.platform import tpu as tpu_facts
from estimator_bf16.levers import accumulation
from estimator_bf16.memory import peak as peak_lib
from estimator_bf16.platform import backend as backend_lib
from estimator_bf16.platform import patching
from estimator_bf16.runner import results
from estimator_bf16.runner import run_state
from estimator_bf16.runner import train_steps
from estimator_bf16.runner import tpu_resolver
from estimator_bf16.safety import preemption

# Set while a patched constructor runs on this thread: TPUEstimator's calls
# Estimator's, which must pass through.
_THREAD = threading.local()


def estimator_classes():
  """(Estimator base, TPUEstimator) pairs of each backend importable here."""
  pairs = [(eb.compat.Estimator, eb.compat.TPUEstimator)]
  if eb.BACKEND == backend_lib.ESTIMATOR_BACKEND:
    # pylint: disable=g-import-not-at-top
    from tensorflow_estimator.python.estimator import estimator as tfe
    from tensorflow_estimator.python.estimator.tpu import tpu_estimator
    # pylint: enable=g-import-not-at-top
    pairs.append((tfe.Estimator, tpu_estimator.TPUEstimator))
  return pairs


def _estimator_facts(arguments, tpu):
  """`TrainGraph` facts about an estimator, from its constructor arguments."""
  use_tpu = bool(tpu and arguments.get('use_tpu', True))
  note = None
  if not tpu:
    note = ("a plain Estimator's input_fn sets its own batch, which the "
            'runner does not split into micro-batches')
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


def _micro_batch(run, arguments):
  """TPUEstimator arguments: train_batch_size becomes the micro-batch.

  The program's `train_batch_size` stays the effective batch of an
  update (what `eb.make_tpu_estimator` does with
  `WrapOptions.gradient_accumulation_steps`). A plain Estimator has no batch
  argument: its input_fn's batch is the micro-batch. On a TPU the input_fn
  keeps the update's batch and each step of the device loop splits it
  (`levers.device_accumulation`).
  """
  batch = arguments.get('train_batch_size')
  if batch is None:
    return
  config = arguments.get('config')
  if arguments.get('use_tpu', True):
    tpu_config = getattr(config, 'tpu_config', None)
    replicas = tpu_facts.tpu_replicas(
        getattr(tpu_config, 'num_shards', None),
        getattr(tpu_config, 'num_cores_per_replica', None))
    micro = accumulation.micro_batch_size(batch, run.steps, replicas,
                                          'TPU replicas')
    run.result.micro_batches.append((batch, micro))
    return
  strategy = getattr(config, 'train_distribute', None)
  replicas = strategy.num_replicas_in_sync if strategy is not None else 1
  micro = accumulation.micro_batch_size(batch, run.steps, replicas,
                                        'replicas of the strategy')
  arguments['train_batch_size'] = micro
  run.result.micro_batches.append((batch, micro))


def _seeded_config(arguments, seed, tpu):
  """Gives the Estimator's config `tf_random_seed=seed` (`run --seed`).

  The Estimator sets it as the graph-level seed of every graph it builds,
  so ops the program left unseeded (fake-data generators, dropout) draw
  the same numbers in a float32 and a bfloat16 run.
  """
  config = arguments.get('config')
  if config is None:
    run_config = (tf.compat.v1.estimator.tpu.RunConfig if tpu else
                  tf.compat.v1.estimator.RunConfig)
    config = run_config()
  arguments['config'] = config.replace(tf_random_seed=seed)


def _refuse_tpu_without_tpu(config):
  """Raises when a TPUEstimator(use_tpu=True) has no TPU to run on.

  Programs reach the TPU through `RunConfig(cluster=resolver)` or, the TF
  1.x spelling, `RunConfig(master=resolver.get_master())`; with the local
  stand-in resolver (or no master at all) and no TPU on this host,
  TPUEstimator would build the TPU graph on the CPU and fail much later,
  somewhere unrelated.

  Raises:
    results.NoTpuError: one line with both ways out (a ValueError, and a
      `results.Refusal`, which `run` prints without a traceback).
  """
  way_out = ("Pass the TPU name (e.g. --tpu=NAME, or 'local' on a TPU VM), "
             'or --use_tpu=false to run on this CPU.')
  cluster = getattr(config, 'cluster', None)
  if isinstance(cluster, tpu_resolver.LocalClusterResolver):
    raise results.NoTpuError(
        'TPUEstimator(use_tpu=True), but the program named no TPU: its '
        'TPUClusterResolver(%r) got the local stand-in. %s' %
        (cluster.requested, way_out))
  if (cluster is None and not getattr(config, 'master', '') and
      not tpu_resolver.tpu_present()):
    raise results.NoTpuError(
        "TPUEstimator(use_tpu=True), but the program named no TPU: its "
        "RunConfig has master '' and no cluster, and this host has no TPU. "
        '%s' % way_out)


def _patched_init(original, tpu):
  """`__init__` that wraps the model_fn of the outermost constructor.

  TPUEstimator's constructor hides the model_fn inside its own TPU wrapper
  before it calls Estimator's, so the model_fn is caught by whichever
  patched constructor runs first; the inner one passes through.
  """

  def __init__(estimator, *args, **kwargs):
    runs = _PATCHER.users  # the active runs, newest last
    if not runs or getattr(_THREAD, 'constructing', False):
      return original(estimator, *args, **kwargs)
    run = runs[-1]
    bound = inspect.signature(original).bind(estimator, *args, **kwargs)
    arguments = bound.arguments
    if tpu and arguments.get('use_tpu', True):
      _refuse_tpu_without_tpu(arguments.get('config'))
    if run.check:
      _scratch_model_dir(arguments, run.scratch_dir())
    if run.seed is not None:
      _seeded_config(arguments, run.seed, tpu)
    if tpu and run.steps > 1:
      _micro_batch(run, arguments)
    if arguments.get('model_fn') is not None:
      arguments['model_fn'] = run.wrap_model_fn(
          arguments['model_fn'], _estimator_facts(arguments, tpu))
    if run.precision.bfloat16:
      params = dict(arguments.get('params') or {})
      params['precision'] = run.precision
      arguments['params'] = params
    _THREAD.constructing = True
    try:
      original(*bound.args, **bound.kwargs)
    finally:
      _THREAD.constructing = False
    run.estimators.add(estimator)
    run.result.estimators += 1

  return __init__


def _owner(estimator):
  """The active run that constructed `estimator`, or None."""
  for run in reversed(_PATCHER.users):
    if estimator in run.estimators:
      return run
  return None


def _patched_entry(original, name):
  """`train` / `evaluate` / `predict` that wrap the input_fn.

  `train` also stops after the current step on SIGTERM and then ends the
  program (`run_state.Preempted`), once the Estimator has saved that step.
  """

  def entry(estimator, *args, **kwargs):
    run = _owner(estimator)
    if run is None:
      return original(estimator, *args, **kwargs)
    bound = inspect.signature(original).bind(estimator, *args, **kwargs)
    arguments = bound.arguments
    if name == 'train':
      run.train_input_fn = arguments['input_fn']
      run.train_config = getattr(estimator, 'config', None)
    arguments['input_fn'] = eb.wrap_input_fn(
        arguments['input_fn'], run.precision, exclude=run.options.exclude)
    if name == 'evaluate':
      metrics = original(*bound.args, **bound.kwargs)
      run.result.evaluations.append(_metric_record(metrics))
      return metrics
    if name != 'train':
      return original(*bound.args, **bound.kwargs)
    hooks = list(arguments.get('hooks') or [])
    counter = train_steps.StepCountHook()
    run.step_hooks.append(counter)
    hooks.append(counter)
    if run.memory:
      hook = peak_lib.PeakMemoryHook()
      run.hooks.append(hook)
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
      raise run_state.Preempted(
          stopper.signal_name, tf.train.latest_checkpoint(estimator.model_dir))
    return returned

  entry.__name__ = name
  return functools.update_wrapper(entry, original)


def _metric_record(metrics):
  """{name: [value, dtype name]} of an evaluation's scalar results."""
  record = {}
  for key, value in (metrics or {}).items():
    array = np.asarray(value)
    try:
      dtype = tf.as_dtype(array.dtype)  # bfloat16 too (numpy kind 'V')
    except TypeError:
      continue
    if array.shape != ():
      continue
    if dtype.is_floating:
      record[str(key)] = [float(array), dtype.name]
    elif dtype.is_integer or dtype.is_bool:
      record[str(key)] = [int(array), dtype.name]
  return record


def _swap():
  """Patches the estimator classes of every backend; the Patcher's apply.

  Five points per backend, all on two classes: the constructors of the
  Estimator base class (plain and canned estimators hand their model_fn
  to it) and of TPUEstimator (which wraps the model_fn before the base
  sees it), and the base class's train / evaluate / predict, which
  TPUEstimator reaches through super() and `train_and_evaluate` calls:
  one patch per method covers every subclass and entry point. They exist
  so an unmodified program's estimators run in the run's precision, and
  are undone when the last run exits.

  Returns:
    The undo list (see `patching.restore`).
  """
  undo = []
  try:
    for base, tpu in estimator_classes():
      for owner, name, replacement in (
          (base, '__init__', lambda f: _patched_init(f, tpu=False)),
          (tpu, '__init__', lambda f: _patched_init(f, tpu=True)),
          (base, 'train', lambda f: _patched_entry(f, 'train')),
          (base, 'evaluate', lambda f: _patched_entry(f, 'evaluate')),
          (base, 'predict', lambda f: _patched_entry(f, 'predict'))):
        original = vars(owner)[name]
        undo.append((owner, name, original))
        setattr(owner, name, replacement(original))
  except Exception:
    patching.restore(undo)
    raise
  return undo


_PATCHER = patching.Patcher(_swap)


@contextlib.contextmanager
def patched_for(run):
  """Inside, the program's estimators run as `run` says; undone on exit.

  Args:
    run: a `run_state.ProgramRun`.

  Yields:
    None. On exit (also on an exception) `run` no longer receives
    estimators, and the classes are as before once no other run is active.
  """
  with _PATCHER.active(run):
    yield
