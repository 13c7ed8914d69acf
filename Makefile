# spool: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: install java postgres jdbc run test unit integration bench lint format clean fuzz \
	docker-build compose-up compose-down pipeline pipeline-report

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

install: $(STAMP)

# pyspark (the Spark pipeline and its tests) runs a JVM: Java 17 or newer. When `java`
# is missing or older, install Debian's JRE 17 without asking (CI has no stdin), as root
# or through passwordless sudo; otherwise say what to install and stop.
JAVA_MIN := 17
JAVA_PKG := openjdk-17-jre-headless
java:
	@ver=$$(java -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1); \
	major=$${ver%%.*}; \
	if [ -n "$$major" ] && [ "$$major" -ge $(JAVA_MIN) ] 2>/dev/null; then exit 0; fi; \
	echo "make: Java $(JAVA_MIN)+ not found (java: $${ver:-missing}); pyspark needs it." \
	     "Installing $(JAVA_PKG)."; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: no apt-get here: install a Java $(JAVA_MIN)+ runtime with this machine's" \
	       "package manager (or set JAVA_HOME/PATH to one) and rerun." >&2; exit 1; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; \
	elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "make: installing $(JAVA_PKG) needs root: run" \
	          "'sudo apt-get install -y $(JAVA_PKG)' and rerun." >&2; exit 1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	if $$sudo apt-get update -q && $$sudo apt-get install -y -q --no-install-recommends $(JAVA_PKG) </dev/null; \
	then java -version; \
	else echo "make: apt-get could not install $(JAVA_PKG); install a Java $(JAVA_MIN)+ runtime" \
	          "and rerun." >&2; exit 1; fi

# The storage tests start their own PostgreSQL (tests/postgres.py) from Debian's
# server package. When no server is installed, install it without asking, as for Java.
# Only its binaries are used: the package's own cluster service is never needed.
PG_PKG := postgresql
postgres:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ -n "$$SPOOL_PG_BINDIR" ]; \
	then exit 0; fi; \
	echo "make: no PostgreSQL server found; the storage tests need one. Installing $(PG_PKG)."; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: no apt-get here: install PostgreSQL 15+ server binaries and set" \
	       "SPOOL_PG_BINDIR to their directory." >&2; exit 1; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; \
	elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "make: installing $(PG_PKG) needs root: run" \
	          "'sudo apt-get install -y $(PG_PKG)' and rerun." >&2; exit 1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	if $$sudo apt-get update -q && $$sudo apt-get install -y -q --no-install-recommends $(PG_PKG) </dev/null; \
	then ls -d /usr/lib/postgresql/*/bin; \
	else echo "make: apt-get could not install $(PG_PKG)." >&2; exit 1; fi

# `spool audit` / `spool compact --storage postgresql://...` read the database through
# Spark's JDBC source with Debian's PostgreSQL JDBC driver (persister/spark/pg.py); when
# its jar is missing, install the package without asking, as for Java. SPOOL_JDBC_JAR
# names another jar instead.
JDBC_JAR := /usr/share/java/postgresql.jar
JDBC_PKG := libpostgresql-jdbc-java
jdbc:
	@if [ -f "$(JDBC_JAR)" ] || [ -n "$$SPOOL_JDBC_JAR" ]; then exit 0; fi; \
	echo "make: no PostgreSQL JDBC driver ($(JDBC_JAR)); the Spark jobs on PostgreSQL" \
	     "need it. Installing $(JDBC_PKG)."; \
	if ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make: no apt-get here: set SPOOL_JDBC_JAR to a PostgreSQL JDBC driver jar." >&2; \
	  exit 1; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=; \
	elif sudo -n true 2>/dev/null; then sudo="sudo -n"; \
	else echo "make: installing $(JDBC_PKG) needs root: run" \
	          "'sudo apt-get install -y $(JDBC_PKG)' and rerun." >&2; exit 1; fi; \
	export DEBIAN_FRONTEND=noninteractive; \
	if $$sudo apt-get update -q && $$sudo apt-get install -y -q --no-install-recommends $(JDBC_PKG) </dev/null; \
	then ls -l $(JDBC_JAR); \
	else echo "make: apt-get could not install $(JDBC_PKG)." >&2; exit 1; fi

run: install
	$(BIN)/spool serve --listen 127.0.0.1:9092 --data-dir ./data $(ARGS)

# The suite runs on TEST_WORKERS pytest-xdist processes (a test file per worker at a
# time, the Spark tests all on one: tests/conftest.py). Three on a 2-core machine: the
# integration tests mostly wait on brokers and clients. `TEST_WORKERS=0` runs it in this
# process (as for --pdb); `make test ARGS=tests/unit/test_x.py` runs one file.
TEST_WORKERS ?= 3
test: install java postgres jdbc
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(ARGS)

unit: install java
	$(BIN)/python -m pytest -q tests/unit $(ARGS)

integration: install java postgres
	$(BIN)/python -m pytest -q tests/integration $(ARGS)

bench: install java
	$(BIN)/python -m bench $(ARGS)

# Malformed and odd requests against a fresh broker; exits 1 on a crash or a traceback.
# `make fuzz FRAMES=200000 SEED=42` repeats a run; a failure prints its seed and frame.
FRAMES ?= 100000
SEED   ?=
fuzz: install
	$(BIN)/python -m tests.fuzz --frames $(FRAMES) $(if $(SEED),--seed $(SEED)) $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict protocol persister coordinator broker
	$(BIN)/lint-imports --no-cache

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The compose stacks (README: "The compose cluster"). Need a Docker engine with the
# compose plugin; COMPOSE="docker-compose" for the standalone binary. STACK=cluster (the
# default): PostgreSQL, three brokers on it, Spark (docker-compose.cluster.yml);
# STACK=single: one broker on its data dir, Spark (docker-compose.yml).
COMPOSE ?= docker compose
STACK   ?= cluster
COMPOSE_FILE_cluster := docker-compose.cluster.yml
COMPOSE_FILE_single  := docker-compose.yml
DC = $(COMPOSE) -f $(or $(COMPOSE_FILE_$(STACK)),$(error STACK=$(STACK): use cluster or single))

docker-build:
	$(DC) build

compose-up:
	$(DC) up -d --build --wait

# The stack up (healthy), then compaction and audit of its share-state log (the
# cluster's database; the single broker's data volume); exits with the pipeline's
# status. `make pipeline-report` copies the audit (report.json, report.html, Parquet)
# out of its volume into ./audit.
pipeline: compose-up
	$(DC) --profile pipeline run --rm pipeline

pipeline-report:
	mkdir -p audit
	$(DC) --profile pipeline run --rm --no-deps -T --entrypoint tar pipeline \
	    -C /audit -cf - . | tar -C audit -xf -

compose-down:
	$(DC) --profile pipeline down

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
