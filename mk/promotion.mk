# Versions on the local server (register, promote, rollback) and its live traffic (shadow, canary).

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
