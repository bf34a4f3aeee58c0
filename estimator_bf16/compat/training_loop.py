"""The training loop of the compat Estimator: hooks, session, steps.

The graph (input_fn and model_fn in TRAIN mode, the Saver) is built by the
Estimator; this module runs it the way tf.estimator did: the hooks every
task runs (NaN check, stop step, loss logging), the chief's checkpoint
hooks, a `MonitoredTrainingSession` (or, in a multi-worker job, a session
that stops when a peer is lost), and the step loop, which turns a lost
peer's error into a `distribute.WorkerFailure` naming it.
"""

import contextlib
import tempfile

from absl import logging
import tensorflow as tf

from estimator_bf16.compat import distribute as compat_distribute
from estimator_bf16.compat import step_deadline

# What tf.distribute's own sessions use when asked to save by time.
_MULTI_WORKER_SAVE_STEPS = 1000


@contextlib.contextmanager
def scratch_dir(strategy, chief):
  """Yields None on the chief, else a throw-away directory, removed after.

  Every task of a multi-worker job must run the same session calls
  (collective ops are matched call by call), so the other workers run the
  chief's checkpoint and summary hooks too, writing into a throw-away
  directory: tf.distribute's own recipe.
  """
  if chief:
    yield None
    return
  scratch = tempfile.mkdtemp(prefix='estimator_bf16_%s_' % (
      compat_distribute.task_name(strategy).replace(':', '')))
  try:
    yield scratch
  finally:
    tf.io.gfile.rmtree(scratch)


def _task_hooks(spec, input_hooks, hooks, steps, max_steps, deadline,
                log_every):
  """The hooks every task runs, in the order tf.estimator ran them."""
  all_hooks = [tf.compat.v1.train.NanTensorHook(spec.loss)]
  if steps is not None or max_steps is not None:
    # Without either, training runs until input_fn's data run out.
    all_hooks.append(tf.compat.v1.train.StopAtStepHook(
        num_steps=steps, last_step=max_steps))
  all_hooks += input_hooks + list(spec.training_hooks) + list(hooks or [])
  if deadline:
    # First: its step ends (after_run) before the other hooks' after_run,
    # checkpoint saves included, run.
    all_hooks.insert(0, deadline)
  if log_every:
    all_hooks.append(tf.compat.v1.train.LoggingTensorHook(
        {'loss': spec.loss, 'step': tf.compat.v1.train.get_global_step()},
        every_n_iter=log_every))
  return all_hooks


def _checkpoint_schedule(config, strategy):
  """(save_steps, save_secs) of the checkpoint hook; None for unset."""
  save_steps = config.save_checkpoints_steps
  save_secs = config.save_checkpoints_secs
  if save_secs and strategy is not None and (
      compat_distribute.is_multi_worker(strategy)):
    # Timers fire at different steps in different tasks; the saves must
    # happen at the same step everywhere.
    logging.warning('save_checkpoints_secs=%s: a multi-worker job saves by '
                    'steps; saving every %d steps instead.', save_secs,
                    _MULTI_WORKER_SAVE_STEPS)
    save_steps, save_secs = _MULTI_WORKER_SAVE_STEPS, None
  return save_steps, save_secs


def _chief_hooks(spec, scaffold, config, strategy, chief, checkpoint_dir,
                 saving_listeners):
  """The chief's hooks: model_fn's chief hooks and the checkpoint saver.

  Off the chief only the saver (into `checkpoint_dir`, a scratch directory)
  runs, without listeners, to keep the session calls in step.

  Raises:
    ValueError: saving_listeners given with checkpoints switched off.
  """
  chief_hooks = list(spec.training_chief_hooks) if chief else []
  save_steps, save_secs = _checkpoint_schedule(config, strategy)
  if save_steps or save_secs:
    chief_hooks.append(tf.compat.v1.train.CheckpointSaverHook(
        checkpoint_dir, save_secs=save_secs, save_steps=save_steps,
        scaffold=scaffold, listeners=saving_listeners if chief else None,
        save_graph_def=config.checkpoint_save_graph_def))
  elif saving_listeners:
    raise ValueError('saving_listeners need checkpoints: set '
                     'save_checkpoints_steps or save_checkpoints_secs.')
  return chief_hooks


def _multi_worker_session(target, model_dir, summary_dir, scaffold, hooks,
                          config, log_every, summary_every):
  """The training session of one task of a multi-worker job.

  Not MonitoredTrainingSession: it treats a lost peer (UnavailableError) as
  a preemption and recreates the session forever, while a job whose task
  died must stop (and be restarted as a whole). Every task restores the
  newest checkpoint of `model_dir` (the chief's), or initializes, in which
  case the strategy broadcasts the chief's initial values.

  Args:
    target: this task's gRPC server target.
    model_dir: where the chief's checkpoints are.
    summary_dir: model_dir on the chief, a scratch directory elsewhere.
    scaffold, hooks, config: as for a MonitoredSession.
    log_every, summary_every: steps between step-rate logs / summaries
      (None or 0: none).
  """
  hooks = list(hooks)
  if log_every:
    hooks.append(tf.compat.v1.train.StepCounterHook(
        output_dir=summary_dir, every_n_steps=log_every))
  if summary_every:
    hooks.append(tf.compat.v1.train.SummarySaverHook(
        scaffold=scaffold, save_steps=summary_every, output_dir=summary_dir))
  return tf.compat.v1.train.SingularMonitoredSession(
      hooks=hooks, scaffold=scaffold, master=target, config=config,
      checkpoint_dir=model_dir)


def _open_session(task_hooks, chief_hooks, scaffold, config, model_dir,
                  strategy, scratch, session_config):
  """The monitored session one task trains in (not entered yet).

  Every worker restores the newest checkpoint of model_dir (the chief's)
  or, on a fresh start, initializes: a multi-worker strategy broadcasts the
  chief's initial values. So each opens its session as a "chief" of its own
  variables.
  """
  target = ''
  if strategy is not None:
    target = compat_distribute.session_target(strategy, session_config)
  if strategy is not None and compat_distribute.is_multi_worker(strategy):
    return _multi_worker_session(
        target, model_dir, scratch or model_dir, scaffold,
        task_hooks + chief_hooks, session_config,
        config.log_step_count_steps, config.save_summary_steps)
  return tf.compat.v1.train.MonitoredTrainingSession(
      master=target, is_chief=True, checkpoint_dir=model_dir,
      scaffold=scaffold, hooks=task_hooks, chief_only_hooks=chief_hooks,
      save_checkpoint_secs=None, save_checkpoint_steps=None,
      save_summaries_steps=config.save_summary_steps or None,
      save_summaries_secs=None, config=session_config,
      log_step_count_steps=config.log_step_count_steps or None,
      max_wait_secs=config.session_creation_timeout_secs)


def _run_steps(session, spec, strategy, deadline):
  """Runs train steps until the session stops; closes the session.

  Returns:
    The loss of the last step run (a numpy float32 scalar), or None if no
    step ran.

  Raises:
    compat_distribute.WorkerFailure: a step failed because another task of a
      multi-worker job failed or stopped answering.
  """
  loss = None
  try:
    with session:
      try:
        while not session.should_stop():
          _, loss = session.run([spec.train_op, spec.loss])
      except BaseException:
        # Before the session closes: a failed step's error, not the
        # backstop, is what the task reports.
        if deadline:
          deadline.stop()
        raise
  except tf.errors.OpError as e:
    failure = strategy and compat_distribute.explain(e, strategy)
    if failure:
      raise failure from e
    raise
  finally:
    # After a clean close: the final checkpoint save was watched too.
    if deadline:
      deadline.stop()
  return loss


def run(spec, scaffold, input_hooks, hooks, steps, max_steps,
        saving_listeners, config, strategy, chief, scratch, session_config):
  """Trains the default graph's model in this task until it should stop.

  Args:
    spec: the TRAIN-mode `EstimatorSpec` (for all local replicas).
    scaffold: the `Scaffold` to use (the spec's, or a default one).
    input_hooks: `SessionRunHook`s input_fn needs.
    hooks: the caller's extra `SessionRunHook`s, or None.
    steps, max_steps: as in `Estimator.train`.
    saving_listeners: `CheckpointSaverListener`s, or None.
    config: the Estimator's `RunConfig` (its model_dir set).
    strategy: the training strategy, or None.
    chief: True if this task writes checkpoints and summaries.
    scratch: None on the chief; elsewhere the directory the other tasks'
      checkpoint and summary hooks write to.
    session_config: the `tf.compat.v1.ConfigProto` of the session.

  Returns:
    The loss of the last step run (numpy float32), or None if none ran.

  Raises:
    compat_distribute.WorkerFailure: under a multi-worker strategy, another task
      failed or stopped answering.
  """
  model_dir = config.model_dir
  deadline = step_deadline.hook_for(strategy)
  task_hooks = _task_hooks(spec, input_hooks, hooks, steps, max_steps,
                           deadline, config.log_step_count_steps)
  chief_hooks = _chief_hooks(spec, scaffold, config, strategy, chief,
                             scratch or model_dir, saving_listeners)
  session = _open_session(task_hooks, chief_hooks, scaffold, config,
                          model_dir, strategy, scratch, session_config)
  return _run_steps(session, spec, strategy, deadline)
