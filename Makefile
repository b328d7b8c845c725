# bagpipe: `make demo` runs the sample job end to end on the local stack; `make test` runs
# the test suite. Both set themselves up first (`make setup`).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CC ?= cc
# the example reducer written in C
REDUCER_C := reducers/max_composite/max_composite

.PHONY: setup demo test lint bench up clean

setup: $(STAMP) node_modules/.bin/azurite $(REDUCER_C)

$(REDUCER_C): $(REDUCER_C).c
	$(CC) -O2 -Wall -Wextra -o $@ $<

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

node_modules/.bin/azurite: package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

demo: setup
	$(BIN)/bagpipe demo

up: setup
	$(BIN)/bagpipe up

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .

# `make bench` runs every benchmark module in bench/; `make bench NAME=x` runs bench/x.py.
bench: setup
	@if [ -n "$(NAME)" ]; then $(BIN)/python -m bench.$(NAME); \
	else for f in $$(ls bench/*.py | grep -v "/_"); do m=$$(basename $$f .py); echo "== bench.$$m"; \
	$(BIN)/python -m bench.$$m || exit 1; done; fi

clean:
	rm -rf $(VENV) node_modules .bagpipe out .pytest_cache $(REDUCER_C)
