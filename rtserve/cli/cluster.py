"""``python -m rtserve cluster``: a single-machine Kubernetes cluster on 127.0.0.1 (rtserve.cluster).

    python -m rtserve cluster modules --kubernetes v1.36.3 --etcd v3.6.16
    python -m rtserve cluster addon-modules --coredns v1.15.0 --metrics-server v0.8.0
    python -m rtserve cluster netpol-module --kube-router v2.1.0
    python -m rtserve cluster metrics-modules --prometheus v0.316.0 --prometheus-adapter v0.12.0
    python -m rtserve cluster start --bin-dir DIR [--run-dir .run/cluster] [--kubeconfig build/cluster/admin.kubeconfig]
        [--containerd-root ~/.cache/rtserve/cluster/containerd] [--pause FILE] [--addons-bin-dir DIR]
        [--netpol-bin-dir DIR] [--metrics-bin-dir DIR] [--port kube-apiserver=6443]
    python -m rtserve cluster status [--run-dir .run/cluster]
    python -m rtserve cluster stop [--run-dir .run/cluster]
    python -m rtserve cluster load [--run-dir .run/cluster] [--engine podman] [--layers DIR] IMAGE [IMAGE ...]

``make cluster``, ``make cluster-status``, ``make cluster-load``, ... call these.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rtserve.cli.common import command, group, named_port
from rtserve.cluster import gomod, images, runtime
from rtserve.cluster.components import PORT_NAMES, Layout
from rtserve.settings import PACKAGE_HOME

RUN_DIR = PACKAGE_HOME / ".run" / "cluster"
KUBECONFIG = PACKAGE_HOME / "build" / "cluster" / "admin.kubeconfig"
CONTAINERD_ROOT = Path.home() / ".cache" / "rtserve" / "cluster" / "containerd"


def _port(text: str) -> tuple[str, int]:
    return named_port(text, PORT_NAMES)


def cmd_modules(args: argparse.Namespace) -> int:
    """Regenerate deploy/cluster's go.mod and go.sum files."""
    for written in gomod.write_modules(args.dir, args.kubernetes, args.etcd, args.go):
        print(f">> wrote {written} and its go.sum")
    return 0


def cmd_addon_modules(args: argparse.Namespace) -> int:
    """Regenerate deploy/cluster/addons' go.mod and go.sum files (CoreDNS, metrics-server)."""
    for written in gomod.write_addon_modules(args.dir, args.coredns, args.metrics_server, args.go):
        print(f">> wrote {written} and its go.sum")
    return 0


def cmd_netpol_module(args: argparse.Namespace) -> int:
    """Regenerate deploy/cluster/netpol's go.mod and go.sum files (kube-router, the network policy controller)."""
    for written in gomod.write_netpol_module(args.dir, args.kube_router, args.go):
        print(f">> wrote {written} and its go.sum")
    return 0


def cmd_metrics_modules(args: argparse.Namespace) -> int:
    """Regenerate deploy/cluster/metrics' go.mod and go.sum files (Prometheus, prometheus-adapter)."""
    for written in gomod.write_metrics_modules(args.dir, args.prometheus, args.prometheus_adapter, args.go):
        print(f">> wrote {written} and its go.sum")
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    """Start the control plane, the node (containerd, kubelet, kube-proxy), add-ons and kube-router's firewall."""
    layout = Layout(
        args.run_dir.resolve(),
        args.bin_dir.resolve(),
        args.kubeconfig.resolve(),
        runtime.resolve_ports(dict(args.port)),
        args.containerd_root.resolve(),
        args.pause.resolve() if args.pause else None,
        args.addons_bin_dir.resolve() if args.addons_bin_dir else None,
        args.netpol_bin_dir.resolve() if args.netpol_bin_dir else None,
        args.metrics_bin_dir.resolve() if args.metrics_bin_dir else None,
    )
    begin = time.monotonic()
    took = runtime.start(layout)
    steps = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items())
    print(f">> cluster ready in {time.monotonic() - begin:.1f} s ({steps}); state in {args.run_dir}")
    print(f"  API server: {layout.api_url}")
    print(f"  kubeconfig: {args.kubeconfig}")
    print(f">> try it: KUBECONFIG={args.kubeconfig} {layout.binary('kubectl')} get namespaces")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the cluster of --run-dir (by its PID files)."""
    stopped = runtime.stop(args.run_dir)
    print(f">> stopped {args.run_dir}:" if stopped else f">> no cluster runs from {args.run_dir}")
    for line in stopped:
        print(f"  {line}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Say whether each component of the cluster of --run-dir runs (exit 3 when one does not)."""
    states = runtime.status(args.run_dir)
    if not states:
        print(f">> no cluster was started from {args.run_dir} (make cluster)")
        return 3
    state = runtime.load_state(args.run_dir)
    for name, line in states.items():
        print(f"  {name:<24} {line}")
    print(f"  API server: {state['api_url']}\n  kubeconfig: {state['kubeconfig']}")
    return 0 if all(line.startswith("running") for line in states.values()) else 3


def cmd_load(args: argparse.Namespace) -> int:
    """Load images built here into the cluster's node (only their new layers, into ctr images import).

    Images the node holds already are skipped.
    """
    begin = time.monotonic()
    done = images.load(images.node_ctr(args.run_dir, args.ctr), args.image, args.engine, layers=args.layers)
    imported = sum(1 for d in done if d.action == "imported")
    print(f">> {len(done)} image(s) on the node, {imported} imported, in {time.monotonic() - begin:.1f} s")
    return 0


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "cluster", __doc__)
    run_dir = (["--run-dir"], {"type": Path, "default": RUN_DIR})
    command(
        commands,
        "modules",
        cmd_modules,
        (["--dir"], {"type": Path, "default": Path("deploy/cluster")}),
        (["--kubernetes"], {"required": True, "help": "k8s.io/kubernetes version, e.g. v1.36.3"}),
        (["--etcd"], {"required": True, "help": "go.etcd.io/etcd/server/v3 version, e.g. v3.6.16"}),
        (["--go"], {"default": "go", "help": "the go command"}),
    )
    command(
        commands,
        "addon-modules",
        cmd_addon_modules,
        (["--dir"], {"type": Path, "default": Path("deploy/cluster/addons")}),
        (["--coredns"], {"required": True, "help": "github.com/coredns/coredns version, e.g. v1.15.0"}),
        (["--metrics-server"], {"required": True, "help": "sigs.k8s.io/metrics-server version, e.g. v0.8.0"}),
        (["--go"], {"default": "go", "help": "the go command"}),
    )
    command(
        commands,
        "netpol-module",
        cmd_netpol_module,
        (["--dir"], {"type": Path, "default": Path("deploy/cluster/netpol")}),
        (["--kube-router"], {"required": True, "help": "kube-router's version, e.g. v2.1.0"}),
        (["--go"], {"default": "go", "help": "the go command"}),
    )
    command(
        commands,
        "metrics-modules",
        cmd_metrics_modules,
        (["--dir"], {"type": Path, "default": Path("deploy/cluster/metrics")}),
        (
            ["--prometheus"],
            {"required": True, "help": "github.com/prometheus/prometheus version, e.g. v0.316.0 (Prometheus 3.16.0)"},
        ),
        (["--prometheus-adapter"], {"required": True, "help": "sigs.k8s.io/prometheus-adapter version, e.g. v0.12.0"}),
        (["--go"], {"default": "go", "help": "the go command"}),
    )
    command(
        commands,
        "start",
        cmd_start,
        (["--bin-dir"], {"type": Path, "required": True, "help": "where make cluster-deps built the binaries"}),
        (["--kubeconfig"], {"type": Path, "default": KUBECONFIG}),
        (
            ["--containerd-root"],
            {
                "type": Path,
                "default": CONTAINERD_ROOT,
                "help": "containerd's root: the node's images, kept between starts",
            },
        ),
        (["--pause"], {"type": Path, "help": "the pause program (default: BIN_DIR/pause)"}),
        (["--addons-bin-dir"], {"type": Path, "help": "where CoreDNS and metrics-server are (default: BIN_DIR)"}),
        (["--netpol-bin-dir"], {"type": Path, "help": "where kube-router is (default: BIN_DIR)"}),
        (
            ["--metrics-bin-dir"],
            {"type": Path, "help": "where Prometheus and prometheus-adapter are (default: BIN_DIR)"},
        ),
        (
            ["--port"],
            {
                "type": _port,
                "action": "append",
                "default": [],
                "metavar": "NAME=PORT",
                "help": "a fixed port (default: free ones)",
            },
        ),
        run_dir,
    )
    command(commands, "stop", cmd_stop, run_dir)
    command(commands, "status", cmd_status, run_dir)
    command(
        commands,
        "load",
        cmd_load,
        (
            ["image"],
            {
                "nargs": "+",
                "metavar": "IMAGE",
                "help": "an image as the engine names it, e.g. registry.example.com/ml/rtserve:1.0",
            },
        ),
        (["--engine"], {"default": "podman", "help": "the engine whose images are saved (podman or docker)"}),
        (["--ctr"], {"default": "ctr", "help": "containerd's client"}),
        (
            ["--layers"],
            {
                "type": Path,
                "default": None,
                "help": "a directory that keeps the images' layers between loads (podman with skopeo): "
                "a second version of an image copies its new layers only",
            },
        ),
        run_dir,
    )
