"""One training protocol, run by either backend, in this or another venv.

Both backends start from the same checkpoint (so initial weights do not
depend on how each graph numbers its random ops), train the legacy program
of tests/support/legacy_tpu_program.py on the same data, then evaluate, predict and
export. The numbers they return can be compared directly; the directories
they leave can be continued by the other backend.

Run as `python -m tests.support.compat_protocol ...` from the repository root to do
the other TensorFlow's half of a cross-version test (see `main`).
"""

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import shutil
import time

import numpy as np
import tensorflow as tf

import estimator_bf16 as eb
from estimator_bf16 import compat
from tests.support import legacy_model

TRAIN_STEPS = 40  # after the start checkpoint's single step
CONTINUE_STEPS = 10
EVAL_STEPS = 4
SERVING_IMAGES = 4
# How long the other TensorFlow's process waits for the caller's half.
_HANDOFF_WAIT_SECS = 600
_PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        'legacy_tpu_program.py')


@contextlib.contextmanager
def legacy_program(backend):
  """Yields a fresh copy of the legacy program bound to `backend`'s estimator.

  Args:
    backend: 'tf_estimator' (the real one, TF 2.15) or 'compat' (installed
      for the duration, unless it already was).
  """
  was_installed = compat.installed()
  if backend == 'compat':
    compat.install()
  elif was_installed:
    raise RuntimeError('compat is installed: tf.estimator is not the real one.')
  try:
    spec = importlib.util.spec_from_file_location(
        'legacy_tpu_program_' + backend, _PROGRAM)
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    yield program
  finally:
    if backend == 'compat' and not was_installed:
      compat.uninstall()


def _estimator(program, model_dir, precision):
  """The user's two-line change: wrap model_fn (and input_fns, below)."""
  model_fn = eb.wrap_model_fn(program.model_fn_builder(model_dir), precision)
  return program.build_estimator(model_fn, model_dir)


def _copy_checkpoint(source_dir, model_dir):
  """Copies only the checkpoint files of source_dir to a new model_dir."""
  os.makedirs(model_dir)
  prefix = os.path.basename(tf.train.latest_checkpoint(source_dir))
  for name in os.listdir(source_dir):
    if name.startswith(prefix + '.'):
      shutil.copy(os.path.join(source_dir, name), model_dir)
  with open(os.path.join(model_dir, 'checkpoint'), 'w') as f:
    f.write('model_checkpoint_path: "%s"\n' % prefix)


def global_step(model_dir):
  reader = tf.train.load_checkpoint(model_dir)
  return int(reader.get_tensor('global_step'))


def model_weights(model_dir):
  """{name: array} of the model's variables (no optimizer slots)."""
  reader = tf.train.load_checkpoint(model_dir)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.split('/')[0] in ('conv', 'hidden', 'logits')
          and 'Adam' not in name}


def serve(export_dir):
  """Runs a SavedModel's default signature on fixed images (float32 [4, 4])."""
  images, _ = legacy_model.synthetic_data(SERVING_IMAGES, seed=3)
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta = tf.compat.v1.saved_model.load(session, ['serve'], export_dir)
    signature = meta.signature_def['serving_default']
    return session.run(signature.outputs['probabilities'].name,
                       {signature.inputs['image'].name: images})


def make_start(backend, work_dir):
  """Trains one float32 step; returns the model_dir (all optimizer slots)."""
  model_dir = os.path.join(work_dir, 'start')
  with legacy_program(backend) as program:
    _estimator(program, model_dir, 'float32').train(
        program.train_input_fn, max_steps=1)
  return model_dir


def run(backend, precision, start_dir, work_dir):
  """Trains from start_dir, evaluates, predicts, exports.

  Returns:
    dict: 'loss', 'accuracy' (floats), 'global_step' (int),
    'probabilities' (list [16][4]), 'serving' (list [4][4], from the
    SavedModel), 'weights' ({name: list}), 'model_dir', 'export_dir' (str).
  """
  model_dir = os.path.join(work_dir, '%s-%s' % (backend, precision))
  _copy_checkpoint(start_dir, model_dir)
  wrap = functools.partial(eb.wrap_input_fn, precision=precision)
  with legacy_program(backend) as program:
    estimator = _estimator(program, model_dir, precision)
    estimator.train(wrap(program.train_input_fn),
                    max_steps=global_step(start_dir) + TRAIN_STEPS)
    metrics = estimator.evaluate(wrap(program.eval_input_fn),
                                 steps=EVAL_STEPS)
    probabilities = [p['probabilities'].tolist() for p in
                     estimator.predict(wrap(program.predict_input_fn))]
    export_dir = estimator.export_saved_model(
        os.path.join(model_dir, 'export'), program.serving_input_receiver_fn)
  export_dir = os.fsdecode(export_dir)
  return {
      'loss': float(metrics['loss']), 'accuracy': float(metrics['accuracy']),
      'global_step': int(metrics['global_step']),
      'probabilities': probabilities, 'serving': serve(export_dir).tolist(),
      'weights': {k: v.tolist() for k, v in model_weights(model_dir).items()},
      'model_dir': model_dir, 'export_dir': export_dir,
  }


def continue_training(backend, precision, source_dir, work_dir):
  """Continues another backend's checkpoint for CONTINUE_STEPS; evaluates.

  Returns:
    dict: 'step_before', 'step_after' (ints), 'loss' (float), 'changed'
    (bool: the weights moved).
  """
  model_dir = os.path.join(work_dir, 'continued-%s-%s' % (backend, precision))
  _copy_checkpoint(source_dir, model_dir)
  before = model_weights(model_dir)
  step = global_step(model_dir)
  wrap = functools.partial(eb.wrap_input_fn, precision=precision)
  with legacy_program(backend) as program:
    estimator = _estimator(program, model_dir, precision)
    estimator.train(wrap(program.train_input_fn),
                    max_steps=step + CONTINUE_STEPS)
    metrics = estimator.evaluate(wrap(program.eval_input_fn),
                                 steps=EVAL_STEPS)
  after = model_weights(model_dir)
  return {'step_before': step, 'step_after': global_step(model_dir),
          'loss': float(metrics['loss']),
          'changed': any(not np.array_equal(before[k], after[k])
                         for k in before)}


def _wait_for_json(path, timeout_secs):
  """The JSON in `path`, once it is there (the caller writes it whole)."""
  deadline = time.monotonic() + timeout_secs
  while not os.path.exists(path):
    if time.monotonic() > deadline:
      raise SystemExit('%s did not appear within %d s' % (path, timeout_secs))
    time.sleep(0.05)
  with open(path) as f:
    return json.load(f)


def main(argv=None):
  """The other TensorFlow's half of a cross-version test; writes JSON.

  For each precision: `run` from --start_dir; then, once the caller has
  written --theirs (it trains its own half meanwhile), `continue_training`
  from the caller's model_dir and `serve` the caller's export.
  """
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--start_dir', required=True)
  parser.add_argument('--work_dir', required=True)
  parser.add_argument('--theirs', required=True,
                      help='path of a JSON file {precision: {"model_dir", '
                      '"export_dir"}}, waited for')
  parser.add_argument('--out', required=True)
  args = parser.parse_args(argv)
  backend = eb.BACKEND
  runs = {precision: run(backend, precision, args.start_dir, args.work_dir)
          for precision in eb.PRECISIONS}
  results = {'tf_version': tf.__version__, 'backend': backend}
  for precision, theirs in _wait_for_json(args.theirs,
                                          _HANDOFF_WAIT_SECS).items():
    results[precision] = {
        'run': runs[precision],
        'continued': continue_training(backend, precision,
                                       theirs['model_dir'], args.work_dir),
        'served': serve(theirs['export_dir']).tolist(),
    }
  with open(args.out, 'w') as f:
    json.dump(results, f)


if __name__ == '__main__':
  main()
