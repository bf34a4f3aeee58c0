"""A BERT-style classifier program as TF 1.12-era code wrote it.

Task: token sequences of `--max_seq_length`; the label says whether most
tokens after [CLS] are in the upper half of the vocabulary. The program
writes its own TFRecords, trains, evaluates, and writes
`eval_results.txt` to `--output_dir`.
"""

import os

import numpy as np
import tensorflow as tf

import tf1_bert_modeling as modeling
import tf1_bert_optimization as optimization

flags = tf.flags
FLAGS = flags.FLAGS

flags.DEFINE_string('output_dir', None, 'Model checkpoints and results.')
flags.DEFINE_integer('max_seq_length', 16, 'Tokens per example.')
flags.DEFINE_integer('train_batch_size', 32, 'Training batch.')
flags.DEFINE_integer('eval_batch_size', 32, 'Evaluation batch.')
flags.DEFINE_float('learning_rate', 2e-3, 'Peak learning rate.')
flags.DEFINE_integer('num_train_steps', 80, 'Training steps.')
flags.DEFINE_bool('use_tpu', False, 'Train on a TPU.')
flags.DEFINE_string('tpu_name', None, 'The TPU to use.')
flags.DEFINE_integer('iterations_per_loop', 10, 'Steps per TPU loop.')

_VOCAB = 32


def write_examples(path, num_examples, seed):
  """TFRecords of (input_ids, input_mask, label_ids)."""
  rng = np.random.RandomState(seed)
  with tf.python_io.TFRecordWriter(path) as writer:
    for _ in range(num_examples):
      length = rng.randint(4, FLAGS.max_seq_length + 1)
      ids = [1] + list(rng.randint(2, _VOCAB, size=length - 1))
      mask = [1] * length
      ids += [0] * (FLAGS.max_seq_length - length)
      mask += [0] * (FLAGS.max_seq_length - length)
      high = sum(int(i >= _VOCAB // 2) for i in ids[1:length])
      label = int(2 * high > length - 1)
      feature = {
          'input_ids': tf.train.Feature(
              int64_list=tf.train.Int64List(value=ids)),
          'input_mask': tf.train.Feature(
              int64_list=tf.train.Int64List(value=mask)),
          'label_ids': tf.train.Feature(
              int64_list=tf.train.Int64List(value=[label])),
      }
      writer.write(tf.train.Example(
          features=tf.train.Features(feature=feature)).SerializeToString())


def file_based_input_fn_builder(input_file, seq_length, is_training):
  name_to_features = {
      'input_ids': tf.FixedLenFeature([seq_length], tf.int64),
      'input_mask': tf.FixedLenFeature([seq_length], tf.int64),
      'label_ids': tf.FixedLenFeature([], tf.int64),
  }

  def _decode_record(record):
    example = tf.parse_single_example(record, name_to_features)
    for name in list(example.keys()):
      example[name] = tf.to_int32(example[name])
    return example

  def input_fn(params):
    d = tf.data.TFRecordDataset(input_file)
    if is_training:
      d = d.repeat().shuffle(buffer_size=256, seed=3)
    d = d.apply(tf.contrib.data.map_and_batch(
        lambda record: _decode_record(record),
        batch_size=params['batch_size'], drop_remainder=True))
    return d

  return input_fn


def model_fn_builder(learning_rate, num_train_steps, use_tpu):

  def model_fn(features, labels, mode, params):
    del labels, params
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    model = modeling.Encoder(features['input_ids'], features['input_mask'],
                             is_training)
    output_layer = model.pooled_output
    hidden_size = output_layer.shape[-1].value
    output_weights = tf.get_variable(
        'output_weights', [2, hidden_size],
        initializer=tf.truncated_normal_initializer(stddev=0.02))
    output_bias = tf.get_variable('output_bias', [2],
                                  initializer=tf.zeros_initializer())
    logits = tf.nn.bias_add(
        tf.matmul(output_layer, output_weights, transpose_b=True),
        output_bias)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    one_hot = tf.one_hot(features['label_ids'], depth=2, dtype=tf.float32)
    per_example_loss = -tf.reduce_sum(one_hot * log_probs, axis=-1)
    loss = tf.reduce_mean(per_example_loss)
    if mode == tf.estimator.ModeKeys.TRAIN:
      train_op = optimization.create_optimizer(
          loss, learning_rate, num_train_steps, use_tpu)
      return tf.contrib.tpu.TPUEstimatorSpec(mode=mode, loss=loss,
                                             train_op=train_op)

    def metric_fn(per_example_loss, label_ids, logits):
      predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
      return {
          'eval_accuracy': tf.metrics.accuracy(label_ids, predictions),
          'eval_loss': tf.metrics.mean(per_example_loss),
      }

    return tf.contrib.tpu.TPUEstimatorSpec(
        mode=mode, loss=loss,
        eval_metrics=(metric_fn, [per_example_loss, features['label_ids'],
                                  logits]))

  return model_fn


def main(_):
  tf.logging.set_verbosity(tf.logging.WARN)
  tf.gfile.MakeDirs(FLAGS.output_dir)
  train_file = os.path.join(FLAGS.output_dir, 'train.tf_record')
  eval_file = os.path.join(FLAGS.output_dir, 'eval.tf_record')
  if not tf.gfile.Exists(train_file):
    write_examples(train_file, 512, seed=1)
    write_examples(eval_file, 128, seed=2)

  tpu_cluster_resolver = None
  if FLAGS.use_tpu and FLAGS.tpu_name:
    tpu_cluster_resolver = tf.contrib.cluster_resolver.TPUClusterResolver(
        FLAGS.tpu_name)
  is_per_host = tf.contrib.tpu.InputPipelineConfig.PER_HOST_V2
  run_config = tf.contrib.tpu.RunConfig(
      cluster=tpu_cluster_resolver, model_dir=FLAGS.output_dir,
      save_checkpoints_steps=40, tf_random_seed=5,
      tpu_config=tf.contrib.tpu.TPUConfig(
          iterations_per_loop=FLAGS.iterations_per_loop,
          per_host_input_for_training=is_per_host))
  estimator = tf.contrib.tpu.TPUEstimator(
      use_tpu=FLAGS.use_tpu,
      model_fn=model_fn_builder(FLAGS.learning_rate, FLAGS.num_train_steps,
                                FLAGS.use_tpu),
      config=run_config, train_batch_size=FLAGS.train_batch_size,
      eval_batch_size=FLAGS.eval_batch_size)
  estimator.train(
      input_fn=file_based_input_fn_builder(train_file, FLAGS.max_seq_length,
                                           True),
      max_steps=FLAGS.num_train_steps)
  result = estimator.evaluate(
      input_fn=file_based_input_fn_builder(eval_file, FLAGS.max_seq_length,
                                           False),
      steps=128 // FLAGS.eval_batch_size)
  with tf.gfile.GFile(os.path.join(FLAGS.output_dir, 'eval_results.txt'),
                      'w') as writer:
    for key in sorted(result.keys()):
      writer.write('%s = %s\n' % (key, str(result[key])))
  print('eval accuracy %.4f loss %.4f' % (result['eval_accuracy'],
                                           result['eval_loss']))


if __name__ == '__main__':
  flags.mark_flag_as_required('output_dir')
  tf.app.run()
