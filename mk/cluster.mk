# The local cluster: its binaries built from the official Go modules, start, stop, load images.

##@ Local cluster
# A single-machine Kubernetes cluster on 127.0.0.1, built from the official Go modules at the
# versions deploy/cluster/go.mod and deploy/cluster/etcd/go.mod pin (make cluster-modules writes
# them). The binaries are built once per machine into CACHE_DIR, keyed by those versions and the
# go.sum files, and reused by every clone.
GO                 ?= $(or $(shell command -v go 2>/dev/null),/usr/local/go/bin/go)
CLUSTER_MODULE     ?= deploy/cluster
# The version a go.mod requires a module at (inside a require block, or on one `require` line).
go_pin              = $(shell scripts/cluster pin $(1) $(2))
CLUSTER_KUBERNETES ?= $(call go_pin,$(CLUSTER_MODULE)/go.mod,k8s.io/kubernetes)
CLUSTER_ETCD       ?= $(call go_pin,$(CLUSTER_MODULE)/etcd/go.mod,go.etcd.io/etcd/server/v3)
CLUSTER_SUM        := $(shell cat $(CLUSTER_MODULE)/go.sum $(CLUSTER_MODULE)/etcd/go.sum 2>/dev/null | sha256sum | cut -c1-12)
CLUSTER_BIN        ?= $(CACHE_DIR)/cluster/$(CLUSTER_KUBERNETES)-$(CLUSTER_SUM)/bin
# The builds run at the lowest priority: they take every core for many minutes (scripts/cluster).
CLUSTER_NICE       ?= 19
CLUSTER_STAMP      := $(CLUSTER_BIN)/.complete

# The add-ons, CoreDNS and metrics-server, have a module each under deploy/cluster/addons (their
# k8s.io versions differ from each other and from Kubernetes'), written by make cluster-addon-modules,
# and a cache directory of their own: keyed by their go.mod, go.sum and our CoreDNS main.go, so that
# changing them never rebuilds Kubernetes.
CLUSTER_ADDONS     ?= $(CLUSTER_MODULE)/addons
CLUSTER_COREDNS    ?= $(call go_pin,$(CLUSTER_ADDONS)/coredns/go.mod,github.com/coredns/coredns)
CLUSTER_METRICS_SERVER ?= $(call go_pin,$(CLUSTER_ADDONS)/metrics-server/go.mod,sigs.k8s.io/metrics-server)
CLUSTER_ADDONS_SUM := $(shell cat $(sort $(wildcard $(CLUSTER_ADDONS)/*/go.mod $(CLUSTER_ADDONS)/*/go.sum $(CLUSTER_ADDONS)/*/*.go)) 2>/dev/null | sha256sum | cut -c1-12)
CLUSTER_ADDONS_BIN ?= $(CACHE_DIR)/cluster/addons-$(CLUSTER_ADDONS_SUM)/bin
CLUSTER_ADDONS_STAMP := $(CLUSTER_ADDONS_BIN)/.complete
# The network policy controller, kube-router run with only its firewall (rtserve/cluster/netpol.py says
# why not kube-network-policies), has a module of its own under deploy/cluster/netpol (make
# cluster-netpol-module) and a cache directory keyed by its go.mod and go.sum.
CLUSTER_NETPOL     ?= $(CLUSTER_MODULE)/netpol
CLUSTER_KUBE_ROUTER ?= $(call go_pin,$(CLUSTER_NETPOL)/go.mod,github.com/cloudnativelabs/kube-router/v2)
CLUSTER_NETPOL_SUM := $(shell cat $(CLUSTER_NETPOL)/go.mod $(CLUSTER_NETPOL)/go.sum 2>/dev/null | sha256sum | cut -c1-12)
CLUSTER_NETPOL_BIN ?= $(CACHE_DIR)/cluster/netpol-$(CLUSTER_NETPOL_SUM)/bin
CLUSTER_NETPOL_STAMP := $(CLUSTER_NETPOL_BIN)/.complete
# Custom metrics for autoscaling: Prometheus (only its Kubernetes service discovery) and
# prometheus-adapter, a module each under deploy/cluster/metrics (their k8s.io versions differ),
# written by make cluster-metrics-modules, and a cache directory keyed by their go.mod and go.sum.
# CLUSTER_PROMETHEUS is the module's version: v0.316.0 is Prometheus 3.16.0.
CLUSTER_METRICS_DIR ?= $(CLUSTER_MODULE)/metrics
CLUSTER_PROMETHEUS ?= $(call go_pin,$(CLUSTER_METRICS_DIR)/prometheus/go.mod,github.com/prometheus/prometheus)
CLUSTER_PROMETHEUS_ADAPTER ?= $(call go_pin,$(CLUSTER_METRICS_DIR)/adapter/go.mod,sigs.k8s.io/prometheus-adapter)
CLUSTER_METRICS_SUM := $(shell cat $(foreach m,prometheus adapter,$(CLUSTER_METRICS_DIR)/$(m)/go.mod $(CLUSTER_METRICS_DIR)/$(m)/go.sum) 2>/dev/null | sha256sum | cut -c1-12)
CLUSTER_METRICS_BIN ?= $(CACHE_DIR)/cluster/metrics-$(CLUSTER_METRICS_SUM)/bin
CLUSTER_METRICS_STAMP := $(CLUSTER_METRICS_BIN)/.complete
# What scripts/cluster's builds need of these.
CLUSTER_BUILD_ENV   = GO=$(GO) CLUSTER_NICE=$(CLUSTER_NICE) CLUSTER_MODULE=$(CLUSTER_MODULE) CLUSTER_BIN=$(CLUSTER_BIN) \
  CLUSTER_KUBERNETES=$(CLUSTER_KUBERNETES) CLUSTER_ETCD=$(CLUSTER_ETCD) CLUSTER_ADDONS=$(CLUSTER_ADDONS) \
  CLUSTER_ADDONS_BIN=$(CLUSTER_ADDONS_BIN) CLUSTER_COREDNS=$(CLUSTER_COREDNS) CLUSTER_METRICS_SERVER=$(CLUSTER_METRICS_SERVER) \
  CLUSTER_NETPOL=$(CLUSTER_NETPOL) CLUSTER_NETPOL_BIN=$(CLUSTER_NETPOL_BIN) CLUSTER_KUBE_ROUTER=$(CLUSTER_KUBE_ROUTER) \
  CLUSTER_METRICS_DIR=$(CLUSTER_METRICS_DIR) CLUSTER_METRICS_BIN=$(CLUSTER_METRICS_BIN) \
  CLUSTER_PROMETHEUS=$(CLUSTER_PROMETHEUS) CLUSTER_PROMETHEUS_ADAPTER=$(CLUSTER_PROMETHEUS_ADAPTER)

.PHONY: cluster-modules
cluster-modules: | $(STAMP) ## Regenerate deploy/cluster's go.mod and go.sum files for CLUSTER_KUBERNETES and CLUSTER_ETCD (then commit them)
	$(PY) -m rtserve cluster modules --dir $(CLUSTER_MODULE) --kubernetes $(CLUSTER_KUBERNETES) \
	  --etcd $(CLUSTER_ETCD) --go $(GO)

# The pod sandbox's program (deploy/cluster/pause), keyed by its source.
CLUSTER_PAUSE      ?= $(CACHE_DIR)/cluster/pause-$(shell cat $(CLUSTER_MODULE)/pause/go.mod $(CLUSTER_MODULE)/pause/main.go | sha256sum | cut -c1-12)/pause
# containerd's root: the node's images, kept between starts (an image is imported once).
CLUSTER_CONTAINERD_ROOT ?= $(CACHE_DIR)/cluster/containerd

.PHONY: cluster-deps
cluster-deps: $(CLUSTER_STAMP) $(CLUSTER_ADDONS_STAMP) $(CLUSTER_NETPOL_STAMP) $(CLUSTER_METRICS_STAMP) $(CLUSTER_PAUSE) cluster-node-deps cluster-netpol-deps ## Build the Kubernetes binaries, etcd, the add-ons (CoreDNS, metrics-server: CLUSTER_ADDONS_BIN), the network policy controller (kube-router: CLUSTER_NETPOL_BIN), Prometheus and prometheus-adapter (CLUSTER_METRICS_BIN) and the pause program (once per machine); install the node's packages
	@echo ">> cluster binaries ($(CLUSTER_KUBERNETES), etcd $(CLUSTER_ETCD)) in $(CLUSTER_BIN)"
	@echo ">> cluster add-ons (coredns $(CLUSTER_COREDNS), metrics-server $(CLUSTER_METRICS_SERVER)) in $(CLUSTER_ADDONS_BIN)"
	@echo ">> network policy controller (kube-router $(CLUSTER_KUBE_ROUTER), firewall only) in $(CLUSTER_NETPOL_BIN)"
	@echo ">> custom metrics (prometheus $(CLUSTER_PROMETHEUS), prometheus-adapter $(CLUSTER_PROMETHEUS_ADAPTER)) in $(CLUSTER_METRICS_BIN)"

.PHONY: cluster-node-deps
cluster-node-deps: ## Install the node's containerd, runc, CNI plugins and iptables from Debian's packages if one is missing
	@scripts/deps cluster-node

.PHONY: cluster-netpol-deps
cluster-netpol-deps: ## Install what the network policy controller runs (ipset, iptables, conntrack) from Debian's packages if one is missing
	@scripts/deps network-policy

$(CLUSTER_PAUSE): $(CLUSTER_MODULE)/pause/main.go $(CLUSTER_MODULE)/pause/go.mod
	mkdir -p $(@D)
	cd $(CLUSTER_MODULE)/pause && GOTOOLCHAIN=local CGO_ENABLED=0 $(GO) build -trimpath -ldflags=-s -o $(abspath $@).tmp .
	mv $@.tmp $@

$(CLUSTER_STAMP):
	@$(CLUSTER_BUILD_ENV) scripts/cluster build kubernetes

.PHONY: cluster-addon-modules
cluster-addon-modules: | $(STAMP) ## Regenerate deploy/cluster/addons' go.mod and go.sum files for CLUSTER_COREDNS and CLUSTER_METRICS_SERVER (then commit them)
	$(PY) -m rtserve cluster addon-modules --dir $(CLUSTER_ADDONS) --coredns $(CLUSTER_COREDNS) \
	  --metrics-server $(CLUSTER_METRICS_SERVER) --go $(GO)

$(CLUSTER_ADDONS_STAMP):
	@$(CLUSTER_BUILD_ENV) scripts/cluster build addons

.PHONY: cluster-netpol-module
cluster-netpol-module: | $(STAMP) ## Regenerate deploy/cluster/netpol's go.mod and go.sum for CLUSTER_KUBE_ROUTER (then commit them)
	$(PY) -m rtserve cluster netpol-module --dir $(CLUSTER_NETPOL) --kube-router $(CLUSTER_KUBE_ROUTER) --go $(GO)

$(CLUSTER_NETPOL_STAMP):
	@$(CLUSTER_BUILD_ENV) scripts/cluster build netpol

.PHONY: cluster-metrics-modules
cluster-metrics-modules: | $(STAMP) ## Regenerate deploy/cluster/metrics' go.mod and go.sum files for CLUSTER_PROMETHEUS and CLUSTER_PROMETHEUS_ADAPTER (then commit them)
	$(PY) -m rtserve cluster metrics-modules --dir $(CLUSTER_METRICS_DIR) --prometheus $(CLUSTER_PROMETHEUS) --prometheus-adapter $(CLUSTER_PROMETHEUS_ADAPTER) --go $(GO)

.PHONY: cluster-metrics-deps
cluster-metrics-deps: $(CLUSTER_METRICS_STAMP) ## Build only Prometheus and prometheus-adapter (once per machine; make cluster-deps builds them with the rest)
	@echo ">> custom metrics (prometheus $(CLUSTER_PROMETHEUS), prometheus-adapter $(CLUSTER_PROMETHEUS_ADAPTER)) in $(CLUSTER_METRICS_BIN)"

$(CLUSTER_METRICS_STAMP):
	@$(CLUSTER_BUILD_ENV) scripts/cluster build metrics

CLUSTER_RUN_DIR    ?= $(RUN_DIR)/cluster
# Whether the cluster of CLUSTER_RUN_DIR runs: its API server's PID file names a live process.
CLUSTER_RUNS        = $(shell pid=$$(head -n1 $(CLUSTER_RUN_DIR)/kube-apiserver.pid 2>/dev/null) && \
  [ -n "$$pid" ] && [ -d /proc/$$pid ] && echo yes)
# The engine whose images make cluster-load (and k8s-deploy OVERLAY=local) load into the node.
CLUSTER_ENGINE     ?= podman
IMAGES             ?=
# Where the loads keep the images' layers (skopeo's OCI layouts, one image per repository, a few GB).
CLUSTER_LAYERS     ?= $(CACHE_DIR)/image-layers
CLUSTER_KUBECONFIG ?= build/cluster/admin.kubeconfig
# Fixed ports, e.g. CLUSTER_PORTS="kube-apiserver=6443" (default: free ones, recorded in the run directory).
CLUSTER_PORTS      ?=

.PHONY: cluster
cluster: cluster-deps | $(STAMP) ## Start the control plane on 127.0.0.1 and a node on this machine (containerd, kubelet, kube-proxy, the add-ons, kube-router enforcing NetworkPolicies); kubeconfig: CLUSTER_KUBECONFIG
	$(PY) -m rtserve cluster start --bin-dir $(CLUSTER_BIN) --run-dir $(CLUSTER_RUN_DIR) \
	  --containerd-root $(CLUSTER_CONTAINERD_ROOT) --pause $(CLUSTER_PAUSE) --addons-bin-dir $(CLUSTER_ADDONS_BIN) \
	  --netpol-bin-dir $(CLUSTER_NETPOL_BIN) --metrics-bin-dir $(CLUSTER_METRICS_BIN) \
	  --kubeconfig $(CLUSTER_KUBECONFIG) $(addprefix --port ,$(CLUSTER_PORTS))

.PHONY: cluster-stop
cluster-stop: ## Stop the cluster `make cluster` started (by its PID files in CLUSTER_RUN_DIR)
	$(PY) -m rtserve cluster stop --run-dir $(CLUSTER_RUN_DIR)

.PHONY: cluster-load
cluster-load: | $(STAMP) ## Load IMAGES built here (e.g. IMAGES="registry.example.com/ml/rtserve:1.0") into the cluster's node, as kind load does; skips those it holds
	@test -n "$(IMAGES)" || { echo 'usage: make cluster-load IMAGES="registry.example.com/ml/rtserve:1.0 ..."'; exit 2; }
	$(PY) -m rtserve cluster load --run-dir $(CLUSTER_RUN_DIR) --engine $(CLUSTER_ENGINE) --layers $(CLUSTER_LAYERS) $(IMAGES)

.PHONY: cluster-status
cluster-status: ## Show whether each component of the cluster in CLUSTER_RUN_DIR runs, its API server and kubeconfig
	$(PY) -m rtserve cluster status --run-dir $(CLUSTER_RUN_DIR)
