# Two commands on a fresh clone: `make demo` and `make test`. Each sets up .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= tpuctl.yaml
export TF_CPP_MIN_LOG_LEVEL ?= 2
export TF_USE_LEGACY_KERAS := 1
export PYTHONDONTWRITEBYTECODE := 1

TORCH_STAMP := .venv-torch/.installed

.PHONY: setup setup-torch demo test test-all lint bench train clean

setup: $(STAMP)

# PyTorch + transformers 5.x, apart from the TensorFlow environment: the tests load exported
# models and tokenizers there, as users will.
setup-torch: $(TORCH_STAMP)

$(TORCH_STAMP): requirements-torch.txt
	@test -x .venv-torch/bin/python || $(PYTHON) -m venv .venv-torch
	.venv-torch/bin/python -m pip install --quiet --upgrade pip
	.venv-torch/bin/python -m pip install --quiet -r requirements-torch.txt
	@touch $(TORCH_STAMP)

# Reinstall only when the dependency list changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[all]'
	@touch $(STAMP)

DEMO := examples/demo.yaml

# The whole pipeline through the launcher, as 2 local worker processes (no SSH, no cloud).
# DEMO_STAGES runs a subset: make demo DEMO_STAGES=tokenizer,prepare
demo: setup
	$(BIN)/tpuctl train --local --overwrite -c $(DEMO) $(if $(DEMO_STAGES),--stages $(DEMO_STAGES))

test: setup setup-torch
	$(BIN)/python -m pytest -q

test-all: setup setup-torch
	$(BIN)/python -m pytest -q -m "slow or not slow"

lint: setup
	$(BIN)/ruff check launcher payload tests bench scripts

bench: setup
	$(BIN)/python -m bench

train: setup
	$(BIN)/tpuctl $@ -c $(CONFIG)

clean:
	rm -rf runs bench/.work .pytest_cache
