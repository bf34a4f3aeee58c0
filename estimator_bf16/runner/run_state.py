"""The state of one program run and what its model_fns record into it.

`ProgramRun` holds the options of one `run_program` call, the `RunResult`
it fills in, the estimators the program constructed and the peak-memory
hooks of its `train` calls. Its `wrap_model_fn` is what each such
estimator gets instead of the program's model_fn: the model_fn in the run's
precision, observed, so every TRAIN graph built is reported (and, in check
mode, the first one ends the program before training). The two exceptions
that end a program early are here too.
"""

import dataclasses
import functools
import shutil
import tempfile
import weakref

import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16.compat import calling
from estimator_bf16.levers import batch_dim
from estimator_bf16.runner import results

# TPUEstimator's own params; never passed on to the memory planner.
_TPU_PARAMS = ('batch_size', 'use_tpu', 'context', 'precision')


class Preempted(BaseException):
  """Raised out of a `train` call that a signal stopped, to end the program.

  A BaseException, like SystemExit: the program's `except Exception` must
  not carry on into evaluation or export on a machine that is going away.
  """

  def __init__(self, signal_name, checkpoint):
    super().__init__(signal_name, checkpoint)
    self.signal_name = signal_name
    self.checkpoint = checkpoint


class TrainGraphBuilt(BaseException):
  """Raised out of the first TRAIN model_fn call in check mode.

  A BaseException, like SystemExit: a program's `except Exception` around
  `train` must not swallow it.
  """


class ProgramRun(object):
  """The options and bookkeeping of one program run.

  Attributes:
    precision: the run's `Precision`, as `run_program` parsed it.
    options: the run's `eb.WrapOptions` (audit, exclude, levers, kernels).
    memory, check: the `run_program` options.
    result: the `RunResult` being filled in.
    estimators: the Estimators constructed under this run (weakly held).
    hooks: the `PeakMemoryHook` of each `train` call, in order.
    step_hooks: the `train_steps.StepCountHook` of each `train` call, in
      order.
  """

  def __init__(self, options, memory, check, result):
    self.precision = result.precision
    self.options = options
    self.memory = memory
    self.check = check
    self.result = result
    self.estimators = weakref.WeakSet()
    self.hooks = []
    self.step_hooks = []
    # What the newest `train` call got (`check --xla` builds from them).
    self.train_input_fn = None
    self.train_config = None
    self._scratch = None
    # RunConfig.tf_random_seed of every Estimator, or None (the program's).
    self.seed = result.seed

  @property
  def steps(self):
    """Gradient accumulation steps K (1: none), the options' value."""
    return self.options.gradient_accumulation_steps

  def scratch_dir(self):
    """A fresh folder for check mode's model_dirs; see `close`."""
    if self._scratch is None:
      self._scratch = tempfile.mkdtemp(prefix='estimator_bf16_check_')
    return self._scratch

  def close(self):
    if self._scratch is not None:
      shutil.rmtree(self._scratch, ignore_errors=True)

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

    # In check mode the run's own report is the audit: nothing raises
    # before it is printed with the plan.
    options = self.options
    if self.check:
      options = dataclasses.replace(options, audit='off')
    wrapped = eb.wrap_model_fn(remember_loss, self.precision, options)
    accepted = calling.model_fn_arg_names(wrapped)
    run = self

    def model_fn_in_precision(features, labels=None, mode=None, params=None,
                              config=None):
      raw.clear()
      try:
        spec = calling.call_model_fn(wrapped, features, labels, mode, params,
                                     config, accepted=accepted)
      except eb.PrecisionError:
        run.record_train_graph(raw.get('loss'))
        raise
      if mode == calling.TRAIN:
        run.record_train_graph(raw.get('loss'))
        if run.check:
          run.result.train_graph = run.train_graph(
              model_fn, features, labels, params, estimator_facts or {})
          raise TrainGraphBuilt()
      return spec

    model_fn_in_precision.__name__ = getattr(model_fn, '__name__', 'model_fn')
    model_fn_in_precision.__doc__ = getattr(model_fn, '__doc__', None)
    return model_fn_in_precision

  def train_graph(self, model_fn, features, labels, params, facts):
    """A `TrainGraph` of the graph being built; specs None if not dense."""
    batch = dict(params or {}).get('batch_size')
    if batch is None:
      # A plain Estimator passes no batch size: the labels show it.
      batch = batch_dim.labels_batch_size(labels)
    try:
      # Where each input's batch is (dimension 0, or last for
      # tensorflow/tpu's transposed images) decides the plan's shapes.
      feature_specs, label_specs = batch_dim.example_specs(
          (features, labels), batch)
    except TypeError as e:
      feature_specs = label_specs = None
      self.result.plan_error = str(e)
    return results.TrainGraph(
        model_fn=model_fn, features=feature_specs, labels=label_specs,
        params={k: v for k, v in dict(params or {}).items()
                if k not in _TPU_PARAMS},
        variable_shapes=[(v.op.name, v.shape.as_list())
                         for v in tf.compat.v1.trainable_variables()],
        batch_size=batch_dim.static_batch_size((features, labels), batch),
        input_fn=self.train_input_fn,
        config=self.train_config,
        iterations_per_loop=getattr(
            getattr(self.train_config, 'tpu_config', None),
            'iterations_per_loop', None), **facts)

  def record_train_graph(self, loss):
    self.result.reports.append(eb.check_graph(strict=False, loss=loss))
