"""The command line: parse, hand off, and report a ClusterError in one line.

    python -m rtserve.cluster modules --kubernetes v1.36.3 --etcd v3.6.16
    python -m rtserve.cluster start --bin-dir DIR [--run-dir .run/cluster] [--kubeconfig build/cluster/admin.kubeconfig] [--port kube-apiserver=6443]
    python -m rtserve.cluster status [--run-dir .run/cluster]
    python -m rtserve.cluster stop [--run-dir .run/cluster]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rtserve.cluster import components, gomod, runtime
from rtserve.cluster.components import Layout
from rtserve.cluster.errors import ClusterError

RUN_DIR = Path(".run/cluster")
KUBECONFIG = Path("build/cluster/admin.kubeconfig")


def _port(text: str) -> tuple[str, int]:
    name, _, port = text.partition("=")
    if name not in components.PORT_NAMES or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PORT with NAME one of {', '.join(components.PORT_NAMES)} (0: a free port), got {text!r}")
    return name, int(port)


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(prog="python -m rtserve.cluster", description=__doc__.splitlines()[0])
    sub = cli.add_subparsers(dest="command", required=True)
    mods = sub.add_parser("modules", help="regenerate deploy/cluster's go.mod and go.sum files")
    mods.add_argument("--dir", type=Path, default=Path("deploy/cluster"))
    mods.add_argument("--kubernetes", required=True, help="k8s.io/kubernetes version, e.g. v1.36.3")
    mods.add_argument("--etcd", required=True, help="go.etcd.io/etcd/server/v3 version, e.g. v3.6.16")
    mods.add_argument("--go", default="go", help="the go command")
    up = sub.add_parser("start", help="start etcd, the API server, the controller manager and the scheduler")
    up.add_argument("--bin-dir", type=Path, required=True, help="where make cluster-deps built the binaries")
    up.add_argument("--kubeconfig", type=Path, default=KUBECONFIG)
    up.add_argument("--port", type=_port, action="append", default=[], metavar="NAME=PORT",
                    help="a fixed port (default: free ones)")
    for name in ("start", "stop", "status"):
        one = up if name == "start" else sub.add_parser(name, help=f"{name} the cluster of --run-dir")
        one.add_argument("--run-dir", type=Path, default=RUN_DIR)
    return cli


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _modules(args: argparse.Namespace) -> int:
    for written in gomod.write_modules(args.dir, args.kubernetes, args.etcd, args.go):
        print(f">> wrote {written} and its go.sum")
    return 0


def _start(args: argparse.Namespace) -> int:
    layout = Layout(args.run_dir.resolve(), args.bin_dir.resolve(), args.kubeconfig.resolve(),
                    runtime.resolve_ports(dict(args.port)))
    begin = time.monotonic()
    took = runtime.start(layout)
    steps = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items())
    print(f">> cluster ready in {time.monotonic() - begin:.1f} s ({steps}); state in {args.run_dir}")
    print(f"  API server: {layout.api_url}")
    print(f"  kubeconfig: {args.kubeconfig}")
    print(f">> try it: KUBECONFIG={args.kubeconfig} {layout.binary('kubectl')} get namespaces")
    return 0


def _stop(args: argparse.Namespace) -> int:
    stopped = runtime.stop(args.run_dir)
    print(f">> stopped {', '.join(stopped)}" if stopped else f">> no cluster runs from {args.run_dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    states = runtime.status(args.run_dir)
    if not states:
        print(f">> no cluster was started from {args.run_dir} (make cluster)")
        return 3
    state = runtime.load_state(args.run_dir)
    for name, line in states.items():
        print(f"  {name:<24} {line}")
    print(f"  API server: {state['api_url']}\n  kubeconfig: {state['kubeconfig']}")
    return 0 if all(line.startswith("running") for line in states.values()) else 3


COMMANDS = {"modules": _modules, "start": _start, "stop": _stop, "status": _status}
