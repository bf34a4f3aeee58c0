"""float32 -> bfloat16 -> float32 through checkpoints, bit for bit.

One model_dir is trained in float32, then bfloat16, then float32 again. The
model has a frozen layer (not in the optimizer's var_list) and a
non-trainable counter: whatever training does not touch must come back
bit-identical from every checkpoint, whichever precision wrote it, because
variables are stored as float32 and bfloat16 only ever reads a cast copy.
Every variable stays float32 throughout.
"""

import numpy as np
import tensorflow as tf

import estimator_bf16 as eb

_STEPS_PER_PHASE = 3
_UNTRAINED = ('frozen/kernel', 'frozen/bias', 'counter')


def _model_fn(features, labels, mode, params):
  del params
  x = features['x']
  # The wrapper casts features; variables take their dtype, so the scope
  # stores them as float32 and reads them as bfloat16 in a bfloat16 run.
  with tf.compat.v1.variable_scope('frozen'):
    kernel = tf.compat.v1.get_variable(
        'kernel', [4, 16], dtype=x.dtype,
        initializer=tf.compat.v1.random_normal_initializer(seed=1))
    bias = tf.compat.v1.get_variable(
        'bias', [16], dtype=x.dtype,
        initializer=tf.compat.v1.random_normal_initializer(seed=2))
  with tf.compat.v1.variable_scope('head'):
    head = tf.compat.v1.get_variable(
        'kernel', [16, 3], dtype=x.dtype,
        initializer=tf.compat.v1.random_normal_initializer(seed=3))
  tf.compat.v1.get_variable('counter', initializer=np.float32(np.pi),
                            trainable=False)
  logits = tf.cast(tf.matmul(tf.nn.relu(tf.matmul(x, kernel) + bias), head),
                   tf.float32)
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
  global_step = tf.compat.v1.train.get_or_create_global_step()
  train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(
      loss, global_step=global_step,
      var_list=tf.compat.v1.trainable_variables('head'))
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss,
                                                     train_op=train_op)


def _input_fn(params):
  rng = np.random.RandomState(0)
  x = rng.normal(size=(64, 4)).astype(np.float32)
  y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
  return tf.data.Dataset.from_tensor_slices(({'x': x}, y)).repeat().batch(
      params['batch_size'], drop_remainder=True)


def _checkpoint(model_dir):
  reader = tf.train.load_checkpoint(model_dir)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}, (
              reader.get_variable_to_dtype_map())


class RoundTripTest(tf.test.TestCase):

  def test_untrained_variables_survive_bit_identical(self):
    model_dir = self.create_tempdir().full_path
    first = None
    steps = 0
    for precision in ('float32', 'bfloat16', 'float32'):
      steps += _STEPS_PER_PHASE
      estimator = eb.make_tpu_estimator(
          _model_fn, model_dir=model_dir, precision=precision,
          train_batch_size=8, estimator_options=eb.EstimatorOptions(
              save_checkpoints_steps=_STEPS_PER_PHASE, tf_random_seed=0))
      estimator.train(eb.wrap_input_fn(_input_fn, precision),
                      max_steps=steps)
      values, dtypes = _checkpoint(model_dir)
      self.assertEqual(values['global_step'], steps)
      for name, dtype in dtypes.items():
        if dtype.is_floating:
          self.assertEqual(dtype, tf.float32, (precision, name))
      if first is None:
        first = values
        # The frozen values use all 24 float32 mantissa bits, so a trip
        # through bfloat16 storage would show.
        self.assertNotAllEqual(
            first['frozen/kernel'],
            first['frozen/kernel'].astype(tf.bfloat16.as_numpy_dtype)
            .astype(np.float32))
        continue
      self.assertEqual(set(values), set(first))
      for name in _UNTRAINED:
        self.assertEqual(values[name].tobytes(), first[name].tobytes(),
                         '%s changed after the %s phase' % (name, precision))
      self.assertNotAllClose(values['head/kernel'], first['head/kernel'])


if __name__ == '__main__':
  tf.test.main()
