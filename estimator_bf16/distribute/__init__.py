"""tf.distribute for Estimator programs: TF_CONFIG and strategies by name."""
