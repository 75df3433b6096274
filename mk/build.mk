# Build: the virtualenv from cached wheels, the demo and example models, archives, the agent, the wheelhouse.

UV_VERSION      ?= 0.13.8
UV_HOME          = $(CACHE_DIR)/uv-$(UV_VERSION)
UV               = $(UV_HOME)/bin/uv
PIP_EXTRA_INDEX ?=
WHEELS_DIR      ?= $(CACHE_DIR)/wheels/$(if $(PIP_EXTRA_INDEX),index-$(call key,$(PIP_EXTRA_INDEX)),pypi)
# (keyed by the requirement lines, not the comments)
WHEELS_STAMP    := $(WHEELS_DIR)/.complete-$(shell sed 's/\#.*//' requirements.txt requirements-dev.txt | grep . | sha256sum | cut -c1-16)
# What scripts/venv needs of these (the virtualenvs and wheels).
VENV_ENV         = UV=$(UV) UV_HOME=$(UV_HOME) PYTHON=$(PYTHON) CACHE_DIR=$(CACHE_DIR) WHEELS_DIR=$(WHEELS_DIR) \
  PIP_EXTRA_INDEX=$(call sq,$(PIP_EXTRA_INDEX)) BIN=$(BIN)

##@ Build
.PHONY: venv
venv: $(STAMP) ## Create .venv and install the pinned dependencies

$(STAMP): requirements.txt requirements-dev.txt | $(WHEELS_STAMP) $(UV)
	@$(VENV_ENV) scripts/venv project $(VENV) $(WHEELS_DIR)
	@touch $@

# Wheels of every pinned requirement, downloaded (or built) once per machine into the user's cache
# and reused by every clone: a wheel's file name carries its version, and the stamp is keyed by
# the requirements files' content (not their dates, which a fresh clone renews). The image installs
# the same wheels (WHEELHOUSE). PIP_EXTRA_INDEX names an extra package index with wheels of its own
# (PyTorch's CPU-only torch, no CUDA libraries: PIP_EXTRA_INDEX=https://download.pytorch.org/whl/cpu).
$(WHEELS_STAMP): | $(UV)
	@$(VENV_ENV) scripts/venv wheels $(WHEELS_DIR)
	@touch $@

# uv (from PyPI, pinned) makes virtualenvs from the cached wheels: each wheel is unpacked once into
# its cache and linked into every clone's .venv (a fresh clone's venv in under a minute).
$(UV):
	@echo ">> installing uv $(UV_VERSION) into $(UV_HOME)"
	rm -rf $(UV_HOME) && $(PYTHON) -m venv $(UV_HOME)
	$(UV_HOME)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

.PHONY: train
train: $(MODEL_DIR)/model.pt2 ## Train the demo MODEL_VERSION and export it (deterministic; prints held-out accuracy)

# The example models, on data installed packages ship (scikit-learn's, palmerpenguins', Faker's):
# examples/breast_cancer.py (a classifier, the default), examples/diabetes.py (a regression),
# examples/digits.py (an image classifier, a CNN), examples/penguins.py (measurements and ids into an
# embedding bag), examples/penguin_heads.py (the same inputs, three outputs: species, body mass and an
# embedding) and examples/names.py (a sequence of characters: a surname's language); EXAMPLE_NAME
# picks one.
EXAMPLE_NAME    ?= breast-cancer
EXAMPLE_MODULE   = examples.$(subst -,_,$(EXAMPLE_NAME))
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

$(EXAMPLE_DIR)/model.pt2 $(EXAMPLE_DIR)/meta.json &: $(STAMP) examples/$(subst -,_,$(EXAMPLE_NAME)).py $(PACKAGE_SRC)
	@echo ">> training and packaging the example model into $(EXAMPLE_DIR)"
	$(PY) -m rtserve model export $(EXAMPLE_MODULE):packaging --version $(EXAMPLE_VERSION) \
	  --out $(EXAMPLE_DIR) --model-config $(MODEL_CONFIG)

.PHONY: example
example: $(EXAMPLE_DIR)/model.pt2 ## Train, package and archive an example model (EXAMPLE_NAME=breast-cancer, diabetes, digits, penguins, penguin-heads or names: model_store/<name>_1.0.mar)
	$(MAKE) --no-print-directory archive MODEL_NAME=$(EXAMPLE_NAME) MODEL_VERSION=$(EXAMPLE_VERSION) ARTIFACTS=$(EXAMPLE_DIR)

# The examples make bench-kinds and make gpu-check cover: bench/example_models.py lists them.
.PHONY: examples
examples: $(STAMP) ## make example for every example of bench/example_models.py in the checkout (make bench-kinds, make gpu-check)
	$(PY) -m bench.example_models --build --artifacts $(DEMO_ARTIFACTS) --model-store $(MODEL_STORE)

# On a machine with a CUDA GPU; elsewhere it says none was found and fails (exit status 2).
GPU_CHECK_ARGS ?=

.PHONY: gpu-check
gpu-check: $(STAMP) ## On a CUDA GPU: the GPU tests, and each example's forward pass at batch 1 and 64 on the GPU vs the CPU
	PYTHON=$(PY) scripts/gpu-check --build --artifacts $(DEMO_ARTIFACTS) --model-store $(MODEL_STORE) $(GPU_CHECK_ARGS)

.PHONY: archive
archive: $(MAR) ## Pack ARTIFACTS (default: the demo) into model_store/$(MODEL_NAME)_$(MODEL_VERSION).mar

$(MAR): $(MODEL_DIR)/model.pt2 $(MODEL_DIR)/meta.json $(HANDLER_SRC) $(MODEL_CONFIG) | $(STAMP)
	@echo ">> checking $(MODEL_DIR) (the handler's safe loader, then its golden set)"
	$(PY) -m rtserve model check $(MODEL_DIR) --version $(MODEL_VERSION)
	STAGE=$(STAGE) ARCHIVER=$(BIN)/torch-model-archiver scripts/archive $(MODEL_NAME) $(MODEL_VERSION) \
	  $(MODEL_DIR) $(MODEL_CONFIG) $@

.PHONY: agent
agent: $(AGENT_JAR) ## Build the frontend's Java agent: greedy batching, OIP model routes, live routes (build/agent/rtserve-agent.jar)

$(AGENT_JAR): $(AGENT_SRC)
	scripts/agent $@ $(filter %.java,$^)

# The wheels the image installs (requirements.txt's, with their dependencies), linked from WHEELS_DIR.
WHEELHOUSE    ?= $(CACHE_DIR)/wheelhouse/$(notdir $(WHEELS_DIR))-$(shell sed 's/\#.*//' requirements.txt | grep . | sha256sum | cut -c1-16)
WHEELHOUSE_STAMP := $(WHEELHOUSE)/.built

.PHONY: wheelhouse
wheelhouse: $(WHEELHOUSE_STAMP) ## The wheels of requirements.txt the image installs (in CACHE_DIR, keyed by its content)

$(WHEELHOUSE_STAMP): | $(STAMP)
	@$(VENV_ENV) scripts/venv wheelhouse $(WHEELHOUSE)

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

$(MODEL_STORE)/$(MODEL_NAME)_%.mar: FORCE
	$(MAKE) --no-print-directory archive MODEL_VERSION=$*

.PHONY: FORCE
FORCE:
