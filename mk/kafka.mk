# Streaming: a local Apache Kafka broker and the stream consumer.

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
	@MVN="$(MVN)" scripts/deps maven
	@echo ">> assembling Apache Kafka $(KAFKA_VERSION) from Maven Central into $(KAFKA_LIBS) (cold: about 50 s)"
	MVN="$(MVN)" scripts/maven-libs $(KAFKA_HOME) $(KAFKA_POM) kafka.version=$(KAFKA_VERSION) kafka_2.13-$(KAFKA_VERSION).jar $(KAFKA_NICE)
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
# (e.g. STREAM_ARGS="--group fraud --features 32"); GUARANTEE: exactly-once (transactions) or
# at-least-once (docs/streaming.md: when duplicates appear).
STREAM_DIR  ?= $(RUN_DIR)/stream
STREAM_ARGS ?=
GUARANTEE   ?= exactly-once

.PHONY: stream
stream: | $(STAMP) ## Start the stream consumer in the background: events -> predictions (dead letters: events.dlq), exactly once (GUARANTEE=at-least-once: no transactions), through the running server
	$(PY) -m rtserve stream start --stream-dir $(STREAM_DIR) -- --kafka-run-dir $(KAFKA_RUN_DIR) --run-dir $(RUN_DIR) \
	  --inference $(INFERENCE_URL) --management $(MANAGEMENT_URL) --model $(MODEL_NAME) --guarantee $(GUARANTEE)$(if $(STREAM_ARGS), $(STREAM_ARGS))

.PHONY: stream-stop
stream-stop: ## Stop the stream consumer `make stream` started (it finishes its step and leaves its group)
	$(PY) -m rtserve stream stop --stream-dir $(STREAM_DIR)
