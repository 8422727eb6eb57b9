# onceflow: the two commands of the README's quick start, and helpers.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TESTSTAMP := $(VENV)/.installed-test

.PHONY: demo check test test-long docs lint bench clean java

$(PY):
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 10), "onceflow needs Python >= 3.10"'
	$(PYTHON) -m venv $(VENV) || { [ "$$(id -u)" = 0 ] && apt-get update -qq \
		&& apt-get install -y -qq python3-venv && rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml setup.py $(wildcard src/onceflow/runtime/jvm/*.scala)
	# the build compiles onceflow's jars with PySpark's Scala compiler (setup.py): Java first, and the
	# build's PySpark is the environment's (no second copy in an isolated build environment)
	bash scripts/ensure_java.sh $(PY)
	$(PY) -m pip install -q "setuptools>=77" wheel "pyspark>=4.1,<5"
	$(PY) -m pip install -q --no-build-isolation -e .
	# the editable install's bytecode, as pip writes a wheel's: each Spark Python worker that imports
	# onceflow reads it instead of compiling the sources (PYTHONDONTWRITEBYTECODE=1 never writes it)
	$(PY) -m compileall -q src
	touch $@

$(TESTSTAMP): $(STAMP)
	$(PY) -m pip install -q --no-build-isolation -e '.[test]'
	touch $@

java: $(STAMP)
	bash scripts/ensure_java.sh $(PY)

demo: $(STAMP)
	bash scripts/ensure_java.sh $(PY)
	$(VENV)/bin/onceflow demo

# the inner loop before a commit (a few minutes): lint, types, and the tests that start no JVM,
# no database server and kill nothing
check: $(TESTSTAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src
	$(PY) -m pytest -q -rf -p no:cacheprovider -m "not spark and not jvm and not postgres and not faults and not slow and not long" tests

# make test runs the test files in TEST_WORKERS processes (pytest-xdist; one file's tests stay in one
# process, with its module fixtures: brokers, servers). Each process starts its own session and
# PostgreSQL server. TEST_WORKERS=0: all in this process.
TEST_WORKERS ?= 2

test: $(TESTSTAMP)
	bash scripts/ensure_java.sh $(PY)
	bash scripts/ensure_postgres.sh
	bash scripts/ensure_chromium.sh
	$(PY) -m onceflow.runtime.jars fetch kafka-broker kafka-connector postgres-jdbc
	# the child drivers' fast-start archive (once per install) trains beside the lint and the docs
	$(PY) -c 'import tempfile, pathlib, onceflow.verify.driver as d; d.fast_start_archive(pathlib.Path(tempfile.mkdtemp()))' \
		& train=$$!; \
	$(VENV)/bin/ruff check src && $(VENV)/bin/mypy src \
		&& NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q; rc=$$?; wait $$train; exit $$rc
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=25 tests

test-long: $(TESTSTAMP)
	bash scripts/ensure_java.sh $(PY)
	bash scripts/ensure_postgres.sh
	$(PY) -m onceflow.runtime.jars fetch kafka-broker kafka-connector postgres-jdbc
	PY=$(PY) bash scripts/test_long.sh

docs: $(TESTSTAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(TESTSTAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy src

bench: $(STAMP)
	$(PY) -m compileall -q src
	bash scripts/ensure_java.sh $(PY)
	$(PY) -m onceflow.runtime.jars fetch kafka-broker kafka-connector postgres-jdbc
	$(PY) benchmarks/bench_user_counts.py

clean:
	rm -rf $(VENV) onceflow-demo build src/*.egg-info
