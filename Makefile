# The two commands the README promises: `make demo` and `make test`.
# Each creates its pinned virtualenv(s) on first use (scripts/make_venv.sh).
DEMO_DIR ?= runs/demo

.PHONY: demo test clean

# TensorFlow reads its C++ log level once, when the package (which imports
# it) loads, before the demo module's own default could apply.
demo:
	scripts/make_venv.sh .venv requirements.txt
	TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -m estimator_bf16.models.demo --out_dir=$(DEMO_DIR)

# The full suite on TensorFlow 2.15 (real TPUEstimator), then the backend
# subset on the newest TensorFlow (estimator_bf16.compat).
test:
	scripts/test_matrix.sh all

clean:
	rm -rf .venv .venv-tf-latest runs
