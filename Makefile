# make check: what CI runs (.ci/run) after the install; make quick: the same with the fast tests only.
PYTHON ?= python

.PHONY: check quick lint test test-fast

check: lint test

quick: lint test-fast

lint:
	ruff check .
	mypy

test:
	$(PYTHON) -m pytest -q

test-fast:
	$(PYTHON) -m pytest -q -m "not slow"
