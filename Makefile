# Two commands matter: `make test` and `make demo` (see README.md).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test demo lint typecheck pytest bench chaos docs clean install

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,summarizer,bench,dev]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict resilience integrations tests/typing

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck docs pytest

demo: $(STAMP)
	$(BIN)/python -m integrations.summarizer demo --quick

bench: $(STAMP)
	(command -v wrk && command -v callgrind_control && command -v redis-server) >/dev/null || apt-get update -qq || true
	command -v wrk >/dev/null || apt-get install -y -qq wrk || echo "wrk unavailable: the uvicorn req/s table will be skipped"
	command -v callgrind_control >/dev/null || apt-get install -y -qq valgrind || echo "valgrind unavailable: the instruction-count table will be skipped"
	command -v redis-server >/dev/null || apt-get install -y -qq redis-server || echo "redis-server unavailable: the Redis tables will be skipped"
	$(BIN)/python -m benchmarks

chaos: $(STAMP)
	RESILIENCE_CHAOS_LONG=1 $(BIN)/python -m pytest -q tests/ratelimit/test_redis_hammer.py tests/bulkhead/test_redis_chaos.py
	RESILIENCE_CHAOS_LONG=1 $(BIN)/python -m tests.chaos
	RESILIENCE_CHAOS_LONG=1 $(BIN)/python -m pytest -q tests/integrations/test_demo.py

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) site .mypy_cache .ruff_cache .pytest_cache .hypothesis
