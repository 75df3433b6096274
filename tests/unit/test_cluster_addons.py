"""The local cluster's add-ons as pure builders: CoreDNS's Corefile and argv, metrics-server's
argv, the RBAC, Service, EndpointSlice and APIService manifests, their certificates and Go
modules (rtserve/cluster/addons.py, rtserve/cluster/gomod.py)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from rtserve.cluster import addons, gomod, pki
from rtserve.errors import ClusterError
from tests.conftest import REPO, go_pin

pytestmark = pytest.mark.unit

NODE_IP = "10.244.0.1"
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
ADDONS = REPO / "deploy" / "cluster" / "addons"


def by_kind_and_name(text: str) -> dict[tuple[str, str], dict]:
    docs = list(yaml.safe_load_all(text))
    assert all(doc["apiVersion"] and doc["metadata"]["name"] for doc in docs)
    found = {(doc["kind"], doc["metadata"]["name"]): doc for doc in docs}
    assert len(found) == len(docs), "two objects share a kind and name"
    return found


def test_corefile_serves_the_cluster_zones_on_the_node_address_from_the_kubeconfig():
    text = addons.corefile(NODE_IP, Path("/run/my cluster/coredns.kubeconfig"), health_port=18080, ready_port=18181)
    assert text == (
        "# The local cluster's DNS (rtserve.cluster.addons.corefile).\n"
        "cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {\n"
        "    bind 10.244.0.1\n"
        "    errors\n"
        "    health 127.0.0.1:18080\n"
        "    ready 127.0.0.1:18181\n"
        "    kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
        '        kubeconfig "/run/my cluster/coredns.kubeconfig"\n'
        "    }\n"
        "}\n"
    )


def test_corefile_has_no_forward_and_logs_queries_only_when_asked():
    quiet = addons.corefile(NODE_IP, Path("/k"), 1, 2, port=1053)
    assert "forward" not in quiet and "    log\n" not in quiet
    assert quiet.splitlines()[1] == "cluster.local:1053 in-addr.arpa:1053 ip6.arpa:1053 {"
    assert "    errors\n    log\n" in addons.corefile(NODE_IP, Path("/k"), 1, 2, log_queries=True)


def test_every_corefile_directive_is_one_our_coredns_build_accepts():
    """The Corefile uses only the plugins deploy/cluster/addons/coredns/main.go compiles in."""
    main_go = (ADDONS / "coredns" / "main.go").read_text()
    built = {
        line.split('"')[1] for line in main_go.split("var directives")[1].split("}")[0].splitlines() if '"' in line
    }
    assert built == {"bind", "ready", "health", "errors", "log", "kubernetes"}
    text = addons.corefile(NODE_IP, Path("/k"), 1, 2, log_queries=True)
    used = {
        line.split()[0]
        for line in text.splitlines()[2:]
        if line.startswith("    ") and not line.startswith("        ") and line.strip() != "}"
    }
    assert used == built
    for plugin in built:
        assert f'"github.com/coredns/coredns/plugin/{plugin}"' in main_go


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"listen_ip": "node"}, "listen_ip must be an IP address, got 'node'"),
        ({"port": 0}, "port must be a port number 1-65535, got 0"),
        ({"ready_port": 70000}, "ready_port must be a port number 1-65535, got 70000"),
        ({"ready_port": 8080}, "health_port and ready_port must differ, both are 8080"),
        ({"domain": "cluster local"}, "domain must be a DNS name, got 'cluster local'"),
        ({"kubeconfig": Path('/a"b')}, "may not hold a quote, backslash or newline"),
    ],
)
def test_a_bad_corefile_parameter_is_named(kwargs, message):
    args = {"listen_ip": NODE_IP, "kubeconfig": Path("/k"), "health_port": 8080, "ready_port": 8181, **kwargs}
    with pytest.raises(ClusterError, match=message):
        addons.corefile(**args)


def test_coredns_runs_the_corefile_and_is_ready_on_loopback():
    assert addons.coredns_argv(Path("/bin/coredns"), Path("/run/Corefile")) == (
        "/bin/coredns",
        "-conf",
        "/run/Corefile",
    )
    assert addons.coredns_ready_url(18181) == "http://127.0.0.1:18181/ready"


def test_coredns_may_list_and_watch_what_it_answers_from_and_nothing_more():
    objects = by_kind_and_name(addons.coredns_manifests())
    role = objects[("ClusterRole", "rtserve:coredns")]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    binding = objects[("ClusterRoleBinding", "rtserve:coredns")]
    assert binding["roleRef"]["name"] == "rtserve:coredns"
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": addons.COREDNS_USER}
    ]


def test_kube_dns_service_sends_udp_and_tcp_to_coredns_on_the_host():
    objects = by_kind_and_name(addons.dns_service_manifests("10.0.0.10", NODE_IP))
    service = objects[("Service", "kube-dns")]
    assert service["metadata"]["namespace"] == "kube-system"
    assert "selector" not in service["spec"] and service["spec"]["clusterIP"] == "10.0.0.10"
    assert [(p["name"], p["protocol"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [
        ("dns", "UDP", 53, 53),
        ("dns-tcp", "TCP", 53, 53),
    ]
    slice_ = objects[("EndpointSlice", "kube-dns-host")]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    assert slice_["endpoints"] == [{"addresses": [NODE_IP], "conditions": {"ready": True}}]


def test_metrics_server_argv_names_its_kubeconfig_certificates_and_the_kubelet_ca():
    argv = addons.metrics_server_argv(
        Path("/bin/metrics-server"),
        Path("/run/ms.kubeconfig"),
        NODE_IP,
        10250 + 1,
        Path("/pki/metrics-server.crt"),
        Path("/pki/metrics-server.key"),
        Path("/pki/ca.crt"),
    )
    assert argv[0] == "/bin/metrics-server"
    flags = dict(arg[2:].split("=", 1) if "=" in arg else (arg[2:], "") for arg in argv[1:])
    assert flags == {
        "kubeconfig": "/run/ms.kubeconfig",
        "authentication-kubeconfig": "/run/ms.kubeconfig",
        "authorization-kubeconfig": "/run/ms.kubeconfig",
        "bind-address": NODE_IP,
        "secure-port": "10251",
        "tls-cert-file": "/pki/metrics-server.crt",
        "tls-private-key-file": "/pki/metrics-server.key",
        "kubelet-certificate-authority": "/pki/ca.crt",
        "kubelet-preferred-address-types": "InternalIP",
        "kubelet-use-node-status-port": "",
        "metric-resolution": "15s",
    }
    assert "kubelet-insecure-tls" not in flags
    assert addons.metrics_server_health_url(NODE_IP, 4443) == "https://10.244.0.1:4443/readyz"
    assert addons.metrics_server_health_url("fd00::1", 4443, "livez") == "https://[fd00::1]:4443/livez"
    with pytest.raises(ClusterError, match="check must be livez, readyz or healthz, got 'ready'"):
        addons.metrics_server_health_url(NODE_IP, 4443, "ready")


def test_metrics_server_manifests_register_the_api_on_the_hosts_address():
    objects = by_kind_and_name(addons.metrics_server_manifests(NODE_IP, 4443, CA_PEM))
    assert set(objects) == {
        ("ClusterRole", "rtserve:metrics-server"),
        ("ClusterRole", "system:aggregated-metrics-reader"),
        ("ClusterRoleBinding", "rtserve:metrics-server"),
        ("ClusterRoleBinding", "metrics-server:system:auth-delegator"),
        ("RoleBinding", "metrics-server-auth-reader"),
        ("Service", "metrics-server"),
        ("EndpointSlice", "metrics-server-host"),
        ("APIService", "v1beta1.metrics.k8s.io"),
    }
    api = objects[("APIService", "v1beta1.metrics.k8s.io")]["spec"]
    assert (api["group"], api["version"]) == ("metrics.k8s.io", "v1beta1")
    assert api["service"] == {"name": "metrics-server", "namespace": "kube-system", "port": 443}
    assert base64.b64decode(api["caBundle"]).decode() == CA_PEM and "insecureSkipTLSVerify" not in api
    # The aggregator resolves the APIService's Service port to the EndpointSlice port of the same name.
    service = objects[("Service", "metrics-server")]
    assert "selector" not in service["spec"] and "clusterIP" not in service["spec"]
    assert service["spec"]["ports"] == [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 4443}]
    slice_ = objects[("EndpointSlice", "metrics-server-host")]
    assert slice_["metadata"]["namespace"] == "kube-system" and slice_["addressType"] == "IPv4"
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "metrics-server"
    assert slice_["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] == addons.MANAGED_BY
    assert slice_["ports"] == [{"name": "https", "protocol": "TCP", "port": 4443}]
    assert slice_["endpoints"] == [{"addresses": [NODE_IP], "conditions": {"ready": True}}]


def test_metrics_server_rbac_reads_nodes_pods_and_kubelet_metrics_as_its_certificate_user():
    objects = by_kind_and_name(addons.metrics_server_manifests(NODE_IP, 4443, CA_PEM))
    assert objects[("ClusterRole", "rtserve:metrics-server")]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
    ]
    reader = objects[("ClusterRole", "system:aggregated-metrics-reader")]
    assert {k: v for k, v in reader["metadata"]["labels"].items() if k.startswith("rbac")} == {
        f"rbac.authorization.k8s.io/aggregate-to-{role}": "true" for role in ("view", "edit", "admin")
    }
    for kind, name, role in (
        ("ClusterRoleBinding", "rtserve:metrics-server", "rtserve:metrics-server"),
        ("ClusterRoleBinding", "metrics-server:system:auth-delegator", "system:auth-delegator"),
        ("RoleBinding", "metrics-server-auth-reader", "extension-apiserver-authentication-reader"),
    ):
        binding = objects[(kind, name)]
        assert binding["roleRef"]["name"] == role
        assert [s["name"] for s in binding["subjects"]] == [addons.METRICS_SERVER_USER]
    assert objects[("RoleBinding", "metrics-server-auth-reader")]["metadata"]["namespace"] == "kube-system"


@pytest.mark.parametrize(
    "node_ip, port, ca, message",
    [
        ("127.0.0.1", 4443, CA_PEM, "node_ip must be a node address .* got 127.0.0.1"),
        ("169.254.1.1", 4443, CA_PEM, "not loopback, link-local or unspecified"),
        ("metrics", 4443, CA_PEM, "node_ip must be an IP address, got 'metrics'"),
        (NODE_IP, 0, CA_PEM, "port must be a port number 1-65535, got 0"),
        (NODE_IP, 4443, "", "ca_pem must be the cluster CA's certificate in PEM form"),
    ],
)
def test_bad_metrics_server_manifest_parameters_are_named(node_ip, port, ca, message):
    with pytest.raises(ClusterError, match=message):
        addons.metrics_server_manifests(node_ip, port, ca)


def test_certificates_name_the_users_the_rbac_binds_and_the_name_the_api_server_checks():
    certs = {cert.name: cert for cert in pki.certificates("10.0.0.1", "node-1", NODE_IP)}
    coredns, metrics = certs["coredns"], certs["metrics-server"]
    assert (coredns.subject, coredns.usage) == ("/CN=rtserve:coredns", "clientAuth")
    assert metrics.subject == "/CN=rtserve:metrics-server" and metrics.ca == "ca"
    # It serves (on the node's address, checked by the API server for its Service's name) and
    # is its own client certificate towards the API server and the kubelets.
    assert metrics.usage == "serverAuth,clientAuth"
    assert {f"IP:{NODE_IP}", "DNS:metrics-server.kube-system.svc"} <= set(metrics.sans)
    users = {
        s["name"]
        for text in (addons.coredns_manifests(), addons.metrics_server_manifests(NODE_IP, 4443, CA_PEM))
        for doc in yaml.safe_load_all(text)
        for s in doc.get("subjects", ())
    }
    assert users == {"rtserve:coredns", "rtserve:metrics-server"}


def test_addon_modules_render_their_own_header_and_build_metrics_server_as_a_tool():
    upstream = {"Go": "1.26.0", "Require": [{"Path": "k8s.io/api", "Version": "v0.37.1"}]}
    coredns = gomod.coredns_module(upstream, "v1.15.0").render()
    assert coredns.startswith(gomod.ADDON_HEADER) and "module rtserve/deploy/cluster/addons/coredns\n" in coredns
    assert "\tgithub.com/coredns/coredns v1.15.0\n" in coredns and "tool" not in coredns
    metrics = gomod.metrics_server_module(upstream, "v0.8.0").render()
    assert "\tsigs.k8s.io/metrics-server v0.8.0\n" in metrics
    assert "tool (\n\tsigs.k8s.io/metrics-server/cmd/metrics-server\n)" in metrics


@pytest.mark.parametrize(
    "sub, module, line", [("coredns", gomod.COREDNS, "v1.15."), ("metrics-server", gomod.METRICS_SERVER, "v0.8.")]
)
def test_committed_addon_modules_are_the_generators(sub, module, line):
    path = ADDONS / sub / "go.mod"
    assert path.read_text().startswith(gomod.ADDON_HEADER)
    assert go_pin(path, module).startswith(line)
    assert (ADDONS / sub / "go.sum").is_file()
