"""A whole legacy TPU program, shaped as tensorflow/tpu's mnist_tpu.py is.

absl flags, `app.run(main)`, a `--use_tpu` flag, a cluster resolver built
from `--tpu` before `--use_tpu` is looked at (so with no TPU named it asks
for `TPUClusterResolver(None)`), its own RunConfig / TPUConfig /
TPUEstimator, then train, evaluate, predict and export. It imports its model
from a sibling module, as such programs do, and knows nothing about
estimator_bf16: the tests run it with `python -m estimator_bf16 run`.

It writes `--results` (JSON: eval metrics, predicted classes, export path).
"""

import json

from absl import app
from absl import flags
import tensorflow as tf
from tensorflow.compat.v1 import estimator as tf_estimator

import legacy_tpu_program  # A sibling: found through sys.path[0].

FLAGS = flags.FLAGS
flags.DEFINE_string('tpu', None, 'TPU name or address; none runs locally.')
flags.DEFINE_string('tpu_zone', None, 'Zone of the TPU.')
flags.DEFINE_string('gcp_project', None, 'Project of the TPU.')
flags.DEFINE_bool('use_tpu', True, 'Train on a TPU.')
flags.DEFINE_string('model_dir', None, 'Checkpoints and summaries.')
flags.DEFINE_integer('train_steps', 60, 'Training steps.')
flags.DEFINE_integer('eval_steps', 8, 'Evaluation steps of 32 examples.')
flags.DEFINE_string('results', None, 'Where to write the results JSON.')
flags.mark_flag_as_required('model_dir')


def run(build_model_fn):
  """Trains, evaluates, predicts and exports with `build_model_fn(model_dir)`."""
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
      FLAGS.tpu, zone=FLAGS.tpu_zone, project=FLAGS.gcp_project)
  config = tf_estimator.tpu.RunConfig(
      cluster=resolver, model_dir=FLAGS.model_dir, tf_random_seed=7,
      save_checkpoints_steps=20, keep_checkpoint_max=3,
      tpu_config=tf_estimator.tpu.TPUConfig(iterations_per_loop=10))
  estimator = tf_estimator.tpu.TPUEstimator(
      model_fn=build_model_fn(FLAGS.model_dir), use_tpu=FLAGS.use_tpu,
      train_batch_size=32, eval_batch_size=32, predict_batch_size=8,
      config=config)
  estimator.train(legacy_tpu_program.train_input_fn,
                  max_steps=FLAGS.train_steps)
  metrics = estimator.evaluate(legacy_tpu_program.eval_input_fn,
                               steps=FLAGS.eval_steps)
  classes = [int(p['classes']) for p in
             estimator.predict(legacy_tpu_program.predict_input_fn)]
  export_dir = estimator.export_saved_model(
      FLAGS.model_dir + '/export',
      legacy_tpu_program.serving_input_receiver_fn)
  print('eval accuracy %.4f loss %.4f' % (metrics['accuracy'],
                                           metrics['loss']))
  if FLAGS.results:
    with open(FLAGS.results, 'w') as f:
      json.dump({'accuracy': float(metrics['accuracy']),
                 'loss': float(metrics['loss']), 'classes': classes,
                 'export_dir': export_dir.decode()}, f)


def main(argv):
  del argv
  run(legacy_tpu_program.model_fn_builder)


if __name__ == '__main__':
  app.run(main)
