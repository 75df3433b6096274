"""Pure builders of the local cluster's node: containerd, CNI, kubelet and kube-proxy configurations and argv.

The node is this machine; ``NODE_IP`` is a second address on the pods' bridge ``BRIDGE`` (a kubelet refuses a
loopback node IP), where the cluster DNS listens too. Nothing here starts a process or touches the host
(:mod:`rtserve.cluster.runtime` and :mod:`rtserve.cluster.host` do).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

NODE_NAME = "rtserve-node"
BRIDGE = "rtsl0"
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
NODE_IP = "10.245.0.1"
#: The free disk below which the kubelet evicts pods and admits no new ones (DiskPressure).
EVICTION_DISK_FREE = "1Gi"
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")
#: Debian's containerd (make cluster-deps installs it).
CONTAINERD = "/usr/bin/containerd"
CNI_NETWORK = "rtserve-local"
#: The kernel settings a kubelet and kube-proxy may change on the host: recorded at the start,
#: put back at the stop.
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "net.ipv4.conf.all.route_localnet",
)


@dataclass(frozen=True)
class NodePaths:
    """Where one node's files live.

    Its run directory (state, sockets, kubelet's root) and the containerd root kept between starts (the imported
    images).
    """

    run_dir: Path
    containerd_root: Path

    @property
    def containerd_state(self) -> Path:
        return self.run_dir / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.run_dir / "config" / "containerd.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.run_dir / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.run_dir / "cni" / "networks"

    @property
    def kubelet_root(self) -> Path:
        return self.run_dir / "kubelet"


def containerd_config(paths: NodePaths, sandbox_image: str, runc: str = "/usr/sbin/runc") -> str:
    """The configuration (version 2) of containerd 1.6 for the node.

    CRI with runc on cgroupfs, overlayfs, the node's CNI network, and the sandbox image built locally (never pulled).
    """
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return (
        "\n".join(
            [
                "# Written by make cluster (rtserve.cluster.node): containerd for the local cluster's node.",
                "version = 2",
                f'root = "{paths.containerd_root}"',
                f'state = "{paths.containerd_state}"',
                "[grpc]",
                f'  address = "{paths.containerd_socket}"',
                "[metrics]",
                '  address = ""',
                f"[{cri}]",
                f'  sandbox_image = "{sandbox_image}"',
                # The node runs as root with a lowered OOM score; containers may only raise their own.
                "  restrict_oom_score_adj = true",
                "  enable_selinux = false",
                f"[{cri}.containerd]",
                '  snapshotter = "overlayfs"',
                '  default_runtime_name = "runc"',
                f"[{cri}.containerd.runtimes.runc]",
                '  runtime_type = "io.containerd.runc.v2"',
                f"[{cri}.containerd.runtimes.runc.options]",
                f'  BinaryName = "{runc}"',
                "  SystemdCgroup = false",
                f"[{cri}.cni]",
                f'  bin_dir = "{CNI_BIN_DIR}"',
                f'  conf_dir = "{paths.cni_conf_dir}"',
                "  max_conf_num = 1",
                '[plugins."io.containerd.internal.v1.opt"]',
                f'  path = "{paths.containerd_state / "opt"}"',
            ]
        )
        + "\n"
    )


def cni_network(paths: NodePaths) -> str:
    """The pods' CNI network: a bridge with the pods' gateway on it.

    Addresses come from host-local (its records in the run directory); no masquerading (nothing outside the node
    is reached).
    """
    return (
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": CNI_NETWORK,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "dataDir": str(paths.cni_ipam_dir),
                            "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                        },
                    }
                ],
            },
            indent=2,
        )
        + "\n"
    )


@dataclass(frozen=True)
class NodePorts:
    kubelet: int
    kubelet_healthz: int
    proxy_healthz: int
    proxy_metrics: int


def kubelet_config(paths: NodePaths, pki: Path, ports: NodePorts, resolv_conf: str = "/etc/resolv.conf") -> str:
    """The kubelet's KubeletConfiguration.

    cgroup v1 accepted (this machine's kernel mounts it), TLS serving with a certificate of the cluster's CA,
    webhook authentication and authorization, the cluster DNS on the node's address, and image garbage
    collection only when the disk is full (the images are built here and cannot be pulled back).
    """
    return yaml.safe_dump(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
            "address": NODE_IP,
            "port": ports.kubelet,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": ports.kubelet_healthz,
            "tlsCertFile": str(pki / "kubelet.crt"),
            "tlsPrivateKeyFile": str(pki / "kubelet.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(pki / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [NODE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": resolv_conf,
            "failSwapOn": False,
            "maxPods": 32,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            # Absolute disk thresholds: the node shares the machine's disk with its images and builds,
            # and 5% of a 252 GB disk (12.6 GB) put a node with 11 GB free under DiskPressure.
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": EVICTION_DISK_FREE,
                "imagefs.available": EVICTION_DISK_FREE,
                "nodefs.inodesFree": "5%",
            },
            "volumePluginDir": str(paths.run_dir / "kubelet-plugins"),
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
        },
        sort_keys=False,
    )


def kubelet_argv(binary: Path, paths: NodePaths, config: Path, kubeconfig: Path) -> tuple[str, ...]:
    return (
        str(binary),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={paths.kubelet_root}",
        f"--cert-dir={paths.run_dir / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    )


def kube_proxy_config(kubeconfig: Path, ports: NodePorts) -> str:
    """The configuration of kube-proxy.

    iptables mode, Services reachable from the host and the pods, NodePorts only on the node's address, and the
    host's conntrack settings left alone.
    """
    return yaml.safe_dump(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": f"127.0.0.1:{ports.proxy_healthz}",
            "metricsBindAddress": f"127.0.0.1:{ports.proxy_metrics}",
            "nodePortAddresses": [f"{NODE_IP}/32"],
            "conntrack": {"maxPerCore": 0, "min": 0},
            "detectLocalMode": "ClusterCIDR",
        },
        sort_keys=False,
    )


def kube_proxy_argv(binary: Path, config: Path) -> tuple[str, ...]:
    return (str(binary), f"--config={config}", "--v=1")
