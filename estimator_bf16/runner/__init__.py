"""Running an unmodified Estimator / TPUEstimator program in bfloat16 (`run`, `check`)."""
