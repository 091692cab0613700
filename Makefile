# hotswap: `make demo` and `make test` do all the set-up on a machine with Python 3.11+ and Java 17+ (Debian/Ubuntu).
# They install redis-server and Maven if missing; `hotswap run` needs neither (README, "What needs what").
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
export PYSPARK_PYTHON := $(abspath $(BIN)/python)
export SPARK_LOCAL_IP := 127.0.0.1
COMPOSE := docker-compose -f compose/docker-compose.yml -p hotswap
# The container route of the tests: when a Docker engine answers, unless HOTSWAP_TEST_SERVICES=embedded.
CONTAINERS := [ "$${HOTSWAP_TEST_SERVICES:-auto}" != embedded ] && docker info >/dev/null 2>&1

.DEFAULT_GOAL := help
.PHONY: help install system-deps browser postgres jars object-store-jars stack-up stack-down demo images compose-demo lint format schema diagram unit check integration cluster test bench soak clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install hotswap with its development tools

system-deps: ## Install redis-server, openssl and Maven if missing (Debian/Ubuntu); check Java
	@command -v redis-server >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server; }
	@command -v openssl >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq openssl; }
	@command -v java >/dev/null 2>&1 || { echo "Java 17+ is required (e.g. apt-get install openjdk-17-jdk-headless)"; exit 1; }
# Java first: installing Maven without it would pull in the distribution's default JRE, maybe older than 17.
	@command -v mvn >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq maven; }

browser: ## Install Chromium if missing (Debian/Ubuntu): the dashboard's integration test drives it headless
	@command -v chromium >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium; }

postgres: ## Install PostgreSQL's server if missing (Debian/Ubuntu): the postgres sink's integration tests start one
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql; }

jars: install system-deps ## Fetch Kafka's and Spark's Kafka connector jars from Maven Central (once)
	$(BIN)/hotswap stack fetch

object-store-jars: jars ## Fetch Hadoop's S3 client (about 690 MB) for checkpoints on s3a://: the cluster test keeps its checkpoints on an S3 server
	$(BIN)/hotswap stack fetch --object-store

stack-up: jars ## Start the embedded Kafka broker and Redis server
	$(BIN)/hotswap stack up

stack-down: ## Stop the embedded stack
	$(BIN)/hotswap stack down

demo: jars ## Run the whole thing for about two minutes: results, a live swap, a final check
	$(BIN)/hotswap demo

images: install jars ## Build the container images (Kafka, Redis, the executor) on a Docker engine
	compose/build-images

compose-demo: images ## The demo on containers (docker-compose): runs it, prints the check, removes it all
	$(COMPOSE) down -v --remove-orphans
	$(COMPOSE) run --rm -T demo; rc=$$?; \
	  [ $$rc = 0 ] || $(COMPOSE) logs --no-color --tail 40 executor spark-worker kafka; \
	  $(COMPOSE) down -v --remove-orphans; exit $$rc

format: install ## Format the code
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

lint: install ## ruff and mypy (strict)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m tests.typecheck

schema: install diagram ## Regenerate docs/status.schema.json (contract/status.py) and docs/swap-states.md
	$(BIN)/python -m hotswap.contract.status > docs/status.schema.json.new && mv docs/status.schema.json.new docs/status.schema.json

diagram: install ## Regenerate docs/swap-states.md, the swap's state diagram, from the phase table (contract/phases.py)
	$(BIN)/python -m hotswap.contract.phases > docs/swap-states.md.new && mv docs/swap-states.md.new docs/swap-states.md

unit: install ## Unit and component tests only (no Kafka, Redis or Spark)
	$(BIN)/pytest -m "not integration" -q

check: lint unit ## Before a push: lint, then unit and component tests (no Kafka, Redis or Spark; under a minute)

integration: object-store-jars browser postgres ## Integration tests against real Kafka, Redis and Spark (Kafka and Redis in containers if Docker answers)
	@if $(CONTAINERS); then $(MAKE) --no-print-directory images; fi
	$(BIN)/pytest -m integration -v

cluster: object-store-jars ## The cluster tests alone: three swaps on a Spark standalone cluster started from pyspark, and a broker killed in a 3-broker Kafka (minutes)
	$(BIN)/pytest -m cluster -v

test: lint object-store-jars browser postgres ## Lint, then every test, the cluster tests included (Kafka and Redis in containers if Docker answers)
	@if $(CONTAINERS); then $(MAKE) --no-print-directory images; fi
	$(BIN)/pytest -v --durations=40

bench: jars ## Benchmarks beside plain Spark and stop-and-restart (QUICK=1: about 15 minutes); not part of `make test`
	@# matplotlib (the plot) comes with the dev extra; install the bench extra only if it is missing.
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/pip install -q -e '.[dev,bench]'
	$(BIN)/python -m benchmarks.run $(if $(QUICK),--quick,)

soak: jars ## SOAK_MINUTES (default 30) of load, swaps and faults, then every window checked; not part of `make test`
	@$(BIN)/python -c 'import matplotlib' 2>/dev/null || $(BIN)/pip install -q -e '.[dev,bench]'
	PYSPARK_PYTHON=$(abspath $(BIN))/python SPARK_LOCAL_IP=127.0.0.1 $(BIN)/python -m benchmarks.soak

clean: ## Stop the stack and remove .hotswap/ (keeps .venv)
	-$(BIN)/hotswap stack down
	rm -rf .hotswap
