# Everything from nothing: `make demo` and `make test` create .venv and install into it.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# the oldest declared versions (constraints-oldest.txt), in a venv of their own
OLDEST_VENV  := .venv-oldest
OLDEST_PY    := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.installed

.PHONY: install demo test test-e2e test-slow test-multinode test-oldest test-ray bench lint docs generate clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# setuptools' note on editable installs is the only warning left: not ours to act on
	PYTHONWARNINGS="ignore:Editable installation" \
		$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	# litdata (the streaming tests) declares torchvision, whose wheels break the CPU torch
	# pinned here (`operator torchvision::nms does not exist`) and which it imports only to
	# decode images and video: install it without its dependencies, then the others it needs
	# (pip's conflict check would report the torchvision left out on purpose)
	$(PY) -m pip install --quiet --no-warn-conflicts -c constraints.txt --no-deps litdata
	$(PY) -m pip install --quiet --no-warn-conflicts -c constraints.txt lightning-utilities \
		filelock numpy boto3 requests 'urllib3>=1.26' tifffile obstore
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# unit tests and doctests (how long: docs/times.md)
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not multinode and not e2e and not ray"

# the unit tests on the oldest versions pyproject.toml declares (constraints-oldest.txt);
# (how long: docs/times.md)
$(OLDEST_STAMP): pyproject.toml constraints-oldest.txt
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install --quiet --upgrade pip
	PYTHONWARNINGS="ignore:Editable installation" \
		$(OLDEST_PY) -m pip install --quiet -c constraints-oldest.txt -e '.[dev]'
	touch $(OLDEST_STAMP)

# The benchmark tooling's own tests (tests/test_bench_*.py, mostly multi-process runs) are
# left out: the declared floors are the library's, and `make test`
# runs those tests on the pinned versions
test-oldest: $(OLDEST_STAMP)
	$(OLDEST_PY) -m pytest -m "not slow and not multinode and not e2e and not ray" \
		--ignore-glob='tests/test_bench_*.py'

# multi-process training runs: tests/e2e and Lightning's own FSDP2 tests (how long:
# docs/times.md); the 15 slowest are listed at the end, to see where the time goes
test-e2e: $(STAMP)
	$(PY) -m pytest -m "e2e and not slow" --durations=15

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

# Ray Train on a local Ray cluster (tests/ray; how long: docs/times.md): the `ray` extra first
RAY_STAMP := $(VENV)/.installed-ray
$(RAY_STAMP): $(STAMP)
	PYTHONWARNINGS="ignore:Editable installation" \
		$(PY) -m pip install --quiet -c constraints.txt -e '.[ray]'
	touch $(RAY_STAMP)

test-ray: $(RAY_STAMP)
	$(PY) -m pytest -m ray tests/ray

# 4 ranks on 2 emulated hosts (network namespaces, veth, torchrun); needs root
test-multinode: $(STAMP)
	$(PY) -m pytest -m multinode tests/multinode

bench: $(STAMP)
	$(PY) -m lightning_hetero.bench

lint: $(STAMP)
	$(PY) -m ruff check lightning_hetero tests examples
	$(PY) -m ruff format --check lightning_hetero tests examples

# the documentation site (mkdocs.yml, docs/) into site/; --strict: any warning (a broken link
# or anchor, a docstring griffe cannot read) fails it
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	PYTHONWARNINGS="ignore:Editable installation" \
		$(PY) -m pip install --quiet -c constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# lightning_hetero/pytorch_lightning/*.py from the Lightning-facing modules (commit the result)
generate: $(STAMP)
	$(PY) -m lightning_hetero._generate

clean:
	rm -rf $(VENV) $(OLDEST_VENV) lightning_logs demo_logs .pytest_cache
