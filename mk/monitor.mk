# Monitoring: Prometheus and Alertmanager on loopback beside the local server.

##@ Monitoring
# Prometheus and Alertmanager on loopback (docs/monitoring.md).
PROMETHEUS_PORT   ?= 9090
ALERTMANAGER_PORT ?= 9093
ALERT_WEBHOOK     ?=
MONITORING_DIR    ?= deploy/monitoring

.PHONY: monitor-deps
monitor-deps: ## Install Prometheus, Alertmanager and promtool from Debian's packages if missing
	@scripts/deps monitor

.PHONY: monitor
monitor: monitor-deps $(STAMP) ## Start Prometheus (127.0.0.1:PROMETHEUS_PORT) and Alertmanager scraping the server `make serve` runs
	$(PY) -m rtserve monitor start --run-dir $(RUN_DIR) --prometheus-port $(PROMETHEUS_PORT) \
	  --alertmanager-port $(ALERTMANAGER_PORT) $(if $(ALERT_WEBHOOK),--webhook $(ALERT_WEBHOOK))

.PHONY: monitor-stop
monitor-stop: ## Stop the Prometheus and Alertmanager `make monitor` started (by their PID files)
	$(PY) -m rtserve monitor stop --run-dir $(RUN_DIR)
