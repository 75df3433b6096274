"""The local cluster's node as built (pure): containerd's and the kubelet's configurations, the
pods' network, the sandbox image, and how the host's clean-up reads iptables and mounts."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import yaml

from rtserve.cluster import host, node, sandbox

PATHS = node.NodePaths(Path("/r/run"), Path("/c/containerd"))
PORTS = node.NodePorts(kubelet=21001, kubelet_healthz=21002, proxy_healthz=21003, proxy_metrics=21004)


def test_containerd_runs_cri_with_runc_on_cgroupfs_and_the_local_sandbox_image():
    config = tomllib.loads(node.containerd_config(PATHS, "localhost/rtserve-pause:abc"))
    assert config["root"] == "/c/containerd" and config["state"] == "/r/run/containerd/state"
    assert config["grpc"]["address"] == "/r/run/containerd/containerd.sock"
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "localhost/rtserve-pause:abc"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert cri["cni"]["conf_dir"] == "/r/run/cni/net.d" and cri["cni"]["bin_dir"] == "/usr/lib/cni"


def test_pods_network_is_a_bridge_with_the_gateway_and_addresses_recorded_in_the_run_dir():
    net = json.loads(node.cni_network(PATHS))
    bridge = net["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["bridge"] == node.BRIDGE and bridge["isGateway"]
    assert bridge["ipam"]["dataDir"] == "/r/run/cni/networks"
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.POD_CIDR, "gateway": node.POD_GATEWAY}]]


def test_kubelet_accepts_cgroup_v1_serves_tls_and_points_pods_at_the_cluster_dns():
    config = yaml.safe_load(node.kubelet_config(PATHS, Path("/r/run/pki"), PORTS))
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["containerRuntimeEndpoint"] == "unix:///r/run/containerd/containerd.sock"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook" and config["readOnlyPort"] == 0
    assert config["tlsCertFile"] == "/r/run/pki/kubelet.crt"
    assert config["clusterDNS"] == [node.NODE_IP] and config["port"] == 21001
    argv = node.kubelet_argv(Path("/b/kubelet"), PATHS, Path("/k.yaml"), Path("/k.kubeconfig"))
    assert f"--node-ip={node.NODE_IP}" in argv and "--root-dir=/r/run/kubelet" in argv


def test_kube_proxy_leaves_conntrack_alone_and_listens_on_loopback():
    config = yaml.safe_load(node.kube_proxy_config(Path("/p.kubeconfig"), PORTS))
    assert config["mode"] == "iptables" and config["clusterCIDR"] == node.POD_CIDR
    assert config["conntrack"] == {"maxPerCore": 0, "min": 0}
    assert config["healthzBindAddress"] == "127.0.0.1:21003"


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def test_sandbox_image_is_a_valid_reproducible_oci_archive():
    name, archive = sandbox.image(b"\x7fELF pause", arch="amd64")
    assert sandbox.image(b"\x7fELF pause", arch="amd64") == (name, archive)
    assert sandbox.image(b"\x7fELF other", arch="amd64")[0] != name
    files = _members(archive)
    for path, data in files.items():  # every blob is stored under its digest
        if path.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == path.rsplit("/", 1)[1]
    entry = json.loads(files["index.json"])["manifests"][0]
    assert entry["annotations"]["io.containerd.image.name"] == name
    assert name == f"{sandbox.REPOSITORY}:{entry['digest'].removeprefix('sha256:')[:12]}"
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"])
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'].removeprefix('sha256:')}"]
    assert _members(layer) == {"pause": b"\x7fELF pause"}
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].removeprefix('sha256:')}"])
    assert config["config"]["Entrypoint"] == ["/pause"] and config["architecture"] == "amd64"


SAVE = """*mangle
:PREROUTING ACCEPT [0:0]
:KUBE-IPTABLES-HINT - [0:0]
COMMIT
*nat
:OUTPUT ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:CNI-abc - [0:0]
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -j CNI-abc
-A KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-X
COMMIT
"""


def test_clean_up_finds_the_kube_chains_and_only_the_jumps_into_them():
    rules, chains = host.kube_rules(SAVE)
    assert chains == [("mangle", "KUBE-IPTABLES-HINT"), ("nat", "KUBE-SERVICES")]
    assert rules == [
        ("nat", ["OUTPUT", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"])
    ]


def test_mounts_under_a_directory_deepest_first(tmp_path):
    assert host.mounts_under(tmp_path) == []
    assert host.mounts_under(Path("/proc"))[-1] == "/proc"


def test_a_network_namespace_covered_by_its_directorys_own_bind_is_still_removed(tmp_path):
    """The stop once failed with EBUSY on a pod's namespace file: its directory had been bound
    onto itself (as CNI's and `ip netns`'s code does) after the namespace was mounted, covering
    that mount. Real mounts, as the node makes them (this machine's tests run as root)."""
    import subprocess

    netns = tmp_path / "netns"
    netns.mkdir()
    ns = netns / "cni-test"
    ns.touch()
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(ns)], check=True)
    subprocess.run(["mount", "--bind", str(netns), str(netns)], check=True)
    try:
        report: list[str] = []
        assert host._remove_netns([str(ns)], report) == []
        assert not ns.exists() and host.mounts_under(netns) == []
        assert report[-2:] == [
            f"unmounted {netns} (bound onto itself, covering namespaces)",
            f"removed network namespace {ns}",
        ]
    finally:
        for point in host.mounts_under(netns):
            subprocess.run(["umount", "-l", point], check=False)


def test_the_namespaces_directory_is_made_a_shared_mount_of_its_own_once(tmp_path):
    """Before the node's first pod: so that a later podman (which binds the directory onto itself
    when it is not a mount point) never covers the pods' namespace mounts. Real mounts."""
    import subprocess

    netns = tmp_path / "netns"
    try:
        host.share_netns_dir(netns)
        host.share_netns_dir(netns)  # a second start: still one mount
        lines = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        own = [fields for fields in lines if fields[4] == str(netns)]
        assert len(own) == 1 and any(f.startswith("shared:") for f in own[0][6 : own[0].index("-")])
    finally:
        for point in host.mounts_under(netns):
            subprocess.run(["umount", "-l", point], check=False)
