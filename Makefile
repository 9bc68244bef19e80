# Tessera: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench openapi clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Tessera needs Python 3.11 or newer: run make PYTHON=python3.11 ...")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/tessera dev

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy app scheduler billing

# Two phases: the suite on two workers, then the timing-sensitive multi-process tests alone
# (killing and restarting real processes, measured to the second, wants a quiet machine). Those
# live in tests/faults/ (tests/conftest.py refuses a serial test elsewhere): the second phase
# collects that folder alone.
test: lint
	$(BIN)/pytest -m "not serial"
	$(BIN)/pytest -m serial -n 0 tests/faults

bench: $(STAMP)
	$(BIN)/tessera bench all --quick

openapi: $(STAMP)
	$(BIN)/tessera openapi --out openapi/openapi.json

clean:
	rm -rf $(VENV) .tessera .pytest_cache .mypy_cache .ruff_cache
