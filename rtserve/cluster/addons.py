"""Pure builders for the local cluster's add-ons on the host: DNS, resource and custom metrics for the autoscaler.

CoreDNS; metrics-server (``metrics.k8s.io``); Prometheus scraping the pods and prometheus-adapter serving their
signals as ``custom.metrics.k8s.io``.

Each gets argv, config and RBAC for its own client-certificate user (:mod:`rtserve.cluster.pki`). metrics-server
and prometheus-adapter are reached through a selector-less Service whose EndpointSlice holds the node's address, so
the API server needs ``--enable-aggregator-routing=true``. Nothing here starts a process or talks to a cluster.
"""

from __future__ import annotations

import base64
import ipaddress
from pathlib import Path

import yaml

from rtserve.cluster.node import CLUSTER_DOMAIN
from rtserve.errors import ClusterError

LOOPBACK = "127.0.0.1"
DNS_PORT = 53
NAMESPACE = "kube-system"
#: The users of the add-ons' client certificates (rtserve.cluster.pki), which the RBAC here binds.
COREDNS_USER = "rtserve:coredns"
METRICS_SERVER_USER = "rtserve:metrics-server"
METRICS_SERVER_SERVICE = "metrics-server"
#: The name the API server checks metrics-server's serving certificate for (its Service's).
METRICS_SERVER_DNS = f"{METRICS_SERVER_SERVICE}.{NAMESPACE}.svc"
METRICS_API_GROUP = "metrics.k8s.io"
#: How often metrics-server scrapes the kubelets (the HorizontalPodAutoscaler syncs every 15 s).
METRIC_RESOLUTION = "15s"
#: The users of Prometheus's and prometheus-adapter's client certificates.
PROMETHEUS_USER = "rtserve:prometheus"
ADAPTER_USER = "rtserve:prometheus-adapter"
ADAPTER_SERVICE = "prometheus-adapter"
#: The name the API server checks prometheus-adapter's serving certificate for (its Service's).
ADAPTER_DNS = f"{ADAPTER_SERVICE}.{NAMESPACE}.svc"
CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
#: How often Prometheus scrapes the pods: six samples in the adapter rules' 30 s rate window.
SCRAPE_INTERVAL = "5s"
#: How often prometheus-adapter lists Prometheus's series (a metric first scraped appears within it).
ADAPTER_RELIST = "30s"
#: The ``endpointslice.kubernetes.io/managed-by`` of the EndpointSlices written here (no
#: controller of the cluster owns them: their Services have no selector).
MANAGED_BY = "rtserve.local-cluster"
_RBAC = "rbac.authorization.k8s.io"


def _ip(value: str, what: str, routable: bool = False) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """Parse ``value`` as an IP address.

    ``routable``: one an EndpointSlice may hold (not loopback or link-local, which the API server refuses).

    Raises:
        ClusterError: not an IP address, or not a routable one where one is needed.
    """
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        raise ClusterError(f"{what} must be an IP address, got {value!r}") from None
    if routable and (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
        raise ClusterError(
            f"{what} must be a node address other pods and the API server reach "
            f"(not loopback, link-local or unspecified), got {value}"
        )
    return ip


def _port(value: int, what: str) -> int:
    """Raises ClusterError unless ``value`` is a TCP/UDP port number (1-65535)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ClusterError(f"{what} must be a port number 1-65535, got {value!r}")
    return value


# --- CoreDNS -----------------------------------------------------------------------------------


def _quoted(path: Path) -> str:
    """A Corefile token for ``path`` (quoted: a path may hold spaces)."""
    text = str(path)
    if '"' in text or "\\" in text or "\n" in text:
        raise ClusterError(f"a Corefile path may not hold a quote, backslash or newline: {text!r}")
    return f'"{text}"'


def corefile(
    listen_ip: str,
    kubeconfig: Path,
    health_port: int,
    ready_port: int,
    port: int = DNS_PORT,
    domain: str = CLUSTER_DOMAIN,
    log_queries: bool = False,
) -> str:
    """The Corefile of the cluster DNS, served on ``listen_ip``:``port``.

    ``domain`` and the reverse zones are answered from the API server's Services and EndpointSlices;
    ``/health`` and ``/ready`` are on loopback ports. Nothing is forwarded (no outside resolver is
    reachable): another name is refused at once.

    Raises:
        ClusterError: a bad address or port, or the health and ready ports are the same.
    """
    _ip(listen_ip, "listen_ip")
    for value, what in ((port, "port"), (health_port, "health_port"), (ready_port, "ready_port")):
        _port(value, what)
    if health_port == ready_port:
        raise ClusterError(f"health_port and ready_port must differ, both are {health_port}")
    if not domain or any(c.isspace() or c in '{}"#' for c in domain):
        raise ClusterError(f"domain must be a DNS name, got {domain!r}")
    zones = (domain, "in-addr.arpa", "ip6.arpa")
    lines = [
        "# The local cluster's DNS (rtserve.cluster.addons.corefile).",
        " ".join(f"{zone}:{port}" for zone in zones) + " {",
        f"    bind {listen_ip}",
        "    errors",
        *(["    log"] if log_queries else []),
        f"    health {LOOPBACK}:{health_port}",
        f"    ready {LOOPBACK}:{ready_port}",
        f"    kubernetes {' '.join(zones)} {{",
        f"        kubeconfig {_quoted(kubeconfig)}",
        "    }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def coredns_argv(binary: Path, corefile_path: Path) -> tuple[str, ...]:
    """The command that runs CoreDNS with the Corefile at ``corefile_path``."""
    return (str(binary), "-conf", str(corefile_path))


def coredns_ready_url(ready_port: int) -> str:
    """The URL that answers 200 once CoreDNS serves the cluster's names (its Services are listed)."""
    return f"http://{LOOPBACK}:{_port(ready_port, 'ready_port')}/ready"


def _labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "rtserve-local-cluster"}


def _meta(name: str, app: str, namespace: str | None = None, **labels: str) -> dict:
    meta: dict = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = {**_labels(app), **labels}
    return meta


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> dict:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs}


def _binding(
    kind: str, name: str, app: str, role_kind: str, role: str, user: str, namespace: str | None = None
) -> dict:
    """A ClusterRoleBinding or RoleBinding of ``role`` to the certificate user ``user``."""
    return {
        "apiVersion": f"{_RBAC}/v1",
        "kind": kind,
        "metadata": _meta(name, app, namespace),
        "roleRef": {"apiGroup": _RBAC, "kind": role_kind, "name": role},
        "subjects": [{"apiGroup": _RBAC, "kind": "User", "name": user}],
    }


def _host_service(name: str, node_ip: str, ports: list[dict], cluster_ip: str | None = None) -> list[dict]:
    """A selector-less Service in kube-system and the EndpointSlice sending it to a process at ``node_ip``.

    Each of ``ports`` holds name, protocol, the Service's port and the process's ``targetPort``.
    """
    ip = _ip(node_ip, "node_ip", routable=True)
    spec: dict = {
        "ports": [
            {"name": p["name"], "protocol": p["protocol"], "port": p["port"], "targetPort": p["targetPort"]}
            for p in ports
        ]
    }
    if cluster_ip:
        spec = {"clusterIP": cluster_ip, **spec}
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name, name, NAMESPACE), "spec": spec},
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": _meta(
                f"{name}-host",
                name,
                NAMESPACE,
                **{"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
            ),
            "addressType": f"IPv{ip.version}",
            "endpoints": [{"addresses": [node_ip], "conditions": {"ready": True}}],
            "ports": [{"name": p["name"], "protocol": p["protocol"], "port": p["targetPort"]} for p in ports],
        },
    ]


def _dump(docs: list[dict]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


def coredns_manifests() -> str:
    """CoreDNS's RBAC (multi-document YAML): list and watch Services, EndpointSlices and namespaces."""
    role = {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "ClusterRole",
        "metadata": _meta(COREDNS_USER, "coredns"),
        "rules": [
            _rule([""], ["services", "namespaces"], ["list", "watch"]),
            _rule(["discovery.k8s.io"], ["endpointslices"], ["list", "watch"]),
        ],
    }
    return _dump(
        [role, _binding("ClusterRoleBinding", COREDNS_USER, "coredns", "ClusterRole", COREDNS_USER, COREDNS_USER)]
    )


def dns_service_manifests(service_ip: str, node_ip: str, port: int = DNS_PORT) -> str:
    """The ``kube-dns`` Service at ``service_ip`` sent to CoreDNS at ``node_ip``:``port``; multi-document YAML.

    UDP and TCP. Needed only when pods use a Service address (the kubelets' ``--cluster-dns``) rather than
    ``node_ip`` itself.

    Raises:
        ClusterError: a bad address or port.
    """
    _ip(service_ip, "service_ip")
    _port(port, "port")
    return _dump(
        _host_service(
            "kube-dns",
            node_ip,
            [
                {"name": "dns", "protocol": "UDP", "port": DNS_PORT, "targetPort": port},
                {"name": "dns-tcp", "protocol": "TCP", "port": DNS_PORT, "targetPort": port},
            ],
            service_ip,
        )
    )


# --- metrics-server ----------------------------------------------------------------------------


def metrics_server_argv(
    binary: Path, kubeconfig: Path, listen_ip: str, port: int, cert: Path, key: Path, kubelet_ca: Path
) -> tuple[str, ...]:
    """The command that runs metrics-server on ``listen_ip``:``port`` with serving certificate ``cert``/``key``.

    ``kubeconfig`` is its client identity for everything: the API server, delegated authentication and
    authorization of its callers, and the kubelets, whose serving certificates ``kubelet_ca`` verifies.
    It scrapes each node's InternalIP at the port the node reports.

    Raises:
        ClusterError: a bad address or port.
    """
    _ip(listen_ip, "listen_ip")
    _port(port, "port")
    return (
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={listen_ip}",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        f"--kubelet-certificate-authority={kubelet_ca}",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-use-node-status-port",
        f"--metric-resolution={METRIC_RESOLUTION}",
    )


def metrics_server_health_url(listen_ip: str, port: int, check: str = "readyz") -> str:
    """The URL of metrics-server's health check ``check`` (HTTPS, no client certificate needed).

    ``livez`` answers 200 once it serves; ``readyz`` only once it holds metrics, after its first scrape
    of a kubelet (until then: 500, ``metric-storage-ready ... no metrics to serve``).

    Raises:
        ClusterError: a bad address or port, or ``check`` is none of livez, readyz, healthz.
    """
    if check not in ("livez", "readyz", "healthz"):
        raise ClusterError(f"check must be livez, readyz or healthz, got {check!r}")
    host = f"[{listen_ip}]" if _ip(listen_ip, "listen_ip").version == 6 else listen_ip
    return f"https://{host}:{_port(port, 'port')}/{check}"


def _aggregated_server(
    app: str, user: str, rules: list[dict], node_ip: str, port: int, ca_pem: str, apis: list[tuple[str, str]]
) -> list[dict]:
    """What the API server needs to serve ``apis`` ((group, version) pairs) from ``app`` at ``node_ip``:``port``.

    Its RBAC (``rules`` for its certificate user ``user``; delegated authentication and authorization of its
    callers), a selector-less Service with its EndpointSlice, and an APIService per API, each trusting ``ca_pem``
    (the cluster CA's certificate, PEM) for the server's serving certificate.

    Raises:
        ClusterError: a bad address or port, or ``ca_pem`` is no PEM certificate.
    """
    _port(port, "port")
    if "-----BEGIN CERTIFICATE-----" not in ca_pem:
        raise ClusterError("ca_pem must be the cluster CA's certificate in PEM form (ca.crt)")
    return [
        {"apiVersion": f"{_RBAC}/v1", "kind": "ClusterRole", "metadata": _meta(user, app), "rules": rules},
        _binding("ClusterRoleBinding", user, app, "ClusterRole", user, user),
        # Delegated authentication and authorization of its callers (TokenReview, SubjectAccessReview).
        _binding(
            "ClusterRoleBinding", f"{app}:system:auth-delegator", app, "ClusterRole", "system:auth-delegator", user
        ),
        # The API server's client and front-proxy CAs (the extension-apiserver-authentication ConfigMap).
        _binding(
            "RoleBinding",
            f"{app}-auth-reader",
            app,
            "Role",
            "extension-apiserver-authentication-reader",
            user,
            NAMESPACE,
        ),
        *_host_service(app, node_ip, [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": port}]),
        *(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": _meta(f"{version}.{group}", app),
                "spec": {
                    "group": group,
                    "version": version,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "service": {"name": app, "namespace": NAMESPACE, "port": 443},
                    "caBundle": base64.b64encode(ca_pem.encode()).decode(),
                },
            }
            for group, version in apis
        ),
    ]


def metrics_server_manifests(node_ip: str, port: int, ca_pem: str) -> str:
    """What the API server needs to serve ``metrics.k8s.io`` from metrics-server at ``node_ip``:``port``.

    Multi-document YAML: its RBAC, a selector-less Service with its EndpointSlice, and the APIService,
    which trusts ``ca_pem`` (the cluster CA's certificate, PEM) for metrics-server's serving certificate.

    Raises:
        ClusterError: a bad address or port, or ``ca_pem`` is no PEM certificate.
    """
    app, read = METRICS_SERVER_SERVICE, ["get", "list", "watch"]
    rules = [_rule([""], ["nodes/metrics"], ["get"]), _rule([""], ["pods", "nodes"], read)]
    docs = _aggregated_server(app, METRICS_SERVER_USER, rules, node_ip, port, ca_pem, [(METRICS_API_GROUP, "v1beta1")])
    # Who may read the metrics API: folded into the view, edit and admin roles.
    docs.insert(
        1,
        {
            "apiVersion": f"{_RBAC}/v1",
            "kind": "ClusterRole",
            "metadata": _meta(
                "system:aggregated-metrics-reader",
                app,
                **{f"{_RBAC}/aggregate-to-{role}": "true" for role in ("view", "edit", "admin")},
            ),
            "rules": [_rule([METRICS_API_GROUP], ["pods", "nodes"], read)],
        },
    )
    return _dump(docs)


# --- custom metrics: Prometheus and prometheus-adapter -----------------------------------------


def prometheus_config(kubeconfig: Path, scrape_interval: str = SCRAPE_INTERVAL) -> str:
    """The local cluster's Prometheus configuration: every running pod annotated ``prometheus.io/scrape: "true"``.

    Pods are found through the API server (``kubeconfig``: its client identity) and scraped at their IP, on the
    port and path their ``prometheus.io/port`` and ``prometheus.io/path`` annotations name; each series gets the
    pod's ``namespace`` and ``pod`` labels, which prometheus-adapter maps to the pod (its rules file).
    """
    annotation = "__meta_kubernetes_pod_annotation_prometheus_io_"
    doc = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "kubernetes_sd_configs": [{"role": "pod", "kubeconfig_file": str(kubeconfig)}],
                "relabel_configs": [
                    {"source_labels": [f"{annotation}scrape"], "regex": "true", "action": "keep"},
                    {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
                    {
                        "source_labels": ["__meta_kubernetes_pod_ip", f"{annotation}port"],
                        "regex": r"(.+);(\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    {"source_labels": [f"{annotation}path"], "regex": "(.+)", "target_label": "__metrics_path__"},
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }
        ],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def prometheus_argv(binary: Path, config: Path, data_dir: Path, port: int) -> tuple[str, ...]:
    """The command that runs Prometheus on loopback ``port`` with ``config``, its data in ``data_dir`` (kept an hour).

    Raises:
        ClusterError: a bad port.
    """
    return (
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        "--storage.tsdb.retention.time=1h",
        f"--web.listen-address={LOOPBACK}:{_port(port, 'port')}",
    )


def prometheus_url(port: int, path: str = "") -> str:
    """Prometheus's URL on loopback (``/-/ready`` answers 200 once it serves queries)."""
    return f"http://{LOOPBACK}:{_port(port, 'port')}{path}"


def prometheus_adapter_argv(
    binary: Path, kubeconfig: Path, rules: Path, prometheus: str, listen_ip: str, port: int, cert: Path, key: Path
) -> tuple[str, ...]:
    """The command that runs prometheus-adapter on ``listen_ip``:``port``, serving ``custom.metrics.k8s.io``.

    It answers from the Prometheus at ``prometheus`` (a URL) by the rules file ``rules``; ``kubeconfig`` is its
    client identity (listing the pods a query names, delegated authentication and authorization); ``cert``/``key``
    its serving certificate. New series names are found every :data:`ADAPTER_RELIST`.

    Raises:
        ClusterError: a bad address or port.
    """
    _ip(listen_ip, "listen_ip")
    return (
        str(binary),
        f"--prometheus-url={prometheus}",
        f"--config={rules}",
        f"--metrics-relist-interval={ADAPTER_RELIST}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={listen_ip}",
        f"--secure-port={_port(port, 'port')}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
    )


def custom_metrics_manifests(node_ip: str, adapter_port: int, ca_pem: str) -> str:
    """RBAC for Prometheus (list and watch pods) and what serves ``custom.metrics.k8s.io`` from prometheus-adapter.

    Multi-document YAML. The HorizontalPodAutoscaler controller may read custom metrics by Kubernetes' own
    bootstrap role; the adapter lists namespaces, pods and services.

    Raises:
        ClusterError: a bad address or port, or ``ca_pem`` is no PEM certificate.
    """
    read = ["get", "list", "watch"]
    prometheus = {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "ClusterRole",
        "metadata": _meta(PROMETHEUS_USER, "prometheus"),
        "rules": [_rule([""], ["pods"], read)],
    }
    docs = [
        prometheus,
        _binding("ClusterRoleBinding", PROMETHEUS_USER, "prometheus", "ClusterRole", PROMETHEUS_USER, PROMETHEUS_USER),
        *_aggregated_server(
            ADAPTER_SERVICE,
            ADAPTER_USER,
            [_rule([""], ["namespaces", "pods", "services"], read)],
            node_ip,
            adapter_port,
            ca_pem,
            [(CUSTOM_METRICS_GROUP, "v1beta1"), (CUSTOM_METRICS_GROUP, "v1beta2")],
        ),
    ]
    return _dump(docs)
