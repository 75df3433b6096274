# Benchmarks and reliability measurements: one bench module per target.

##@ Benchmarks
BENCH_STAMP := $(VENV)/.bench-installed
BENCH_ARGS  ?=

$(BENCH_STAMP): requirements-bench.txt $(STAMP)
	@echo ">> installing the benchmark-only dependencies (requirements-bench.txt)"
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-bench.txt
	@touch $@

.PHONY: bench-deps
bench-deps: $(BENCH_STAMP) ## Install FastAPI/uvicorn (benchmark only) and the load tool wrk (apt, if missing)
	@scripts/deps wrk

.PHONY: bench
bench: $(MAR) $(MODEL_DIR)/model.pt2 $(AGENT_JAR) bench-deps bench-handler ## Raw forward, FastAPI (seed; tuned with the model eager, exported, direct) and rtserve (shipped, greedy off, telemetry off, batchSize 1): about 12 min
	$(PY) -m bench.perf --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

.PHONY: bench-perf-deps
bench-perf-deps: ## Install perf (Debian's linux-perf, if missing): make bench-tail traces the scheduler with it
	@scripts/deps perf

.PHONY: bench-tail
bench-tail: $(MAR) $(MODEL_DIR)/model.pt2 $(AGENT_JAR) bench-deps bench-perf-deps ## Where the c=1 tail goes: each lone request matched with the kernel's scheduler trace (about a minute)
	$(PY) -m bench.tail --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

.PHONY: bench-quick
bench-quick: $(MAR) $(MODEL_DIR)/model.pt2 $(AGENT_JAR) bench-deps ## rtserve as shipped vs the tuned FastAPI (model eager, exported, direct) at c=1, 8, 64 (about 2.5 min): before/after a request-path change
	$(PY) -m bench.perf --quick --model-store $(MODEL_STORE) --version $(MODEL_VERSION) $(BENCH_ARGS)

.PHONY: bench-kinds
bench-kinds: examples $(AGENT_JAR) bench-deps ## Each example model (regression, image CNN: arrays and PNG, ...) on rtserve vs the tuned FastAPI serving the same program: c=1 p50/p99, c=64 req/s and p99 (about 6 min)
	$(PY) -m bench.kinds --model-store $(MODEL_STORE) --artifacts $(DEMO_ARTIFACTS) $(BENCH_ARGS)

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

# The stream benchmark's sizes: the saturation window (it closes after BENCH_STREAM_EVENTS outputs
# or BENCH_STREAM_WINDOW seconds, whichever comes first), the fixed rate offered in the latency
# phases and the length of each. BENCH_STREAM_ARGS=--profile-broker records the broker with Java
# Flight Recorder over the exactly-once fixed-rate phase.
BENCH_STREAM_EVENTS  ?= 200000
BENCH_STREAM_WINDOW  ?= 20
BENCH_STREAM_RATE    ?= 4000
BENCH_STREAM_SECONDS ?= 20
BENCH_STREAM_ARGS    ?=

.PHONY: bench-stream
bench-stream: $(MAR) $(AGENT_JAR) kafka-deps ## Kafka stream consumer vs transport and a naive one: saturation, p50/p99 at 4,000 events/s per guarantee, targets, CPU split (about 6 min)
	$(PY) -m bench.stream --model-store $(MODEL_STORE) --version $(MODEL_VERSION) --kafka-libs $(KAFKA_LIBS) \
	  --events $(BENCH_STREAM_EVENTS) --window $(BENCH_STREAM_WINDOW) --rate $(BENCH_STREAM_RATE) \
	  --seconds $(BENCH_STREAM_SECONDS) $(BENCH_STREAM_ARGS)

.PHONY: bench-stream-txn
bench-stream-txn: kafka-deps | $(STAMP) ## Back-to-back Kafka transactions: CONCURRENT_TRANSACTIONS refusals and time per transaction for each pause after a commit (about 1 min)
	$(PY) -m bench.stream_txn --kafka-libs $(KAFKA_LIBS)

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
	@scripts/deps nginx
