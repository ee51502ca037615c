# Two commands do all the set-up: `make demo` and `make test`. What a command needs beyond the plain install is an
# extra (pyproject.toml), installed by its target: install-hf, install-harness, install-tracking, install-curate,
# install-kernels, install-docs, install-llama; install-all is every one but llama (which compiles llama.cpp).
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
NATIVE := setup.py $(wildcard src/gptlab/tokenizer/_native/*.c src/gptlab/tokenizer/_native/*.h)
# Every dependency pinned to the versions the suite passed with (pip constraints); `make lock` updates it.
LOCK := requirements.lock

EXTRAS := hf harness tracking curate kernels docs all
.PHONY: demo test install install-dev install-llama $(addprefix install-,$(EXTRAS)) bench lock clean scaling curate docs

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_INDEX_FLAG) "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: $(VENV)/.torch pyproject.toml $(LOCK) $(NATIVE)
	$(PIP) install -q -c $(LOCK) -e .
	touch $@

# The dev extras hold llama-cpp-python, which compiles llama.cpp from source (a C++ compiler and cmake: on Debian
# `apt-get install build-essential cmake`): the library alone, no examples, tests, tools or server, on every core.
# It is built for the x86-64 baseline with AVX2 (GGML_NATIVE=OFF), not for this machine's own instructions: built
# natively on an Intel Xeon with AMX, llama.cpp's AMX kernels die at the first q8_0 decode (SIGSEGV), and a native
# build is not safe on another CPU. pip's wheel cache is keyed on the source alone, not on CMAKE_ARGS, and would hand
# back a wheel built with other flags, so this one package is built without it (minutes, once per environment).
# A build for this CPU only: make install-dev LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON ..." (see docs/export.md first).
LLAMA_SPEC := $(shell grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
$(VENV)/.llama: $(VENV)/.torch pyproject.toml
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2) \
		$(PIP) install -q --no-cache-dir --force-reinstall --no-deps "$(LLAMA_SPEC)"
	touch $@

$(VENV)/.installed-dev: $(VENV)/.torch $(VENV)/.llama pyproject.toml $(LOCK) $(NATIVE)
	$(PIP) install -q -c $(LOCK) -e ".[dev]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# One extra over the plain install: `make install-hf` installs gptlab[hf] (a stamp per extra, redone after the plain install).
$(VENV)/.installed-%: $(VENV)/.installed
	$(PIP) install -q -c $(LOCK) -e ".[$*]"
	touch $@
install-hf: $(VENV)/.installed-hf
install-harness: $(VENV)/.installed-harness
install-tracking: $(VENV)/.installed-tracking
install-curate: $(VENV)/.installed-curate
install-kernels: $(VENV)/.installed-kernels
install-docs: $(VENV)/.installed-docs
install-all: $(VENV)/.installed-all
# llama-cpp-python, compiled as install-dev compiles it ($(VENV)/.llama above, with its LLAMA_CMAKE_ARGS)
$(VENV)/.installed-llama: $(VENV)/.installed $(VENV)/.llama
	$(PIP) install -q -c $(LOCK) -e ".[llama]"
	touch $@
install-llama: $(VENV)/.installed-llama

demo: $(VENV)/.installed
	$(VENV)/bin/gptlab run

test: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -n 2 --dist loadgroup -q  # loadgroup: tests sharing a module fixture (xdist_group) build it once

# The docs site (mkdocs.yml, docs/) into site/, offline; --strict: a broken link, a missing page or a page left out of
# the nav fails, as in CI (tests/test_docs_site.py). Read it at site/index.html, or serve it: $(PY) -m mkdocs serve
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: $(VENV)/.installed-dev
	$(PY) bench/tokenizer_train.py --large-mb 200
	$(PY) bench/tokenizer_encode.py
	$(PY) bench/tokenizer_profile.py
	$(PY) bench/data_prepare.py
	$(PY) bench/generate.py
	$(PY) bench/eval_hellaswag.py
	$(PY) bench/shakespeare_cpu.py
	$(PY) bench/recipe_ablation.py
	$(PY) bench/train_throughput.py
	$(PY) bench/sft_throughput.py
	$(PY) bench/serve.py
	$(PY) bench/grpo_rollout.py
	$(PY) bench/model_info_measure.py
	$(PY) bench/model_switches.py

# The README's miniature scaling study: 3 FLOP budgets x sizes on the built-in corpus with a 512-token BPE, an lr sweep
# at the middle budget, then the fit (plots and predictions in $(SCALING)/sweep/fit). Rerunning resumes and skips what is done.
SCALING ?= runs/scaling-mini
SIZES := 1x32 1x64 2x64 2x96 3x128
SWEEP = $(VENV)/bin/gptlab sweep --data $(SCALING)/data --sizes $(SIZES) --head-dim 32 --out $(SCALING)/sweep
scaling: $(VENV)/.installed
	test -f $(SCALING)/tokenizer/tokenizer.json || $(VENV)/bin/gptlab tokenizer train --corpus shakespeare --vocab-size 512 --out $(SCALING)/tokenizer
	test -f $(SCALING)/data/manifest.json || $(VENV)/bin/gptlab data prepare shakespeare -t $(SCALING)/tokenizer --out $(SCALING)/data --quiet
	$(SWEEP) --budgets 6e11 2e12 6e12 --tokens-per-param 0.5 150
	$(SWEEP) --budgets 2e12 --tokens-per-param 0.5 150 --lr-scales 0.5 1 2
	$(SWEEP) --budgets 2e12 --tokens-per-param 0.5 200
	$(VENV)/bin/gptlab fit $(SCALING)/sweep --target 1e14 1e16

# The README's curation example: a synthetic 200-page crawl (a WARC file, made offline) through gptlab data curate.
CURATE ?= runs/curate-example
curate: $(VENV)/.installed
	test -f $(CURATE)/crawl.warc.gz || $(PY) -m gptlab.curate.example $(CURATE)/crawl.warc.gz
	$(VENV)/bin/gptlab data curate $(CURATE)/crawl.warc.gz --out $(CURATE)/curated

# Re-resolve every dependency (newest versions pyproject.toml allows) in a fresh venv and record them.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q $(TORCH_INDEX_FLAG) "$(TORCH_SPEC)"
	.venv-lock/bin/pip install -q -e ".[dev]"
	{ sed -n '1,3p' $(LOCK); .venv-lock/bin/pip freeze --exclude-editable | sed 's/+cpu$$//'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock
	@echo "requirements.lock updated: run make test, then commit it"

clean:
	rm -rf $(VENV) build site src/*.egg-info src/gptlab/tokenizer/*.so
