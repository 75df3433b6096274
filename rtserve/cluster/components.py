"""Pure builders of the cluster's components: a :class:`Layout` in, each one's argv, files and ready URL out.

Nothing here starts a process (:mod:`rtserve.cluster.runtime` does).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rtserve.cluster import addons, netpol, node
from rtserve.cluster.pki import FRONT_PROXY_CLIENT
from rtserve.settings import PACKAGE_HOME

HOST = "127.0.0.1"
#: prometheus-adapter's rules: the one file users give their own adapter too.
ADAPTER_RULES = PACKAGE_HOME / "deploy" / "monitoring" / "prometheus-adapter.yaml"
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"
#: The components, in start order (stop runs in reverse): the control plane, then the node.
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
NODE = ("containerd", "kubelet", "kube-proxy")
ADDONS = ("coredns", "metrics-server")
#: The custom metrics the autoscaler reads: Prometheus scraping the pods, prometheus-adapter serving them.
CUSTOM_METRICS = ("prometheus", "prometheus-adapter")
#: The network policy controller (kube-router's firewall), started once the add-ons run.
NETWORK_POLICY = ("kube-router",)
NAMES = CONTROL_PLANE + NODE + ADDONS + CUSTOM_METRICS + NETWORK_POLICY
PORT_NAMES = (
    "etcd",
    "etcd-peer",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kubelet-healthz",
    "kube-proxy-healthz",
    "kube-proxy-metrics",
    "coredns-health",
    "coredns-ready",
    "metrics-server",
    "prometheus",
    "prometheus-adapter",
    "kube-router-health",
)


@dataclass(frozen=True)
class Layout:
    """Where everything of one cluster lives, and its ports."""

    run_dir: Path
    bin_dir: Path
    kubeconfig: Path
    ports: dict[str, int]
    #: containerd's root (the node's images), kept between starts.
    containerd_root: Path = Path("/var/lib/rtserve-cluster/containerd")
    #: The pause program (`make cluster-deps` builds it beside the others).
    pause: Path | None = None
    #: Where CoreDNS and metrics-server were built (default: ``bin_dir``).
    addons_bin: Path | None = None
    #: Where the network policy controller (kube-router) was built (default: ``bin_dir``).
    netpol_bin: Path | None = None
    #: Where Prometheus and prometheus-adapter were built (default: ``bin_dir``).
    metrics_bin: Path | None = None

    @property
    def pki(self) -> Path:
        return self.run_dir / "pki"

    @property
    def api_url(self) -> str:
        return f"https://{HOST}:{self.ports['kube-apiserver']}"

    def binary(self, name: str) -> Path:
        if name in ADDONS and self.addons_bin is not None:
            return self.addons_bin / name
        if name in NETWORK_POLICY and self.netpol_bin is not None:
            return self.netpol_bin / name
        if name in CUSTOM_METRICS and self.metrics_bin is not None:
            return self.metrics_bin / name
        return self.bin_dir / name

    def config(self, name: str) -> Path:
        return self.run_dir / "config" / name

    @property
    def node(self) -> node.NodePaths:
        return node.NodePaths(self.run_dir, self.containerd_root)

    @property
    def node_ports(self) -> node.NodePorts:
        p = self.ports
        return node.NodePorts(p["kubelet"], p["kubelet-healthz"], p["kube-proxy-healthz"], p["kube-proxy-metrics"])


@dataclass(frozen=True)
class Component:
    """One process of the cluster: how to run it and how to tell it is ready.

    ``ready_url``: an ``https://`` URL asked with the admin's certificate, an ``http://`` one on
    loopback, or ``unix://`` + a socket containerd answers on.
    """

    name: str
    argv: tuple[str, ...]
    ready_url: str
    files: dict[Path, str] = field(default_factory=dict)


def kubeconfig(layout: Layout, user: str, embed: bool = False) -> str:
    """A kubeconfig for the API server as ``user`` (a certificate in the PKI: ``<user>.crt``).

    ``embed``: the certificates inside it (one self-contained file), else their paths.
    """
    pki = layout.pki

    def ref(key: str, path: Path) -> dict[str, str]:
        if embed:
            return {f"{key}-data": base64.b64encode(path.read_bytes()).decode()}
        return {key: str(path)}

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "rtserve-local",
        "preferences": {},
        "clusters": [
            {
                "name": "rtserve-local",
                "cluster": {"server": layout.api_url, **ref("certificate-authority", pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {**ref("client-certificate", pki / f"{user}.crt"), **ref("client-key", pki / f"{user}.key")},
            }
        ],
        "contexts": [{"name": "rtserve-local", "context": {"cluster": "rtserve-local", "user": user}}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def etcd(layout: Layout) -> Component:
    pki, client, peer = layout.pki, layout.ports["etcd"], layout.ports["etcd-peer"]
    url = f"https://{HOST}:{client}"
    return Component(
        "etcd",
        (
            str(layout.binary("etcd")),
            "--name=rtserve-local",
            f"--data-dir={layout.run_dir / 'etcd'}",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://{HOST}:{peer}",
            f"--initial-advertise-peer-urls=http://{HOST}:{peer}",
            f"--initial-cluster=rtserve-local=http://{HOST}:{peer}",
            f"--cert-file={pki / 'etcd.crt'}",
            f"--key-file={pki / 'etcd.key'}",
            "--client-cert-auth=true",
            f"--trusted-ca-file={pki / 'ca.crt'}",
            "--log-level=warn",
        ),
        f"{url}/health",
    )


def kube_apiserver(layout: Layout) -> Component:
    pki, port = layout.pki, layout.ports["kube-apiserver"]
    return Component(
        "kube-apiserver",
        (
            str(layout.binary("kube-apiserver")),
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={port}",
            f"--etcd-servers=https://{HOST}:{layout.ports['etcd']}",
            f"--etcd-cafile={pki / 'ca.crt'}",
            f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
            f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            # The node's kubelet is reached at its address, with a certificate of the cluster's CA.
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-certificate-authority={pki / 'ca.crt'}",
            # Aggregated APIs (metrics-server on the node's address) are reached at their endpoints.
            "--enable-aggregator-routing=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            # The default admission plugins (PodSecurity among them) stay on; NodeRestriction goes
            # with the Node authorizer. Privileged pods are allowed by the server, so that what
            # refuses one is the namespace's PodSecurity level, as in a real cluster.
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
            # The API server listens on loopback only, an address the `kubernetes` Service's
            # endpoints may not hold: it gets none (in-cluster clients need a node address).
            "--endpoint-reconciler-type=none",
            "--profiling=false",
        ),
        f"{layout.api_url}/readyz",
    )


def _controller_args(layout: Layout, name: str, user: str) -> tuple[str, ...]:
    """The flags the controller manager and the scheduler share.

    Their kubeconfig and a TLS listener on loopback with a certificate of the cluster's CA.
    """
    kubecfg = layout.config(f"{name}.kubeconfig")
    pki = layout.pki
    return (
        f"--kubeconfig={kubecfg}",
        f"--authentication-kubeconfig={kubecfg}",
        f"--authorization-kubeconfig={kubecfg}",
        f"--bind-address={HOST}",
        f"--secure-port={layout.ports[name]}",
        f"--tls-cert-file={pki / f'{user}.crt'}",
        f"--tls-private-key-file={pki / f'{user}.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--leader-elect=false",
    )


def kube_controller_manager(layout: Layout) -> Component:
    pki, name = layout.pki, "kube-controller-manager"
    return Component(
        name,
        (
            str(layout.binary(name)),
            *_controller_args(layout, name, "controller-manager"),
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--controllers=*,bootstrapsigner,tokencleaner",
        ),
        f"https://{HOST}:{layout.ports[name]}/healthz",
        {layout.config(f"{name}.kubeconfig"): kubeconfig(layout, "controller-manager")},
    )


def kube_scheduler(layout: Layout) -> Component:
    name = "kube-scheduler"
    return Component(
        name,
        (str(layout.binary(name)), *_controller_args(layout, name, "scheduler")),
        f"https://{HOST}:{layout.ports[name]}/healthz",
        {layout.config(f"{name}.kubeconfig"): kubeconfig(layout, "scheduler")},
    )


def control_plane(layout: Layout) -> list[Component]:
    """The control plane's components in start order."""
    return [etcd(layout), kube_apiserver(layout), kube_controller_manager(layout), kube_scheduler(layout)]


def containerd(layout: Layout, sandbox_image: str) -> Component:
    paths = layout.node
    return Component(
        "containerd",
        (node.CONTAINERD, f"--config={paths.containerd_config}"),
        f"unix://{paths.containerd_socket}",
        {
            paths.containerd_config: node.containerd_config(paths, sandbox_image),
            paths.cni_conf_dir / "10-rtserve.conflist": node.cni_network(paths),
        },
    )


def kubelet(layout: Layout) -> Component:
    config, kubecfg = layout.config("kubelet.yaml"), layout.config("kubelet.kubeconfig")
    return Component(
        "kubelet",
        node.kubelet_argv(layout.binary("kubelet"), layout.node, config, kubecfg),
        f"http://127.0.0.1:{layout.ports['kubelet-healthz']}/healthz",
        {config: node.kubelet_config(layout.node, layout.pki, layout.node_ports), kubecfg: kubeconfig(layout, "node")},
    )


def kube_proxy(layout: Layout) -> Component:
    config, kubecfg = layout.config("kube-proxy.yaml"), layout.config("kube-proxy.kubeconfig")
    return Component(
        "kube-proxy",
        node.kube_proxy_argv(layout.binary("kube-proxy"), config),
        f"http://127.0.0.1:{layout.ports['kube-proxy-healthz']}/healthz",
        {config: node.kube_proxy_config(kubecfg, layout.node_ports), kubecfg: kubeconfig(layout, "kube-proxy")},
    )


def coredns(layout: Layout) -> Component:
    """The cluster DNS on the node's address (port 53), answering from the API server."""
    corefile, kubecfg = layout.config("Corefile"), layout.config("coredns.kubeconfig")
    return Component(
        "coredns",
        addons.coredns_argv(layout.binary("coredns"), corefile),
        addons.coredns_ready_url(layout.ports["coredns-ready"]),
        {
            corefile: addons.corefile(
                node.NODE_IP, kubecfg, layout.ports["coredns-health"], layout.ports["coredns-ready"]
            ),
            kubecfg: kubeconfig(layout, "coredns"),
        },
    )


def metrics_server(layout: Layout) -> Component:
    """metrics-server on the node's address, scraping the kubelet (``kubectl top``, the HPA)."""
    kubecfg, pki = layout.config("metrics-server.kubeconfig"), layout.pki
    return Component(
        "metrics-server",
        addons.metrics_server_argv(
            layout.binary("metrics-server"),
            kubecfg,
            node.NODE_IP,
            layout.ports["metrics-server"],
            pki / "metrics-server.crt",
            pki / "metrics-server.key",
            pki / "ca.crt",
        ),
        addons.metrics_server_health_url(node.NODE_IP, layout.ports["metrics-server"], "livez"),
        {kubecfg: kubeconfig(layout, "metrics-server")},
    )


def prometheus(layout: Layout) -> Component:
    """Prometheus on loopback, scraping the pods annotated ``prometheus.io/scrape`` (the autoscaler's signals)."""
    config, kubecfg = layout.config("prometheus.yml"), layout.config("prometheus.kubeconfig")
    port = layout.ports["prometheus"]
    return Component(
        "prometheus",
        addons.prometheus_argv(layout.binary("prometheus"), config, layout.run_dir / "prometheus", port),
        addons.prometheus_url(port, "/-/ready"),
        {config: addons.prometheus_config(kubecfg), kubecfg: kubeconfig(layout, "prometheus")},
    )


def prometheus_adapter(layout: Layout) -> Component:
    """prometheus-adapter on the node's address: the pods' queue time and p99 as ``custom.metrics.k8s.io``.

    Its rules are the repository's ``deploy/monitoring/prometheus-adapter.yaml`` (:data:`ADAPTER_RULES`).
    """
    kubecfg, rules, pki = (
        layout.config("prometheus-adapter.kubeconfig"),
        layout.config("prometheus-adapter.yaml"),
        layout.pki,
    )
    port = layout.ports["prometheus-adapter"]
    return Component(
        "prometheus-adapter",
        addons.prometheus_adapter_argv(
            layout.binary("prometheus-adapter"),
            kubecfg,
            rules,
            addons.prometheus_url(layout.ports["prometheus"]),
            node.NODE_IP,
            port,
            pki / "prometheus-adapter.crt",
            pki / "prometheus-adapter.key",
        ),
        f"https://{node.NODE_IP}:{port}/readyz",
        {kubecfg: kubeconfig(layout, "prometheus-adapter"), rules: ADAPTER_RULES.read_text()},
    )


def kube_router(layout: Layout) -> Component:
    """The network policy controller on the host: kube-router's firewall for the node's pods."""
    kubecfg = layout.config("kube-router.kubeconfig")
    port = layout.ports["kube-router-health"]
    return Component(
        "kube-router",
        netpol.argv(layout.binary("kube-router"), kubecfg, node.NODE_NAME, SERVICE_CIDR, port),
        netpol.health_url(port),
        {kubecfg: kubeconfig(layout, "kube-router")},
    )
