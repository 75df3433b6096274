# Test: the tiers (scripts/test runs them) and the alerting rules' tests.

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
	@PY=$(PY) PYTEST_ARGS=$(call sq,$(PYTEST_ARGS)) TEST_SPLIT_ON=$(TEST_SPLIT_ON) TEST_T0=$(TEST_T0) \
	  TEST_CLUSTER=$(call sq,$(TEST_CLUSTER)) TEST_CLUSTER_ARGS=$(call sq,$(TEST_CLUSTER_ARGS)) \
	  TEST_BESIDE=$(call sq,$(TEST_BESIDE)) TEST_BESIDE_ARGS=$(call sq,$(TEST_BESIDE_ARGS)) scripts/test

.PHONY: test-rules
test-rules: monitor-deps ## Check the alerting rules and run their unit tests (promtool)
	promtool check rules $(MONITORING_DIR)/rtserve-alerts.yml
	promtool test rules $(MONITORING_DIR)/tests/*.test.yml

.PHONY: test-lint
test-lint: $(STAMP) ## Check the Python code with ruff and its format (pyproject.toml; make test runs the same in tests/unit/test_lint.py)
	$(PY) -m ruff check . && $(PY) -m ruff format --check .
