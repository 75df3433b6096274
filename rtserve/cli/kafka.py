"""``python -m rtserve kafka``: a single-node Apache Kafka broker on 127.0.0.1 (rtserve.stream).

    python -m rtserve kafka start --libs DIR [--run-dir .run/kafka] [--port broker=9092]
        [--partitions 4] [--heap 512m] [--fresh]
    python -m rtserve kafka status [--run-dir .run/kafka]
    python -m rtserve kafka stop [--run-dir .run/kafka]
    python -m rtserve kafka run --libs DIR --run-dir DIR --host POD_IP [--port 9092]
        [--controller-port 9093] [--partitions 4] [--heap 512m]     # in the foreground

``make kafka``, ``make kafka-status`` and ``make kafka-stop`` call these; ``make kafka-deps`` assembles DIR;
``run`` is the broker's container in Kubernetes (deploy/k8s/components/kafka).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rtserve.cli.common import command, group, heap, listen_port, named_port, pod_ip
from rtserve.settings import PACKAGE_HOME
from rtserve.stream.broker import PORT_NAMES, TOPICS, Layout

RUN_DIR = PACKAGE_HOME / ".run" / "kafka"


def _port(text: str) -> tuple[str, int]:
    return named_port(text, PORT_NAMES)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def cmd_start(args: argparse.Namespace) -> int:
    """Start the broker and controller, wait until it answers metadata, create the topics.

    The node's storage is formatted the first time.
    """
    from rtserve.stream import local

    run_dir = args.run_dir.resolve()
    layout = Layout(
        run_dir,
        args.libs.resolve(),
        local.resolve_ports(run_dir, dict(args.port)),
        heap=args.heap,
        partitions=args.partitions,
        java=args.java,
    )
    begin = time.monotonic()
    took = local.start(layout, fresh=args.fresh)
    steps = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items())
    print(f">> Kafka ready in {time.monotonic() - begin:.1f} s ({steps}); data and logs in {args.run_dir}")
    print(f"  bootstrap: {layout.bootstrap}")
    print(f"  topics:    {', '.join(TOPICS)} ({layout.partitions} partitions each)")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Run the broker in the foreground on --host (a pod's IP): as start, then until SIGTERM.

    Its output is this command's; the file ``ready`` in --run-dir exists while it serves its topics.
    """
    from rtserve.errors import StreamError
    from rtserve.stream import local

    if args.port == args.controller_port:
        raise StreamError(f"--port and --controller-port are both {args.port}: give two ports")
    layout = Layout(
        args.run_dir.resolve(),
        args.libs.resolve(),
        {"broker": args.port, "controller": args.controller_port},
        heap=args.heap,
        partitions=args.partitions,
        java=args.java,
        host=args.host,
        console=True,
    )
    print(
        f">> Kafka broker on {layout.bootstrap} (controller on 127.0.0.1:{args.controller_port}, heap "
        f"{args.heap}); data in {layout.data}",
        flush=True,
    )
    return local.run(layout, say=lambda line: print(line, flush=True))


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the broker of --run-dir (by its PID file); its data stays."""
    from rtserve.stream import local

    stopped = local.stop(args.run_dir)
    print(f">> {stopped}; data kept in {args.run_dir}" if stopped else f">> no Kafka broker runs from {args.run_dir}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Say whether the broker of --run-dir runs, where, and its topics (exit 3 when it does not run)."""
    from rtserve.stream import local

    lines = local.status(args.run_dir)
    for name, line in lines.items():
        print(f"  {name:<10} {line}")
    return 0 if lines["kafka"].startswith("running") else 3


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "kafka", __doc__)
    run_dir = (["--run-dir"], {"type": Path, "default": RUN_DIR, "help": "the node's config, data, logs and PID file"})
    command(
        commands,
        "start",
        cmd_start,
        (["--libs"], {"type": Path, "required": True, "help": "the classpath directory make kafka-deps fills"}),
        (
            ["--port"],
            {
                "type": _port,
                "action": "append",
                "default": [],
                "metavar": "NAME=PORT",
                "help": "a fixed port (default: the recorded one, else a free one)",
            },
        ),
        (["--partitions"], {"type": _positive, "default": 4, "help": "partitions per topic"}),
        (["--heap"], {"default": "512m", "help": "the JVM's maximum heap (-Xmx)"}),
        (["--java"], {"default": "java", "help": "the java program (Java 17 or later)"}),
        (["--fresh"], {"action": "store_true", "help": "delete the run directory's data first"}),
        run_dir,
    )
    command(
        commands,
        "run",
        cmd_run,
        (["--libs"], {"type": Path, "required": True, "help": "the classpath directory"}),
        (["--run-dir"], {"type": Path, "required": True, "help": "the node's config, data and state (its volume)"}),
        (
            ["--host"],
            {
                "type": pod_ip,
                "required": True,
                "help": "the address clients' listener binds and advertises (a pod's IP)",
            },
        ),
        (["--port"], {"type": listen_port, "default": 9092, "help": "clients' port"}),
        (["--controller-port"], {"type": listen_port, "default": 9093, "help": "the controller's port (127.0.0.1)"}),
        (["--partitions"], {"type": _positive, "default": 4, "help": "partitions per topic"}),
        (["--heap"], {"type": heap, "default": "512m", "help": "the JVM's maximum heap (-Xmx)"}),
        (["--java"], {"default": "java", "help": "the java program (Java 17 or later)"}),
    )
    command(commands, "stop", cmd_stop, run_dir)
    command(commands, "status", cmd_status, run_dir)
