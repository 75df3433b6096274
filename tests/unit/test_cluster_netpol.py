"""The local cluster's network policy controller as a pure builder: kube-router's argv with only its
firewall, its RBAC and certificate, which ipsets are its own, and its Go module
(rtserve/cluster/netpol.py, rtserve/cluster/gomod.py, rtserve/cluster/components.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rtserve.cluster import components, gomod, netpol, pki
from rtserve.errors import ClusterError
from tests.conftest import REPO, go_pin

pytestmark = pytest.mark.unit

NETPOL = REPO / "deploy" / "cluster" / "netpol"


def test_only_the_firewall_runs_for_the_named_node_with_the_services_range():
    argv = netpol.argv(Path("/cache/kube-router"), Path("/run/kube-router.kubeconfig"), "node-1", "10.0.0.0/24", 20244)
    assert argv[0] == "/cache/kube-router"
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert flags == {
        "kubeconfig": "/run/kube-router.kubeconfig",
        "hostname-override": "node-1",
        "run-firewall": "true",
        "run-router": "false",
        "run-service-proxy": "false",
        "run-loadbalancer": "false",
        "enable-cni": "false",
        "service-cluster-ip-range": "10.0.0.0/24",
        "iptables-sync-period": netpol.SYNC_PERIOD,
        "health-port": "20244",
        "metrics-port": "0",
    }
    assert netpol.health_url(20244) == "http://127.0.0.1:20244/healthz"


@pytest.mark.parametrize("port", [0, 65536, True, "20244"])
def test_a_bad_health_port_is_refused_by_name(port):
    with pytest.raises(ClusterError, match=r"^health_port must be a port number 1-65535, got "):
        netpol.argv(Path("/k"), Path("/c"), "n", "10.0.0.0/24", port)


def test_its_rbac_only_reads_and_binds_the_user_its_certificate_names():
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(netpol.manifests())}
    assert set(docs) == {"ClusterRole", "ClusterRoleBinding"}
    verbs = {v for rule in docs["ClusterRole"]["rules"] for v in rule["verbs"]}
    assert verbs == {"get", "list", "watch"}
    resources = {r for rule in docs["ClusterRole"]["rules"] for r in rule["resources"]}
    assert {"nodes", "pods", "namespaces", "networkpolicies"} <= resources
    assert docs["ClusterRoleBinding"]["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": netpol.USER}
    ]
    cert = {c.name: c for c in pki.certificates("10.0.0.1", "node-1", "10.245.0.1")}["kube-router"]
    assert (cert.subject, cert.usage) == (f"/CN={netpol.USER}", "clientAuth")


def test_the_component_runs_from_its_own_cache_directory_after_the_add_ons():
    ports = dict(zip(components.PORT_NAMES, range(21001, 21001 + len(components.PORT_NAMES))))
    layout = components.Layout(
        Path("/run/c"), Path("/bin/k8s"), Path("/k/admin"), ports, netpol_bin=Path("/cache/netpol-1/bin")
    )
    component = components.kube_router(layout)
    assert component.argv[0] == "/cache/netpol-1/bin/kube-router"
    assert component.ready_url == f"http://127.0.0.1:{ports['kube-router-health']}/healthz"
    assert (
        components.NAMES[-1] == "kube-router" and components.NAMES.index("metrics-server") < len(components.NAMES) - 1
    )
    assert components.Layout(Path("/r"), Path("/b"), Path("/k"), ports).binary("kube-router") == Path("/b/kube-router")


def test_only_its_own_ipsets_are_destroyed():
    names = ["KUBE-SRC-ABCDEF0123456789", "KUBE-DST-0123456789ABCDEF", "TMP-QWERTYUIOPASDFGH", "my-set", "KUBE-other"]
    assert netpol.own_ipsets(names) == names[:3]


def test_the_module_pins_every_upstream_requirement_and_builds_kube_router_as_a_tool():
    upstream = {
        "Go": "1.21",
        "Require": [
            {"Path": "google.golang.org/grpc", "Version": "v1.62.0"},
            {"Path": "k8s.io/client-go", "Version": "v0.29.2", "Indirect": True},
        ],
    }
    text = gomod.kube_router_module(upstream, "v2.1.0").render()
    assert text.startswith(gomod.NETPOL_HEADER) and "module rtserve/deploy/cluster/netpol\n" in text
    assert "go 1.21\n" in text
    for line in ("github.com/cloudnativelabs/kube-router/v2 v2.1.0", "google.golang.org/grpc v1.62.0"):
        assert f"\t{line}\n" in text
    assert "\tk8s.io/client-go v0.29.2\n" in text
    assert "tool (\n\tgithub.com/cloudnativelabs/kube-router/v2/cmd/kube-router\n)" in text


def test_the_committed_module_is_the_generators_at_the_pinned_version():
    path = NETPOL / "go.mod"
    assert path.read_text().startswith(gomod.NETPOL_HEADER)
    assert go_pin(path, gomod.KUBE_ROUTER) == "v2.1.0"
    assert (NETPOL / "go.sum").is_file()
