"""Kubernetes probes and the pre-stop drain for a TorchServe started by ``rtserve.server run``.

Token authorization stays on, so Kubernetes' own ``httpGet`` probes cannot call ``/ping``: the
inference key is random per start and lives in ``key_file.json`` in the server's run directory,
inside the pod. These exec probes read that key (renewing it with the API key when it expires)
and the effective ``config.properties`` the server wrote there, and call the server on loopback.

    python -m rtserve.probe ready   # /ping is healthy AND the model answers a real prediction
    python -m rtserve.probe live    # the frontend answers HTTP at all (any status)
    python -m rtserve.probe drain --propagation 10 --timeout 15   # preStop hook

``drain`` first creates the ``drain`` file in the run directory, which makes ``ready`` fail from
then on, waits ``propagation`` seconds for endpoints and proxies to stop sending new requests,
then waits until TorchServe is idle (no queued job, no inference request completed for
``quiet`` seconds) or ``timeout`` passes. Only then does the kubelet send SIGTERM.

Every command prints one line (the kubelet keeps it in the pod's events) and exits 0 on
success, 1 on failure. The run directory and model come from ``--run-dir`` / ``--model`` or
``$RTSERVE_RUN_DIR`` / ``$RTSERVE_MODEL``, the variables the container sets for the server too.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rtserve.client import Client, TorchServeError
from rtserve.server import DRAIN_FILE, read_properties, sample_payload

logger = logging.getLogger(__name__)

#: Access-log markers of inference requests (not /ping, not management calls).
INFERENCE_PATHS = (" /predictions/", " /explanations/")


@dataclass
class Result:
    """A probe's verdict and the one line that explains it."""

    ok: bool
    message: str


def loopback(address: str) -> str:
    """``http://0.0.0.0:8080`` (a listener bound to every interface) -> ``http://127.0.0.1:8080``."""
    parts = urlsplit(address)
    host = parts.hostname or "127.0.0.1"
    if host in ("0.0.0.0", "::", "localhost"):
        host = "127.0.0.1"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme or "http", netloc, "", "", ""))


def local_client(run_dir: Path, timeout: float) -> Client:
    """A client for the server in ``run_dir``, from its effective config and key file.

    Raises:
        FileNotFoundError: the server has not written its config yet.
    """
    props = read_properties(run_dir / "config.properties")
    return Client(loopback(props["inference_address"]), loopback(props["management_address"]),
                  key_file=run_dir / "key_file.json", timeout=timeout, retries=0)


def ready(run_dir: Path, model: str, timeout: float = 3.0) -> Result:
    """Ready when not draining, ``/ping`` is healthy and ``model`` answers a prediction."""
    if (run_dir / DRAIN_FILE).exists():
        return Result(False, "draining: not accepting new requests")
    if not (run_dir / "key_file.json").exists():
        return Result(False, "TorchServe has not written key_file.json yet")
    try:
        client = local_client(run_dir, timeout)
        if not client.ping():
            return Result(False, "/ping: a model is not healthy yet")
        answer = client.predict(model, sample_payload())
    except (OSError, KeyError, TorchServeError) as exc:
        return Result(False, f"not ready: {exc}")
    if not isinstance(answer, dict) or "prediction" not in answer:
        return Result(False, f"{model} answered without a prediction: {answer!r:.200}")
    return Result(True, f"ready: {model} {answer.get('model_version', '?')} answers")


def live(run_dir: Path, timeout: float = 3.0) -> Result:
    """Live when the frontend answers ``/ping`` with any HTTP status (models may be loading)."""
    try:
        client = local_client(run_dir, timeout)
        healthy = client.ping()
    except (OSError, KeyError) as exc:
        return Result(False, f"no config yet: {exc}")
    except TorchServeError as exc:
        if exc.status:
            return Result(True, f"live: frontend answered {exc.status}")
        return Result(False, f"frontend does not answer: {exc}")
    return Result(True, f"live: /ping {'200' if healthy else '500'}")


def inference_requests_done(log_dir: Path) -> int:
    """How many inference requests TorchServe has answered (lines of its access log)."""
    try:
        with open(log_dir / "access_log.log", errors="replace") as log:
            return sum(1 for line in log if any(p in line for p in INFERENCE_PATHS))
    except OSError:
        return 0


def pending_jobs(client: Client, model: str) -> int:
    """Requests queued for ``model``'s default version and not yet taken by a worker."""
    desc = client.describe(model)[0]
    return int(desc.get("jobQueueStatus", {}).get("pendingRequests", 0))


def drain(run_dir: Path, model: str, propagation: float, timeout: float, quiet: float = 2.0,
          poll: float = 0.25) -> Result:
    """Stop readiness, wait for traffic to move away, then wait for in-flight work to finish.

    Args:
        run_dir: the server's run directory (the drain file is created there).
        model: the model whose job queue must be empty.
        propagation: seconds to wait after readiness turns false, for endpoints to update.
        timeout: the most seconds to wait for idleness after ``propagation``.
        quiet: TorchServe is idle once its queue is empty and no inference request has
            completed for this long.
        poll: seconds between checks.
    """
    (run_dir / DRAIN_FILE).touch()
    logger.info("drain: readiness is now false; waiting %.0fs for endpoints to update", propagation)
    time.sleep(propagation)
    client = local_client(run_dir, timeout=min(3.0, max(timeout, 0.5)))
    log_dir = Path(os.environ.get("LOG_LOCATION", run_dir / "logs"))
    started = time.monotonic()
    done = inference_requests_done(log_dir)
    last_change = started
    while True:
        now = time.monotonic()
        count = inference_requests_done(log_dir)
        if count != done:
            done, last_change = count, now
        try:
            pending = pending_jobs(client, model)
        except TorchServeError as exc:
            if exc.status == 0:
                return Result(True, f"drained: TorchServe no longer answers ({exc})")
            pending = -1  # unknown: keep waiting
        if pending == 0 and now - last_change >= quiet:
            return Result(True, f"drained after {now - started:.1f}s: queue empty, "
                                f"no request completed for {quiet:.1f}s ({done} served)")
        if now - started >= timeout:
            return Result(False, f"drain timed out after {timeout:.0f}s "
                                 f"({pending} queued); stopping anyway")
        time.sleep(poll)


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m rtserve.probe``."""
    parser = argparse.ArgumentParser(prog="python -m rtserve.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["ready", "live", "drain"])
    parser.add_argument("--run-dir", type=Path,
                        default=Path(os.environ.get("RTSERVE_RUN_DIR", ".run")),
                        help="the server's run directory (default: $RTSERVE_RUN_DIR)")
    parser.add_argument("--model", default=os.environ.get("RTSERVE_MODEL", "realtime-classifier"),
                        help="model that must answer (default: $RTSERVE_MODEL)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="ready/live: seconds per HTTP call (3); drain: most seconds to wait "
                             "for idleness after --propagation (15)")
    parser.add_argument("--propagation", type=float, default=10.0,
                        help="drain: seconds between readiness turning false and the idle wait")
    parser.add_argument("--quiet", type=float, default=2.0,
                        help="drain: idle means no inference request completed for this long")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one check; print its one-line verdict; exit 0 when it passed."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    if args.check == "ready":
        result = ready(args.run_dir, args.model, args.timeout or 3.0)
    elif args.check == "live":
        result = live(args.run_dir, args.timeout or 3.0)
    else:
        timeout = 15.0 if args.timeout is None else args.timeout
        # A failed preStop hook only adds a FailedPreStopHook event; SIGTERM follows anyway.
        result = drain(args.run_dir, args.model, args.propagation, timeout, args.quiet)
    sys.stdout.write(result.message + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
