# Everything from nothing: `make demo` and `make test` create .venv and install into it.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-e2e test-slow test-multinode bench lint generate clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# setuptools' note on editable installs is the only warning left: not ours to act on
	PYTHONWARNINGS="ignore:Editable installation" \
		$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# unit tests and doctests (about 5 min on 2 cores)
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not multinode and not e2e"

# multi-process training runs: tests/e2e and Lightning's own FSDP2 tests (about 25 min)
test-e2e: $(STAMP)
	$(PY) -m pytest -m "e2e and not slow"

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# 4 ranks on 2 emulated hosts (network namespaces, veth, torchrun); needs root
test-multinode: $(STAMP)
	$(PY) -m pytest -m multinode tests/multinode

bench: $(STAMP)
	$(PY) -m lightning_hetero.bench

lint: $(STAMP)
	$(PY) -m ruff check lightning_hetero tests examples
	$(PY) -m ruff format --check lightning_hetero tests examples

# lightning_hetero/pytorch_lightning/*.py from the Lightning-facing modules (commit the result)
generate: $(STAMP)
	$(PY) -m lightning_hetero._generate

clean:
	rm -rf $(VENV) lightning_logs demo_logs .pytest_cache
