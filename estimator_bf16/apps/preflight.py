"""Checks that run before training writes anything to model_dir.

A bad --model_dir or unusable data should fail in seconds, with the flag or
file named, not after graph building and a first checkpoint. Both checks
here run before the Estimator exists:

* `check_model_dir`: the directory can be created and written to;
* `check_input`: one batch of the training data and one of the eval data
  can be read, so an empty data set, a file that is not TFRecord, a missing
  feature, images of the wrong size or labels out of range in the first
  records fail with the file named. Damage further into the data is caught
  while training, by the same checks in the input pipeline.
"""

import os

import tensorflow as tf

from estimator_bf16.models import records


class ModelDirError(ValueError):
  """model_dir cannot be created or written."""


def check_model_dir(model_dir):
  """Creates `model_dir` if needed and checks that a file can be written.

  Raises:
    ModelDirError: with the path and the operating system's reason.
  """
  probe = os.path.join(model_dir, '.write_test_%d' % os.getpid())
  try:
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(probe, 'w') as f:
      f.write('')
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    reason = getattr(e, 'message', None) or str(e)
    raise ModelDirError(
        'cannot write to %s (%s); checkpoints, summaries and the export go '
        'there, so pick a writable directory.' % (model_dir, reason.strip()))


def check_input(inputs):
  """Reads one batch from each input_fn, in one throwaway graph.

  Args:
    inputs: list of (what, input_fn, params): 'training' or 'eval' for the
      message, an `input_fn(params)` returning a `tf.data.Dataset`, and what
      the Estimator would pass it (at least 'batch_size').

  Raises:
    records.InputError: some data is empty, smaller than one batch, or its
      first batch holds a bad record (the message names the file).
  """
  with tf.Graph().as_default():
    batches = []
    for what, input_fn, params in inputs:
      try:
        dataset = input_fn(params)
      except records.InputError as e:
        raise records.InputError('The %s data: %s' % (what, e)) from e
      batches.append(
          tf.compat.v1.data.make_one_shot_iterator(dataset).get_next())
    with tf.compat.v1.Session() as session:
      for (what, _, params), batch in zip(inputs, batches):
        try:
          session.run(batch)
        except tf.errors.OutOfRangeError as e:
          raise records.InputError(
              'The %s data holds fewer than one batch of %d examples '
              '(batches are full, as TPUs need): check the files, or use a '
              'smaller batch.' % (what, params['batch_size'])) from e
        except tf.errors.OpError as e:
          translated = records.translate_error(e, 'the %s data' % what)
          if translated is None:
            raise
          raise translated from e
