# rtserve: train, archive, serve and test a real-time PyTorch classifier on TorchServe.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec
.DEFAULT_GOAL := help

MODEL_NAME    ?= realtime-classifier
MODEL_VERSION ?= 1.0
PYTHON        ?= python3
VENV          ?= .venv
MODEL_STORE   ?= model_store
# ARTIFACTS: the model artifact directory to pack (model.pt2 + meta.json, written by
# rtserve.model.package.export; see docs/bring-your-own-model.md). Not given: the demo model, trained
# into DEMO_ARTIFACTS/MODEL_VERSION by rtserve.model.train through the same API.
USER_ARTIFACTS := $(filter-out undefined,$(origin ARTIFACTS))
DEMO_ARTIFACTS ?= artifacts
ARTIFACTS     ?= $(DEMO_ARTIFACTS)/$(MODEL_VERSION)
RUN_DIR       ?= .run
MODEL_CONFIG  ?= model/model-config.yaml
PYTEST_ARGS   ?=
INFERENCE_URL ?= http://127.0.0.1:8080
MANAGEMENT_URL ?= http://127.0.0.1:8081
WORKERS       ?=
# Where the server ships its records (docs/records.md): auto = the node `make cassandra` runs
# from RUN_DIR/cassandra when it runs, else none (the spool is kept locally); or host:port[,...].
RECORDS_STORE ?= auto

# Demo training options per version; `make archive MODEL_VERSION=2.0` trains the larger model.
TRAIN_ARGS_1.0 = --epochs 1 --hidden 64
TRAIN_ARGS_2.0 = --epochs 6 --hidden 128
TRAIN_ARGS    ?= $(or $(TRAIN_ARGS_$(MODEL_VERSION)),$(TRAIN_ARGS_1.0))

# Downloads and builds that outlive a clone (wheels, later cluster binaries and jars), keyed by version.
key = $(shell printf '%s' '$(1)' | sha256sum | cut -c1-12)
CACHE_DIR       ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/rtserve
# $(1) as one shell word in single quotes: a script gets a variable's text as a recipe line had it.
sq = '$(subst ','\'',$(1))'

BIN       := $(VENV)/bin
PY        := $(BIN)/python
STAMP     := $(VENV)/.installed
MODEL_DIR := $(ARTIFACTS)
MAR       := $(MODEL_STORE)/$(MODEL_NAME)_$(MODEL_VERSION).mar
HANDLER_SRC := $(wildcard handler/*.py)
STAGE     := build/stage/$(MODEL_NAME)_$(MODEL_VERSION)
AGENT_JAR := build/agent/rtserve-agent.jar
AGENT_SRC := $(wildcard agent/src/rtserve/agent/*.java) agent/MANIFEST.MF

##@ General
.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m [VAR=value]\n"} \
	  /^[a-zA-Z0-9_.%-]+:.*?##/ { printf "  \033[36m%-24s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)
	@printf "\nVariables: MODEL_NAME=%s MODEL_VERSION=%s MODEL_STORE=%s\n" "$(MODEL_NAME)" "$(MODEL_VERSION)" "$(MODEL_STORE)"

# The domains, in this order (a later file may use an earlier one's variables when it is read).
include $(addprefix mk/,build.mk serve.mk promotion.mk monitor.mk image.mk k8s.mk cluster.mk \
  kafka.mk cassandra.mk test.mk bench.mk)

# The names before one naming rule (k8s-* for the cluster, no prefix for the local server, image*
# and pod* for images and pods, <group>-deps for tool installs): each fails and names its
# successor. (`history` now means the local server's; the cluster's is k8s-history.)
RENAMED := deploy:k8s-deploy rollout-status:k8s-status history-versions:history podman:pod-deps \
  checkov-venv:k8s-deps nginx:nginx-deps rehearsal:bench-rehearsal
RENAMED_OLD := $(foreach r,$(RENAMED),$(word 1,$(subst :, ,$(r))))
.PHONY: $(RENAMED_OLD)
$(RENAMED_OLD):
	@echo "make $@ was renamed: use make $(word 2,$(subst :, ,$(filter $@:%,$(RENAMED))))" >&2; exit 2
