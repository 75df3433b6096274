"""``python -m rtserve probe``: the pod's probe checks run once, and its pre-stop drain (rtserve.server.probe).

    python -m rtserve probe ready   # /ping is healthy AND the model answers a real prediction
    python -m rtserve probe live    # the frontend answers HTTP at all (any status)
    python -m rtserve probe drain --propagation 10 --timeout 15   # preStop hook

Every command prints one line (kept in the pod's events) and exits 0 on success, 1 on failure.
The run directory and model: ``--run-dir`` / ``--model``, else ``$RTSERVE_RUN_DIR`` / ``$RTSERVE_MODEL``.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from rtserve.cli.common import command, group, settings
from rtserve.server.probe import drain, live, ready


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--run-dir", type=Path, help="the server's run directory (default: $RTSERVE_RUN_DIR)")
    p.add_argument("--model", help="model that must answer (default: $RTSERVE_MODEL)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="ready/live: seconds per HTTP call (3); drain: most seconds to wait for idleness after --propagation (15)",
    )
    p.add_argument(
        "--propagation",
        type=float,
        default=10.0,
        help="drain: seconds between readiness turning false and the idle wait",
    )
    p.add_argument(
        "--quiet", type=float, default=2.0, help="drain: idle means nothing arrived, queued or running for this long"
    )
    return p


def _verdict(result) -> int:
    sys.stdout.write(result.message + "\n")
    return 0 if result.ok else 1


def cmd_ready(args: argparse.Namespace) -> int:
    """Ready: not draining, /ping healthy, and the model answers a prediction."""
    s = settings(args)
    return _verdict(ready(s.run_dir, s.model, args.timeout or 3.0))


def cmd_live(args: argparse.Namespace) -> int:
    """Live: the frontend answers /ping with any HTTP status (models may be loading)."""
    return _verdict(live(settings(args).run_dir, args.timeout or 3.0))


def cmd_drain(args: argparse.Namespace) -> int:
    """Readiness false, then wait for traffic to move away and in-flight work to finish."""
    s = settings(args)
    timeout = 15.0 if args.timeout is None else args.timeout
    timer = None
    if s.gateway_dir is not None:
        # Once the endpoints are gone, each gateway answer closes its client's keep-alive connection, so the
        # client reconnects to a ready pod (kube-proxy routes only new connections). Connections still open
        # when the drain ends are closed then: closing one at once would race a request sent on it.
        from rtserve.gateway.nginx import close_client_connections, closing, draining

        # First, the gateway's /readyz answers 503: the kubelet's HTTP probe of the gateway takes
        # the pod out of the serving endpoints at once (the rtserve container's /ready follows
        # once the drain below writes its marker).
        draining(s.gateway_dir, True)
        timer = threading.Timer(args.propagation, closing, args=(s.gateway_dir, True))
        timer.daemon = True
        timer.start()
    try:
        # A failed preStop hook only adds a FailedPreStopHook event; SIGTERM follows anyway.
        return _verdict(drain(s.run_dir, args.propagation, timeout, args.quiet, s.log_location))
    finally:
        if timer is not None:
            timer.cancel()
            closing(s.gateway_dir, True)
            close_client_connections(s.gateway_dir)


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "probe", __doc__)
    for name, func in (("ready", cmd_ready), ("live", cmd_live), ("drain", cmd_drain)):
        command(commands, name, func, parents=(options(),))
