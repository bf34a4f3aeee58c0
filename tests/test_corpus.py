"""The corpus runner (scripts/corpus.py) on a tiny repository it is given.

The real corpus (tensorflow/tpu at three commits) takes an hour and the
repository; here a git repository made by the test holds two programs: one that
trains and evaluates, one without a recipe. The table must say so, row by
row. A second one, laid out like the other repositories (programs at its
root, `--source`), gets its own table; one of its programs fails in
float32.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from scripts import corpus
from scripts import corpus_checks
from scripts import corpus_data
from scripts import corpus_programs
from scripts import corpus_recipes
from scripts import corpus_runs
from scripts import corpus_table

_TINY = '''
from absl import app, flags
import numpy as np
import tensorflow.compat.v1 as tf
from tensorflow.compat.v1 import estimator as tf_estimator
import tiny_flags

FLAGS = flags.FLAGS


def input_fn(params):
  rng = np.random.RandomState(0)
  x = rng.rand(64, 6).astype(np.float32)
  y = (x[:, 0] > 0.5).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
      params['batch_size'], drop_remainder=True)


def model_fn(features, labels, mode, params):
  logits = tf.layers.dense(tf.layers.dense(features, 8, tf.nn.relu), 2)
  loss = tf.losses.sparse_softmax_cross_entropy(labels, logits)
  train_op = tf.train.AdamOptimizer(0.05).minimize(
      loss, tf.train.get_global_step())

  def metric_fn(labels, logits):
    return {'accuracy': tf.metrics.accuracy(labels, tf.argmax(logits, 1))}

  return tf_estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, logits]))


def main(argv):
  del argv
  estimator = tf_estimator.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=FLAGS.use_tpu, train_batch_size=8,
      eval_batch_size=8, config=tf_estimator.tpu.RunConfig(
          model_dir=FLAGS.model_dir, tf_random_seed=1))
  estimator.train(input_fn, max_steps=FLAGS.train_steps)
  estimator.evaluate(input_fn, steps=2)


if __name__ == '__main__':
  app.run(main)
'''
_TINY_FLAGS = '''
from absl import flags
flags.DEFINE_string('model_dir', None, 'Where.')
flags.DEFINE_integer('train_steps', 100, 'Steps.')
flags.DEFINE_bool('use_tpu', True, 'TPU.')
'''
_BROKEN = '''
from absl import app
# TPUEstimator( is what marks a program; this one needs data it lacks.
def main(argv):
  raise FileNotFoundError('gs://bucket/train-*: no such file')
if __name__ == '__main__':
  app.run(main)
'''

_NO_DATA = '''
from absl import app, flags
flags.DEFINE_integer('train_steps', 1, 'Steps.')
FLAGS = flags.FLAGS
# TPUEstimator( marks a program; this one stops before it builds one.
def main(argv):
  del argv
  raise FileNotFoundError('no data for %d steps' % FLAGS.train_steps)
if __name__ == '__main__':
  app.run(main)
'''


def _make_repository(folder, files):
  """A git repository of `files` ({path: text}); returns its git dir."""
  for path, text in files.items():
    os.makedirs(os.path.join(folder, os.path.dirname(path)), exist_ok=True)
    with open(os.path.join(folder, path), 'w') as f:
      f.write(textwrap.dedent(text))
  _git(folder, 'init', '-q')
  _git(folder, 'add', '.')
  _git(folder, 'commit', '-q', '-m', 'programs')
  return os.path.join(folder, '.git')


def _git(folder, *args):
  env = dict(os.environ, GIT_AUTHOR_NAME='t', GIT_AUTHOR_EMAIL='t@t',
             GIT_COMMITTER_NAME='t', GIT_COMMITTER_EMAIL='t@t')
  return subprocess.run(['git', '-C', folder] + list(args), env=env,
                        check=True, capture_output=True, text=True).stdout


@pytest.mark.slow
class CorpusRunTest(tf.test.TestCase):

  def _repository(self):
    return _make_repository(self.create_tempdir().full_path, {
        'models/official/tiny/tiny_main.py': _TINY,
        'models/official/tiny/tiny_flags.py': _TINY_FLAGS,
        'models/official/other/other_main.py': _BROKEN,
        'models/official/tiny/README.md': 'not a program\n',
    })

  def _corpus(self, out, *sources):
    """Runs scripts/corpus.py on `sources`; returns what it wrote to `out`."""
    code = corpus.main(list(sources) + [
        '--python', sys.executable, '--out', out,
        '--work', self.create_tempdir().full_path, '--max_seconds', '120'])
    self.assertEqual(code, 0)
    with open(out) as f:
      return f.read()

  def test_the_table_says_what_each_program_did(self):
    git_dir = self._repository()
    recipes = {
        'models/official/tiny/tiny_main.py': corpus_recipes.Recipe(
            # --not_ours is defined nowhere: dropped, or absl would refuse.
            ('--use_tpu=false', '--model_dir={model_dir}',
             '--train_steps=6', '--not_ours=1'),
            # Also dropped from the evaluation of the float32 checkpoint.
            eval_flags=('--not_ours=2',)),
    }
    out = os.path.join(self.create_tempdir().full_path, 'corpus.md')
    with mock.patch.dict(corpus_recipes.RECIPES, recipes, clear=True):
      table = self._corpus(out, '--repo', git_dir, '--commits', 'HEAD')
    self.assertIn('Passed: **1 of 1**', table)
    rows = {line.split('|')[2].strip(' `'): line
            for line in table.splitlines() if line.startswith('| ')
            and '.py' in line}
    self.assertEqual(sorted(rows), ['official/other/other_main.py',
                                    'official/tiny/tiny_main.py'])
    tiny = rows['official/tiny/tiny_main.py']
    self.assertRegex(tiny, r'\| OK \| OK \| 100\.0% \| no problems \| OK \| '
                     r'match \(same weights\)')
    self.assertTrue(tiny.rstrip(' |').endswith('pass'), tiny)
    # A program whose float32 run fails: the next test's train.py.
    self.assertIn('no recipe', rows['official/other/other_main.py'])

  def test_another_repository_gets_its_own_table(self):
    # Laid out like google-research/bert: programs at the root, one more
    # in a folder that only `Source.programs` names (no marker in it).
    # Its program stops at once (one process, not a training's four):
    # what is tested is that its own recipe reached it, and where its row
    # goes; the rows of a training are the test above's.
    git_dir = _make_repository(self.create_tempdir().full_path, {
        'train.py': _NO_DATA,
        'tools/launch.py': 'raise SystemExit(3)\n',
        'tools/skipped.py': _BROKEN,
    })
    recipes = {
        'someone/tiny:train.py': corpus_recipes.Recipe(
            ('--use_tpu=false', '--model_dir={model_dir}',
             '--train_steps=6')),
        # tensorflow/tpu's key: not this repository's program.
        'train.py': corpus_recipes.Recipe(skip='not this one'),
        'someone/tiny:tools/skipped.py': corpus_recipes.Recipe(
            skip='needs what is not here'),
    }
    sources = {'someone/tiny': corpus_recipes.Source(
        ('',), programs=('tools/launch.py',))}
    out = os.path.join(self.create_tempdir().full_path, 'corpus.md')
    tpu_table = 'tensorflow/tpu table\n'
    with open(out, 'w') as f:
      f.write('# Corpus\n\n%s\n\n%s%s\n## Others\n\n%s\nold\n' % (
          corpus_table.TABLE_MARK, tpu_table, corpus_table.END_MARK,
          corpus_table.OTHERS_MARK))
    with mock.patch.dict(corpus_recipes.RECIPES, recipes, clear=True), \
        mock.patch.dict(corpus_recipes.SOURCES, sources):
      text = self._corpus(out, '--source', 'someone/tiny=%s@HEAD' % git_dir)
    # The tensorflow/tpu table stays; the new one replaces `old`.
    self.assertIn(corpus_table.TABLE_MARK + '\n\n' + tpu_table +
                  corpus_table.END_MARK, text)
    self.assertNotIn('old', text)
    table = text[text.index(corpus_table.OTHERS_MARK):]
    self.assertIn('| repository | commit | program |', table)
    self.assertNotIn(git_dir, table)  # no machine paths
    rows = {line.split('|')[3].strip(' `'): line
            for line in table.splitlines() if '| someone/tiny |' in line}
    self.assertEqual(sorted(rows), ['tools/launch.py', 'tools/skipped.py',
                                    'train.py'])
    # Its flag came from the recipe keyed by this repository.
    self.assertIn('not runnable: float32: exit 1: FileNotFoundError: no '
                  'data for 6 steps', rows['train.py'])
    self.assertIn('no recipe: needs what is not here',
                  rows['tools/skipped.py'])
    self.assertIn('no recipe: what it needs is not known here',
                  rows['tools/launch.py'])


class CorpusPartsTest(tf.test.TestCase):

  def test_metric_values_dtypes_and_noise(self):
    reference = {'evaluations': [{'accuracy': [0.5, 'float32'],
                                  'loss': [2.0, 'float32'],
                                  'global_step': [4, 'int64']}]}

    def bf16(accuracy, loss, dtype='float32'):
      return {'evaluations': [{'accuracy': [accuracy, dtype],
                               'loss': [loss, 'float32'],
                               'global_step': [4, 'int64']}]}

    self.assertEqual(
        corpus_checks.metric_problems(reference, bf16(0.625, 2.3)), [])
    # A share moves by whole examples: 0.25 apart is the limit.
    self.assertLen(
        corpus_checks.metric_problems(reference, bf16(0.875, 2.0)), 1)
    self.assertIn('eval accuracy is bfloat16',
                  corpus_checks.metric_problems(
                      reference, bf16(0.5, 2.0, 'bfloat16'))[0])
    self.assertIn('eval loss 4',
                  corpus_checks.metric_problems(reference,
                                                bf16(0.5, 4.0))[0])
    self.assertEqual(corpus_checks.metric_problems(
        reference, bf16(0.5, 4.0), values=False), [])
    self.assertEqual(corpus_checks.metric_problems(reference, {}),
                     ['no evaluation'])
    # COCO's AP and AR are shares: near zero after a few steps, they differ
    # by little in absolute terms and a lot relative to their size.
    coco = {'evaluations': [{'AP50': [0.0004, 'float32'],
                             'ARmax10': [0.0, 'float32']}]}
    coco_bf16 = {'evaluations': [{'AP50': [0.025, 'float32'],
                                  'ARmax10': [0.02, 'float32']}]}
    self.assertEqual(corpus_checks.metric_problems(coco, coco_bf16), [])
    # A diverged run is never close.
    self.assertIn('eval loss nan', corpus_checks.metric_problems(
        reference, bf16(0.5, float('nan')))[0])
    # A row's values come from the float32 checkpoint evaluated in
    # bfloat16 when there is one; names and dtypes from the fresh run.
    row = corpus_checks.Row(
        'c', 'p', '2.15.1',
        float32=corpus_checks.Outcome(0, 1, '', reference),
        bfloat16=corpus_checks.Outcome(0, 1, '', bf16(0.9, 40.0)),
        same_weights=corpus_checks.Outcome(0, 1, '', bf16(0.5, 2.1)))
    self.assertEqual(corpus_checks.row_metric_problems(row), [])
    row.same_weights = corpus_checks.Outcome(0, 1, '', bf16(0.5, 9.0))
    self.assertIn('eval loss 9', corpus_checks.row_metric_problems(row)[0])
    # A program that trained on from the checkpoint evaluated other
    # weights: the fresh runs are compared instead.
    trained_on = bf16(0.5, 9.0)
    trained_on['evaluations'][-1]['global_step'] = [8, 'int64']
    trained_on['train_steps'] = [4]
    row.same_weights = corpus_checks.Outcome(0, 1, '', trained_on)
    row.bfloat16 = corpus_checks.Outcome(0, 1, '', bf16(0.5, 2.2))
    self.assertEqual(corpus_checks.row_metric_problems(row), [])

  def test_a_programs_flags_come_from_what_it_imports(self):
    root = self.create_tempdir().full_path
    files = {
        'models/a/main.py': 'import helper\nfrom common import shared\n'
                            'import args\n'
                            'flags.DEFINE_integer("steps", 1, "")\n',
        'models/a/helper.py': 'flags.DEFINE_string(name="data_dir", '
                              'default="", help="")\n',
        'models/common/shared.py': "flags.DEFINE_bool('use_tpu', 1, '')\n",
        'models/b/other.py': "flags.DEFINE_bool('precision', 1, '')\n",
        # argparse's flags count too (google-research/electra).
        'models/a/args.py': "parser.add_argument('--data-dir', '-d')\n",
    }
    for path, text in files.items():
      os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
      with open(os.path.join(root, path), 'w') as f:
        f.write(text)
    self.assertEqual(
        corpus_programs.program_flags(
            os.path.join(root, 'models/a/main.py'),
            [os.path.join(root, 'models')]),
        {'steps', 'data_dir', 'use_tpu', 'data-dir'})

  def test_rows_come_back_from_their_json(self):
    row = corpus_checks.Row(
        'abcd1234', 'models/a/main.py', '2.15.1',
        float32=corpus_checks.Outcome(0, 3.5, '', {'evaluations': []}),
        plan='OK')
    again = corpus_checks.row_from_dict(
        json.loads(json.dumps(dataclasses.asdict(row))))
    self.assertEqual(again, row)
    self.assertTrue(again.float32.ok)

  def test_the_table_goes_below_the_mark(self):
    path = os.path.join(self.create_tempdir().full_path, 'corpus.md')
    with open(path, 'w') as f:
      f.write('# Title\n\nText.\n\n' + corpus_table.TABLE_MARK +
              '\nold table\n')
    corpus_table.write_table(path, 'new table\n')
    with open(path) as f:
      self.assertEqual(f.read(), '# Title\n\nText.\n\n' +
                       corpus_table.TABLE_MARK + '\n\nnew table\n')
    # A table ends at the next mark: what follows it stays.
    with open(path, 'a') as f:
      f.write(corpus_table.END_MARK + '\nMore.\n' + corpus_table.OTHERS_MARK +
              '\nx\n')
    corpus_table.write_table(path, 'newer\n')
    corpus_table.write_table(path, 'others\n', corpus_table.OTHERS_MARK)
    with open(path) as f:
      self.assertEqual(f.read(), '# Title\n\nText.\n\n' +
                       corpus_table.TABLE_MARK + '\n\nnewer\n\n' +
                       corpus_table.END_MARK + '\nMore.\n' +
                       corpus_table.OTHERS_MARK + '\n\nothers\n')

  def test_the_coco_records_and_json_agree(self):
    folder = self.create_tempdir().full_path
    corpus_data.write_data('coco', folder)
    source_ids = {}
    for split in ('train', 'val'):
      path = os.path.join(folder, split + '.tfrecord')
      source_ids[split] = []
      # Read without eager execution, which other test modules of the
      # process may have turned off.
      for record in tf.compat.v1.io.tf_record_iterator(path):
        feature = tf.train.Example.FromString(record).features.feature
        for key in ('image/encoded', 'image/source_id', 'image/height',
                    'image/width', 'image/object/class/label',
                    'image/object/area', 'image/object/is_crowd',
                    'image/segmentation/class/encoded', 'image/object/mask'):
          self.assertIn(key, feature)
        size = corpus_data.COCO_IMAGE_SIZE
        self.assertEqual(feature['image/height'].int64_list.value, [size])
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
          pixels = session.run(tf.io.decode_jpeg(
              feature['image/encoded'].bytes_list.value[0]))
        self.assertEqual(pixels.shape, (size, size, 3))
        box = {side: np.array(feature['image/object/bbox/' + side]
                              .float_list.value)
               for side in ('xmin', 'ymin', 'xmax', 'ymax')}
        labels = feature['image/object/class/label'].int64_list.value
        # Mask R-CNN's decoder: one PNG mask per box, 1 exactly on the
        # box's pixels.
        pngs = feature['image/object/mask'].bytes_list.value
        self.assertLen(pngs, len(labels))
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
          png = tf.compat.v1.placeholder(tf.string, [])
          decode = tf.io.decode_png(png, channels=1)
          masks = [session.run(decode, {png: data}) for data in pngs]
        for index, mask in enumerate(masks):
          self.assertEqual(mask.shape, (size, size, 1))
          rows, columns = np.nonzero(mask[:, :, 0])
          self.assertEqual(set(mask.flatten()), {0, 1})
          self.assertEqual(columns.min(), round(box['xmin'][index] * size))
          self.assertEqual(columns.max() + 1,
                           round(box['xmax'][index] * size))
          self.assertEqual(rows.min(), round(box['ymin'][index] * size))
          self.assertEqual(rows.max() + 1, round(box['ymax'][index] * size))
        self.assertBetween(len(labels), 1, 3)
        for side in box.values():
          self.assertLen(side, len(labels))
          self.assertTrue(np.all((side >= 0) & (side <= 1)), side)
        self.assertTrue(np.all(box['xmin'] < box['xmax']))
        self.assertTrue(np.all(box['ymin'] < box['ymax']))
        self.assertTrue(all(1 <= label <= corpus_data.COCO_CLASSES
                            for label in labels))
        source_ids[split].append(
            int(feature['image/source_id'].bytes_list.value[0]))
    with open(os.path.join(folder, 'instances_val.json')) as f:
      coco = json.load(f)
    # pycocotools finds each validation record's image and boxes by id.
    self.assertEqual(sorted(image['id'] for image in coco['images']),
                     sorted(source_ids['val']))
    self.assertFalse(set(source_ids['train']) & set(source_ids['val']))
    image_ids = {image['id'] for image in coco['images']}
    categories = {category['id'] for category in coco['categories']}
    for annotation in coco['annotations']:
      self.assertIn(annotation['image_id'], image_ids)
      self.assertIn(annotation['category_id'], categories)
      x, y, width, height = annotation['bbox']
      self.assertGreater(min(width, height), 0)
      self.assertLessEqual(x + width, corpus_data.COCO_IMAGE_SIZE)
      self.assertLessEqual(y + height, corpus_data.COCO_IMAGE_SIZE)
      self.assertEqual(annotation['area'], width * height)
      # The 'segm' evaluation's polygon: the box's corners.
      polygon, = annotation['segmentation']
      self.assertEqual(sorted(zip(polygon[::2], polygon[1::2])),
                       [(x, y), (x, y + height), (x + width, y),
                        (x + width, y + height)])
    self.assertIn('info', coco)  # pycocotools' loadRes copies it

  def test_the_reason_is_the_line_that_says_why(self):
    self.assertEqual(corpus_runs._reason(  # pylint: disable=protected-access
        'Traceback ...\nValueError: bad\n\nestimator_bf16 run: p.py\n'
        'failed: ValueError: bad (at p.py:3)\nexit code: 1\n'),
                     'ValueError: bad (at p.py:3)')
    self.assertEqual(corpus_runs._reason(  # pylint: disable=protected-access
        "FATAL Flags parsing error: Unknown command line flag 'x'\n"
        'estimator_bf16: warning: --precision went to the program\n'),
                     "FATAL Flags parsing error: Unknown command line flag 'x'")
    # An installed library's file is named from the library on.
    self.assertEqual(corpus_runs._reason(  # pylint: disable=protected-access
        "failed: ImportError: cannot import name 'profiler' (/v/lib/"
        'python3.11/site-packages/tensorflow/python/eager/__init__.py) (at '
        './main.py:37)\n'),
                     "ImportError: cannot import name 'profiler' (tensorflow/"
                     'python/eager/__init__.py) (at ./main.py:37)')


if __name__ == '__main__':
  tf.test.main()
