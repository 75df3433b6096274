# rtserve: train, archive, serve and test a real-time PyTorch classifier on TorchServe.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec
.DEFAULT_GOAL := help

MODEL_NAME    ?= realtime-classifier
MODEL_VERSION ?= 1.0
PYTHON        ?= python3
VENV          ?= .venv
MODEL_STORE   ?= model_store
ARTIFACTS     ?= artifacts
RUN_DIR       ?= .run
MODEL_CONFIG  ?= model/model-config.yaml
PYTEST_ARGS   ?=
INFERENCE_URL ?= http://127.0.0.1:8080
MANAGEMENT_URL ?= http://127.0.0.1:8081
WORKERS       ?=

# Training options per version; `make archive MODEL_VERSION=2.0` trains the larger model.
TRAIN_ARGS_1.0 = --epochs 1 --hidden 64
TRAIN_ARGS_2.0 = --epochs 6 --hidden 128
TRAIN_ARGS    ?= $(or $(TRAIN_ARGS_$(MODEL_VERSION)),$(TRAIN_ARGS_1.0))

BIN       := $(VENV)/bin
PY        := $(BIN)/python
STAMP     := $(VENV)/.installed
MODEL_DIR := $(ARTIFACTS)/$(MODEL_VERSION)
MAR       := $(MODEL_STORE)/$(MODEL_NAME)_$(MODEL_VERSION).mar
HANDLER_SRC := $(wildcard handler/*.py)
STAGE     := build/stage/$(MODEL_NAME)_$(MODEL_VERSION)

##@ General
.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m [VAR=value]\n"} \
	  /^[a-zA-Z0-9_.%-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)
	@printf "\nVariables: MODEL_NAME=%s MODEL_VERSION=%s MODEL_STORE=%s\n" "$(MODEL_NAME)" "$(MODEL_VERSION)" "$(MODEL_STORE)"

##@ Build
.PHONY: venv
venv: $(STAMP) ## Create .venv and install the pinned dependencies

$(STAMP): requirements.txt requirements-dev.txt
	@echo ">> creating $(VENV) and installing pinned dependencies (about a minute)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

.PHONY: train
train: $(MODEL_DIR)/weights.pt ## Train MODEL_VERSION (deterministic; prints epochs and held-out accuracy)

$(MODEL_DIR)/weights.pt $(MODEL_DIR)/meta.json &: $(STAMP) rtserve/train.py rtserve/data.py handler/model.py
	@echo ">> training $(MODEL_NAME) $(MODEL_VERSION) ($(TRAIN_ARGS))"
	$(PY) -m rtserve.train --version $(MODEL_VERSION) --out $(MODEL_DIR) $(TRAIN_ARGS)

.PHONY: archive
archive: $(MAR) ## Build model_store/$(MODEL_NAME)_$(MODEL_VERSION).mar

$(MAR): $(MODEL_DIR)/weights.pt $(MODEL_DIR)/meta.json $(HANDLER_SRC) $(MODEL_CONFIG) | $(STAMP)
	@echo ">> archiving $@"
	rm -rf $(STAGE) && mkdir -p $(STAGE)/files/handler $(STAGE)/out $(STAGE)/tmp $(MODEL_STORE)
	cp $(HANDLER_SRC) $(STAGE)/files/handler/
	cp $(MODEL_DIR)/meta.json $(STAGE)/files/
	TMPDIR=$(abspath $(STAGE)/tmp) $(BIN)/torch-model-archiver --model-name $(MODEL_NAME) \
	  --version $(MODEL_VERSION) --serialized-file $(MODEL_DIR)/weights.pt \
	  --handler handler/rtserve_handler.py --extra-files $(STAGE)/files \
	  --config-file $(MODEL_CONFIG) --export-path $(STAGE)/out --force
	mv $(STAGE)/out/$(MODEL_NAME).mar $@
	@echo ">> built $@"

##@ Run
.PHONY: serve
serve: $(MAR) ## Install, build the archive, start TorchServe on localhost and wait until it answers
	$(PY) -m rtserve.server start --run-dir $(RUN_DIR) --model-store $(MODEL_STORE) \
	  --models $(MODEL_NAME)=$(notdir $(MAR))
	@echo ">> try it:"
	@echo "   TOKEN=\$$($(PY) -m rtserve token)"
	@echo "   curl -s http://127.0.0.1:8080/predictions/$(MODEL_NAME) -H \"Authorization: Bearer \$$TOKEN\" \\"
	@echo "        -H 'Content-Type: application/json' -d @examples/request.json"
	@echo "   or: make predict"

.PHONY: predict
predict: $(STAMP) ## Send examples/request.json to the running server
	$(PY) -m rtserve predict $(MODEL_NAME) examples/request.json

.PHONY: stop
stop: ## Stop the TorchServe started by `make serve`
	$(PY) -m rtserve.server stop --run-dir $(RUN_DIR)

##@ Versions (on the running server, through the management API)
RTSERVE := $(PY) -m rtserve --inference $(INFERENCE_URL) --management $(MANAGEMENT_URL) --run-dir $(RUN_DIR)

.PHONY: register
register: $(MAR) ## Register MODEL_VERSION beside the running ones (not default); waits for its workers
	$(RTSERVE) register $(MODEL_NAME) $(MODEL_VERSION) $(if $(WORKERS),--workers $(WORKERS))

.PHONY: promote
promote: $(STAMP) ## Make MODEL_VERSION the default (the previous default is recorded for rollback)
	$(RTSERVE) promote $(MODEL_NAME) $(MODEL_VERSION)

.PHONY: rollback
rollback: $(STAMP) ## Return the default to the version before the last promote
	$(RTSERVE) rollback $(MODEL_NAME)

.PHONY: retire
retire: $(STAMP) ## Unregister MODEL_VERSION (refused for the default version)
	$(RTSERVE) retire $(MODEL_NAME) $(MODEL_VERSION)

.PHONY: scale
scale: $(STAMP) ## Scale to WORKERS workers (the default version, or VERSION=x)
	@test -n "$(WORKERS)" || { echo "usage: make scale WORKERS=N [VERSION=x]"; exit 2; }
	$(RTSERVE) scale $(MODEL_NAME) $(WORKERS) $(if $(VERSION),--version $(VERSION))

.PHONY: models
models: $(STAMP) ## List versions: default, workers and queue
	$(RTSERVE) models $(MODEL_NAME)

.PHONY: history-versions
history-versions: $(STAMP) ## Show the recorded default-version changes (what rollback reads)
	$(RTSERVE) history $(MODEL_NAME)

##@ Test
.PHONY: test
test: $(STAMP) ## Run the whole test suite (builds what it needs, starts and stops its own servers)
	$(PY) -m pytest $(PYTEST_ARGS)

##@ Benchmarks
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_ARGS  ?=

$(BENCH_STAMP): requirements-bench.txt $(STAMP)
	@echo ">> installing the benchmark-only dependencies (requirements-bench.txt)"
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-bench.txt
	@touch $@

.PHONY: bench-deps
bench-deps: $(BENCH_STAMP) ## Install FastAPI/uvicorn (benchmark only) and the load tool wrk (apt, if missing)
	@command -v wrk >/dev/null || { echo ">> installing wrk (apt)"; \
	  { apt-get install -y -qq wrk >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq wrk; }; } \
	  || { echo "wrk is missing and cannot be installed here: install Debian's wrk package"; exit 1; }; }

.PHONY: bench
bench: $(MAR) $(ARTIFACTS)/$(MODEL_VERSION)/weights.pt bench-deps ## Raw forward vs seed FastAPI vs rtserve's TorchServe (about 5 min; BENCH_ARGS=... to vary)
	$(PY) -m bench.perf --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

.PHONY: bench-handler
bench-handler: $(MODEL_DIR)/weights.pt ## Handler time per request in a full batch of 32, and the raw forward pass
	$(PY) -m bench.handler_micro --model-dir $(MODEL_DIR)

.PHONY: bench-rollout
bench-rollout: $(MODEL_STORE)/$(MODEL_NAME)_1.0.mar $(MODEL_STORE)/$(MODEL_NAME)_2.0.mar ## Rollout 1.0 -> 2.0 and back under steady load (about 40 s)
	$(PY) -m bench.rollout_load --model-store $(MODEL_STORE)

.PHONY: bench-hostile
bench-hostile: $(MAR) ## Hostile-input corpus over HTTP mixed into valid traffic (3000 bad requests)
	$(PY) -m bench.hostile_input --model-store $(MODEL_STORE) --version $(MODEL_VERSION)

.PHONY: bench-overload
bench-overload: $(MAR) ## A burst of 400 requests against 1 worker and a queue of 8: fast 503s, then normal service
	$(PY) -m bench.overload --model-store $(MODEL_STORE) --version $(MODEL_VERSION) --burst 400 --queue 8 --workers 1

$(MODEL_STORE)/$(MODEL_NAME)_%.mar: FORCE
	$(MAKE) --no-print-directory archive MODEL_VERSION=$*

.PHONY: FORCE
FORCE:

.PHONY: clean
clean: ## Remove build outputs (archives, artifacts, run directory); keeps .venv
	rm -rf build $(ARTIFACTS) $(RUN_DIR) $(MODEL_STORE)/*.mar
