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
UV_VERSION      ?= 0.13.8
UV_HOME          = $(CACHE_DIR)/uv-$(UV_VERSION)
UV               = $(UV_HOME)/bin/uv
PIP_EXTRA_INDEX ?=
WHEELS_DIR      ?= $(CACHE_DIR)/wheels/$(if $(PIP_EXTRA_INDEX),index-$(call key,$(PIP_EXTRA_INDEX)),pypi)
# (keyed by the requirement lines, not the comments)
WHEELS_STAMP    := $(WHEELS_DIR)/.complete-$(shell sed 's/\#.*//' requirements.txt requirements-dev.txt | grep . | sha256sum | cut -c1-16)

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

##@ Build
.PHONY: venv
venv: $(STAMP) ## Create .venv and install the pinned dependencies

$(STAMP): requirements.txt requirements-dev.txt | $(WHEELS_STAMP) $(UV)
	@echo ">> creating $(VENV) from the wheels in $(WHEELS_DIR) (uv: unpacked once, then linked)"
	$(UV) venv --quiet --allow-existing --seed --python $(PYTHON) $(VENV)
	VIRTUAL_ENV=$(abspath $(VENV)) UV_CACHE_DIR=$(CACHE_DIR)/uv-cache $(UV) pip install --quiet \
	  --no-index --find-links $(WHEELS_DIR) --compile-bytecode -r requirements-dev.txt
	@touch $@

# Wheels of every pinned requirement, downloaded (or built) once per machine into the user's cache
# and reused by every clone: a wheel's file name carries its version, and the stamp is keyed by
# the requirements files' content (not their dates, which a fresh clone renews). The image installs
# the same wheels (WHEELHOUSE). PIP_EXTRA_INDEX names an extra package index with wheels of its own
# (PyTorch's CPU-only torch, no CUDA libraries: PIP_EXTRA_INDEX=https://download.pytorch.org/whl/cpu).
$(WHEELS_STAMP): | $(UV)
	@echo ">> downloading the pinned wheels into $(WHEELS_DIR) (once per machine: torch from PyPI is the CUDA build, about 3 GB)"
	@mkdir -p $(WHEELS_DIR)
	$(UV_HOME)/bin/pip wheel --quiet --disable-pip-version-check -r requirements-dev.txt \
	  -w $(WHEELS_DIR) --find-links $(WHEELS_DIR) $(if $(PIP_EXTRA_INDEX),--extra-index-url $(PIP_EXTRA_INDEX))
	@touch $@

# uv (from PyPI, pinned) makes virtualenvs from the cached wheels: each wheel is unpacked once into
# its cache and linked into every clone's .venv (a fresh clone's venv in under a minute).
$(UV):
	@echo ">> installing uv $(UV_VERSION) into $(UV_HOME)"
	rm -rf $(UV_HOME) && $(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

.PHONY: train
train: $(MODEL_DIR)/model.pt2 ## Train the demo MODEL_VERSION and export it (deterministic; prints held-out accuracy)

# The example model (examples/breast_cancer.py: scikit-learn's bundled breast cancer data).
EXAMPLE_NAME    ?= breast-cancer
EXAMPLE_VERSION ?= 1.0
EXAMPLE_DIR     ?= $(DEMO_ARTIFACTS)/$(EXAMPLE_NAME)/$(EXAMPLE_VERSION)
PACKAGE_SRC     := rtserve/model/package.py handler/model.py handler/drift.py

ifeq ($(USER_ARTIFACTS),)
$(MODEL_DIR)/model.pt2 $(MODEL_DIR)/meta.json &: $(STAMP) rtserve/model/train.py rtserve/model/data.py $(PACKAGE_SRC)
	@echo ">> training $(MODEL_NAME) $(MODEL_VERSION) ($(TRAIN_ARGS))"
	$(PY) -m rtserve model train --version $(MODEL_VERSION) --out $(MODEL_DIR) $(TRAIN_ARGS) \
	  --model-config $(MODEL_CONFIG)
else ifneq ($(abspath $(ARTIFACTS)),$(abspath $(EXAMPLE_DIR)))
$(MODEL_DIR)/model.pt2 $(MODEL_DIR)/meta.json:
	@echo "error: $@ is missing: export your model into $(ARTIFACTS) with rtserve.model.package.export first (docs/bring-your-own-model.md)"; exit 1
endif

$(EXAMPLE_DIR)/model.pt2 $(EXAMPLE_DIR)/meta.json &: $(STAMP) examples/breast_cancer.py $(PACKAGE_SRC)
	@echo ">> training and packaging the example model into $(EXAMPLE_DIR)"
	$(PY) -m rtserve model export examples.breast_cancer:packaging --version $(EXAMPLE_VERSION) \
	  --out $(EXAMPLE_DIR) --model-config $(MODEL_CONFIG)

.PHONY: example
example: $(EXAMPLE_DIR)/model.pt2 ## Train, package and archive the example model (model_store/breast-cancer_1.0.mar)
	$(MAKE) --no-print-directory archive MODEL_NAME=$(EXAMPLE_NAME) MODEL_VERSION=$(EXAMPLE_VERSION) ARTIFACTS=$(EXAMPLE_DIR)

.PHONY: archive
archive: $(MAR) ## Pack ARTIFACTS (default: the demo) into model_store/$(MODEL_NAME)_$(MODEL_VERSION).mar

$(MAR): $(MODEL_DIR)/model.pt2 $(MODEL_DIR)/meta.json $(HANDLER_SRC) $(MODEL_CONFIG) | $(STAMP)
	@echo ">> checking $(MODEL_DIR) (the handler's safe loader, then its golden set)"
	$(PY) -m rtserve model check $(MODEL_DIR) --version $(MODEL_VERSION)
	@echo ">> archiving $@"
	rm -rf $(STAGE) && mkdir -p $(STAGE)/files/handler $(STAGE)/out $(STAGE)/tmp $(MODEL_STORE)
	cp $(HANDLER_SRC) $(STAGE)/files/handler/
	cp $(MODEL_DIR)/meta.json $(STAGE)/files/
	TMPDIR=$(abspath $(STAGE)/tmp) $(BIN)/torch-model-archiver --model-name $(MODEL_NAME) \
	  --version $(MODEL_VERSION) --serialized-file $(MODEL_DIR)/model.pt2 \
	  --handler handler/rtserve_handler.py --extra-files $(STAGE)/files \
	  --config-file $(MODEL_CONFIG) --export-path $(STAGE)/out --force
	mv $(STAGE)/out/$(MODEL_NAME).mar $@
	@echo ">> built $@"

.PHONY: agent
agent: $(AGENT_JAR) ## Build the frontend's Java agent: greedy batching, OIP model routes, live routes (build/agent/rtserve-agent.jar)

$(AGENT_JAR): $(AGENT_SRC)
	@command -v javac >/dev/null || { echo ">> installing a JDK (apt) for javac"; \
	  { apt-get install -y -qq openjdk-17-jdk-headless >/dev/null 2>&1 || \
	    { apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless; }; } \
	  || { echo "javac is missing and cannot be installed: install a JDK 17"; exit 1; }; }
	rm -rf build/agent/classes && mkdir -p build/agent/classes
	javac --release 17 -Xlint:all -Werror -d build/agent/classes $(filter %.java,$^)
	jar --create --file $@ --manifest agent/MANIFEST.MF -C build/agent/classes .
	@echo ">> built $@"

# The wheels the image installs (requirements.txt's, with their dependencies), linked from WHEELS_DIR.
WHEELHOUSE    ?= $(CACHE_DIR)/wheelhouse/$(notdir $(WHEELS_DIR))-$(shell sed 's/\#.*//' requirements.txt | grep . | sha256sum | cut -c1-16)
WHEELHOUSE_STAMP := $(WHEELHOUSE)/.built

.PHONY: wheelhouse
wheelhouse: $(WHEELHOUSE_STAMP) ## The wheels of requirements.txt the image installs (in CACHE_DIR, keyed by its content)

$(WHEELHOUSE_STAMP): | $(STAMP)
	@echo ">> wheels for requirements.txt into $(WHEELHOUSE)"
	rm -rf $(WHEELHOUSE).tmp && mkdir -p $(WHEELHOUSE).tmp
	$(BIN)/pip download --quiet --disable-pip-version-check --no-index --find-links $(WHEELS_DIR) \
	  -r requirements.txt -d $(WHEELHOUSE).tmp
	cp requirements.txt $(WHEELHOUSE).tmp/
	touch $(WHEELHOUSE).tmp/.built
	rm -rf $(WHEELHOUSE) && mv $(WHEELHOUSE).tmp $(WHEELHOUSE)

.PHONY: clean
clean: ## Remove build outputs (archives, artifacts, run directory); keeps .venv
	rm -rf build $(DEMO_ARTIFACTS) $(RUN_DIR) $(MODEL_STORE)/*.mar

# The archive `make register`, `make serve` and `make image` use. With ARTIFACTS, or for the demo
# (MODEL_NAME realtime-classifier with its artifacts in DEMO_ARTIFACTS, or no archive yet): $(MAR),
# built or rebuilt from them first. Otherwise the archive `make archive ... ARTIFACTS=<dir>` built
# earlier, as it is (ARTIFACTS need not be restated; without ARTIFACTS the demo's rules would train
# the demo model into it).
ARCHIVE_BUILDS := $(or $(USER_ARTIFACTS),$(and $(filter realtime-classifier,$(MODEL_NAME)),$(or \
  $(wildcard $(DEMO_ARTIFACTS)/$(MODEL_VERSION)/meta.json),$(if $(wildcard $(MAR)),,no archive yet))))
ARCHIVE         = $(if $(ARCHIVE_BUILDS),$(MAR),$(STAMP))
require_archive = test -f $(MAR) || { echo "error: $(MAR) is missing: build it with make archive MODEL_NAME=$(MODEL_NAME) MODEL_VERSION=$(MODEL_VERSION) ARTIFACTS=<dir> (docs/bring-your-own-model.md)"; exit 1; }

##@ Run
.PHONY: serve
serve: $(ARCHIVE) $(AGENT_JAR) ## Build the archive (the demo, or ARTIFACTS), start TorchServe on localhost, wait until it answers
	@$(require_archive)
	$(PY) -m rtserve server start --run-dir $(RUN_DIR) --model-store $(MODEL_STORE) \
	  --models $(MODEL_NAME)=$(notdir $(MAR)) --records-store "$(RECORDS_STORE)"
	@echo ">> try it:"
	@echo "   TOKEN=\$$($(PY) -m rtserve client token)"
	@echo "   curl -s http://127.0.0.1:8080/predictions/$(MODEL_NAME) -H \"Authorization: Bearer \$$TOKEN\" \\"
	@echo "        -H 'Content-Type: application/json' -d @examples/request.json"
	@echo "   or: make predict"

.PHONY: predict
predict: $(STAMP) ## Send examples/request.json to the running server
	$(PY) -m rtserve client predict $(MODEL_NAME) examples/request.json

.PHONY: explain
explain: $(STAMP) ## Explain examples/request.json on the running server (per-feature attributions)
	$(PY) -m rtserve client explain $(MODEL_NAME) examples/request.json

.PHONY: stop
stop: ## Stop the TorchServe started by `make serve` (DRAIN=1: drain first, see `make drain`)
	$(PY) -m rtserve server stop --run-dir $(RUN_DIR) $(if $(DRAIN),--drain)

.PHONY: drain
drain: $(STAMP) ## Mark the running server not ready, wait until no request arrives, waits or runs
	$(PY) -m rtserve server drain --run-dir $(RUN_DIR)

##@ Versions (local server)
# On the running server, through the management API.
# The promotion gate (docs/versions-and-promotion.md): thresholds in GATE_CONFIG; REQUESTS: a
# JSON-lines file of recent request bodies compared too; FORCE=1 REASON="..." overrides a refusal.
GATE_CONFIG ?= config/gate.yaml
REQUESTS    ?=
FORCE       ?=
REASON      ?=
SERVER_OPTIONS = --inference $(INFERENCE_URL) --management $(MANAGEMENT_URL) \
  --run-dir $(RUN_DIR) --model-store $(MODEL_STORE) --gate-config $(GATE_CONFIG)
RTSERVE := $(PY) -m rtserve versions $(SERVER_OPTIONS)


.PHONY: register
register: $(ARCHIVE) ## Register MODEL_VERSION beside the running ones (not default); waits for its workers, checks its golden set
	@$(require_archive)
	$(RTSERVE) register $(MODEL_NAME) $(MODEL_VERSION) $(if $(WORKERS),--workers $(WORKERS))

.PHONY: promote
promote: $(STAMP) ## Make MODEL_VERSION the default if it passes the gate (REQUESTS=, FORCE=1 REASON=); recorded for rollback
	$(RTSERVE) promote $(MODEL_NAME) $(MODEL_VERSION) $(if $(REQUESTS),--requests $(REQUESTS)) \
	  $(if $(FORCE),--force --reason "$$REASON")

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

.PHONY: history
history: $(STAMP) ## Show the recorded default-version changes (what rollback reads)
	$(RTSERVE) history $(MODEL_NAME)

##@ Live traffic (shadow, canary)
# The frontend's agent follows RUN_DIR/live-routes.json and logs the candidate's answers to
# RUN_DIR/live-log.jsonl; thresholds in GATE_CONFIG's live: section (docs/versions-and-promotion.md).
PERCENT ?=
LIVE := $(PY) -m rtserve live $(SERVER_OPTIONS)
# shadow-report: the shadow route's version unless MODEL_VERSION is given on the command line.
GIVEN_VERSION = $(if $(filter command line environment,$(origin MODEL_VERSION)),--version $(MODEL_VERSION))

.PHONY: shadow
shadow: $(STAMP) ## Mirror PERCENT (default 100) of live requests to MODEL_VERSION (registered, not default); callers see the default only
	$(LIVE) shadow $(MODEL_NAME) $(MODEL_VERSION) $(if $(PERCENT),--percent $(PERCENT))

.PHONY: shadow-report
shadow-report: $(STAMP) ## Compare the shadow's answers with the default's: agreement, classes, latency, errors, largest disagreements
	$(LIVE) shadow-report $(MODEL_NAME) $(GIVEN_VERSION)

.PHONY: shadow-stop
shadow-stop: $(STAMP) ## Stop mirroring (a canary is kept)
	$(LIVE) shadow-stop $(MODEL_NAME)

.PHONY: canary
canary: $(STAMP) ## MODEL_VERSION answers PERCENT of requests (sticky per x-rtserve-key); a watcher aborts it on a breach
	@test -n "$(PERCENT)" || { echo "usage: make canary MODEL_VERSION=x PERCENT=10"; exit 2; }
	$(LIVE) canary $(MODEL_NAME) $(MODEL_VERSION) --percent $(PERCENT)

.PHONY: canary-stop
canary-stop: $(STAMP) ## Stop the canary's watcher and set its share to 0
	$(LIVE) canary-stop $(MODEL_NAME)

##@ Monitoring
# Prometheus and Alertmanager on loopback (docs/monitoring.md).
PROMETHEUS_PORT   ?= 9090
ALERTMANAGER_PORT ?= 9093
ALERT_WEBHOOK     ?=
MONITORING_DIR    ?= deploy/monitoring

.PHONY: monitor-deps
monitor-deps: ## Install Prometheus, Alertmanager and promtool from Debian's packages if missing
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null && \
	    { command -v prometheus-alertmanager || command -v alertmanager; } >/dev/null; then \
	  echo ">> present: $$(prometheus --version 2>&1 | head -1)"; \
	else \
	  echo ">> installing prometheus and prometheus-alertmanager from Debian's packages (apt-get)"; \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null 2>&1 || \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager; }; }; \
	fi

.PHONY: monitor
monitor: monitor-deps $(STAMP) ## Start Prometheus (127.0.0.1:PROMETHEUS_PORT) and Alertmanager scraping the server `make serve` runs
	$(PY) -m rtserve monitor start --run-dir $(RUN_DIR) --prometheus-port $(PROMETHEUS_PORT) \
	  --alertmanager-port $(ALERTMANAGER_PORT) $(if $(ALERT_WEBHOOK),--webhook $(ALERT_WEBHOOK))

.PHONY: monitor-stop
monitor-stop: ## Stop the Prometheus and Alertmanager `make monitor` started (by their PID files)
	$(PY) -m rtserve monitor stop --run-dir $(RUN_DIR)

##@ Image and pod
# The image of one model version, and the cluster's pod run locally (docs/image-and-pod.md).
IMG           ?= registry.example.com/ml/rtserve
# Docker where it is installed, else podman (what these machines have; `make pod-deps` installs it).
DOCKER        ?= $(if $(shell command -v docker 2>/dev/null),docker,podman)
# podman reads the project's settings (runc, cgroupfs, ulimits); the machine's are left alone.
export CONTAINERS_CONF ?= $(abspath deploy/podman/containers.conf)
BASE_IMAGE    ?= docker.io/library/python:3.11-slim-bookworm
# The local stand-in for BASE_IMAGE (debootstrap); its tag changes with the script that builds it.
LOCAL_BASE    ?= localhost/rtserve-base:bookworm-$(shell sha256sum deploy/podman/build-base.sh | cut -c1-12)
IMAGE_CONTEXT ?= build/image/$(MODEL_VERSION)
# One image build at a time on this machine (clones and test processes alike): the next one
# takes the layers the first cached (the builder stage and the 4 GB virtualenv) instead of
# making its own copies at the same time (two at once filled the disk once).
IMAGE_LOCK    ?= $(CACHE_DIR)/image-build.lock
# The image's tag: the model version (what the overlays pin); tests use their own.
IMAGE_TAG     ?= $(MODEL_VERSION)
POD_DIR       ?= $(RUN_DIR)/pod
# The overlay `make pod` runs (local, or local-records: with its records in an in-cluster
# Cassandra node), and its namespace.
POD_OVERLAY   ?= local
POD_NAMESPACE ?= rtserve-$(POD_OVERLAY)
POD_ROLLOUT_TO ?= 2.0
GATEWAY_BASE  ?= docker.io/library/debian:bookworm-slim
GATEWAY_STANDIN ?= localhost/rtserve-gateway-standin:nginx-bookworm

.PHONY: pod-deps
# catatonit is the pause process of `podman pod create` (a recommended package, so named here).
pod-deps: ## Install podman, buildah, debootstrap, runc and catatonit from Debian's packages if one is missing
	@if command -v podman >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 \
	    && command -v catatonit >/dev/null 2>&1; then \
	  echo ">> $$(podman --version)"; \
	else \
	  echo ">> installing podman from Debian's packages (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    podman buildah debootstrap uidmap slirp4netns fuse-overlayfs runc iptables nginx catatonit >/dev/null; \
	fi

.PHONY: image-base
image-base: ## Build LOCAL_BASE (Debian bookworm, Python 3.11) with debootstrap, for where BASE_IMAGE cannot be pulled
	@if $(DOCKER) image inspect $(LOCAL_BASE) >/dev/null 2>&1; then echo ">> $(LOCAL_BASE) is built"; \
	else DOCKER=$(DOCKER) deploy/podman/build-base.sh $(LOCAL_BASE) build/image-base; fi

.PHONY: image
image: $(ARCHIVE) $(WHEELHOUSE_STAMP) ## Build IMG:IMAGE_TAG (default MODEL_VERSION) with that version's archive (DOCKER=podman|docker; reused while its inputs are unchanged)
	@$(require_archive)
	@echo ">> staging the build context in $(IMAGE_CONTEXT)"
	rm -rf $(IMAGE_CONTEXT) && mkdir -p $(IMAGE_CONTEXT)/handler \
	  $(IMAGE_CONTEXT)/model_store $(IMAGE_CONTEXT)/deploy/k8s/base $(IMAGE_CONTEXT)/config \
	  $(IMAGE_CONTEXT)/agent/src/rtserve/agent
	cp agent/MANIFEST.MF $(IMAGE_CONTEXT)/agent/
	cp agent/src/rtserve/agent/*.java $(IMAGE_CONTEXT)/agent/src/rtserve/agent/
	cp Dockerfile deploy/podman/prune_venv.py $(IMAGE_CONTEXT)/
	$(PY) -m deploy.podman.prune_venv --list > $(IMAGE_CONTEXT)/runtime-modules.txt
	cp -rl $(abspath $(WHEELHOUSE)) $(IMAGE_CONTEXT)/wheelhouse 2>/dev/null || cp -r $(WHEELHOUSE) $(IMAGE_CONTEXT)/wheelhouse
	rm -f $(IMAGE_CONTEXT)/wheelhouse/.built
	cp config/* $(IMAGE_CONTEXT)/config/
	cp handler/*.py $(IMAGE_CONTEXT)/handler/
	tar -cf - --exclude=__pycache__ --exclude='*.pyc' rtserve | tar -xf - -C $(IMAGE_CONTEXT)
	cp $(K8S_DIR)/base/config.properties $(IMAGE_CONTEXT)/deploy/k8s/base/
	cp $(MAR) $(IMAGE_CONTEXT)/model_store/
	@base=$$(DOCKER=$(DOCKER) deploy/podman/base-image.sh $(BASE_IMAGE) $(LOCAL_BASE)); \
	inputs=$$($(PY) -m deploy.podman.context_hash $(IMAGE_CONTEXT) \
	  "$$($(DOCKER) image inspect --format '{{.Id}}' $$base)") || exit 1; \
	if [ "$$($(DOCKER) image inspect --format '{{index .Config.Labels "rtserve.inputs"}}' $(IMG):$(IMAGE_TAG) 2>/dev/null)" = "$$inputs" ]; then \
	  echo ">> $(IMG):$(IMAGE_TAG) is up to date (inputs $$inputs)"; exit 0; fi; \
	start=$$(date +%s); \
	echo "$(DOCKER) build --build-arg BASE_IMAGE=$$base ... -t $(IMG):$(IMAGE_TAG) $(IMAGE_CONTEXT)"; \
	mkdir -p $(CACHE_DIR); \
	flock $(IMAGE_LOCK) $(DOCKER) build --build-arg BASE_IMAGE=$$base --build-arg MODEL_NAME=$(MODEL_NAME) \
	  --build-arg MODEL_VERSION=$(MODEL_VERSION) --label rtserve.inputs=$$inputs \
	  -t $(IMG):$(IMAGE_TAG) $(IMAGE_CONTEXT) > $(IMAGE_CONTEXT).log 2>&1 || { tail -n 40 $(IMAGE_CONTEXT).log; exit 1; }; \
	echo ">> built $(IMG):$(IMAGE_TAG) in $$(( $$(date +%s) - start )) s on $$base: $$($(DOCKER) image inspect --format '{{.Size}}' $(IMG):$(IMAGE_TAG) | numfmt --to=si)B (log: $(IMAGE_CONTEXT).log)"


.PHONY: image-gateway
image-gateway: ## Build the gateway stand-in (Debian's nginx) used when the manifest's nginx image cannot be pulled
	@base=$$(DOCKER=$(DOCKER) deploy/podman/base-image.sh $(GATEWAY_BASE) $(LOCAL_BASE)); \
	inputs=$$( { cat deploy/podman/gateway.Dockerfile; $(DOCKER) image inspect --format '{{.Id}}' $$base; } | sha256sum | cut -c1-16); \
	if [ "$$($(DOCKER) image inspect --format '{{index .Config.Labels "rtserve.inputs"}}' $(GATEWAY_STANDIN) 2>/dev/null)" = "$$inputs" ]; then \
	  echo ">> $(GATEWAY_STANDIN) is up to date"; exit 0; fi; \
	mkdir -p build/image-gateway; \
	$(DOCKER) build --build-arg BASE_IMAGE=$$base --label rtserve.inputs=$$inputs -t $(GATEWAY_STANDIN) \
	  -f deploy/podman/gateway.Dockerfile build/image-gateway > build/image-gateway.log 2>&1 || { tail -n 30 build/image-gateway.log; exit 1; }; \
	echo ">> built $(GATEWAY_STANDIN) on $$base"

# The records store's image (deploy/cassandra/Containerfile): one Cassandra node from the jars
# `make cassandra-deps` assembles, Debian's Java 17 and rtserve's code (its entry command), on the
# rtserve image's base; the local overlay's in-cluster store runs it (deploy/k8s/components/cassandra).
CASSANDRA_IMG     ?= registry.example.com/ml/rtserve-cassandra
CASSANDRA_IMAGE    = $(CASSANDRA_IMG):$(CASSANDRA_VERSION)
CASSANDRA_CONTEXT ?= build/image-cassandra

.PHONY: image-cassandra
image-cassandra: cassandra-deps $(WHEELHOUSE_STAMP) | $(STAMP) ## Build the records store's image CASSANDRA_IMG:CASSANDRA_VERSION (Cassandra's jars, Java 17, rtserve's code; reused while its inputs are unchanged)
	@rm -rf $(CASSANDRA_CONTEXT) && mkdir -p $(CASSANDRA_CONTEXT)/wheelhouse
	@cp deploy/cassandra/Containerfile $(CASSANDRA_CONTEXT)/
	@cp -rl $(CASSANDRA_LIBS) $(CASSANDRA_CONTEXT)/libs 2>/dev/null || cp -r $(CASSANDRA_LIBS) $(CASSANDRA_CONTEXT)/libs
	@cp $(WHEELHOUSE)/[Pp][Yy][Yy][Aa][Mm][Ll]-*.whl $(CASSANDRA_CONTEXT)/wheelhouse/
	@tar -cf - --exclude=__pycache__ --exclude='*.pyc' rtserve | tar -xf - -C $(CASSANDRA_CONTEXT)
	@base=$$(DOCKER=$(DOCKER) deploy/podman/base-image.sh $(BASE_IMAGE) $(LOCAL_BASE)); \
	inputs=$$($(PY) -m deploy.podman.context_hash $(CASSANDRA_CONTEXT) \
	  "$$($(DOCKER) image inspect --format '{{.Id}}' $$base)") || exit 1; \
	if [ "$$($(DOCKER) image inspect --format '{{index .Config.Labels "rtserve.inputs"}}' $(CASSANDRA_IMAGE) 2>/dev/null)" = "$$inputs" ]; then \
	  echo ">> $(CASSANDRA_IMAGE) is up to date (inputs $$inputs)"; exit 0; fi; \
	start=$$(date +%s); mkdir -p $(CACHE_DIR); \
	flock $(IMAGE_LOCK) $(DOCKER) build -f $(CASSANDRA_CONTEXT)/Containerfile --build-arg BASE_IMAGE=$$base \
	  --build-arg CASSANDRA_VERSION=$(CASSANDRA_VERSION) --label rtserve.inputs=$$inputs \
	  -t $(CASSANDRA_IMAGE) $(CASSANDRA_CONTEXT) > $(CASSANDRA_CONTEXT).log 2>&1 || { tail -n 40 $(CASSANDRA_CONTEXT).log; exit 1; }; \
	echo ">> built $(CASSANDRA_IMAGE) in $$(( $$(date +%s) - start )) s on $$base: $$($(DOCKER) image inspect --format '{{.Size}}' $(CASSANDRA_IMAGE) | numfmt --to=si)B (log: $(CASSANDRA_CONTEXT).log)"

.PHONY: image-push
image-push: ## Push IMG:MODEL_VERSION to its registry
	$(DOCKER) push $(IMG):$(MODEL_VERSION)

# `make pod` is the production pod on `make cluster`'s node: the local overlay (deploy/k8s/overlays/local),
# rolled out and verified by `make k8s-deploy OVERLAY=local` (which builds and loads the images),
# run by the real kubelet: its probes, preStop hook, restarts and security context are Kubernetes'
# own. podman only builds the images (make image) here.
.PHONY: pod
pod: $(STAMP) ## Run the production pod on the local cluster (started when it is not running): k8s-deploy OVERLAY=POD_OVERLAY (local), then how to call it
	$(if $(CLUSTER_RUNS),,@$(MAKE) --no-print-directory cluster)
	@$(MAKE) --no-print-directory k8s-deploy OVERLAY=$(POD_OVERLAY) MODEL_VERSION=$(POD_VERSION)
	@$(MAKE) --no-print-directory pod-info

.PHONY: pod-info
pod-info: $(STAMP) ## Where and how to call the running pod (the Service's address; the gateway token into POD_DIR/gateway-token)
	@$(PY) -m rtserve k8s pod-info $(POD_CLI_ARGS) --token-file $(POD_DIR)/gateway-token

.PHONY: pod-stop
pod-stop: $(STAMP) ## Remove the pod: delete its Deployment (preStop drains each pod within its grace period), then its namespace
	$(PY) -m rtserve k8s pod-stop $(POD_CLI_ARGS)

.PHONY: pod-status
pod-status: $(STAMP) ## The pod's replicas: phase, ready, version, restarts per container, address
	@$(PY) -m rtserve k8s pod-status $(POD_CLI_ARGS)

.PHONY: pod-rollout
pod-rollout: $(STAMP) ## Under steady traffic through the Service: k8s-deploy 2.0, then k8s-rollback to 1.0 (after make pod; a few minutes)
	$(PY) -m bench.pod_rollout --kubectl "$(POD_KUBECTL)" --namespace $(POD_NAMESPACE) --new $(POD_ROLLOUT_TO)

.PHONY: pod-report
pod-report: $(STAMP) ## Image size and breakdown, a pod's time to ready, memory idle and under load, the sizing sweep (after make pod; about 2 min)
	$(PY) -m bench.pod_report --kubectl "$(POD_KUBECTL)" --namespace $(POD_NAMESPACE) --tag $(POD_VERSION)

##@ Kubernetes (cluster)
OVERLAY         ?= staging
# The kubectl command (options may follow it). Not given, for OVERLAY=local while `make cluster`
# runs: the cluster's own kubectl and kubeconfig (no kubectl need be installed).
# The overlays that run on this machine's cluster (their images loaded into the node, not pulled):
# local, and local-records (local with its records in an in-cluster Cassandra node).
LOCAL_OVERLAYS   = local local-records
LOCAL_OVERLAY    = $(filter $(LOCAL_OVERLAYS),$(OVERLAY))
LOCAL_CLUSTER    = $(and $(LOCAL_OVERLAY),$(CLUSTER_RUNS))
KUBECTL         ?= $(if $(LOCAL_CLUSTER),$(CLUSTER_BIN)/kubectl --kubeconfig $(CLUSTER_KUBECONFIG),kubectl)
NAMESPACE       ?= rtserve-$(OVERLAY)
K8S_APP         ?= rtserve
ROLLOUT_TIMEOUT ?= 15m
K8S_DIR         ?= deploy/k8s
K8S_VERSION     ?= 1.32.0
CHECKOV_VENV    ?= .venv-checkov
K8S_BUILD       ?= build/k8s/$(OVERLAY)

K8S_OVERLAYS   := $(notdir $(wildcard $(K8S_DIR)/overlays/*))
CHECKOV_STAMP  := $(CHECKOV_VENV)/.installed
# The version the overlay pins (its images newTag), used when MODEL_VERSION is not given.
pinned_version  = $(shell sed -n 's/^ *newTag: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' $(K8S_DIR)/overlays/$(1)/kustomization.yaml)
PINNED_VERSION  = $(call pinned_version,$(OVERLAY))
DEPLOY_VERSION  = $(if $(filter file,$(origin MODEL_VERSION)),$(PINNED_VERSION),$(MODEL_VERSION))
# The version `make pod` runs: MODEL_VERSION when given, else the one the local overlay pins.
POD_VERSION     = $(if $(filter file,$(origin MODEL_VERSION)),$(call pinned_version,$(POD_OVERLAY)),$(MODEL_VERSION))
# The pod targets' kubectl: the local cluster's while it runs, else the one on PATH (kind, minikube, k3d).
POD_KUBECTL    ?= $(if $(CLUSTER_RUNS),$(CLUSTER_BIN)/kubectl --kubeconfig $(CLUSTER_KUBECONFIG),kubectl)
POD_CLI_ARGS    = --kubectl "$(POD_KUBECTL)" --namespace $(POD_NAMESPACE) --app $(K8S_APP) --model $(MODEL_NAME)

# The verification Job's kustomization: the overlay's own verify/ when it has one (local's takes
# the images from the node), else the shared one (rtserve.k8s.deploy.Target.verify_dir: the same rule).
VERIFY_DIR     ?= $(or $(patsubst %/kustomization.yaml,%,$(wildcard $(K8S_DIR)/overlays/$(OVERLAY)/verify/kustomization.yaml)),$(K8S_DIR)/verify)
VERIFY_BUILD   ?= $(K8S_BUILD)-verify
VERIFY_TIMEOUT ?= 300
# A stricter p99 bound (ms) for the verification Job than the image's config/gate.yaml (empty: the image's).
VERIFY_MAX_P99_MS ?=
# The rollout's steps are rtserve.k8s.deploy (python -m rtserve k8s deploy|verify).
K8S_ARGS = --overlay $(OVERLAY) --image $(IMG) --version "$(DEPLOY_VERSION)" --namespace $(NAMESPACE) \
  --app $(K8S_APP) --model $(MODEL_NAME) --k8s-dir $(K8S_DIR) --build-dir $(K8S_BUILD) \
  --verify-dir $(VERIFY_DIR) --verify-build-dir $(VERIFY_BUILD) --kubectl "$(KUBECTL)" --rollout-timeout $(ROLLOUT_TIMEOUT) \
  --verify-timeout $(VERIFY_TIMEOUT) $(if $(VERIFY_MAX_P99_MS),--verify-max-p99-ms $(VERIFY_MAX_P99_MS)) \
  --gate-config $(GATE_CONFIG) --state-dir $(K8S_LIVE_DIR) --model-store $(MODEL_STORE) \
  $(if $(FORCE),--force --reason "$$REASON") $(if $(LOCAL_CLUSTER),--local-volumes)

# OVERLAY=local (or local-records) first: on `make cluster`'s node, the image IMG:version built
# when the engine lacks it, the gateway stand-in (its build is skipped when up to date) and, for
# k8s-deploy OVERLAY=local-records, the records store's image (the same), all loaded into the node
# (the verification Job runs the same image);
# elsewhere (kind, minikube, k3d) a reminder to load them. Then the namespace, and the gateway
# token's Secret when it has none (a random token). $(1): more images to build (their targets)
# and $(2) to load.
LOCAL_IMAGE = $(IMG):$(DEPLOY_VERSION)
RECORDS_OVERLAY      = $(filter local-records,$(OVERLAY))
RECORDS_IMAGE_TARGET = $(if $(RECORDS_OVERLAY),image-cassandra)
RECORDS_IMAGE        = $(if $(RECORDS_OVERLAY),$(CASSANDRA_IMAGE))
define k8s_local_images
$(if $(filter podman,$(CLUSTER_ENGINE)),@$(MAKE) --no-print-directory pod-deps)
if [ -f $(MODEL_STORE)/$(MODEL_NAME)_$(DEPLOY_VERSION).mar ] || ! $(CLUSTER_ENGINE) image inspect $(LOCAL_IMAGE) >/dev/null 2>&1; then \
  $(MAKE) --no-print-directory image DOCKER=$(CLUSTER_ENGINE) MODEL_VERSION=$(DEPLOY_VERSION) IMAGE_TAG=$(DEPLOY_VERSION); fi
$(MAKE) --no-print-directory image-gateway $(1) DOCKER=$(CLUSTER_ENGINE)
$(PY) -m rtserve cluster load --run-dir $(CLUSTER_RUN_DIR) --engine $(CLUSTER_ENGINE) $(LOCAL_IMAGE) $(GATEWAY_STANDIN) $(2)
endef
define k8s_local_secret
$(KUBECTL) apply -f $(K8S_DIR)/overlays/$(OVERLAY)/namespace.yaml
$(KUBECTL) -n $(NAMESPACE) get secret rtserve-gateway-tokens >/dev/null 2>&1 || \
  $(KUBECTL) -n $(NAMESPACE) create secret generic rtserve-gateway-tokens \
  --from-literal=tokens="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(32))')"
endef
k8s_local_reminder = @echo ">> no cluster runs from $(CLUSTER_RUN_DIR) (make cluster): the node must hold $(LOCAL_IMAGE) and $(GATEWAY_STANDIN)$(if $(1), (and the records store's $(1))) (kind load docker-image, minikube image load)"

.PHONY: k8s-deploy
k8s-deploy: $(STAMP) ## Apply OVERLAY with image IMG:MODEL_VERSION (default: the overlay's pin), wait, verify (k8s-verify); undo and fail if the verification fails. OVERLAY=local (or local-records): build and load the images (the records store's too) first
	$(if $(LOCAL_OVERLAY),$(if $(CLUSTER_RUNS),$(call k8s_local_images,$(RECORDS_IMAGE_TARGET),$(RECORDS_IMAGE)),$(call k8s_local_reminder,$(RECORDS_IMAGE))))
	$(if $(LOCAL_OVERLAY),$(k8s_local_secret))
	$(PY) -m rtserve k8s deploy $(K8S_ARGS)

.PHONY: k8s-verify
k8s-verify: $(STAMP) ## Run the verification Job (image IMG:MODEL_VERSION) against OVERLAY's Service: golden set + p99; fail with its report
	$(PY) -m rtserve k8s verify $(K8S_ARGS)

.PHONY: k8s-status
k8s-status: ## Wait until OVERLAY's rollout finishes (fails after ROLLOUT_TIMEOUT or the progress deadline)
	$(KUBECTL) -n $(NAMESPACE) rollout status deployment/$(K8S_APP) --timeout=$(ROLLOUT_TIMEOUT)

.PHONY: k8s-history
k8s-history: ## List OVERLAY's rollout revisions with their change cause (model version and image)
	$(KUBECTL) -n $(NAMESPACE) rollout history deployment/$(K8S_APP)

.PHONY: k8s-rollback
k8s-rollback: ## Roll OVERLAY back to the previous revision (or TO_REVISION) and wait for it
	$(KUBECTL) -n $(NAMESPACE) rollout undo deployment/$(K8S_APP)$(if $(TO_REVISION), --to-revision=$(TO_REVISION))
	$(KUBECTL) -n $(NAMESPACE) rollout status deployment/$(K8S_APP) --timeout=$(ROLLOUT_TIMEOUT)

# Shadow and canary in the cluster (docs/kubernetes.md#shadow-and-canary-in-the-cluster): the
# candidate MODEL_VERSION as its own Deployment and Service (deploy/k8s/candidate, an overlay's own
# candidate/ when it has one), the routes in the ConfigMap rtserve-live-routes and written straight
# into each default pod. This machine keeps its copies (routes, the pods' logs, the canary
# watcher's PID file and log, the history) in K8S_LIVE_DIR.
K8S_LIVE_DIR  ?= $(K8S_BUILD)-live
K8S_LIVE_ARGS  = --overlay $(OVERLAY) --image $(IMG) --namespace $(NAMESPACE) --app $(K8S_APP) \
  --model $(MODEL_NAME) --k8s-dir $(K8S_DIR) --build-dir $(K8S_BUILD) --state-dir $(K8S_LIVE_DIR) \
  --kubectl "$(KUBECTL)" --rollout-timeout $(ROLLOUT_TIMEOUT) --gate-config $(GATE_CONFIG) \
  --model-store $(MODEL_STORE)
k8s_live_usage = @test "$(origin MODEL_VERSION)" != file || { echo "usage: make $@ OVERLAY=$(OVERLAY) MODEL_VERSION=2.0 $(1)"; exit 2; }

.PHONY: k8s-shadow
k8s-shadow: $(STAMP) ## Deploy MODEL_VERSION as OVERLAY's candidate and mirror PERCENT (default 100) of the default pods' requests to it (OVERLAY=local: build and load its image first)
	$(call k8s_live_usage,[PERCENT=100])
	$(if $(LOCAL_OVERLAY),$(if $(CLUSTER_RUNS),$(k8s_local_images),$(k8s_local_reminder)))
	$(PY) -m rtserve k8s shadow $(MODEL_VERSION) $(if $(PERCENT),--percent $(PERCENT)) $(K8S_LIVE_ARGS)

.PHONY: k8s-shadow-report
k8s-shadow-report: $(STAMP) ## Read OVERLAY's default pods' live and audit logs: the shadow's agreement, classes, latency, errors, largest disagreements
	$(PY) -m rtserve k8s shadow-report $(GIVEN_VERSION) $(K8S_LIVE_ARGS)

.PHONY: k8s-canary
k8s-canary: $(STAMP) ## MODEL_VERSION (deployed as OVERLAY's candidate) answers PERCENT of requests, sticky per x-rtserve-key; a watcher here aborts it on a breach
	$(call k8s_live_usage,PERCENT=10)
	@test -n "$(PERCENT)" || { echo "usage: make k8s-canary OVERLAY=$(OVERLAY) MODEL_VERSION=2.0 PERCENT=10"; exit 2; }
	$(if $(LOCAL_OVERLAY),$(if $(CLUSTER_RUNS),$(k8s_local_images),$(k8s_local_reminder)))
	$(PY) -m rtserve k8s canary $(MODEL_VERSION) --percent $(PERCENT) $(K8S_LIVE_ARGS)

.PHONY: k8s-live-stop
k8s-live-stop: $(STAMP) ## Stop the canary's watcher, turn OVERLAY's shadow and canary off in every default pod, delete the candidate
	$(PY) -m rtserve k8s live-stop $(K8S_LIVE_ARGS)

.PHONY: k8s-pin
k8s-pin: ## Record MODEL_VERSION as OVERLAY's image tag in its kustomization.yaml (then commit it)
	sed -i 's/^\( *newTag: *\).*$$/\1"$(MODEL_VERSION)"/' $(K8S_DIR)/overlays/$(OVERLAY)/kustomization.yaml
	@grep -n 'newTag' $(K8S_DIR)/overlays/$(OVERLAY)/kustomization.yaml

.PHONY: k8s-render
k8s-render: ## Render every overlay to build/k8s/render/<overlay>.yaml, the verification Job to verify.yaml and the candidate to candidate.yaml (an overlay's own to <overlay>-verify.yaml, <overlay>-candidate.yaml)
	@rm -rf build/k8s/render && mkdir -p build/k8s/render
	@for o in $(K8S_OVERLAYS); do \
	  $(KUBECTL) kustomize $(K8S_DIR)/overlays/$$o > build/k8s/render/$$o.yaml; echo ">> build/k8s/render/$$o.yaml"; \
	  for part in verify candidate; do if [ -f $(K8S_DIR)/overlays/$$o/$$part/kustomization.yaml ]; then \
	    $(KUBECTL) kustomize $(K8S_DIR)/overlays/$$o/$$part > build/k8s/render/$$o-$$part.yaml; echo ">> build/k8s/render/$$o-$$part.yaml"; fi; done; done
	$(KUBECTL) kustomize $(K8S_DIR)/verify > build/k8s/render/verify.yaml; echo ">> build/k8s/render/verify.yaml"
	$(KUBECTL) kustomize $(K8S_DIR)/candidate > build/k8s/render/candidate.yaml; echo ">> build/k8s/render/candidate.yaml"

.PHONY: k8s-deps
k8s-deps: $(CHECKOV_STAMP) ## Install checkov into its own virtualenv, .venv-checkov (its pins clash with the test tools'; kept in CACHE_DIR)

# The virtualenv itself lives in CACHE_DIR, keyed by the pins, and CHECKOV_VENV links to it: a
# fresh clone reuses it (making it took 30 to 100 s of a loaded CI run).
CHECKOV_CACHED := $(CACHE_DIR)/checkov-$(shell sed 's/\#.*//' requirements-checkov.txt | grep . | sha256sum | cut -c1-12)
$(CHECKOV_STAMP): requirements-checkov.txt | $(UV)
	@if [ ! -f $(CHECKOV_CACHED)/.installed ]; then \
	  echo ">> creating $(CHECKOV_CACHED) for checkov (about 30 s, once per machine)"; \
	  rm -rf $(CHECKOV_CACHED) && $(UV) venv --quiet --python $(PYTHON) $(CHECKOV_CACHED) && \
	  VIRTUAL_ENV=$(CHECKOV_CACHED) UV_CACHE_DIR=$(CACHE_DIR)/uv-cache $(UV) pip install --quiet -r requirements-checkov.txt && \
	  touch $(CHECKOV_CACHED)/.installed || exit 1; \
	fi
	rm -rf $(CHECKOV_VENV) && ln -s $(CHECKOV_CACHED) $(CHECKOV_VENV)
	@touch $@

.PHONY: k8s-lint
k8s-lint: k8s-render $(STAMP) $(CHECKOV_STAMP) ## Validate every overlay offline: Kubernetes K8S_VERSION schemas (strict) and checkov
	@out="$$($(BIN)/kubernetes-validate --strict --quiet -k $(K8S_VERSION) build/k8s/render/*.yaml)" || { \
	  echo "$$out"; exit 1; }; \
	if [ -n "$$out" ]; then echo "$$out"; echo "error: a warning (e.g. a missing schema) counts as a failure"; exit 1; fi
	@echo ">> every object is valid for Kubernetes $(K8S_VERSION) (strict schemas)"
	$(CHECKOV_VENV)/bin/checkov -d build/k8s/render --framework kubernetes --skip-download --compact --quiet

##@ Local cluster
# A single-machine Kubernetes cluster on 127.0.0.1, built from the official Go modules at the
# versions deploy/cluster/go.mod and deploy/cluster/etcd/go.mod pin (make cluster-modules writes
# them). The binaries are built once per machine into CACHE_DIR, keyed by those versions and the
# go.sum files, and reused by every clone.
GO                 ?= $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
CLUSTER_MODULE     ?= deploy/cluster
# The version a go.mod requires a module at (inside a require block, or on one `require` line).
go_pin              = $(shell awk '$$1 == "$(2)" {print $$2; exit} $$1 == "require" && $$2 == "$(2)" {print $$3; exit}' $(1) 2>/dev/null)
CLUSTER_KUBERNETES ?= $(call go_pin,$(CLUSTER_MODULE)/go.mod,k8s.io/kubernetes)
CLUSTER_ETCD       ?= $(call go_pin,$(CLUSTER_MODULE)/etcd/go.mod,go.etcd.io/etcd/server/v3)
CLUSTER_SUM        := $(shell cat $(CLUSTER_MODULE)/go.sum $(CLUSTER_MODULE)/etcd/go.sum 2>/dev/null | sha256sum | cut -c1-12)
CLUSTER_BIN        ?= $(CACHE_DIR)/cluster/$(CLUSTER_KUBERNETES)-$(CLUSTER_SUM)/bin
# The builds run at the lowest priority: they take every core for many minutes.
CLUSTER_NICE       ?= 19
CLUSTER_STAMP      := $(CLUSTER_BIN)/.complete
# What CLUSTER_BIN holds once complete.
CLUSTER_PROGRAMS   := kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd
# (in a build's recipe, its directory $$tmp) every program of $(2) there, then marked complete and
# moved to $(1); a build that finished first keeps its place (rename never replaces a full directory).
complete_bin        = for p in $(2); do test -x $$tmp/$$p || { echo "error: $$p was not built"; exit 1; }; done && \
  touch $$tmp/.complete && { rm -rf $(1) && mv -T $$tmp $(1) || rm -rf $$tmp; }
k8s_minor           = $(word 2,$(subst ., ,$(CLUSTER_KUBERNETES)))
# What `kubectl version` and the API server's /version report (hack/lib/version.sh sets the same).
K8S_LDFLAGS         = $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version, \
  -X $(p).gitVersion=$(CLUSTER_KUBERNETES) -X $(p).gitMajor=1 -X $(p).gitMinor=$(k8s_minor) -X $(p).gitTreeState=clean)

# The add-ons, CoreDNS and metrics-server, have a module each under deploy/cluster/addons (their
# k8s.io versions differ from each other and from Kubernetes'), written by make cluster-addon-modules,
# and a cache directory of their own: keyed by their go.mod, go.sum and our CoreDNS main.go, so that
# changing them never rebuilds Kubernetes.
CLUSTER_ADDONS     ?= $(CLUSTER_MODULE)/addons
CLUSTER_COREDNS    ?= $(call go_pin,$(CLUSTER_ADDONS)/coredns/go.mod,github.com/coredns/coredns)
CLUSTER_METRICS_SERVER ?= $(call go_pin,$(CLUSTER_ADDONS)/metrics-server/go.mod,sigs.k8s.io/metrics-server)
CLUSTER_ADDONS_SUM := $(shell cat $(sort $(wildcard $(CLUSTER_ADDONS)/*/go.mod $(CLUSTER_ADDONS)/*/go.sum $(CLUSTER_ADDONS)/*/*.go)) 2>/dev/null | sha256sum | cut -c1-12)
CLUSTER_ADDONS_BIN ?= $(CACHE_DIR)/cluster/addons-$(CLUSTER_ADDONS_SUM)/bin
CLUSTER_ADDONS_STAMP := $(CLUSTER_ADDONS_BIN)/.complete

.PHONY: cluster-modules
cluster-modules: | $(STAMP) ## Regenerate deploy/cluster's go.mod and go.sum files for CLUSTER_KUBERNETES and CLUSTER_ETCD (then commit them)
	$(PY) -m rtserve cluster modules --dir $(CLUSTER_MODULE) --kubernetes $(CLUSTER_KUBERNETES) \
	  --etcd $(CLUSTER_ETCD) --go $(GO)

# The pod sandbox's program (deploy/cluster/pause), keyed by its source.
CLUSTER_PAUSE      ?= $(CACHE_DIR)/cluster/pause-$(shell cat $(CLUSTER_MODULE)/pause/go.mod $(CLUSTER_MODULE)/pause/main.go | sha256sum | cut -c1-12)/pause
# containerd's root: the node's images, kept between starts (an image is imported once).
CLUSTER_CONTAINERD_ROOT ?= $(CACHE_DIR)/cluster/containerd

.PHONY: cluster-deps
cluster-deps: $(CLUSTER_STAMP) $(CLUSTER_ADDONS_STAMP) $(CLUSTER_PAUSE) cluster-node-deps ## Build the Kubernetes binaries, etcd, the add-ons (CoreDNS, metrics-server: CLUSTER_ADDONS_BIN) and the pause program (once per machine); install the node's containerd, runc, CNI plugins and iptables
	@echo ">> cluster binaries ($(CLUSTER_KUBERNETES), etcd $(CLUSTER_ETCD)) in $(CLUSTER_BIN)"
	@echo ">> cluster add-ons (coredns $(CLUSTER_COREDNS), metrics-server $(CLUSTER_METRICS_SERVER)) in $(CLUSTER_ADDONS_BIN)"

.PHONY: cluster-node-deps
cluster-node-deps: ## Install the node's containerd, runc, CNI plugins and iptables from Debian's packages if one is missing
	@if command -v containerd >/dev/null 2>&1 && command -v ctr >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 \
	    && [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] \
	    && command -v iptables-save >/dev/null 2>&1; then \
	  echo ">> node: $$(containerd --version | cut -d' ' -f3), $$(runc --version | head -1)"; \
	else \
	  echo ">> installing containerd, runc, CNI plugins and iptables from Debian's packages (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    containerd runc containernetworking-plugins iptables >/dev/null; \
	fi

$(CLUSTER_PAUSE): $(CLUSTER_MODULE)/pause/main.go $(CLUSTER_MODULE)/pause/go.mod
	mkdir -p $(@D)
	cd $(CLUSTER_MODULE)/pause && GOTOOLCHAIN=local CGO_ENABLED=0 $(GO) build -trimpath -ldflags=-s -o $(abspath $@).tmp .
	mv $@.tmp $@

$(CLUSTER_STAMP):
	@echo ">> building Kubernetes $(CLUSTER_KUBERNETES) and etcd $(CLUSTER_ETCD) into $(CLUSTER_BIN) (cold: 46 min at nice 19 on 2 busy cores, 15.5 min of CPU, 2.3 GB peak)"
	@test -x "$(GO)" || command -v "$(GO)" >/dev/null || { echo "error: no Go toolchain ($(GO)): install Go 1.26 or set GO="; exit 1; }
	@# a directory of this build's own (a second build at once, e.g. a make cluster beside a
	@# make cluster-deps, once deleted the first one's binaries before it marked them complete)
	tmp=$(CLUSTER_BIN).tmp.$$$$ && rm -rf $$tmp && mkdir -p $$tmp && \
	(cd $(CLUSTER_MODULE) && GOTOOLCHAIN=local CGO_ENABLED=0 nice -n $(CLUSTER_NICE) $(GO) build -trimpath \
	  -ldflags '$(strip $(K8S_LDFLAGS))' -o $$tmp/ tool) && \
	(cd $(CLUSTER_MODULE)/etcd && GOTOOLCHAIN=local CGO_ENABLED=0 nice -n $(CLUSTER_NICE) $(GO) build -trimpath \
	  -o $$tmp/etcd go.etcd.io/etcd/server/v3) && \
	$(call complete_bin,$(CLUSTER_BIN),$(CLUSTER_PROGRAMS))

.PHONY: cluster-addon-modules
cluster-addon-modules: | $(STAMP) ## Regenerate deploy/cluster/addons' go.mod and go.sum files for CLUSTER_COREDNS and CLUSTER_METRICS_SERVER (then commit them)
	$(PY) -m rtserve cluster addon-modules --dir $(CLUSTER_ADDONS) --coredns $(CLUSTER_COREDNS) \
	  --metrics-server $(CLUSTER_METRICS_SERVER) --go $(GO)

$(CLUSTER_ADDONS_STAMP):
	@echo ">> building CoreDNS $(CLUSTER_COREDNS) and metrics-server $(CLUSTER_METRICS_SERVER) into $(CLUSTER_ADDONS_BIN) (cold: 7 min at nice 19 on 2 busy cores, 9.2 min of CPU, 1.5 GB peak, module downloads included)"
	@test -x "$(GO)" || command -v "$(GO)" >/dev/null || { echo "error: no Go toolchain ($(GO)): install Go 1.26 or set GO="; exit 1; }
	tmp=$(CLUSTER_ADDONS_BIN).tmp.$$$$ && rm -rf $$tmp && mkdir -p $$tmp && \
	(cd $(CLUSTER_ADDONS)/coredns && GOTOOLCHAIN=local CGO_ENABLED=0 nice -n $(CLUSTER_NICE) $(GO) build -trimpath \
	  -o $$tmp/coredns .) && \
	(cd $(CLUSTER_ADDONS)/metrics-server && GOTOOLCHAIN=local CGO_ENABLED=0 nice -n $(CLUSTER_NICE) $(GO) build -trimpath \
	  -ldflags '-X k8s.io/client-go/pkg/version.gitVersion=$(CLUSTER_METRICS_SERVER)' \
	  -o $$tmp/metrics-server sigs.k8s.io/metrics-server/cmd/metrics-server) && \
	$(call complete_bin,$(CLUSTER_ADDONS_BIN),coredns metrics-server)

CLUSTER_RUN_DIR    ?= $(RUN_DIR)/cluster
# Whether the cluster of CLUSTER_RUN_DIR runs: its API server's PID file names a live process.
CLUSTER_RUNS        = $(shell pid=$$(head -n1 $(CLUSTER_RUN_DIR)/kube-apiserver.pid 2>/dev/null) && \
  [ -n "$$pid" ] && [ -d /proc/$$pid ] && echo yes)
# The engine whose images make cluster-load (and k8s-deploy OVERLAY=local) load into the node.
CLUSTER_ENGINE     ?= podman
IMAGES             ?=
CLUSTER_KUBECONFIG ?= build/cluster/admin.kubeconfig
# Fixed ports, e.g. CLUSTER_PORTS="kube-apiserver=6443" (default: free ones, recorded in the run directory).
CLUSTER_PORTS      ?=

.PHONY: cluster
cluster: cluster-deps | $(STAMP) ## Start the control plane on 127.0.0.1 and a node on this machine (containerd, kubelet, kube-proxy); kubeconfig: CLUSTER_KUBECONFIG
	$(PY) -m rtserve cluster start --bin-dir $(CLUSTER_BIN) --run-dir $(CLUSTER_RUN_DIR) \
	  --containerd-root $(CLUSTER_CONTAINERD_ROOT) --pause $(CLUSTER_PAUSE) --addons-bin-dir $(CLUSTER_ADDONS_BIN) \
	  --kubeconfig $(CLUSTER_KUBECONFIG) $(addprefix --port ,$(CLUSTER_PORTS))

.PHONY: cluster-stop
cluster-stop: ## Stop the cluster `make cluster` started (by its PID files in CLUSTER_RUN_DIR)
	$(PY) -m rtserve cluster stop --run-dir $(CLUSTER_RUN_DIR)

.PHONY: cluster-load
cluster-load: | $(STAMP) ## Load IMAGES built here (e.g. IMAGES="registry.example.com/ml/rtserve:1.0") into the cluster's node, as kind load does; skips those it holds
	@test -n "$(IMAGES)" || { echo 'usage: make cluster-load IMAGES="registry.example.com/ml/rtserve:1.0 ..."'; exit 2; }
	$(PY) -m rtserve cluster load --run-dir $(CLUSTER_RUN_DIR) --engine $(CLUSTER_ENGINE) $(IMAGES)

.PHONY: cluster-status
cluster-status: ## Show whether each component of the cluster in CLUSTER_RUN_DIR runs, its API server and kubeconfig
	$(PY) -m rtserve cluster status --run-dir $(CLUSTER_RUN_DIR)

##@ Streaming (Kafka)
# A single-node Apache Kafka broker (KRaft: broker and controller in one JVM) on 127.0.0.1. No
# distribution tarball: deploy/kafka/pom.xml names org.apache.kafka:kafka_2.13 and Maven copies it
# and its runtime dependencies from Maven Central into CACHE_DIR (~/.m2 is Maven's download cache),
# once per machine, keyed by KAFKA_VERSION and the pom's content.
KAFKA_VERSION    ?= 4.4.0
KAFKA_POM        ?= deploy/kafka/pom.xml
KAFKA_HOME       ?= $(CACHE_DIR)/kafka/$(KAFKA_VERSION)
KAFKA_LIBS        = $(KAFKA_HOME)/libs
KAFKA_STAMP      := $(KAFKA_HOME)/.complete-$(shell sha256sum < $(KAFKA_POM) | cut -c1-12)
MVN              ?= mvn
require_mvn = command -v $(MVN) >/dev/null || { echo ">> installing Maven (apt)"; \
  { apt-get install -y -qq maven >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq maven; }; } \
  || { echo "Maven ($(MVN)) is missing and cannot be installed: install Maven 3 or set MVN="; exit 1; }; }
# $(call maven_libs,HOME,POM,PROPERTY=VERSION,JAR,NICE): Maven (at nice NICE) copies POM's runtime
# dependencies into HOME/libs, through HOME/libs.tmp (its log: HOME/maven.log), checks that JAR
# is among them and drops HOME's old stamps.
define maven_libs
rm -rf $(1)/libs.tmp && mkdir -p $(1)
nice -n $(5) $(MVN) --batch-mode -f $(2) -D$(3) dependency:copy-dependencies -DincludeScope=runtime \
  -DoutputDirectory=$(abspath $(1))/libs.tmp > $(1)/maven.log 2>&1 || \
  { tail -n 40 $(1)/maven.log; echo "error: Maven failed (all of it: $(1)/maven.log)"; exit 1; }
@test -f $(1)/libs.tmp/$(4) || { echo "error: Maven copied no $(4)"; exit 1; }
rm -rf $(1)/libs && mv $(1)/libs.tmp $(1)/libs
rm -f $(1)/.complete-*
endef
# Maven runs at a low priority: it shares the machine with servers and tests.
KAFKA_NICE       ?= 10
KAFKA_RUN_DIR    ?= $(RUN_DIR)/kafka
# Fixed ports, e.g. KAFKA_PORTS="broker=9092 controller=9093" (default: those recorded in
# KAFKA_RUN_DIR by the last start, else free ones).
KAFKA_PORTS      ?=
KAFKA_PARTITIONS ?= 4
KAFKA_HEAP       ?= 512m
# 1: delete KAFKA_RUN_DIR's data (topics, offsets, transactions) before the start.
KAFKA_FRESH      ?= 0

.PHONY: kafka-deps
kafka-deps: $(KAFKA_STAMP) ## Assemble Apache Kafka KAFKA_VERSION's jars from Maven Central into CACHE_DIR (once per machine)
	@echo ">> Kafka $(KAFKA_VERSION): $$(ls $(KAFKA_LIBS) | wc -l) jars in $(KAFKA_LIBS)"

$(KAFKA_STAMP):
	@$(require_mvn)
	@echo ">> assembling Apache Kafka $(KAFKA_VERSION) from Maven Central into $(KAFKA_LIBS) (cold: about 50 s)"
	$(call maven_libs,$(KAFKA_HOME),$(KAFKA_POM),kafka.version=$(KAFKA_VERSION),kafka_2.13-$(KAFKA_VERSION).jar,$(KAFKA_NICE))
	touch $@

.PHONY: kafka
kafka: kafka-deps | $(STAMP) ## Start a single-node Kafka broker on 127.0.0.1 (data and logs in KAFKA_RUN_DIR) with the topics events, predictions, events.dlq
	$(PY) -m rtserve kafka start --libs $(KAFKA_LIBS) --run-dir $(KAFKA_RUN_DIR) --partitions $(KAFKA_PARTITIONS) \
	  --heap $(KAFKA_HEAP)$(addprefix --port ,$(KAFKA_PORTS))$(if $(filter 1,$(KAFKA_FRESH)), --fresh)

.PHONY: kafka-stop
kafka-stop: ## Stop the broker `make kafka` started (by its PID file in KAFKA_RUN_DIR); its data stays
	$(PY) -m rtserve kafka stop --run-dir $(KAFKA_RUN_DIR)

.PHONY: kafka-status
kafka-status: ## Show whether the broker of KAFKA_RUN_DIR runs, its bootstrap address and topics
	$(PY) -m rtserve kafka status --run-dir $(KAFKA_RUN_DIR)

# The stream consumer (python -m rtserve stream run) in the background, against the broker of
# KAFKA_RUN_DIR and the server of RUN_DIR (its key file); STREAM_ARGS: more options of `stream run`
# (e.g. STREAM_ARGS="--group fraud --features 32").
STREAM_DIR  ?= $(RUN_DIR)/stream
STREAM_ARGS ?=

.PHONY: stream
stream: | $(STAMP) ## Start the stream consumer in the background: events -> predictions (dead letters: events.dlq), exactly once, through the running server
	$(PY) -m rtserve stream start --stream-dir $(STREAM_DIR) -- --kafka-run-dir $(KAFKA_RUN_DIR) --run-dir $(RUN_DIR) \
	  --inference $(INFERENCE_URL) --management $(MANAGEMENT_URL) --model $(MODEL_NAME)$(if $(STREAM_ARGS), $(STREAM_ARGS))

.PHONY: stream-stop
stream-stop: ## Stop the stream consumer `make stream` started (it finishes its step and leaves its group)
	$(PY) -m rtserve stream stop --stream-dir $(STREAM_DIR)

##@ Records (Cassandra)
# A single-node Apache Cassandra on 127.0.0.1 keeping the records (docs/records.md). No
# distribution tarball: deploy/cassandra/pom.xml names org.apache.cassandra:cassandra-all and Maven
# copies it and its runtime dependencies from Maven Central into CACHE_DIR, once per machine,
# keyed by CASSANDRA_VERSION and the pom's content.
CASSANDRA_VERSION ?= 5.0.6
CASSANDRA_POM     ?= deploy/cassandra/pom.xml
CASSANDRA_HOME    ?= $(CACHE_DIR)/cassandra/$(CASSANDRA_VERSION)
CASSANDRA_LIBS     = $(CASSANDRA_HOME)/libs
CASSANDRA_STAMP   := $(CASSANDRA_HOME)/.complete-$(shell sha256sum < $(CASSANDRA_POM) | cut -c1-12)
CASSANDRA_RUN_DIR ?= $(RUN_DIR)/cassandra
# The JVM's heap (-Xms and -Xmx); the CQL port (default: the one recorded in CASSANDRA_RUN_DIR by
# the last start, else a free one).
CASSANDRA_HEAP    ?= 512m
CASSANDRA_PORT    ?=
# 1: delete CASSANDRA_RUN_DIR's data (every record) before the start.
CASSANDRA_FRESH   ?= 0
# Maven runs at a low priority: it shares the machine with servers and tests.
CASSANDRA_NICE    ?= 10

.PHONY: cassandra-deps
cassandra-deps: $(CASSANDRA_STAMP) ## Assemble Apache Cassandra CASSANDRA_VERSION's jars from Maven Central into CACHE_DIR (once per machine)
	@echo ">> Cassandra $(CASSANDRA_VERSION): $$(ls $(CASSANDRA_LIBS) | wc -l) jars in $(CASSANDRA_LIBS)"

$(CASSANDRA_STAMP):
	@$(require_mvn)
	@echo ">> assembling Apache Cassandra $(CASSANDRA_VERSION) from Maven Central into $(CASSANDRA_LIBS) (cold: about 30 s)"
	$(call maven_libs,$(CASSANDRA_HOME),$(CASSANDRA_POM),cassandra.version=$(CASSANDRA_VERSION),cassandra-all-$(CASSANDRA_VERSION).jar,$(CASSANDRA_NICE))
	touch $@

.PHONY: cassandra
cassandra: cassandra-deps | $(STAMP) ## Start a single-node Cassandra on 127.0.0.1 (data and logs in CASSANDRA_RUN_DIR) with the records' schema
	$(PY) -m rtserve cassandra start --libs $(CASSANDRA_LIBS) --run-dir $(CASSANDRA_RUN_DIR) --heap $(CASSANDRA_HEAP)$(addprefix --port ,$(CASSANDRA_PORT))$(if $(filter 1,$(CASSANDRA_FRESH)), --fresh)

.PHONY: cassandra-stop
cassandra-stop: ## Stop the node `make cassandra` started (by its PID file in CASSANDRA_RUN_DIR); its data stays
	$(PY) -m rtserve cassandra stop --run-dir $(CASSANDRA_RUN_DIR)

.PHONY: cassandra-status
cassandra-status: ## Show whether the node of CASSANDRA_RUN_DIR runs, its CQL address and memory
	$(PY) -m rtserve cassandra status --run-dir $(CASSANDRA_RUN_DIR)

##@ Test
.PHONY: test
# The cluster tier is the longest (image builds and loads, pods starting, rollouts, preStop
# drains), so by default it runs in a pytest process of its own (TEST_CLUSTER) beside the
# others, its output printed after theirs; the stream and records tiers (TEST_BESIDE: broker and
# node restarts, session timeouts, a JVM each) run in a third pytest once the first of those two
# ends (the cluster tier or the main tier, whichever; the lanes' lengths drift by day), so that
# the 2 cores take two tiers at a time (three at once: CI's timeouts and 5,400 s); with
# PYTEST_ARGS (or TEST_SPLIT=0) one pytest runs with exactly those arguments.
# Every tool a test needs is installed first, or make test stops there saying which: no test is
# skipped for a tool the project can install (nginx: the rehearsal and the gateway; wrk and
# FastAPI: the perf smoke runs and the pod sizing sweep; podman: the images; containerd, runc,
# the CNI plugins: the cluster tier's node; Apache Cassandra's jars: the records tier).
TEST_SPLIT  ?= 1
TEST_CLUSTER ?= tests/cluster
# -raP: the captured output of passed tests too (the figures they print: request counts of each
# rollout, timings, the stream faults' counts), in the tiers' logs that make test prints, and the
# short summary of every outcome but a pass (a bare -rP would drop the failures from it).
TEST_CLUSTER_ARGS ?= -raP
TEST_BESIDE ?= tests/stream tests/records
TEST_BESIDE_ARGS ?= -raP
TEST_SPLIT_ON = $(and $(filter 1,$(TEST_SPLIT)),$(if $(strip $(PYTEST_ARGS)),,split))
# When this make started (for `make test`'s own timing: setup, i.e. what it builds and installs
# first, included).
TEST_T0 := $(if $(filter test,$(MAKECMDGOALS)),$(shell date +%s))
# (split: the wheelhouse first, so that the two processes' `make image` runs never both make it)
test: $(STAMP) $(AGENT_JAR) $(if $(TEST_SPLIT_ON),$(WHEELHOUSE_STAMP)) ## Run the whole test suite (builds what it needs, starts and stops its own servers)
	@$(MAKE) --no-print-directory nginx-deps >/dev/null || \
	  { echo "error: nginx could not be installed (make nginx-deps): the rehearsal and gateway tests need it"; exit 1; }
	@$(MAKE) --no-print-directory bench-deps >/dev/null || \
	  { echo "error: wrk or FastAPI could not be installed (make bench-deps): the perf smoke runs and the pod sizing sweep need them"; exit 1; }
	@$(MAKE) --no-print-directory pod-deps  # the images the cluster tier runs (podman): it fails without
	@$(MAKE) --no-print-directory cluster-node-deps  # the cluster tier's node (-m cluster)
	@$(MAKE) --no-print-directory cassandra-deps >/dev/null || \
	  { echo "error: Apache Cassandra's jars could not be assembled (make cassandra-deps): the records tier needs them"; exit 1; }
	@if [ -z "$(TEST_SPLIT_ON)" ]; then \
	  echo "$(PY) -m pytest $(PYTEST_ARGS)"; exec $(PY) -m pytest $(PYTEST_ARGS); fi; \
	mkdir -p build && start=$$(date +%s); \
	echo ">> $(TEST_CLUSTER) runs in a pytest process of its own beside the rest (its output follows theirs); $(TEST_BESIDE) once the first of the two ends"; \
	$(PY) -m pytest $(TEST_CLUSTER) $(TEST_CLUSTER_ARGS) > build/test-cluster.log 2>&1 & cluster=$$!; \
	{ $(PY) -m pytest $(addprefix --ignore=,$(TEST_CLUSTER) $(TEST_BESIDE)) 2>&1 | tee build/test-main.log; } & main=$$!; \
	trap 'kill $$cluster $$main $$(ps -o pid= --ppid $$main) 2>/dev/null; exit 143' INT TERM; \
	first=; firstrc=0; wait -n -p first $$cluster $$main || firstrc=$$?; \
	echo ">> $$([ "$$first" = "$$cluster" ] && echo "$(TEST_CLUSTER)" || echo "the main tier") ended first: $(TEST_BESIDE) starts (build/test-beside.log)"; \
	other=0; $(PY) -m pytest $(TEST_BESIDE) $(TEST_BESIDE_ARGS) > build/test-beside.log 2>&1 || other=$$?; \
	later=0; wait $$([ "$$first" = "$$cluster" ] && echo $$main || echo $$cluster) || later=$$?; \
	if [ "$$first" = "$$cluster" ]; then rest=$$later; third=$$firstrc; else rest=$$firstrc; third=$$later; fi; \
	echo ">> $(TEST_BESIDE) (build/test-beside.log):"; cat build/test-beside.log; \
	echo ">> $(TEST_CLUSTER) (build/test-cluster.log):"; cat build/test-cluster.log; \
	end=$$(date +%s); \
	echo ">> make test: $$(( end - $(or $(TEST_T0),$$start) )) s (setup $$(( start - $(or $(TEST_T0),$$start) )) s, tests $$(( end - start )) s); exit status: $$rest for the main tier, $$other for $(TEST_BESIDE), $$third for the cluster"; \
	grep -hE '^(FAILED|ERROR) ' build/test-main.log build/test-beside.log build/test-cluster.log | sed 's/^/>> /' || true; \
	[ $$rest -eq 0 ] && [ $$other -eq 0 ] && [ $$third -eq 0 ]

.PHONY: test-rules
test-rules: monitor-deps ## Check the alerting rules and run their unit tests (promtool)
	promtool check rules $(MONITORING_DIR)/rtserve-alerts.yml
	promtool test rules $(MONITORING_DIR)/tests/*.test.yml

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
bench: $(MAR) $(MODEL_DIR)/model.pt2 $(AGENT_JAR) bench-deps bench-handler ## Raw forward, FastAPI (seed and tuned) and rtserve (shipped, greedy off, telemetry off, batchSize 1): about 8 min
	$(PY) -m bench.perf --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

.PHONY: bench-perf-deps
bench-perf-deps: ## Install perf (Debian's linux-perf, if missing): make bench-tail traces the scheduler with it
	@command -v perf >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf; }

.PHONY: bench-tail
bench-tail: $(MAR) $(MODEL_DIR)/model.pt2 $(AGENT_JAR) bench-deps bench-perf-deps ## Where the c=1 tail goes: each lone request matched with the kernel's scheduler trace (about a minute)
	$(PY) -m bench.tail --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

.PHONY: bench-quick
bench-quick: $(MAR) $(MODEL_DIR)/model.pt2 $(AGENT_JAR) bench-deps ## rtserve as shipped vs the tuned FastAPI at c=1, 8, 64 (about 90 s): before/after a request-path change
	$(PY) -m bench.perf --quick --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

.PHONY: bench-handler
# The AOTInductor-compiled program, kept as a file (compiling takes about a minute on 2 cores).
COMPILED := build/compiled/$(MODEL_NAME)_$(MODEL_VERSION).aoti.pt2

$(COMPILED): $(MODEL_DIR)/model.pt2 | $(STAMP)
	@echo ">> compiling $< with AOTInductor (about a minute)"
	$(PY) -c 'import sys; from pathlib import Path; from bench.handler_micro import compile_aoti; \
	  compile_aoti(Path(sys.argv[1]), Path(sys.argv[2]))' $(MODEL_DIR) $@

bench-handler: $(MODEL_DIR)/model.pt2 $(COMPILED) ## Handler time per request in a full batch of 32 and the forward pass: previous eager, exported, AOTInductor
	$(PY) -m bench.handler_micro --model-dir $(MODEL_DIR) --compiled $(COMPILED) --out bench/results/handler_micro.json

.PHONY: bench-rollout
bench-rollout: $(MODEL_STORE)/$(MODEL_NAME)_1.0.mar $(MODEL_STORE)/$(MODEL_NAME)_2.0.mar ## Rollout 1.0 -> 2.0 (golden set, gate) and back under steady load (about 70 s)
	$(PY) -m bench.rollout_load --model-store $(MODEL_STORE)

.PHONY: bench-hostile
bench-hostile: $(MAR) ## Hostile-input corpus over HTTP mixed into valid traffic (3000 bad requests)
	$(PY) -m bench.hostile_input --model-store $(MODEL_STORE) --version $(MODEL_VERSION)

.PHONY: bench-overload
bench-overload: $(MAR) ## A burst of 400 requests against 1 worker and a queue of 8: fast 503s, then normal service
	$(PY) -m bench.overload --model-store $(MODEL_STORE) --version $(MODEL_VERSION) --burst 400 --queue 8 --workers 1

.PHONY: bench-latency-histogram
bench-latency-histogram: $(STAMP) ## Cost of rtserve_request_duration_seconds per request (exporter side, off the request path)
	$(PY) -m bench.request_histogram

.PHONY: bench-explain
bench-explain: $(MAR) ## Time one explanation (in-process and over HTTP on a private TorchServe); about 40 s
	$(PY) -m bench.explain_latency --mar $(MAR)

.PHONY: bench-probe
bench-probe: $(MAR) $(AGENT_JAR) ## Wall and CPU time of the pod's exec probes (probe ready, live) on a warmed server, and their imports (about a minute)
	$(PY) -m bench.probe_cost --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

##@ Reliability
# Worker crash, drain, rolling replacement behind nginx.
REHEARSAL_ARGS ?=

.PHONY: bench-crash
bench-crash: $(MODEL_STORE)/$(MODEL_NAME)_1.0.mar ## SIGKILL a worker under steady load: failed requests, recovery time (about 25 s)
	$(PY) -m bench.worker_crash --model-store $(MODEL_STORE)

.PHONY: bench-drain
bench-drain: $(MODEL_STORE)/$(MODEL_NAME)_1.0.mar ## Stop a server under load: plain SIGTERM vs drain, then SIGTERM (about 40 s)
	$(PY) -m bench.drain --model-store $(MODEL_STORE)

.PHONY: bench-rehearsal
bench-rehearsal: nginx-deps $(MODEL_STORE)/$(MODEL_NAME)_1.0.mar $(MODEL_STORE)/$(MODEL_NAME)_2.0.mar ## Rolling replacement 1.0 -> 2.0 -> 1.0 of 2 replicas behind nginx, under load (about 90 s)
	$(PY) -m bench.rolling_rehearsal --model-store $(MODEL_STORE) $(REHEARSAL_ARGS)

# The stream benchmark's sizes: events waiting for the shipped consumer, seconds the naive one
# reads the same backlog, and the length of each fixed-rate phase.
BENCH_STREAM_EVENTS  ?= 20000
BENCH_STREAM_SECONDS ?= 20
BENCH_STREAM_ARGS    ?=

.PHONY: bench-stream
bench-stream: $(MAR) $(AGENT_JAR) kafka-deps ## Kafka stream consumer vs a naive one on one broker: events/s at saturation, p50/p99 at half of it, exactly once, CPU split (about 4 min)
	$(PY) -m bench.stream --model-store $(MODEL_STORE) --version $(MODEL_VERSION) --kafka-libs $(KAFKA_LIBS) \
	  --events $(BENCH_STREAM_EVENTS) --naive-seconds $(BENCH_STREAM_SECONDS) --seconds $(BENCH_STREAM_SECONDS) $(BENCH_STREAM_ARGS)

.PHONY: bench-records-store
bench-records-store: cassandra-deps | $(STAMP) ## One Cassandra node (CASSANDRA_HEAP): cold start, restart, RSS, records/s through Store.write vs single inserts and through the shipper, CPU per record (about 4 min)
	$(PY) -m bench.records_store --libs $(CASSANDRA_LIBS) --heap $(CASSANDRA_HEAP) $(BENCH_ARGS)

# The soak (bench/soak.py; after make pod POD_OVERLAY=local-records, whose records it checks in
# the store, or make pod): its length in minutes and its rate in requests/s
# (empty: half the capacity it measures first through the Service).
SOAK_MINUTES ?= 60
SOAK_RATE    ?=
SOAK_ARGS    ?=

.PHONY: soak
soak: $(STAMP) ## SOAK_MINUTES (60) through POD_OVERLAY's Service at half its measured capacity (after make pod POD_OVERLAY=local-records): failures, restarts, evictions, memory, disk, records, shipper lag; bench/results/soak.{json,png}
	$(PY) -m bench.soak --kubectl "$(POD_KUBECTL)" --namespace $(POD_NAMESPACE) --minutes $(SOAK_MINUTES)$(if $(SOAK_RATE), --rate $(SOAK_RATE)) $(SOAK_ARGS)

.PHONY: nginx-deps
nginx-deps: ## Install nginx from Debian's packages if it is missing (the rehearsal's load balancer)
	@if command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; then \
	  echo ">> nginx present: $$(PATH=$$PATH:/usr/sbin nginx -v 2>&1)"; \
	else \
	  echo ">> installing nginx from Debian's packages (apt-get)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx; \
	fi

$(MODEL_STORE)/$(MODEL_NAME)_%.mar: FORCE
	$(MAKE) --no-print-directory archive MODEL_VERSION=$*

.PHONY: FORCE
FORCE:

# The names before one naming rule (k8s-* for the cluster, no prefix for the local server, image*
# and pod* for images and pods, <group>-deps for tool installs): each fails and names its
# successor. (`history` now means the local server's; the cluster's is k8s-history.)
RENAMED := deploy:k8s-deploy rollout-status:k8s-status history-versions:history podman:pod-deps \
  checkov-venv:k8s-deps nginx:nginx-deps rehearsal:bench-rehearsal
RENAMED_OLD := $(foreach r,$(RENAMED),$(word 1,$(subst :, ,$(r))))
.PHONY: $(RENAMED_OLD)
$(RENAMED_OLD):
	@echo "make $@ was renamed: use make $(word 2,$(subst :, ,$(filter $@:%,$(RENAMED))))" >&2; exit 2
