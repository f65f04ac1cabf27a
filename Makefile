# SPGC developer entry points. `make demo` runs the main job, `make test` the tests.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python

.PHONY: setup demo test test-extended lint dev clean

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/spgc demo

# The tests import the *installed* package: pytest runs from tests/ (so neither the checkout
# root nor its garbled_core/ without a compiled module is on sys.path), and the check below
# fails if an import would resolve to the source tree anyway. tests/ must stay a plain
# directory (no __init__.py), else pytest would put the checkout root on sys.path.
test: setup
	@test ! -e tests/__init__.py || { echo "tests/__init__.py would shadow the installed package" >&2; exit 1; }
	@cd tests && ../$(PY) -c 'import pathlib, sys, spgc, garbled_core; \
	  venv = pathlib.Path(sys.prefix).resolve(); \
	  bad = [f"{m.__name__} from {p}" for m in (spgc, garbled_core) for p in m.__path__ \
	         if venv not in pathlib.Path(p).resolve().parents]; \
	  sys.exit(f"tests would not import the installed package: {bad}" if bad else 0)'
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --durations=25 .

# Also the full matrices of the slowest end-to-end tests (tests/conftest.py: EXTENDED_ENV).
test-extended:
	SPGC_EXTENDED_TESTS=1 $(MAKE) test

lint:
	@if [ -x $(VENV)/bin/ruff ]; then $(VENV)/bin/ruff check .; else ruff check .; fi

# Editable developer install into .venv: the installed spgc, spgc.servers, spgc.providers and
# garbled_core point at the files in this checkout (scikit-build-core's redirect maps servers/
# and providers/ under spgc), so Python edits apply without reinstalling; C++ edits need another
# `make dev`. `make test` installs a regular (non-editable) copy again.
dev: setup
	$(PY) -m pip install -q --no-build-isolation --config-settings=build-dir=build/editable -e ".[test]"

clean:
	rm -rf build dist *.egg-info
