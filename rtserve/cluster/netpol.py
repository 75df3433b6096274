"""Pure builders for the local cluster's network policy controller: kube-router with only its firewall.

The node's CNI (the bridge plugin) enforces no NetworkPolicy, so kube-router's network policy controller runs on the
host beside kube-proxy, with its router and service proxy off: it keeps one iptables chain per local pod (its
addresses in ipsets) in the filter table's INPUT, FORWARD and OUTPUT chains, which the pods' bridged traffic crosses
(``br_netfilter``). It drops what no policy allows and accepts what the node itself sends (the kubelet's probes).

Why not ``sigs.k8s.io/kube-network-policies``, SIG Network's own (kind's default): it hands each new connection to
userspace with nftables' ``queue`` statement, and this kernel has no ``nft_queue`` (``CONFIG_NFT_QUEUE`` is not
set): ``nft add rule inet t c queue num 100 bypass`` answers ``Could not process rule: No such file or directory``.
kube-router needs only what the kernel has: ipset's ``hash:ip`` and ``hash:net``, and the iptables matches ``set``,
``comment``, ``conntrack``, ``mark``, ``physdev``, ``addrtype`` and the ``NFLOG`` target.

Nothing here starts a process or talks to a cluster (:mod:`rtserve.cluster.runtime` does).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from rtserve.errors import ClusterError

LOOPBACK = "127.0.0.1"
#: The user of its client certificate (rtserve.cluster.pki), which the RBAC here binds.
USER = "rtserve:kube-router"
#: How often it rewrites every chain from scratch (changes apply at once, on the watch events).
SYNC_PERIOD = "1m"
#: The prefixes of what it leaves on the host: iptables chains (``KUBE-ROUTER-*``, ``KUBE-POD-FW-*``,
#: ``KUBE-NWPLCY-*``: the node's ``KUBE-*`` clean-up removes them) and ipsets.
IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-", "TMP-")
_RBAC = "rbac.authorization.k8s.io"


def argv(binary: Path, kubeconfig: Path, node_name: str, service_cidr: str, health_port: int) -> tuple[str, ...]:
    """The command that runs kube-router's firewall alone for node ``node_name``.

    ``service_cidr``: the Services' range (its rules let replies from Service addresses through); the health
    check answers on ``health_port`` (kube-router listens on every address; it is asked on loopback).

    Raises:
        ClusterError: ``health_port`` is not a port number.
    """
    if isinstance(health_port, bool) or not isinstance(health_port, int) or not 0 < health_port < 65536:
        raise ClusterError(f"health_port must be a port number 1-65535, got {health_port!r}")
    return (
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        # The node's CNI configuration is ours (rtserve.cluster.node): kube-router leaves it alone.
        "--enable-cni=false",
        f"--service-cluster-ip-range={service_cidr}",
        f"--iptables-sync-period={SYNC_PERIOD}",
        f"--health-port={health_port}",
        "--metrics-port=0",
    )


def health_url(health_port: int) -> str:
    """The URL that answers 200 once its firewall has synced (500 when a sync is overdue)."""
    return f"http://{LOOPBACK}:{health_port}/healthz"


def manifests() -> str:
    """Its RBAC (multi-document YAML): read the node, and list and watch what its informers cache.

    Pods, namespaces and NetworkPolicies make its rules; the process starts informers for Services, Endpoints
    and EndpointSlices too (kube-router's own command builds them for every controller) and waits for them.
    """
    labels = {"app.kubernetes.io/name": "kube-router", "app.kubernetes.io/part-of": "rtserve-local-cluster"}
    watch = ["get", "list", "watch"]
    role = {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": USER, "labels": labels},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes", "pods", "namespaces", "services", "endpoints"], "verbs": watch},
            {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": watch},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": watch},
        ],
    }
    binding = {
        "apiVersion": f"{_RBAC}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": USER, "labels": labels},
        "roleRef": {"apiGroup": _RBAC, "kind": "ClusterRole", "name": USER},
        "subjects": [{"apiGroup": _RBAC, "kind": "User", "name": USER}],
    }
    return yaml.safe_dump_all([role, binding], sort_keys=False)


def own_ipsets(names: list[str]) -> list[str]:
    """Which of the host's ipsets ``names`` kube-router made (its prefixes), to destroy after its chains."""
    return [n for n in names if n.startswith(IPSET_PREFIXES)]
