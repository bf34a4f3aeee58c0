"""legacy_tpu_main.py with a planted mistake no wrapper can fix.

Its model_fn creates a variable explicitly stored in bfloat16
(`tf.Variable(..., dtype=tf.bfloat16)`): stored variables must be float32, so
`estimator_bf16 check` must fail and name `planted/bf16_scale`.
"""

from absl import app
import tensorflow as tf

import legacy_tpu_main
import legacy_tpu_program


def planted_model_fn_builder(model_dir):
  model_fn = legacy_tpu_program.model_fn_builder(model_dir)

  def planted_model_fn(features, labels, mode, params):
    with tf.compat.v1.variable_scope('planted'):
      # Not trainable: optimizers cannot even build slots for it, which
      # would fail before any audit; the audit must still catch it.
      scale = tf.Variable(1.0, dtype=tf.bfloat16, trainable=False,
                          name='bf16_scale')
    image = features['image'] * tf.cast(scale, features['image'].dtype)
    return model_fn({'image': image}, labels, mode, params)

  return planted_model_fn


def main(argv):
  del argv
  legacy_tpu_main.run(planted_model_fn_builder)


if __name__ == '__main__':
  app.run(main)
