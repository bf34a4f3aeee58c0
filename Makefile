# The two commands the README promises: `make demo` and `make test`.
# Each creates its pinned virtualenv(s) on first use (scripts/make_venv.sh).
DEMO_DIR ?= runs/demo

.PHONY: demo test clean

# The package's commands hide TensorFlow's C++ log lines themselves
# (estimator_bf16/platform/quiet.py).
demo:
	scripts/make_venv.sh .venv requirements.txt
	.venv/bin/python -m estimator_bf16.apps.demo --out_dir=$(DEMO_DIR)

# The full suite on TensorFlow 2.15 (real TPUEstimator), then the backend
# subset on the newest TensorFlow (estimator_bf16.compat).
test:
	scripts/test_matrix.sh all

clean:
	rm -rf .venv .venv-tf-latest runs
