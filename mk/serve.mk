# Run: one local TorchServe (make serve), its predictions, explanations, drain and stop.

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
