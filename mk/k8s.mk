# Kubernetes: deploy, verify, roll back, shadow and canary an overlay on a cluster; render and lint them.

##@ Kubernetes (cluster)
OVERLAY         ?= staging
# The kubectl command (options may follow it). Not given, for OVERLAY=local while `make cluster`
# runs: the cluster's own kubectl and kubeconfig (no kubectl need be installed).
# The overlays that run on this machine's cluster (their images loaded into the node, not pulled):
# local, local-records (local with its records in an in-cluster Cassandra node) and local-stream
# (local with the stream consumer and an in-cluster Kafka broker).
LOCAL_OVERLAYS   = local local-records local-stream
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

CHECKOV_STAMP  := $(CHECKOV_VENV)/.installed
# The version the overlay pins (its images newTag), used when MODEL_VERSION is not given.
pinned_version  = $(shell K8S_DIR=$(K8S_DIR) scripts/k8s pin $(1))
PINNED_VERSION  = $(call pinned_version,$(OVERLAY))
DEPLOY_VERSION  = $(if $(filter file,$(origin MODEL_VERSION)),$(PINNED_VERSION),$(MODEL_VERSION))
# The version `make pod` runs: MODEL_VERSION when given, else the one the local overlay pins.
POD_VERSION     = $(if $(filter file,$(origin MODEL_VERSION)),$(call pinned_version,$(POD_OVERLAY)),$(MODEL_VERSION))
# The pod targets' kubectl: the local cluster's while it runs, else the one on PATH (kind, minikube, k3d).
POD_KUBECTL    ?= $(if $(CLUSTER_RUNS),$(CLUSTER_BIN)/kubectl --kubeconfig $(CLUSTER_KUBECONFIG),kubectl)
POD_CLI_ARGS    = --kubectl "$(POD_KUBECTL)" --namespace $(POD_NAMESPACE) --app $(K8S_APP) --model $(MODEL_NAME)

# The verification Job's kustomization: not given, rtserve.k8s.deploy.Target.verify_dir decides
# (the overlay's own verify/ when it has one, else the shared one).
VERIFY_DIR     ?=
VERIFY_BUILD   ?= $(K8S_BUILD)-verify
VERIFY_TIMEOUT ?= 300
# A stricter p99 bound (ms) for the verification Job than the image's config/gate.yaml (empty: the image's).
VERIFY_MAX_P99_MS ?=
# The rollout's steps are rtserve.k8s.deploy (python -m rtserve k8s deploy|verify).
K8S_ARGS = --overlay $(OVERLAY) --image $(IMG) --version "$(DEPLOY_VERSION)" --namespace $(NAMESPACE) \
  --app $(K8S_APP) --model $(MODEL_NAME) --k8s-dir $(K8S_DIR) --build-dir $(K8S_BUILD) \
  $(if $(VERIFY_DIR),--verify-dir $(VERIFY_DIR)) --verify-build-dir $(VERIFY_BUILD) --kubectl "$(KUBECTL)" --rollout-timeout $(ROLLOUT_TIMEOUT) \
  --verify-timeout $(VERIFY_TIMEOUT) $(if $(VERIFY_MAX_P99_MS),--verify-max-p99-ms $(VERIFY_MAX_P99_MS)) \
  --gate-config $(GATE_CONFIG) --state-dir $(K8S_LIVE_DIR) --model-store $(MODEL_STORE) \
  $(if $(FORCE),--force --reason "$$REASON") $(if $(LOCAL_CLUSTER),--local-volumes)

# OVERLAY=local (or local-records, local-stream) first: on `make cluster`'s node, the image
# IMG:version built when the engine lacks it, the gateway stand-in (its build is skipped when up to
# date) and, for k8s-deploy OVERLAY=local-records, the records store's image (OVERLAY=local-stream:
# the stream's broker's; the same), all loaded into the node (the verification Job runs the same image);
# elsewhere (kind, minikube, k3d) a reminder to load them. Then the namespace, and the gateway
# token's Secret when it has none (a random token). $(1): more images to build (their targets)
# and $(2) to load.
LOCAL_IMAGE = $(IMG):$(DEPLOY_VERSION)
RECORDS_OVERLAY      = $(filter local-records,$(OVERLAY))
STREAM_OVERLAY       = $(filter local-stream,$(OVERLAY))
# The overlay's own in-cluster store or broker: its image's target, the image, and what it is.
OVERLAY_IMAGE_TARGET = $(if $(RECORDS_OVERLAY),image-cassandra)$(if $(STREAM_OVERLAY),image-kafka)
OVERLAY_IMAGE        = $(if $(RECORDS_OVERLAY),$(CASSANDRA_IMAGE))$(if $(STREAM_OVERLAY),$(KAFKA_IMAGE))
OVERLAY_IMAGE_WHAT   = $(if $(RECORDS_OVERLAY),the records store's)$(if $(STREAM_OVERLAY),the stream's broker's)
define k8s_local_images
$(if $(filter podman,$(CLUSTER_ENGINE)),@$(MAKE) --no-print-directory pod-deps)
if [ -f $(MODEL_STORE)/$(MODEL_NAME)_$(DEPLOY_VERSION).mar ] || ! $(CLUSTER_ENGINE) image inspect $(LOCAL_IMAGE) >/dev/null 2>&1; then \
  $(MAKE) --no-print-directory image DOCKER=$(CLUSTER_ENGINE) MODEL_VERSION=$(DEPLOY_VERSION) IMAGE_TAG=$(DEPLOY_VERSION); fi
$(MAKE) --no-print-directory image-gateway $(1) DOCKER=$(CLUSTER_ENGINE)
$(PY) -m rtserve cluster load --run-dir $(CLUSTER_RUN_DIR) --engine $(CLUSTER_ENGINE) --layers $(CLUSTER_LAYERS) $(LOCAL_IMAGE) $(GATEWAY_STANDIN) $(2)
endef
define k8s_local_secret
$(KUBECTL) apply -f $(K8S_DIR)/overlays/$(OVERLAY)/namespace.yaml
$(KUBECTL) -n $(NAMESPACE) get secret rtserve-gateway-tokens >/dev/null 2>&1 || \
  $(KUBECTL) -n $(NAMESPACE) create secret generic rtserve-gateway-tokens \
  --from-literal=tokens="$$($(PY) -c 'import secrets; print(secrets.token_urlsafe(32))')"
endef
k8s_local_reminder = @echo ">> no cluster runs from $(CLUSTER_RUN_DIR) (make cluster): the node must hold $(LOCAL_IMAGE) and $(GATEWAY_STANDIN)$(if $(1), (and $(OVERLAY_IMAGE_WHAT) $(1))) (kind load docker-image, minikube image load)"

.PHONY: k8s-deploy
k8s-deploy: $(STAMP) ## Apply OVERLAY with image IMG:MODEL_VERSION (default: the overlay's pin), wait, verify (k8s-verify); undo and fail if the verification fails. OVERLAY=local (or local-records, local-stream): build and load the images (the records store's, the broker's too) first
	$(if $(LOCAL_OVERLAY),$(if $(CLUSTER_RUNS),$(call k8s_local_images,$(OVERLAY_IMAGE_TARGET),$(OVERLAY_IMAGE)),$(call k8s_local_reminder,$(OVERLAY_IMAGE))))
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
	K8S_DIR=$(K8S_DIR) scripts/k8s pin $(OVERLAY) $(MODEL_VERSION)

.PHONY: k8s-render
k8s-render: ## Render every overlay to build/k8s/render/<overlay>.yaml, the verification Job to verify.yaml and the candidate to candidate.yaml (an overlay's own to <overlay>-verify.yaml, <overlay>-candidate.yaml)
	KUBECTL=$(call sq,$(KUBECTL)) K8S_DIR=$(K8S_DIR) scripts/k8s render

.PHONY: k8s-deps
k8s-deps: $(CHECKOV_STAMP) ## Install checkov into its own virtualenv, .venv-checkov (its pins clash with the test tools'; kept in CACHE_DIR)

# The virtualenv itself lives in CACHE_DIR, keyed by the pins, and CHECKOV_VENV links to it: a
# fresh clone reuses it (making it took 30 to 100 s of a loaded CI run).
CHECKOV_CACHED := $(CACHE_DIR)/checkov-$(shell sed 's/\#.*//' requirements-checkov.txt | grep . | sha256sum | cut -c1-12)
$(CHECKOV_STAMP): requirements-checkov.txt | $(UV)
	@$(VENV_ENV) scripts/venv checkov $(CHECKOV_CACHED) $(CHECKOV_VENV)
	@touch $@

.PHONY: k8s-lint
k8s-lint: k8s-render $(STAMP) $(CHECKOV_STAMP) ## Validate every overlay offline: Kubernetes K8S_VERSION schemas (strict) and checkov
	BIN=$(BIN) K8S_VERSION=$(K8S_VERSION) CHECKOV_VENV=$(CHECKOV_VENV) scripts/k8s lint
