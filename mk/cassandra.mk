# Records: a local Apache Cassandra node keeping every request's record.

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
	@MVN="$(MVN)" scripts/deps maven
	@echo ">> assembling Apache Cassandra $(CASSANDRA_VERSION) from Maven Central into $(CASSANDRA_LIBS) (cold: about 30 s)"
	MVN="$(MVN)" scripts/maven-libs $(CASSANDRA_HOME) $(CASSANDRA_POM) cassandra.version=$(CASSANDRA_VERSION) cassandra-all-$(CASSANDRA_VERSION).jar $(CASSANDRA_NICE)
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
