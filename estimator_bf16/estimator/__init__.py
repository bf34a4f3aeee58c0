"""The Estimator side: wrapping a model_fn / input_fn and making the TPUEstimator."""
