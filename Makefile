# The two commands the README promises: `make demo` and `make test`.
# Each creates .venv with the pinned requirements on first use.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_DIR ?= runs/demo

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip==24.3.1
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m models.demo --out_dir=$(DEMO_DIR)

test: $(STAMP)
	$(BIN)/python -m pytest tests -q

clean:
	rm -rf $(VENV) runs
