# The one place the torch pin lives: a CPU build of torch 2.13.0 that pip takes from this
# machine's disk. An unpinned `torch` would pull a multi-GB CUDA build.
TORCH_PIN := torch==2.13.0
VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed

.PHONY: install run test test-fast bench clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e ".[dev,plot]" "$(TORCH_PIN)"
	touch $(STAMP)

# The main job: HalfCheetah-v5 with default settings, learner + broadcaster + 2 actors.
run: install
	$(VENV)/bin/asyncrl run --env HalfCheetah-v5 $(ARGS)

test: install
	$(PY) -m pytest -q $(ARGS)

bench: install
	$(PY) bench/throughput.py $(ARGS)

clean:
	$(VENV)/bin/asyncrl clean || true
