# Wire: the two commands are `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python

.PHONY: setup demo test test-durations test-long lint bench java chromium postgresql clean lock

# The class archive every Spark JVM Wire launches maps (wire_dagster/jvmarchive.py): made once per
# virtual environment (~20 s), a check of ~0.1 s after that.
setup: $(STAMP)
	$(BIN)/python -m wire_dagster.jvmarchive

java:
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then \
	  echo "Java 17 is missing: install it with 'sudo apt-get install -y openjdk-17-jre-headless', then re-run make."; exit 1; fi

$(STAMP): pyproject.toml requirements.lock | java
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c requirements.lock -e '.[test]'
	touch $(STAMP)

# Headless Chromium for the real-browser test (Debian's package).
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser test"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium >/dev/null; }

# Debian's PostgreSQL server binaries (initdb, pg_ctl, postgres) for the test that runs Dagster's
# storage on a real PostgreSQL (tests/test_e2e_postgres.py); the test starts its own server on
# loopback with a data directory of its own, never the system's cluster.
postgresql:
	@ls /usr/lib/postgresql/*/bin/initdb /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
	  echo "installing Debian's postgresql for the PostgreSQL storage test"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql >/dev/null; }

demo: setup
	$(BIN)/wire demo

# Lint first: a formatting, lint or type error fails `make test` (and CI) in seconds.
# Two pytest workers (pytest-xdist): modules are units of work, the `dagster dev` stack's tests one
# unit on one worker, the longest units first (tests/conftest.py, tests/durations.json); each
# worker has its own S3 and Spark Connect servers.
XDIST := -n 2 --dist loadgroup --no-loadscope-reorder

test: setup chromium postgresql lint
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=20 $(XDIST)

# Format, lint and type-check the whole tree (rules in pyproject.toml).
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/pyright -p .

# The long matrices: more seeds and sizes (WIRE_SEEDS, WIRE_CRASH_SEEDS; WIRE_FAULT_*: the flaky-network
# test's seeds, fault rates, events per segment and the outage after a lost commit marker's answer).
# Measure the suite: tests/durations.json, by which conftest.py runs the longest units first.
test-durations: setup chromium postgresql
	$(BIN)/python -m pytest -q -p no:cacheprovider --junitxml=.durations.xml $(XDIST)
	$(BIN)/python tests/durations.py .durations.xml

test-long: setup chromium postgresql lint
	WIRE_SEEDS=25 WIRE_CRASH_SEEDS=5 WIRE_DERIVED_SEEDS=4 WIRE_COMPUTE_SEEDS=10 WIRE_RAW_JOIN_SEEDS=4 WIRE_RAW_JOIN_KILLS=3 WIRE_NEXMARK_EVENTS=200000 WIRE_TICK_KILLS=10 WIRE_SHELL_KILLS=6 WIRE_PRODUCE_KILLS=4 WIRE_FAULT_SEEDS=3 WIRE_FAULT_RATES=0.06,0.1 WIRE_FAULT_EVENTS=4000 \
	WIRE_FAULT_MARKER_OUTAGE=45 $(BIN)/python -m pytest -q -p no:cacheprovider $(XDIST)

# The real NEXMark q5, q7, q8, q11 (BENCHMARKS.md); the first-stage comparison is benchmarks/compare.py.
# --graph: each query's stages in one `wire tick --upstream`, as BENCHMARKS.md's latest figures.
NEXMARK_ARGS ?= --graph
bench: setup
	$(BIN)/python benchmarks/produce.py
	$(BIN)/python benchmarks/kernel.py
	$(BIN)/python benchmarks/nexmark_queries.py $(NEXMARK_ARGS)

# Re-pin: resolve the ranges in pyproject.toml and freeze them.
lock:
	rm -rf /tmp/wire-lock && $(PYTHON) -m venv /tmp/wire-lock && /tmp/wire-lock/bin/pip install -q '.[test]' && \
	/tmp/wire-lock/bin/pip freeze --exclude wire-dagster > requirements.lock

clean:
	rm -rf $(VENV) .wire build *.egg-info
