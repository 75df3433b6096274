# Images (rtserve, the records store, the stream's broker, the gateway stand-in) and the pod on the local cluster.

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
# The dependencies image the version's image is built on (deploy/podman/deps.Dockerfile: Java 17,
# tini, the pruned virtualenv), tagged DEPS_IMG:<hash of its inputs> and built only when no image
# has that tag; its context (the wheelhouse, hard-linked) beside the version's.
DEPS_IMG      ?= localhost/rtserve-deps
DEPS_CONTEXT  ?= $(IMAGE_CONTEXT)-deps
# One image build at a time on this machine (clones and test processes alike): the next one
# takes the layers or the image the first made (the dependencies image and its 4 GB virtualenv)
# instead of making its own copies at the same time (two at once filled the disk once).
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
# What scripts/image needs of these, for each of its images.
IMAGE_ENV = DOCKER="$(DOCKER)" PY=$(PY) BASE_IMAGE=$(BASE_IMAGE) LOCAL_BASE=$(LOCAL_BASE) CACHE_DIR=$(CACHE_DIR) \
  IMAGE_LOCK=$(IMAGE_LOCK) WHEELHOUSE=$(abspath $(WHEELHOUSE))

.PHONY: pod-deps
pod-deps: ## Install podman, buildah, skopeo, debootstrap, runc and catatonit from Debian's packages if one is missing
	@scripts/deps pod

.PHONY: image-base
image-base: ## Build LOCAL_BASE (Debian bookworm, Python 3.11) with debootstrap, for where BASE_IMAGE cannot be pulled
	@if $(DOCKER) image inspect $(LOCAL_BASE) >/dev/null 2>&1; then echo ">> $(LOCAL_BASE) is built"; \
	else DOCKER=$(DOCKER) deploy/podman/build-base.sh $(LOCAL_BASE) build/image-base; fi

.PHONY: image
image: $(ARCHIVE) $(WHEELHOUSE_STAMP) ## Build IMG:IMAGE_TAG (default MODEL_VERSION) with that version's archive (DOCKER=podman|docker; reused while its inputs are unchanged)
	@$(require_archive)
	@$(IMAGE_ENV) IMG=$(IMG) IMAGE_TAG=$(IMAGE_TAG) IMAGE_CONTEXT=$(IMAGE_CONTEXT) MAR=$(MAR) \
	  DEPS_IMG=$(DEPS_IMG) DEPS_CONTEXT=$(DEPS_CONTEXT) \
	  MODEL_NAME=$(MODEL_NAME) MODEL_VERSION=$(MODEL_VERSION) K8S_DIR=$(K8S_DIR) scripts/image rtserve


.PHONY: image-gateway
image-gateway: ## Build the gateway stand-in (Debian's nginx) used when the manifest's nginx image cannot be pulled
	@$(IMAGE_ENV) GATEWAY_BASE=$(GATEWAY_BASE) GATEWAY_STANDIN=$(GATEWAY_STANDIN) scripts/image gateway

# The records store's image (deploy/cassandra/Containerfile): one Cassandra node from the jars
# `make cassandra-deps` assembles, Debian's Java 17 and rtserve's code (its entry command), on the
# rtserve image's base; the local overlay's in-cluster store runs it (deploy/k8s/components/cassandra).
CASSANDRA_IMG     ?= registry.example.com/ml/rtserve-cassandra
CASSANDRA_IMAGE    = $(CASSANDRA_IMG):$(CASSANDRA_VERSION)
CASSANDRA_CONTEXT ?= build/image-cassandra

.PHONY: image-cassandra
image-cassandra: cassandra-deps $(WHEELHOUSE_STAMP) | $(STAMP) ## Build the records store's image CASSANDRA_IMG:CASSANDRA_VERSION (Cassandra's jars, Java 17, rtserve's code; reused while its inputs are unchanged)
	@$(IMAGE_ENV) CASSANDRA_CONTEXT=$(CASSANDRA_CONTEXT) CASSANDRA_LIBS=$(CASSANDRA_LIBS) \
	  CASSANDRA_IMAGE=$(CASSANDRA_IMAGE) CASSANDRA_VERSION=$(CASSANDRA_VERSION) scripts/image cassandra

# The stream's broker image (deploy/kafka/Containerfile): one Kafka node from the jars `make
# kafka-deps` assembles, Debian's Java 17 and rtserve's code (its entry command is make kafka's start
# in the foreground), on the rtserve image's base; the local-stream overlay's in-cluster broker runs
# it (deploy/k8s/components/kafka).
KAFKA_IMG     ?= registry.example.com/ml/rtserve-kafka
KAFKA_IMAGE    = $(KAFKA_IMG):$(KAFKA_VERSION)
KAFKA_CONTEXT ?= build/image-kafka

.PHONY: image-kafka
image-kafka: kafka-deps $(WHEELHOUSE_STAMP) | $(STAMP) ## Build the stream's broker image KAFKA_IMG:KAFKA_VERSION (Kafka's jars, Java 17, rtserve's code; reused while its inputs are unchanged)
	@$(IMAGE_ENV) KAFKA_CONTEXT=$(KAFKA_CONTEXT) KAFKA_LIBS=$(KAFKA_LIBS) \
	  KAFKA_IMAGE=$(KAFKA_IMAGE) KAFKA_VERSION=$(KAFKA_VERSION) scripts/image kafka

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
