PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The tests also compile for TPU slices, which needs libtpu (the `tpu` extra, about 700 MB), and run the
# Beam pipeline of prepare-data (the `beam` extra). The demo and the tests score models with lm-evaluation-harness
# (the `eval` extra). The tests load Hugging Face exports in transformers (the `hf` extra: CPU torch), and run the
# collapse pruner in Optuna studies (the `sweep` extra).
TEST_STAMP := $(VENV)/.installed-tpu-hf

.PHONY: demo test test-slow install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[test,eval]'
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,eval,tpu,beam,hf,sweep]'
	touch $(TEST_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/celerity demo --workdir runs/demo

# Two workers, one per core, each taking whole test files (so that module fixtures are built once).
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-slow: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -m slow

clean:
	rm -rf $(VENV) runs
