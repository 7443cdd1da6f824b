# Two commands set up and run everything on a fresh machine with Python 3.11:
#   make demo   -- venv, install, then the main job on the embedded default
#   make test   -- venv, install, then the test suite
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed
# The Hugging Face example's trainer runs in a venv of its own (as on a cloud it runs in
# its image): transformers 5.15 needs huggingface_hub>=1.31 (click>=8.4.2), which clashes
# with skypilot 0.14.1 in the launcher's venv. Pinned: the versions the adapter is tested with.
# datasets 5.2.0 (needs huggingface_hub>=1.31, so here too) + torchdata: the streaming-resume tests.
HF_VENV ?= .venv-hf
HF_STAMP = $(HF_VENV)/.installed
# The Lightning example's trainer: lightning 2.6.6 and pytorch-lightning 2.6.6 (lightning
# depends on it, unpinned: pinned here to the same release), torchmetrics 1.9.0 and
# lightning-utilities 0.15.3 (what 2.6.6 resolves to), torchdata for its StatefulDataLoader.
# The Accelerate example runs in .venv-hf: transformers' Trainer needs accelerate, pinned there.
PL_VENV ?= .venv-lightning
PL_STAMP = $(PL_VENV)/.installed
# pytest-xdist workers for `make test` (docs/benchmarks.md: measured on 2 cores).
TEST_WORKERS ?= 2

.PHONY: demo test test-fast lint bench clean

# The venvs are built by uv, pinned: it unpacks torch once into its cache and links it into all
# three venvs. Nothing is byte-compiled at install: compiling every module of three venvs was most
# of the stage (about 60 s of its 65 on a clean clone; uv alone links the three in under 5 s).
# Instead Python writes the bytecode of what is imported, once, as it does on any machine where
# PYTHONDONTWRITEBYTECODE is not set: this machine sets it, and make unsets it for everything it
# runs (below), else every leg would compile torch again. Each venv's recipe ends by importing
# what every leg imports (torch, and torch._dynamo through an optimizer), so the suite's first
# legs do not all compile torch at once. docs/benchmarks.md, "The venvs stage", has the figures.
# uv reads no pip.conf: the find-links pip is configured with (where the CPU build of torch lies on
# this machine) are passed on; without them torch==2.13.0 would come from PyPI.
UV_VENV ?= .venv-uv
UV       = $(UV_VENV)/bin/uv
UV_PIN   = uv==0.13.9
unexport PYTHONDONTWRITEBYTECODE
# What every leg imports first, imported once per venv so that its bytecode is written then.
WARM = import torch; torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()); import torch.distributed.run
FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
ifneq ($(FIND_LINKS),)
export UV_FIND_LINKS = $(FIND_LINKS)
endif

$(UV): Makefile
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/python -m pip install -q $(UV_PIN)
	touch $(UV)

$(STAMP): pyproject.toml Makefile $(UV)
	$(UV) venv -q --seed --allow-existing -p $(PYTHON) $(VENV)
	# torch first and pinned: an open range would pull a multi-GB CUDA build.
	$(UV) pip install -q -p $(PY) torch==2.13.0
	# [sky]: skypilot 0.14.1, whose task-YAML parser validates every rendered leg. [torch]: the
	# local backend runs a leg's trainer in this interpreter (the CLI alone needs no torch).
	$(UV) pip install -q -p $(PY) -e '.[dev,sky,torch]' --config-setting editable_mode=compat
	$(PY) -c '$(WARM)'
	touch $(STAMP)

$(HF_STAMP): pyproject.toml Makefile $(UV)
	$(UV) venv -q --seed --allow-existing -p $(PYTHON) $(HF_VENV)
	$(UV) pip install -q -p $(HF_VENV)/bin/python torch==2.13.0 transformers==5.15.1 accelerate==1.15.0 datasets==5.2.0 torchdata==0.11.0
	$(UV) pip install -q -p $(HF_VENV)/bin/python --no-deps -e . --config-setting editable_mode=compat
	$(HF_VENV)/bin/python -c '$(WARM); from transformers import Trainer; import accelerate'
	touch $(HF_STAMP)

$(PL_STAMP): pyproject.toml Makefile $(UV)
	$(UV) venv -q --seed --allow-existing -p $(PYTHON) $(PL_VENV)
	$(UV) pip install -q -p $(PL_VENV)/bin/python torch==2.13.0 lightning==2.6.6 pytorch-lightning==2.6.6 torchmetrics==1.9.0 lightning-utilities==0.15.3 torchdata==0.11.0
	$(UV) pip install -q -p $(PL_VENV)/bin/python --no-deps -e . --config-setting editable_mode=compat
	$(PL_VENV)/bin/python -c '$(WARM); import lightning'
	touch $(PL_STAMP)

demo: $(STAMP)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

# The docker-backend tests build and run the image for real: the engine (Debian's
# docker.io, started here as root) and a debootstrap base image come first.
# PREFLIGHT_SKIP_DOCKER=1 skips them on purpose; otherwise a missing engine fails.
# The real-SkyPilot tier starts SkyPilot's own API server (offline); its host needs rsync.
test:
	@rm -f .stage-times
	@# The venvs at once: uv's installs wait on the disk and unpacking as much as on the CPU.
	@bash scripts/stage.sh venvs $(MAKE) --no-print-directory -j3 $(STAMP) $(HF_STAMP) $(PL_STAMP)
	@# The project's own modules as bytecode, once, before two workers' first legs would each
	@# compile them at the same moment (the venvs' modules are written as they are first imported).
	@bash scripts/stage.sh bytecode $(PY) -m compileall -q -x '/assets/' launcher runtime tests
	@# How fast this machine starts a leg (torch + torch._dynamo): read the wall time against it.
	@bash scripts/stage.sh calibrate $(PY) scripts/calibrate.py
	@bash scripts/stage.sh sky-host bash scripts/sky-host.sh
	@bash scripts/stage.sh c-compiler bash scripts/c-compiler.sh
	@if [ "$$PREFLIGHT_SKIP_DOCKER" != 1 ]; then bash scripts/stage.sh engine bash scripts/docker-engine.sh && bash scripts/stage.sh base-image bash scripts/make-base-image.sh; fi
	@rc=0; bash scripts/stage.sh pytest env PREFLIGHT_HF_PYTHON=$(CURDIR)/$(HF_VENV)/bin/python PREFLIGHT_PL_PYTHON=$(CURDIR)/$(PL_VENV)/bin/python $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=30 --junitxml=$(CURDIR)/.test-times.xml --basetemp=$(CURDIR)/.pytest-tmp || rc=$$?; bash scripts/stage.sh --summary; exit $$rc

# The unit tier, for the inner loop (under 2 minutes): tests marked `unit` start no leg,
# no SkyPilot server and no Docker engine. `make test` runs them too, with everything else.
test-fast: $(STAMP)
	@bash scripts/c-compiler.sh
	$(PY) -m pytest -q -m unit -p no:cacheprovider --basetemp=$(CURDIR)/.pytest-tmp-fast

# ruff and mypy, pinned in pyproject.toml's dev extra (the pins are read from there) and configured
# there (mypy: what it checks, runtime/, and why torch and the rest are read as Any).
# A venv of its own, so that a fresh clone lints in seconds, before any torch is installed.
LINT_VENV ?= .venv-lint
RUFF_PIN := $(shell grep -o '"ruff==[0-9.]*"' pyproject.toml | tr -d '"')
MYPY_PIN := $(shell grep -o '"mypy==[0-9.]*"' pyproject.toml | tr -d '"')

$(LINT_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(LINT_VENV)
	$(LINT_VENV)/bin/python -m pip install -q $(RUFF_PIN) $(MYPY_PIN)
	touch $@

lint: $(LINT_VENV)/.installed
	$(LINT_VENV)/bin/ruff check .
	$(LINT_VENV)/bin/ruff format --check .
	$(LINT_VENV)/bin/mypy

bench: $(STAMP) $(HF_STAMP)
	$(PY) bench/cli_startup.py
	$(PY) bench/session_overhead.py
	$(PY) bench/breakdown_overhead.py
	$(PY) bench/async_save.py
	$(PY) bench/sharded_save.py
	$(PY) bench/final_push.py
	$(HF_VENV)/bin/python bench/hf_resume_skip.py
	$(PY) bench/sky_node_setup.py

clean:
	rm -rf $(VENV) $(HF_VENV) $(PL_VENV) $(LINT_VENV) $(UV_VENV) .demo
