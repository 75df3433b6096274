"""``python -m rtserve cassandra``: a single-node Apache Cassandra on 127.0.0.1 for the records (rtserve.records).

    python -m rtserve cassandra start --libs DIR [--run-dir .run/cassandra] [--port 9042]
        [--storage-port 7000] [--heap 512m] [--fresh]
    python -m rtserve cassandra status [--run-dir .run/cassandra]
    python -m rtserve cassandra address [--run-dir .run/cassandra]
    python -m rtserve cassandra stop [--run-dir .run/cassandra]
    python -m rtserve cassandra run --libs DIR --run-dir DIR --host POD_IP [--port 9042]
        [--storage-port 7000] [--heap 512m]      # in the foreground: becomes the JVM

``make cassandra-deps`` assembles DIR; ``run`` is the store's container in Kubernetes (deploy/k8s/components/cassandra).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from rtserve.cli.common import command, group, heap, listen_port, pod_ip
from rtserve.records import foreground
from rtserve.records.node import Layout
from rtserve.settings import PACKAGE_HOME

RUN_DIR = PACKAGE_HOME / ".run" / "cassandra"


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535 (0: a free one), got {text!r}")
    return int(text)


def cmd_start(args: argparse.Namespace) -> int:
    """Start the node, wait until a CQL session connects, create the records' schema.

    Its data stays from the last start unless --fresh.
    """
    from rtserve.records import local, store

    # The driver's INFO lines (the data center it chose) are not this command's output.
    logging.getLogger("cassandra").setLevel(logging.WARNING)
    run_dir = args.run_dir.resolve()
    wanted = {"native": args.port, "storage": args.storage_port}
    layout = Layout(run_dir, args.libs.resolve(), local.resolve_ports(run_dir, wanted), heap=args.heap, java=args.java)
    begin = time.monotonic()
    took = local.start(layout, fresh=args.fresh)
    steps = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items())
    print(f">> Cassandra ready in {time.monotonic() - begin:.1f} s ({steps}); data and logs in {args.run_dir}")
    print(f"  address:  {layout.address} (CQL; storage port {layout.ports['storage']})")
    print(f"  keyspace: rtserve, schema version {store.SCHEMA_VERSION} (records_by_id, records_by_minute)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run the node in the foreground on --host (a pod's IP).

    Writes its configuration under --run-dir, then becomes its JVM (the log goes to the standard output too).
    """
    layout = Layout(
        args.run_dir.resolve(),
        args.libs.resolve(),
        {"native": args.port, "storage": args.storage_port},
        heap=args.heap,
        java=args.java,
        host=args.host,
        console=True,
    )
    print(
        f">> Cassandra node on {layout.address} (storage port {args.storage_port}, heap "
        f"{args.heap}); data and logs in {layout.run_dir}",
        flush=True,
    )
    foreground.run(layout)
    return 0  # not reached: run() replaces this process


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the node of --run-dir (by its PID file); its data stays."""
    from rtserve.records import local

    stopped = local.stop(args.run_dir)
    print(f">> {stopped}; data kept in {args.run_dir}" if stopped else f">> no Cassandra node runs from {args.run_dir}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Say whether the node of --run-dir runs, where, and its memory (exit 3 when it does not run)."""
    from rtserve.records import local

    lines = local.status(args.run_dir)
    for name, line in lines.items():
        print(f"  {name:<10} {line}")
    return 0 if lines["cassandra"].startswith("running") else 3


def cmd_address(args: argparse.Namespace) -> int:
    """Print the node's CQL address, host:port (for scripts)."""
    from rtserve.records import local

    print(local.load_state(args.run_dir)["address"])
    return 0


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "cassandra", __doc__)
    run_dir = (["--run-dir"], {"type": Path, "default": RUN_DIR, "help": "the node's config, data, logs and PID file"})
    command(
        commands,
        "start",
        cmd_start,
        (["--libs"], {"type": Path, "required": True, "help": "the classpath directory make cassandra-deps fills"}),
        (
            ["--port"],
            {"type": _port, "default": 0, "help": "the CQL port (default: the recorded one, else a free one)"},
        ),
        (["--storage-port"], {"type": _port, "default": 0, "help": "the storage (gossip) port (default: as --port)"}),
        (["--heap"], {"type": heap, "default": "512m", "help": "the JVM's heap (-Xms and -Xmx)"}),
        (["--java"], {"default": "java", "help": "the java program (Java 17)"}),
        (["--fresh"], {"action": "store_true", "help": "delete the node's data first"}),
        run_dir,
    )
    command(
        commands,
        "run",
        cmd_run,
        (["--libs"], {"type": Path, "required": True, "help": "the classpath directory"}),
        (["--run-dir"], {"type": Path, "required": True, "help": "the node's config, data and logs (its volume)"}),
        (
            ["--host"],
            {"type": pod_ip, "required": True, "help": "the address to listen on and give clients (the pod's IP)"},
        ),
        (["--port"], {"type": listen_port, "default": 9042, "help": "the CQL port"}),
        (["--storage-port"], {"type": listen_port, "default": 7000, "help": "the storage (gossip) port"}),
        (["--heap"], {"type": heap, "default": "512m", "help": "the JVM's heap (-Xms and -Xmx)"}),
        (["--java"], {"default": "java", "help": "the java program (Java 17)"}),
    )
    command(commands, "stop", cmd_stop, run_dir)
    command(commands, "status", cmd_status, run_dir)
    command(commands, "address", cmd_address, run_dir)
