r"""``python -m rtserve server``: start, run, drain or stop a TorchServe instance in its run directory.

    python -m rtserve server start --run-dir .run --models realtime-classifier=realtime-classifier_1.0.mar
    python -m rtserve server stop --run-dir .run [--drain]
    python -m rtserve server drain --run-dir .run      # not ready, wait until idle (preStop)
    python -m rtserve server status --run-dir .run
    python -m rtserve server run                       # the container's main process

and the two processes a server runs beside TorchServe (it starts them; for a look by hand):

    python -m rtserve server exporter --listen http://127.0.0.1:8082 \
        --upstream http://127.0.0.1:41234 --dir .run/metrics --access-log .run/logs/access_log.log
    python -m rtserve server oip --listen http://127.0.0.1:8093 --run-dir .run \
        --model-store model_store --models realtime-classifier=realtime-classifier_1.0.mar

The options that name a setting default to the environment's (``$RTSERVE_RUN_DIR``, ...: rtserve.settings).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rtserve.cli.common import command, group, settings
from rtserve.errors import RtserveError, ServerError
from rtserve.server.properties import RECORDS_STORE_KEY
from rtserve.settings import RunDir

logger = logging.getLogger(__name__)


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--run-dir", type=Path, help="default: $RTSERVE_RUN_DIR or .run")
    p.add_argument("--model-store", type=Path, help="default: $RTSERVE_MODEL_STORE or model_store")
    p.add_argument(
        "--config",
        type=Path,
        help="default: $RTSERVE_CONFIG, else config.properties (start, run); the run dir's copy (others)",
    )
    p.add_argument("--models", nargs="*", help="NAME=FILE.mar to load at start (default: $RTSERVE_MODELS)")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=15.0,
        help="run: seconds TorchServe gets to stop after SIGTERM before SIGKILL",
    )
    p.add_argument(
        "--probes",
        help="run: answer the kubelet's HTTP probes (GET /ready, /live) on HOST:PORT, e.g. 0.0.0.0:8087 (default: off)",
    )
    p.add_argument("--drain", action="store_true", help="stop: drain first (not ready, wait until idle), then SIGTERM")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="drain: give up waiting after this many seconds")
    p.add_argument("--quiet", type=float, default=1.0, help="drain: seconds with no arrival, queued or running request")
    p.add_argument("--min-wait", type=float, default=0.0, help="drain: wait at least this long (readiness propagation)")
    p.add_argument(
        "--records-store",
        help="start: the records store's contact points host:port[,...]; 'auto': the "
        "node `make cassandra` runs from RUN_DIR/cassandra, if it runs; '': none "
        "(the spool is kept locally). Default: config.properties' rtserve_records_store",
    )
    return p


def records_store(choice: str, run_dir: Path) -> str:
    """``--records-store``: contact points as given, or for ``auto`` the local node's address.

    That is the node ``make cassandra`` runs from ``RUN_DIR/cassandra`` ("" when none runs there).
    """
    if choice != "auto":
        return choice
    from rtserve.records import local

    where = RunDir(run_dir).cassandra
    try:
        address = local.load_state(where)["address"]
    except (RtserveError, KeyError):
        return ""
    return address if local.pid(where) is not None else ""


def _server(args: argparse.Namespace):
    """The instance of ``--run-dir``.

    A running one is reached through the effective config it was started with (unless ``--config`` or
    ``$RTSERVE_CONFIG`` names one).
    """
    from rtserve.server.torchserve import TorchServe

    s = settings(args)
    config = s.config
    if config is None and args.command not in ("start", "run") and s.run.config.exists():
        config = s.run.config
    overrides = {}
    if args.command == "start" and args.records_store is not None:
        overrides[RECORDS_STORE_KEY] = records_store(args.records_store, s.run_dir)
    return TorchServe(s.run_dir, s.model_store, list(s.models), config or s.torchserve_config, overrides, settings=s)


def cmd_start(args: argparse.Namespace) -> int:
    """Start TorchServe in the background and wait until every model answers."""
    server = _server(args)
    try:
        server.start()
        waited = server.wait_ready(args.timeout, server.model_names)
    except ServerError as exc:
        logger.error("%s", exc)
        server.stop()
        return 1
    props = server.props
    logger.info("TorchServe ready in %.1fs (pid %d), logs in %s", waited, server.pid(), server.log_dir)
    logger.info("  inference:  %s", props["inference_address"])
    logger.info("  management: %s", props["management_address"])
    logger.info("  metrics:    %s", props["metrics_address"])
    logger.info("  keys:       %s", server.key_file)
    store = props.get("rtserve_records_store", "").strip()
    logger.info(
        "  records:    %s",
        f"shipped to {store}"
        if store
        else f"kept in {server.files.records} (no records store: make cassandra, then start again)",
    )
    return 0


def _stop_or_drain(args: argparse.Namespace) -> int:
    server = _server(args)
    pid = server.pid()
    if pid is None:
        logger.info("TorchServe is not running.")
        return 0
    report = (
        server.drain(args.drain_timeout, args.quiet, args.min_wait) if args.command == "drain" or args.drain else None
    )
    if args.command == "stop":
        server.stop()
        logger.info("TorchServe stopped (pid %s).", pid)
    return 0 if report is None or report.drained else 1


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the running instance (with --drain: drain it first)."""
    return _stop_or_drain(args)


def cmd_drain(args: argparse.Namespace) -> int:
    """Mark the instance not ready, then wait until no request arrives, waits or runs (preStop)."""
    return _stop_or_drain(args)


def cmd_status(args: argparse.Namespace) -> int:
    """Say whether an instance runs from the run directory (exit 1 when none does)."""
    server = _server(args)
    pid = server.pid()
    logger.info(f"running (pid {pid}){', draining' if server.draining else ''}" if pid else "not running")
    return 0 if pid else 1


def cmd_run(args: argparse.Namespace) -> int:
    """Stay in the foreground until SIGTERM (the container's entry point)."""
    from rtserve import container

    return container.run(settings(args), args.stop_timeout, args.probes)


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve TorchServe's and the handler's metrics on --listen until SIGTERM (a server's sidecar)."""
    from rtserve.observability.exporter import serve

    return serve(
        args.listen, args.upstream, args.dir, args.access_log, args.warmup_requests, args.outputs, args.output_bytes
    )


def cmd_oip(args: argparse.Namespace) -> int:
    """Serve the OIP model metadata and readiness routes on --listen until SIGTERM.

    A server's sidecar: the frontend's agent sends those routes there.
    """
    from rtserve.server.oip import serve

    s = settings(args)
    return serve(args.listen, s.run_dir, s.model_store, list(s.models))


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "server", __doc__)
    for name, func in (
        ("start", cmd_start),
        ("stop", cmd_stop),
        ("status", cmd_status),
        ("drain", cmd_drain),
        ("run", cmd_run),
    ):
        command(commands, name, func, parents=(options(),))
    listen = (["--listen"], {"required": True, "help": "http://127.0.0.1:PORT to serve on"})
    command(
        commands,
        "exporter",
        cmd_exporter,
        listen,
        (["--upstream"], {"help": "TorchServe's own metrics listener (http://host:port)"}),
        (["--dir"], {"type": Path, "required": True, "help": "the workers' metrics directory"}),
        (["--access-log"], {"type": Path, "help": "TorchServe's access_log.log (request latency)"}),
        (
            ["--warmup-requests"],
            {"type": int, "default": 0, "help": "leave this many warm-up requests out of the latency histogram"},
        ),
        (
            ["--outputs"],
            {
                "type": Path,
                "nargs": "*",
                "default": [],
                "help": "output files to keep within --output-bytes each (copy-truncate)",
            },
        ),
        (
            ["--output-bytes"],
            {"type": int, "default": 0, "help": "each output file's cap, with its one backup (0: none)"},
        ),
        log_format="%(asctime)s %(message)s",
        log_stream="stderr",
    )
    command(
        commands,
        "oip",
        cmd_oip,
        listen,
        (["--run-dir"], {"type": Path, "help": "default: $RTSERVE_RUN_DIR or .run"}),
        (["--model-store"], {"type": Path, "help": "default: $RTSERVE_MODEL_STORE"}),
        (["--models"], {"nargs": "*", "help": "NAME=FILE.mar (default: $RTSERVE_MODELS)"}),
    )
