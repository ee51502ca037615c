# Two commands do all the set-up: `make demo` and `make test`.
# torch is installed first and pinned, so a machine without a GPU takes the CPU
# wheel at hand instead of pulling a multi-GB CUDA build for `torch>=2.4`.
# Elsewhere: make TORCH_SPEC='torch' TORCH_INDEX=https://download.pytorch.org/whl/cpu
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TORCH_INDEX_FLAG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
# The compiled tokenizer core: editing it re-runs the install, which rebuilds it.
NATIVE := setup.py $(wildcard src/gptlab/tokenizer/_native/*.c)

.PHONY: demo test install install-dev bench clean

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_INDEX_FLAG) "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml $(NATIVE)
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.torch pyproject.toml $(NATIVE)
	$(PIP) install -q -e ".[dev]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(VENV)/bin/gptlab run

test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -n 2 -q

bench: $(VENV)/.installed-dev
	$(PY) bench/tokenizer_train.py --large-mb 200
	$(PY) bench/tokenizer_encode.py
	$(PY) bench/tokenizer_profile.py
	$(PY) bench/data_prepare.py
	$(PY) bench/generate.py
	$(PY) bench/eval_hellaswag.py
	$(PY) bench/shakespeare_cpu.py

clean:
	rm -rf $(VENV) build src/*.egg-info src/gptlab/tokenizer/*.so
