# spectrace — fresh machine: `make demo`, then `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
SAMPLE  ?= .cache/samples/tp1_node.sqlite
PAIR    ?= tp1
RANGES  ?=
ARGS    ?=

.PHONY: install demo demo-pair test test-all lint typecheck bench clean notebooks

$(BIN)/spectrace: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev,cluster]'
	@touch $@

install: $(BIN)/spectrace

demo: install $(SAMPLE)
	$(BIN)/spectrace analyze $(SAMPLE) $(if $(RANGES),--ranges '$(RANGES)') $(ARGS)

# a bundled two-pass pair (PAIR_node + PAIR_graph): the analysis with the probe-effect section
demo-pair: install
	$(BIN)/spectrace analyze $$($(BIN)/python -m nvtx_hooks.capture.samples $(PAIR)_node) \
	  --timing $$($(BIN)/python -m nvtx_hooks.capture.samples $(PAIR)_graph) $(ARGS)

# The tests a developer runs often: all but the `slow` ones (the heaviest end-to-end runs, PyPI downloads) and
# the notebooks' own run, in TEST_WORKERS processes (pytest-xdist; one per core of the 2-core machine; a whole
# test file per process, so that its module fixtures are computed once); -rs: why each skipped test was skipped
# (the shared real traces beside the checkout, torch, root, ...). `make test-all` (CI) runs everything.
TEST_WORKERS ?= 2
PYTEST       := $(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile
test: install
	$(PYTEST) -m 'not slow' -p no:nbmake tests

test-all: install
	$(PYTEST) --nbmake tests notebooks

# the notebooks in Jupyter Lab (SPECTRACE_REPORT / SPECTRACE_BASELINE / SPECTRACE_STEPS: docs/cli.md); jupyterlab is
# in the dev extra that `make install` installs (as root, e.g. in a container, Jupyter wants --allow-root)
notebooks: install
	@$(BIN)/python -c "import jupyterlab" 2>/dev/null || { echo "jupyter lab is not in $(VENV): $(BIN)/pip install -e '.[dev,cluster]', then make notebooks again"; exit 2; }
	$(BIN)/jupyter lab notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(ARGS)

lint: install
	$(BIN)/ruff check .

# mypy over analyze and nvtx_hooks, as [tool.mypy] in pyproject.toml says (docs/design.md: Before a commit)
typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python -m bench.bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# --- captures (issue 4): `spectrace trace` = nsys profile + SQLite export + NAME.manifest.json ---
MODEL        ?= meta-llama/Llama-3.1-8B-Instruct
DRAFT        ?= jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B
TP           ?= 8
STEPS        ?= 3
TOPK         ?= 1
DRAFT_TOKENS ?= 4
PORT         ?= 30000
SERVER       ?= $(BIN)/python -m sglang.launch_server
SERVER_ARGS  ?=
LOAD_ARGS    ?= --num-prompts 64 --input-len 256 --output-len 256 --concurrency 16
TRACE_ARGS   ?=
TRACE_DIR    ?= .cache/traces
TRACE_NAME   ?= sglang_eagle3_tp$(TP)_s$(STEPS)
WORKLOAD_ARGS ?=
SERVE        := $(BIN)/python -m nvtx_hooks.capture.serve --port $(PORT) $(LOAD_ARGS) --
SERVER_CMD   := $(SERVER) --model-path $(MODEL) --tp $(TP) --port $(PORT)
SPEC_FLAGS   := --speculative-algorithm EAGLE3 --speculative-draft-model-path $(DRAFT) \
                --speculative-num-steps $(STEPS) --speculative-eagle-topk $(TOPK) \
                --speculative-num-draft-tokens $(DRAFT_TOKENS)

.PHONY: trace trace-baseline trace-demo

$(SAMPLE): | install
	$(BIN)/python -m nvtx_hooks.capture.samples $(basename $(notdir $@)) >/dev/null

trace: install
	$(BIN)/spectrace trace -o $(TRACE_DIR)/$(TRACE_NAME) $(TRACE_ARGS) -- \
	  $(SERVE) $(SERVER_CMD) $(SPEC_FLAGS) $(SERVER_ARGS)

trace-baseline: install
	$(BIN)/spectrace trace -o $(TRACE_DIR)/sglang_baseline_tp$(TP) $(TRACE_ARGS) -- \
	  $(SERVE) $(SERVER_CMD) $(SERVER_ARGS)

trace-demo: install
	$(BIN)/spectrace trace --capture all --stats -o $(TRACE_DIR)/demo_workload $(TRACE_ARGS) -- \
	  $(BIN)/python -m nvtx_hooks.capture.workload $(WORKLOAD_ARGS)
