"""TF 1.x programs (`import tensorflow as tf`, `tf.contrib`) under `run`.

The two programs in models/tf1/ are written as TF 1.12-era code
was and never import estimator_bf16; they run unchanged through the real
command line in both precisions, on whichever backend this TensorFlow has.
Small programs written by the tests pin down detection, the scoping (only
the program's folders see TF 1.x `tensorflow`), the contrib mapping and
its one-line error.
"""

import builtins as builtins_module
import contextlib
import glob
import importlib
import io
import json
import logging
import os
import re
import shutil
import sys
import textwrap
import threading
import types

from absl.testing import parameterized
import pytest
import tensorflow as tf
from tensorflow.python.framework import tensor_shape

import estimator_bf16 as eb
from estimator_bf16.apps import cli
from estimator_bf16.runner import program as runner
from estimator_bf16.runner import report as run_report
from estimator_bf16.runner import tf1 as tf1_lib
from estimator_bf16.runner.tf1 import contrib as contrib_lib
from estimator_bf16.runner.tf1 import module as module_lib
from estimator_bf16.runner.tf1 import scope as scope_lib
from tests.runner import test_runner
from tests.support import paths
from tests.support import scratch

_REPO = paths.REPO
_PROGRAMS = os.path.join('models', 'tf1')
_BERT = os.path.join(_PROGRAMS, 'bert_style', 'tf1_run_classifier.py')
_RESNET = os.path.join(_PROGRAMS, 'resnet_style', 'tf1_resnet_main.py')
# float32 trains each program far enough to be the reference its
# bfloat16 evaluation is compared with; a bfloat16 run is checked for how
# it trains, not how well, so it runs a few steps past the memory
# measurement (session run 4 of a train call): one TPU loop of each.
_STEPS = {('bert_style', 'float32'): 80, ('bert_style', 'bfloat16'): 10,
          ('resnet_style', 'float32'): 160, ('resnet_style', 'bfloat16'): 20}
# bfloat16 vs float32 on each program's eval set, stated from runs on
# TensorFlow 2.15.1 and 2.21.0 (the runs are not bit-reproducible: CPU
# reductions and input threads). bert_style: accuracy 0.97-1.0 in both
# precisions, loss 0.01-0.10. resnet_style (256 digits): at 80 steps its
# batch-norm averages were still settling (eval loss 0.18-0.38 in either
# precision, one pair 0.16 apart); at 160 steps six runs gave accuracy
# 0.926-0.957 and loss 0.167-0.264 in both precisions.
_TOLERANCE = {'bert_style': {'accuracy': 0.05, 'loss': 0.15},
              'resnet_style': {'accuracy': 0.06, 'loss': 0.15}}
_SCRATCH = scratch.ModuleScratch()


def setUpModule():
  _SCRATCH.start()


def tearDownModule():
  _SCRATCH.stop()


def _name(program):
  return os.path.basename(os.path.dirname(program))


def _args(program, precision, model_dir, steps=None):
  """The program's own command line (`_STEPS` of `precision` by default)."""
  steps = steps or _STEPS[_name(program), precision]
  if _name(program) == 'bert_style':
    return ['--output_dir=' + model_dir, '--num_train_steps=%d' % steps]
  # The program's own --precision (tensorflow/tpu style) follows run's.
  return ['--use_tpu=false', '--model_dir=' + model_dir,
          '--train_steps=%d' % steps, '--precision=' + precision]


@_SCRATCH.cached
def _run(program, precision):
  """Runs a TF 1.x program once per precision; returns (proc, model_dir)."""
  model_dir = os.path.join(_SCRATCH.root, '%s_%s' % (_name(program),
                                                    precision))
  proc = test_runner._cli_here(  # pylint: disable=protected-access
      'run', '--precision=' + precision, '--memory', program,
      *_args(program, precision, model_dir))
  return proc, model_dir


def _eval_results(model_dir):
  """{'accuracy', 'loss'} from the program's eval_results.txt."""
  values = {}
  with open(os.path.join(model_dir, 'eval_results.txt')) as f:
    for line in f:
      key, _, value = line.partition(' = ')
      values[key] = float(value)
  accuracy = values.get('eval_accuracy', values.get('top_1_accuracy'))
  return {'accuracy': accuracy, 'loss': values.get('eval_loss',
                                                   values['loss'])}


_PROGRAM_CASES = [
    dict(testcase_name='bert_style_' + p, program=_BERT, precision=p,
         ops=('MatMul', 'BatchMatMulV2'))
    for p in eb.PRECISIONS] + [
        dict(testcase_name='resnet_style_' + p, program=_RESNET, precision=p,
             ops=('Conv2D', 'MatMul', 'Conv2DBackpropFilter'))
        for p in eb.PRECISIONS]


@pytest.mark.slow
class Tf1ProgramTest(tf.test.TestCase, parameterized.TestCase):
  """The two TF 1.x programs, unchanged, through the command line."""

  @parameterized.named_parameters(*_PROGRAM_CASES)
  def test_runs_unchanged_in_precision(self, program, precision, ops):
    proc, model_dir = _run(program, precision)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('eval accuracy', proc.stdout)
    self.assertRegex(proc.stderr, r'TF 1\.x API: on \(%s:\d+: ' %
                     program.replace('.', r'\.'))
    # Float32 master weights and optimizer slots, at the requested step.
    stored = test_runner.assert_trained_in_precision(
        self, proc.stderr, model_dir, precision, ops,
        _STEPS[_name(program), precision])
    self.assertGreater(len(stored), 10)

  def test_resnet_style_gets_the_resolver_stand_in_and_its_summaries(self):
    proc, model_dir = _run(_RESNET, 'bfloat16')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertIn('TPU resolver: local stand-in', proc.stderr)
    # The tf.contrib.summary host_call wrote its scalars.
    tags = set()
    for path in glob.glob(os.path.join(model_dir, 'events.out.tfevents.*')):
      for event in tf.compat.v1.train.summary_iterator(path):
        tags.update(v.tag for v in event.summary.value)
    self.assertContainsSubset({'loss', 'learning_rate'}, tags)

  @parameterized.named_parameters(('bert_style', _BERT),
                                  ('resnet_style', _RESNET))
  def test_bfloat16_eval_matches_float32(self, program):
    # bfloat16 evaluates the float32 run's weights (a copy of its
    # model_dir, whose training is done): two fresh trainings differ by
    # more than the precision, since TF 1.x's op seeds move with the casts
    # and thread scheduling moves a short run (the float32 loss alone
    # went from 0.14 to 0.18 between two machines). That run goes through
    # run_program in this process: the command line is checked above.
    proc, model_dir = _run(program, 'float32')
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    results = {'float32': _eval_results(model_dir)}
    same = model_dir + '_weights_in_bfloat16'
    shutil.rmtree(same, ignore_errors=True)
    shutil.copytree(model_dir, same)
    os.remove(os.path.join(same, 'eval_results.txt'))
    # The programs set TensorFlow's log level for the whole process.
    tf_logger = logging.getLogger('tensorflow')
    level = tf_logger.level
    try:
      result = runner.run_program(
          program, _args(program, 'bfloat16', same,
                         steps=_STEPS[_name(program), 'float32']),
          precision='bfloat16')
    finally:
      tf_logger.setLevel(level)
    self.assertEqual(result.exit_code, 0, result.error)
    self.assertEqual(result.precision, 'bfloat16')
    self.assertIn('training steps run: 0',
                  run_report.format_run_report(result))
    results['bfloat16'] = _eval_results(same)
    tolerance = _TOLERANCE[_name(program)]
    self.assertGreater(results['float32']['accuracy'], 0.85)
    for key in ('accuracy', 'loss'):
      self.assertLessEqual(
          abs(results['bfloat16'][key] - results['float32'][key]),
          tolerance[key], results)

  def test_check_builds_and_plans_a_tf1_program(self):
    model_dir = os.path.join(_SCRATCH.root, 'checked')
    # The command's exit code and report, computed in this process.
    with test_runner._cli_in_this_process() as main:  # pylint: disable=protected-access
      code, _, stderr, _ = main('check', _BERT, '--output_dir=' + model_dir)
    self.assertEqual(code, 0, stderr[-3000:])
    self.assertIn('TF 1.x API: on', stderr)
    self.assertIn('memory plan: largest batch per TPU core', stderr)
    self.assertIn('result: OK', stderr)


_CONTRIB_PROGRAM = '''\
import tensorflow as tf

%s
'''


class Tf1RunTest(tf.test.TestCase, parameterized.TestCase):
  """run_program in this process, on TF 1.x programs the tests write."""

  def _write(self, folder, name, source):
    path = os.path.join(folder, name)
    with open(path, 'w') as f:
      f.write(textwrap.dedent(source))
    return path

  def _run_quietly(self, program, args=(), **kwargs):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
      result = runner.run_program(program, list(args), **kwargs)
    return result, err.getvalue()

  @parameterized.named_parameters(
      ('attribute', 'x = tf.contrib.opt.LazyAdamOptimizer',
       'tf.contrib.opt has no successor', 'maps tf.contrib.{'),
      ('from_import',
       'from tensorflow.contrib.training import stratified_sample',
       'tf.contrib.training.stratified_sample has no successor',
       'rejection_resample'),
      ('module_import', 'import tensorflow.contrib.learn as learn',
       'tf.contrib.learn has no successor', 'maps tf.contrib.{'),
      ('deep_symbol', 'from tensorflow.contrib.tpu.python.tpu import nope',
       'tf.contrib.tpu.python.tpu.nope has no successor', 'maps'))
  def test_unmapped_contrib_is_one_line_naming_the_program_line(
      self, statement, message, hint):
    folder = self.create_tempdir().full_path
    program = self._write(folder, 'program.py', _CONTRIB_PROGRAM % statement)
    result, err = self._run_quietly(program)
    self.assertEqual(result.exit_code, 1)
    self.assertIn('%s:3: %s' % (program, message), result.error)
    self.assertIn(hint, result.error)
    self.assertStartsWith(result.error, 'UnmappedContribError: ')
    self.assertNotIn('\n', result.error)
    self.assertEqual(err, result.error + '\n')

  def test_an_import_failure_shows_only_the_programs_frames(self):
    folder = self.create_tempdir().full_path
    self._write(folder, 'helper.py', '''
        import tensorflow as tf
        from a_module_nobody_has import thing
        ''')
    program = self._write(folder, 'program.py', '''
        import tensorflow as tf
        import helper
        flags = tf.flags
        ''')
    result, err = self._run_quietly(program)
    self.assertEqual(result.exit_code, 1)
    self.assertTrue(result.tf1)
    files = re.findall(r'File "([^"]+)"', result.error)
    self.assertEqual([os.path.basename(f) for f in files],
                     ['program.py', 'helper.py'], result.error)
    self.assertIn("ModuleNotFoundError: No module named 'a_module_nobody_has'",
                  err)
    self.assertRegex(result.reason, r'\(at .*helper\.py:3\)$')

  def test_an_error_beside_a_partly_read_predict_is_the_programs(self):
    # The kept generator is suspended inside Estimator.predict's graph
    # context; leaving the run's own default graph failed with "Nesting
    # violated for default stack", in place of the program's TypeError.
    folder = self.create_tempdir().full_path
    program = self._write(folder, 'program.py', '''
        import sys
        import numpy as np
        import tensorflow as tf

        def model_fn(features, labels, mode, params):
          y = tf.layers.dense(features['x'], 1)
          if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.contrib.tpu.TPUEstimatorSpec(mode, predictions={'y': y})
          loss = tf.reduce_mean(y)
          return tf.contrib.tpu.TPUEstimatorSpec(
              mode, loss=loss, train_op=tf.train.GradientDescentOptimizer(
                  0.1).minimize(loss, tf.train.get_global_step()))

        def input_fn(params):
          return tf.data.Dataset.from_tensor_slices(
              {'x': np.ones((8, 4), np.float32)}).repeat().batch(
                  params['batch_size'], drop_remainder=True)

        estimator = tf.contrib.tpu.TPUEstimator(
            model_fn=model_fn, use_tpu=False, train_batch_size=4,
            predict_batch_size=4,
            config=tf.contrib.tpu.RunConfig(model_dir=sys.argv[1]))
        estimator.train(input_fn, max_steps=1)
        kept = estimator.predict(input_fn, yield_single_examples=False)
        first = next(kept)
        range(first['y'][0, 0])  # a TypeError of the program's own
        ''')
    result, err = self._run_quietly(
        program, [os.path.join(folder, 'model')], precision='float32')
    self.assertEqual(result.exit_code, 1, err[-2000:])
    self.assertRegex(result.reason, r'^TypeError: .*\(at .*program\.py:27\)$')
    self.assertNotIn('Nesting violated', err)

  def test_only_the_program_folders_see_tf1(self):
    """tf-slim and a module outside the folders keep the real TensorFlow."""
    root = self.create_tempdir().full_path
    program_dir, lib_dir = (os.path.join(root, n) for n in ('prog', 'lib'))
    os.makedirs(program_dir)
    os.makedirs(lib_dir)
    view = '''
        import tensorflow as tf

        def view(tensor):
          """How this module sees `tensorflow` and a static dimension."""
          dim = tensor.shape[-1]
          return {'module': type(tf).__name__,
                  'dim': type(dim).__name__,
                  'value': dim.value if hasattr(dim, 'value') else dim}
        '''
    self._write(lib_dir, 'tf1_outside_lib.py', view)
    self._write(program_dir, 'tf1_sibling.py', view)
    program = self._write(program_dir, 'program.py', '''
        import json, sys
        sys.path.insert(0, sys.argv[1])
        import tensorflow as tf
        import tf_slim
        import tf1_outside_lib, tf1_sibling

        with tf.Graph().as_default():
          x = tf.placeholder(tf.float32, [None, 5])
          y = tf.contrib.layers.fully_connected(x, 3)  # tf-slim code
          seen = {'sibling': tf1_sibling.view(x),
                  'library': tf1_outside_lib.view(x),
                  'slim_output_dim': type(y.shape[-1]).__name__,
                  'tf_is_real': sys.modules['tensorflow'] is not tf,
                  'slim_builtins_are_real': (
                      vars(tf_slim)['__builtins__'] is not __builtins__)}
        with open(sys.argv[2], 'w') as f:
          json.dump(seen, f)
        ''')
    out = os.path.join(root, 'seen.json')
    tf1_view = {'module': 'Tf1Module', 'dim': 'Dimension', 'value': 5}
    tf2_view = {'module': 'module', 'dim': 'int', 'value': 5}
    for tf1_paths, library in (((), tf2_view), ((lib_dir,), tf1_view)):
      result, _ = self._run_quietly(program, [lib_dir, out], tf1=True,
                                    tf1_paths=tf1_paths)
      self.assertEqual(result.exit_code, 0, result.error)
      with open(out) as f:
        seen = json.load(f)
      self.assertEqual(seen['sibling'], tf1_view)
      self.assertEqual(seen['library'], library)
      self.assertEqual(seen['slim_output_dim'], 'Dimension')
      self.assertTrue(seen['tf_is_real'])
      self.assertTrue(seen['slim_builtins_are_real'])
      # The program's own modules are forgotten after the run; a library
      # outside its folders stays imported, as any library does.
      self.assertFalse('tf1_sibling' in sys.modules)
      self.assertEqual('tf1_outside_lib' in sys.modules, not tf1_paths)
      sys.modules.pop('tf1_outside_lib', None)

  def test_a_shared_tf1_module_on_the_path_runs_as_tf1(self):
    # As tensorflow/tpu's programs import models/common and
    # models/hyperparameters through PYTHONPATH: TF 1.x code outside the
    # program's folder, with no --tf1_path.
    root = self.create_tempdir().full_path
    shared = os.path.join(root, 'shared')
    os.makedirs(shared)
    self._write(shared, 'tf1_shared_hooks.py', '''
        import tensorflow as tf

        class CountingHook(tf.train.SessionRunHook):
          calls = 0

          def after_run(self, run_context, run_values):
            CountingHook.calls += 1
            tf.logging.info('step done')
        ''')
    program = self._write(root, 'program.py', '''
        import sys
        sys.path.insert(0, sys.argv[1])
        import numpy as np
        import tensorflow as tf
        import tf1_shared_hooks

        def input_fn(params):
          x = np.ones([8, 3], np.float32)
          return tf.data.Dataset.from_tensor_slices(
              (x, np.zeros([8], np.int32))).repeat().batch(4)

        def model_fn(features, labels, mode, params):
          logits = tf.layers.dense(features, 2)
          loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
          train_op = tf.train.GradientDescentOptimizer(0.1).minimize(
              loss, tf.train.get_global_step())
          return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

        tf.estimator.Estimator(model_fn, model_dir=sys.argv[2]).train(
            input_fn, max_steps=3, hooks=[tf1_shared_hooks.CountingHook()])
        assert tf1_shared_hooks.CountingHook.calls == 3
        ''')
    try:
      result, err = self._run_quietly(
          program, [shared, self.create_tempdir().full_path])
    finally:
      sys.modules.pop('tf1_shared_hooks', None)
    self.assertEqual(result.exit_code, 0, result.error or err[-2000:])
    self.assertTrue(result.tf1)
    self.assertEqual(result.train_steps, [3])

  def test_everything_is_put_back(self):
    folder = self.create_tempdir().full_path
    program = self._write(folder, 'program.py', '''
        import tensorflow as tf
        FLAG = tf.flags.DEFINE_integer('tf1_put_back_flag', 1, 'A flag.')
        raise RuntimeError('the program failed')
        ''')
    original = vars(tensor_shape.TensorShape)['_v2_behavior']
    meta_path = list(sys.meta_path)
    result, _ = self._run_quietly(program)
    self.assertTrue(result.tf1)
    self.assertEqual(result.exit_code, 1)
    self.assertIs(vars(tensor_shape.TensorShape)['_v2_behavior'], original)
    self.assertEqual(sys.meta_path, meta_path)
    self.assertNotIn('tf1_put_back_flag', tf.compat.v1.flags.FLAGS)
    self.assertIsInstance(tf.TensorShape([4])[0], int)

  @parameterized.named_parameters(
      ('detected', None, 0, True, r'program\.py:3: tf\.flags\.DEFINE_string'),
      ('forced_on', True, 0, True, r'--tf1'),
      ('forced_off', False, 1, False, r'--no-tf1'))
  def test_detection_and_its_override(self, tf1_option, exit_code, on,
                                      reason):
    folder = self.create_tempdir().full_path
    program = self._write(folder, 'program.py', '''
        import tensorflow as tf
        tf.flags.DEFINE_string('tf1_detect_flag', 'x', 'A TF 1.x flag.')
        ''')
    result, _ = self._run_quietly(program, tf1=tf1_option)
    self.assertEqual(result.exit_code, exit_code, result.error)
    self.assertEqual(result.tf1, on)
    self.assertRegex(result.tf1_reason, reason)
    if exit_code:
      self.assertIn("has no attribute 'flags'", result.error)

  def test_graph_code_outside_the_estimator_runs_as_in_tf1(self):
    folder = self.create_tempdir().full_path
    out = os.path.join(folder, 'out.json')
    program = self._write(folder, 'program.py', '''
        import json, sys
        import tensorflow as tf
        x = tf.placeholder(tf.float32, [None, 3])
        total = tf.reduce_sum(x * 2.0)
        with tf.Session() as sess:
          value = sess.run(total, {x: [[1.0, 2.0, 3.0]]})
        with open(sys.argv[1], 'w') as f:
          json.dump({'value': float(value), 'dim': x.shape[1].value}, f)
        ''')
    eager = tf.executing_eagerly()  # other tests may have turned it off
    result, _ = self._run_quietly(program, [out])
    self.assertEqual(result.exit_code, 0, result.error)
    with open(out) as f:
      self.assertEqual(json.load(f), {'value': 12.0, 'dim': 3})
    self.assertEqual(tf.executing_eagerly(), eager)

  def test_tf1_15_imports_contrib_through_compat_v1_and_gfile_modules(self):
    # TF 1.15 code (gpt2-ml) reaches tf.contrib through
    # `tensorflow.compat.v1`, and TF 1.13 code (transformer-xl) imports
    # `tensorflow.gfile` as a module; compat.v2 stays TensorFlow's own.
    folder = self.create_tempdir().full_path
    out = os.path.join(folder, 'out.json')
    self._write(folder, 'tf1_gfile_helper.py', '''
        import tensorflow as tf
        from tensorflow.gfile import Exists as exists
        import tensorflow.logging
        ''')
    program = self._write(folder, 'program.py', '''
        import json, sys
        import tensorflow.compat.v1 as tf
        import tensorflow.compat.v2 as tf2
        from tensorflow.compat import v1 as v1_again
        import tf1_gfile_helper
        config = tf.contrib.tpu.RunConfig(model_dir=sys.argv[1])
        seen = {'run_config': config.model_dir == sys.argv[1],
                'same_module': v1_again is tf and tf.compat.v1 is tf,
                'v2_is_real': tf2 is sys.modules['tensorflow'].compat.v2,
                'exists': tf1_gfile_helper.exists(sys.argv[1]),
                'logging': tf1_gfile_helper.tensorflow.logging is tf.logging}
        with open(sys.argv[2], 'w') as f:
          json.dump(seen, f)
        ''')
    result, _ = self._run_quietly(program, [folder, out])
    self.assertEqual(result.exit_code, 0, result.error)
    self.assertTrue(result.tf1)
    self.assertRegex(result.tf1_reason, r'program\.py:7: tf\.compat\.v1\.contrib')
    with open(out) as f:
      self.assertEqual(json.load(f), {
          'run_config': True, 'same_module': True, 'v2_is_real': True,
          'exists': True, 'logging': True})

  def test_bad_tf1_path_is_refused_before_anything_runs(self):
    folder = self.create_tempdir().full_path
    program = self._write(folder, 'program.py', 'import sys\n')
    with self.assertRaisesRegex(runner.ProgramError, 'no such folder'):
      runner.run_program(program, tf1_paths=[os.path.join(folder, 'nope')])
    with contextlib.redirect_stderr(io.StringIO()) as err:
      code = cli.main(['run', '--tf1_path=' + os.path.join(folder, 'nope'),
                       program])
    self.assertEqual(code, cli.EXIT_USAGE)
    self.assertIn('--tf1_path', err.getvalue())


class DetectTest(tf.test.TestCase, parameterized.TestCase):
  """tf1.detect reads source, follows imports, and names the first use."""

  @parameterized.named_parameters(
      ('flags', 'import tensorflow as tf\nFLAGS = tf.flags.FLAGS\n',
       'program.py:2: tf.flags.FLAGS'),
      ('optimizer_subclass',
       'import tensorflow as tf\n\nclass O(tf.train.Optimizer):\n  pass\n',
       'program.py:3: tf.train.Optimizer'),
      ('aliased', 'import tensorflow as t1\nx = t1.placeholder\n',
       'program.py:2: tf.placeholder'),
      ('contrib_import', 'import os\nfrom tensorflow.contrib import tpu\n',
       'program.py:2: from tensorflow.contrib import tpu'),
      ('first_by_line', 'import tensorflow as tf\na = tf.nn.relu(\n'
       '    tf.get_variable)\nb = tf.logging\n',
       'program.py:3: tf.get_variable'),
      ('compat_v1_is_tf2_code',
       'import tensorflow.compat.v1 as tf\nFLAGS = tf.flags.FLAGS\n', None),
      ('contrib_through_compat_v1',
       'import tensorflow.compat.v1 as tf\nFLAGS = tf.flags.FLAGS\n'
       'c = tf.contrib.tpu.RunConfig\n',
       'program.py:3: tf.compat.v1.contrib.tpu.RunConfig'),
      ('contrib_through_from_compat',
       'from tensorflow.compat import v1\nc = v1.contrib.tpu\n',
       'program.py:2: tf.compat.v1.contrib.tpu'),
      ('tf1_only_module_import',
       'import tensorflow as tf\nfrom tensorflow.gfile import Exists\n',
       'program.py:2: from tensorflow.gfile import Exists'),
      ('compat_v2_module_is_tf2_code',
       'from tensorflow.compat.v2 import io\nx = io.gfile\n', None),
      ('tf2_names_only', 'import tensorflow as tf\nx = tf.nn.relu\n'
       'y = tf.compat.v1.estimator\n', None),
      ('no_tensorflow', 'flags = None\nx = flags.DEFINE_string\n', None))
  def test_evidence(self, source, evidence):
    folder = self.create_tempdir().full_path
    program = os.path.join(folder, 'program.py')
    with open(program, 'w') as f:
      f.write(source)
    found = tf1_lib.detect(program, [folder])
    self.assertEqual(found.tf1, evidence is not None)
    self.assertEqual(found.evidence,
                     None if evidence is None else
                     os.path.join(folder, evidence))

  def test_follows_imports_into_the_folders_only(self):
    root = self.create_tempdir().full_path
    folder, other = os.path.join(root, 'p'), os.path.join(root, 'o')
    os.makedirs(os.path.join(folder, 'pkg'))
    os.makedirs(other)
    tf1_source = 'import tensorflow as tf\nnorm = tf.contrib.layers\n'
    for path, source in (
        (os.path.join(folder, 'program.py'), 'import pkg.model\n'),
        (os.path.join(folder, 'pkg', '__init__.py'), ''),
        (os.path.join(folder, 'pkg', 'model.py'), tf1_source),
        (os.path.join(root, 'prog2.py'), 'import outside\n'),
        (os.path.join(other, 'outside.py'), tf1_source)):
      with open(path, 'w') as f:
        f.write(source)
    found = tf1_lib.detect(os.path.join(folder, 'program.py'), [folder])
    self.assertEqual(found.evidence, os.path.join(
        folder, 'pkg', 'model.py') + ':2: tf.contrib.layers')
    self.assertEqual(found.files, 3)
    self.assertFalse(tf1_lib.detect(os.path.join(root, 'prog2.py'), [root]).tf1)
    self.assertTrue(
        tf1_lib.detect(os.path.join(root, 'prog2.py'), [root, other]).tf1)


class HParamsTest(tf.test.TestCase):
  """tf.contrib.training.HParams, as TF 1.x programs use it."""

  def test_values_keep_their_types(self):
    hparams_class = contrib_lib.contrib().training.HParams
    params = hparams_class(depth=50, rate=0.1, name='resnet', sizes=[1, 2],
                           bf16=True)
    params.parse('depth=18, rate=1, sizes=[3,4,5], bf16=false,name=r18')
    params.add_hparam('image_size', 224)
    params.set_hparam('image_size', '128')
    params.override_from_dict({'rate': 3})
    self.assertEqual(params.values(), {
        'depth': 18, 'rate': 3.0, 'name': 'r18', 'sizes': [3, 4, 5],
        'bf16': False, 'image_size': 128})
    self.assertIsInstance(params.rate, float)
    self.assertEqual(params.get('missing', 7), 7)
    self.assertIn('depth', params)
    self.assertEqual(hparams_class(a=1).parse_json('{"a": 2}').a, 2)

  def test_mistakes_raise(self):
    params = contrib_lib.contrib().training.HParams(depth=50, on=True)
    with self.assertRaisesRegex(KeyError, 'Unknown hyperparameter'):
      params.parse('width=2')
    with self.assertRaisesRegex(ValueError, 'exists'):
      params.add_hparam('depth', 1)
    with self.assertRaisesRegex(ValueError, 'reserved'):
      params.add_hparam('values', 1)
    # As TF 1.x's: a hyperparameter whose value is None may be added over.
    params.add_hparam('num_shards', None)
    params.add_hparam('num_shards', 8)
    self.assertEqual(params.num_shards, 8)
    with self.assertRaisesRegex(ValueError, 'not a bool'):
      params.parse('on=maybe')
    with self.assertRaisesRegex(ValueError, 'is an int'):
      params.set_hparam('depth', 2.5)


class ContribTest(tf.test.TestCase, parameterized.TestCase):
  """The mapping table resolves to TensorFlow's and tf-slim's objects."""

  def test_every_source_of_the_table_resolves(self):
    for name, mapping in tf1_lib.CONTRIB.items():
      for source in mapping.sources:
        self.assertIsNotNone(contrib_lib._attribute_path(source)(),  # pylint: disable=protected-access
                             '%s: %s' % (name, source))
      for renamed in mapping.renames.values():
        got = renamed()
        self.assertTrue(callable(got) or isinstance(got, types.ModuleType),
                        name)

  def test_symbols_programs_use(self):
    import tf_slim  # pylint: disable=g-import-not-at-top
    contrib = contrib_lib.contrib()
    v1 = tf.compat.v1
    for got, want in (
        (contrib.tpu.TPUEstimator, v1.estimator.tpu.TPUEstimator),
        (contrib.tpu.TPUEstimatorSpec, v1.estimator.tpu.TPUEstimatorSpec),
        (contrib.tpu.RunConfig, v1.estimator.tpu.RunConfig),
        (contrib.tpu.InputPipelineConfig,
         v1.estimator.tpu.InputPipelineConfig),
        (contrib.tpu.CrossShardOptimizer, v1.tpu.CrossShardOptimizer),
        (contrib.tpu.bfloat16_scope, v1.tpu.bfloat16_scope),
        (contrib.tpu.python.tpu.tpu_config.TPUConfig,
         v1.estimator.tpu.TPUConfig),
        (contrib.cluster_resolver.TPUClusterResolver,
         tf.distribute.cluster_resolver.TPUClusterResolver),
        (contrib.data.map_and_batch, tf.data.experimental.map_and_batch),
        (contrib.data.parallel_interleave,
         v1.data.experimental.parallel_interleave),
        (contrib.data.TFRecordDataset, v1.data.TFRecordDataset),
        (contrib.layers.layer_norm, tf_slim.layer_norm),
        (contrib.layers.xavier_initializer, tf_slim.xavier_initializer),
        (contrib.slim.arg_scope, tf_slim.arg_scope),
        (contrib.framework.nest, tf.nest),
        (contrib.training.python.training.evaluation.checkpoints_iterator,
         v1.train.checkpoints_iterator),
        (contrib.summary.create_file_writer,
         tf.summary.create_file_writer),
        (contrib.rnn.LSTMCell, v1.nn.rnn_cell.LSTMCell),
        # The module paths Inception-era tensorflow/tpu programs import.
        (contrib.framework.python.ops.arg_scope, tf_slim.arg_scope),
        (contrib.layers.python.layers.regularizers.l2_regularizer,
         tf_slim.l2_regularizer),
        (contrib.layers.python.layers.layers.conv2d, tf_slim.conv2d),
        (contrib.slim.nets.inception.inception_v3,
         importlib.import_module('tf_slim.nets').inception.inception_v3),
        (contrib.keras.layers.Dense, v1.keras.layers.Dense),
        (contrib.util.make_ndarray, tf.make_ndarray),
        (contrib.tpu.python.ops.tpu_ops.all_to_all,
         importlib.import_module(
             'tensorflow.python.tpu.ops.tpu_ops').all_to_all),
        (contrib.distribute.TPUStrategy,
         v1.distribute.experimental.TPUStrategy),
        (contrib.distribute.MirroredStrategy, v1.distribute.MirroredStrategy)):
      self.assertIs(got, want)

  def test_a_mapped_name_brings_no_notice_blaming_the_package(self):
    # TensorFlow's wrapper of tf.compat.v1.estimator.tpu logs "From FILE:
    # The name ... is deprecated" once per name, blaming whoever read it.
    module = contrib_lib._attribute_path('tf.compat.v1.estimator.tpu')()  # pylint: disable=protected-access
    checked = getattr(module, '_tfmw_deprecated_checked', None)
    if checked is None:
      self.skipTest('tf.compat.v1.estimator.tpu is no TensorFlow module '
                    'wrapper here (the compat backend)')
    checked.discard('TPUConfig')
    module._tfmw_warning_count = 0  # pylint: disable=protected-access
    with self.assertNoLogs('tensorflow', level='WARNING'):
      got = contrib_lib.contrib().tpu.TPUConfig
    self.assertIs(got, tf.compat.v1.estimator.tpu.TPUConfig)

  def test_batch_and_drop_remainder(self):
    contrib = contrib_lib.contrib()
    with tf.Graph().as_default():
      dataset = tf.data.Dataset.range(5).apply(
          contrib.data.batch_and_drop_remainder(2))
      batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
      with tf.compat.v1.Session() as sess:
        batches = [sess.run(batch).tolist() for _ in range(2)]
        with self.assertRaises(tf.errors.OutOfRangeError):
          sess.run(batch)
    self.assertEqual(batches, [[0, 1], [2, 3]])

  def test_summary_scalar_takes_family_and_the_global_step(self):
    logdir = self.get_temp_dir()
    summary = contrib_lib.contrib().summary
    with tf.Graph().as_default():
      step = tf.compat.v1.train.get_or_create_global_step()
      writer = summary.create_file_writer(logdir)
      with writer.as_default(), summary.always_record_summaries():
        summary.scalar('loss', tf.constant(2.5), family='train')
        ops = summary.all_summary_ops()
      with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  writer.init()])
        sess.run(ops)
        sess.run(writer.flush())
        del step
    values = {}
    for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
      for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
          values[value.tag] = (event.step, tf.make_ndarray(value.tensor))
    self.assertEqual(values, {'train/loss': (0, 2.5)})

  def test_record_summaries_every_n_global_steps(self):
    logdir = self.get_temp_dir() + '/every_n'
    summary = contrib_lib.contrib().summary
    with tf.Graph().as_default():
      step = tf.compat.v1.train.get_or_create_global_step()
      writer = summary.create_summary_file_writer(logdir)
      with writer.as_default(), summary.record_summaries_every_n_global_steps(
          3, step):
        summary.scalar('step_seen', tf.cast(step, tf.float32))
        ops = summary.all_summary_ops()
      with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(),
                  writer.init()])
        for _ in range(7):
          sess.run(ops)
          sess.run(tf.compat.v1.assign_add(step, 1))
        sess.run(writer.flush())
    steps = []
    for path in glob.glob(os.path.join(logdir, 'events.out.tfevents.*')):
      for event in tf.compat.v1.train.summary_iterator(path):
        steps += [event.step for _ in event.summary.value]
    self.assertEqual(sorted(steps), [0, 3, 6])

  def test_tf1_doc_table_is_the_mapping(self):
    with open(os.path.join(_REPO, 'docs', 'tf1.md')) as f:
      doc = f.read()
    self.assertTrue(
        tf1_lib.coverage_markdown() in doc,
        'regenerate the table of docs/tf1.md from '
        'estimator_bf16.runner.tf1.coverage_markdown():\n' +
        tf1_lib.coverage_markdown())


class ShapesTest(tf.test.TestCase):
  """TF 1.x shapes for code of the scope only, undone on exit."""

  def test_dimension_for_scoped_code_int_elsewhere(self):
    folder = self.create_tempdir().full_path
    code = compile('def first(shape):\n  return shape[0], list(shape)\n',
                   os.path.join(folder, 'scoped.py'), 'exec')
    shape = tf.TensorShape([3, None])
    with scope_lib.Tf1Scope([folder]) as scope:
      scoped = {'__builtins__': scope.builtins}
      exec(code, scoped)  # pylint: disable=exec-used
      first, dims = scoped['first'](shape)
      self.assertIsInstance(first, tf.compat.v1.Dimension)
      self.assertEqual(first.value, 3)
      self.assertIsNone(dims[1].value)
      self.assertIsInstance(shape[0], int)
      self.assertIsNone(shape[1])
      with scope_lib.Tf1Scope([folder]):  # nested scopes
        self.assertIsInstance(scoped['first'](shape)[0],
                              tf.compat.v1.Dimension)
      self.assertIsInstance(scoped['first'](shape)[0],
                            tf.compat.v1.Dimension)
    self.assertIsInstance(scoped['first'](shape)[0], int)

  def _tf1_code(self, builtins):
    """A function run as TF 1.x code on `builtins`: (dim type, shape[0])."""
    code = compile('def first(shape):\n  return shape[0]\n',
                   os.path.join(self.create_tempdir().full_path, 'x.py'),
                   'exec')
    scoped = {'__builtins__': builtins}
    exec(code, scoped)  # pylint: disable=exec-used
    return scoped['first']

  def test_a_stand_in_installed_before_is_asked_and_put_back(self):
    original = vars(tensor_shape.TensorShape)['_v2_behavior']
    asked = []

    def stand_in_getter(shape):
      asked.append(shape)
      return original.fget(shape)

    stand_in = property(stand_in_getter)
    builtins = dict(vars(builtins_module))
    first = self._tf1_code(builtins)
    tensor_shape.TensorShape._v2_behavior = stand_in
    try:
      with module_lib.v1_shapes_for(builtins):
        self.assertIsInstance(first(tf.TensorShape([3])),
                              tf.compat.v1.Dimension)
        self.assertFalse(asked)  # TF 1.x code: the scope answers.
        self.assertIsInstance(tf.TensorShape([3])[0], int)
        self.assertTrue(asked)  # Other code: the stand-in answers.
      self.assertIs(vars(tensor_shape.TensorShape)['_v2_behavior'], stand_in)
    finally:
      tensor_shape.TensorShape._v2_behavior = original

  def test_scopes_on_two_threads_undo_when_the_last_leaves(self):
    original = vars(tensor_shape.TensorShape)['_v2_behavior']
    base = dict(vars(builtins_module))
    entered, leave_first, first_left = (threading.Event() for _ in range(3))
    seen = {}

    def first_thread(builtins):
      with module_lib.v1_shapes_for(builtins):
        entered.set()
        leave_first.wait(30)
      first_left.set()

    first_builtins, second_builtins = dict(base), dict(base)
    first_code = self._tf1_code(first_builtins)
    second_code = self._tf1_code(second_builtins)
    thread = threading.Thread(target=first_thread, args=(first_builtins,))
    thread.start()
    try:
      self.assertTrue(entered.wait(30))
      with module_lib.v1_shapes_for(second_builtins):
        # The first thread leaves while this one is still inside.
        leave_first.set()
        self.assertTrue(first_left.wait(30))
        seen['second'] = type(second_code(tf.TensorShape([3])))
        seen['first_after_leaving'] = type(first_code(tf.TensorShape([3])))
        self.assertIsNot(vars(tensor_shape.TensorShape)['_v2_behavior'],
                         original)
    finally:
      leave_first.set()
      thread.join(30)
    self.assertEqual(seen, {'second': tf.compat.v1.Dimension,
                            'first_after_leaving': int})
    self.assertIs(vars(tensor_shape.TensorShape)['_v2_behavior'], original)
    self.assertIsInstance(second_code(tf.TensorShape([3])), int)

  def test_covers_the_folders_but_not_libraries_or_this_package(self):
    root = self.create_tempdir().full_path
    scope = scope_lib.Tf1Scope([root])
    self.assertTrue(scope.covers(os.path.join(root, 'a', 'b.py')))
    self.assertFalse(scope.covers(os.path.join(
        root, '.venv', 'lib', 'site-packages', 'tf_slim', 'x.py')))
    self.assertFalse(scope.covers(eb.__file__))
    self.assertFalse(scope.covers(root + '_sibling/x.py'))

  def test_covers_a_tf1_module_outside_the_folders_by_its_source(self):
    scope = scope_lib.Tf1Scope([self.create_tempdir().full_path])
    elsewhere = self.create_tempdir().full_path
    sources = {
        'tf1.py': 'import tensorflow as tf\ntf.logging.info("x")\n',
        'v1_compat.py': 'import tensorflow.compat.v1 as tf\n'
                        'tf.logging.info("x")\n',
        'tf2.py': 'import tensorflow as tf\nx = tf.constant(1)\n',
        'python2.py': 'print "x"\n'}
    for name, source in sources.items():
      with open(os.path.join(elsewhere, name), 'w') as f:
        f.write(source)
    covered = {name: scope.covers(os.path.join(elsewhere, name))
               for name in sources}
    self.assertEqual(covered, {'tf1.py': True, 'v1_compat.py': False,
                               'tf2.py': False, 'python2.py': False})
    # The Python installation's own files never are.
    self.assertFalse(scope.covers(os.__file__))


if __name__ == '__main__':
  tf.test.main()
