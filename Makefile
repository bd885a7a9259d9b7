# spectrace — fresh machine: `make demo`, then `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
SAMPLE  ?= ../shared/traces/tp2_probe_node.sqlite
RANGES  ?=
ARGS    ?=

.PHONY: install demo test lint bench clean

$(BIN)/spectrace: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

install: $(BIN)/spectrace

demo: install
	$(BIN)/spectrace analyze $(SAMPLE) $(if $(RANGES),--ranges '$(RANGES)') $(ARGS)

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

bench: install
	$(BIN)/python -m analyze.bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
