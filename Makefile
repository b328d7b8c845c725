# bagpipe: `make demo` runs the sample job end to end on the local stack; `make test` runs
# the test suite. Each sets up what it needs first: `make demo-setup` the runtime (the
# demo's and `make up`'s), `make setup` the runtime and the test and lint tools.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# the runtime dependencies and the project, installed editable
RUNTIME := $(VENV)/.runtime
# the test and lint tools on top
STAMP := $(VENV)/.installed
CC ?= cc
# `make test` runs the suite in this many processes (its tests mostly wait on storage, workers
# and servers, so more processes than cores shorten it), then the tests marked `alone` (those
# that time workers, attempts or links) by themselves
TEST_PROCESSES ?= 3
# a module to a process at a time, the longest first (tests/schedule.py), the timed modules after
PARALLEL := --dist loadfile --no-loadscope-reorder -m 'not alone'
# the example reducer written in C
REDUCER_C := reducers/max_composite/max_composite

.PHONY: demo-setup setup demo test durations lint bench faults up clean

# Toxiproxy, the fault-injection proxy of the transfer tests and benchmarks (go install)
TOXIPROXY := .tools/toxiproxy/server
# the STAC validators the tests run (stac-api-validator, stac-validator), in a virtualenv of their own
STAC_TOOLS := .tools/stac/.installed
# the openEO test suite (openeo-test-suite), in a virtualenv of its own
OPENEO_SUITE := .tools/openeo/.installed
# openeo-processes-dask, which `bench.openeo --parts processes` times beside bagpipe's own
# processes, in a virtualenv of its own (made for the benchmarks only: not a runtime dependency)
OPENEO_PROCESSES := .tools/openeo-processes/.installed

# the portal's map data, copied from npm packages (served by the API, no CDN)
VENDOR := portal/vendor/.copied
# Debian's Chromium, the headless browser the portal's tests drive (Playwright)
CHROMIUM := /usr/bin/chromium
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# what the demo needs: no Go, Toxiproxy, Chromium or test tools
demo-setup: $(RUNTIME) node_modules/.bin/azurite $(VENDOR)

setup: demo-setup $(STAMP) $(REDUCER_C) $(TOXIPROXY) $(STAC_TOOLS) $(OPENEO_SUITE)

$(VENDOR): node_modules/.bin/azurite
	mkdir -p $(@D)
	cp node_modules/world-atlas/land-50m.json node_modules/topojson-client/dist/topojson-client.min.js $(@D)/
	touch $@

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium

$(TOXIPROXY): bagpipe/toxiproxy.py | $(RUNTIME)
	$(BIN)/python -c "from bagpipe.toxiproxy import install; install()"
	touch $@

$(STAC_TOOLS): requirements-stac.txt
	test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install --quiet --upgrade pip
	$(@D)/bin/pip install --quiet -r requirements-stac.txt
	touch $@

$(OPENEO_SUITE): requirements-openeo.txt
	test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install --quiet --upgrade pip
	$(@D)/bin/pip install --quiet -r requirements-openeo.txt
	touch $@

$(OPENEO_PROCESSES): requirements-processes.txt
	test -x $(@D)/bin/python || $(PYTHON) -m venv $(@D)
	$(@D)/bin/pip install --quiet --upgrade pip
	$(@D)/bin/pip install --quiet -r requirements-processes.txt
	touch $@

$(REDUCER_C): $(REDUCER_C).c
	$(CC) -O2 -Wall -Wextra -o $@ $<

$(RUNTIME): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

$(STAMP): requirements-dev.txt $(RUNTIME)
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

node_modules/.bin/azurite: package.json
	npm install --no-audit --no-fund --loglevel=error
	touch $@

demo: demo-setup
	$(BIN)/bagpipe demo

up: demo-setup $(REDUCER_C)
	$(BIN)/bagpipe up

test: setup $(CHROMIUM)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) $(PARALLEL) --durations=25
	$(BIN)/python -m pytest -q -m alone

# each module's seconds, for the order in which the test processes take them (tests/schedule.py)
durations: setup $(CHROMIUM)
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) $(PARALLEL) --record-module-times
	$(BIN)/python -m pytest -q -m alone --record-module-times

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# `make bench` runs every benchmark in bench/ (the modules that run as a program; the others are
# their parts); `make bench NAME=x` runs bench/x.py.
bench: setup $(OPENEO_PROCESSES)
	@if [ -n "$(NAME)" ]; then $(BIN)/python -m bench.$(NAME); \
	else for f in $$(grep -l '^if __name__ == "__main__":' bench/*.py); do m=$$(basename $$f .py); echo "== bench.$$m"; \
	$(BIN)/python -m bench.$$m || exit 1; done; fi

# `make faults` runs the fault harness as a program (docs/faults.md): the first call of every
# distinct operation of its scenario, each failed three ways, then the 2,000-task chaos run
faults: setup
	$(BIN)/python -m tests.harness.faults --distinct --jobs 2
	$(BIN)/python -m tests.harness.chaos

clean:
	rm -rf $(VENV) node_modules .bagpipe out .pytest_cache .tools portal/vendor $(REDUCER_C)
