"""``python -m rtserve live``: shadow and canary a candidate version on a running TorchServe.

    python -m rtserve live shadow realtime-classifier 2.0 --percent 100
    python -m rtserve live shadow-report realtime-classifier
    python -m rtserve live shadow-stop realtime-classifier
    python -m rtserve live canary realtime-classifier 2.0 --percent 10    # starts the watcher
    python -m rtserve live canary-stop realtime-classifier

The frontend's agent follows the routes file in the run directory (live-routes.json) and logs
the candidate's answers to live-log.jsonl beside it; see docs/versions-and-promotion.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rtserve.cli.common import client, client_options, command, emit, group, settings

logger = logging.getLogger(__name__)

def _history(args: argparse.Namespace):
    from rtserve.promotion.history import History

    return History(settings(args).run.history)


def _candidate(args: argparse.Namespace) -> str:
    """The candidate's URL on this server, once it is registered, has a ready worker and is not
    the default.

    Raises:
        LiveError: it is not.
    """
    from rtserve.errors import LiveError
    from rtserve.promotion.rollout import Rollout, archive_name

    archive_name(args.model, args.version)  # a plain name
    status = {s.version: s for s in Rollout(client(args), _history(args), args.model).status()}
    found = status.get(args.version)
    if found is None:
        raise LiveError(f"{args.model} {args.version} is not registered (registered: "
                        f"{', '.join(sorted(status))}); `make register MODEL_VERSION={args.version}` "
                        "first; nothing changed")
    if found.default:
        raise LiveError(f"{args.model} {args.version} is the default: shadow or canary another "
                        "version; nothing changed")
    if found.workers_ready == 0:
        raise LiveError(f"{args.model} {args.version} has no ready worker "
                        f"(`make scale WORKERS=1 VERSION={args.version}`); nothing changed")
    return f"{args.inference.rstrip('/')}/predictions/{args.model}/{args.version}"


def _percent(args: argparse.Namespace) -> float:
    from rtserve.errors import LiveError

    if not 0 < args.percent <= 100:
        raise LiveError(f"--percent must be in (0, 100], got {args.percent:g}; nothing changed")
    return float(args.percent)


def _set(args: argparse.Namespace, kind: str, route) -> None:
    from rtserve.promotion.live import set_route

    run = settings(args).run
    set_route(run.live_routes, args.model, run.live_log.resolve(), kind, route)


def cmd_shadow(args: argparse.Namespace) -> None:
    """Mirror a share of live requests to a registered candidate (callers see the default only)."""
    from rtserve.promotion.live import Route

    percent = _percent(args)
    _set(args, "shadow", Route(args.version, percent, _candidate(args)))
    _history(args).append({"action": "shadow", "model": args.model, "version": args.version,
                           "percent": percent})
    run = settings(args).run
    logger.info("shadow: %g%% of %s's requests mirrored to %s (routes %s, live log %s); "
                "`make shadow-report` compares the answers", percent, args.model, args.version,
                run.live_routes, run.live_log)


def _route(args: argparse.Namespace, kind: str):
    from rtserve.promotion.live import read_routes

    routes = read_routes(settings(args).run.live_routes)
    return getattr(routes, kind) if routes else None


def cmd_shadow_stop(args: argparse.Namespace) -> None:
    """Stop mirroring (the canary, if any, is kept)."""
    route = _route(args, "shadow")
    if route is None:
        logger.info("no shadow is on; nothing changed")
        return
    _set(args, "shadow", None)
    _history(args).append({"action": "shadow-stop", "model": args.model, "version": route.version})
    logger.info("shadow of %s %s stopped", args.model, route.version)


def report(model: str, version: str, live_log: Path, records: Path, model_store: Path,
           save_to: Path, as_json: bool):
    """The shadow report of ``version`` over the live log and the default's records (a spool,
    or a file copied from pods), printed (text or JSON),
    saved as JSON to ``save_to`` and returned (``make shadow-report``, ``make
    k8s-shadow-report``, and ``make k8s-deploy``'s live evidence)."""
    import json

    from rtserve.errors import ArchiveError
    from rtserve.model.archive import read_archive
    from rtserve.promotion.live import shadow_report_from_files
    from rtserve.promotion.rollout import archive_name

    try:
        labels = read_archive(model_store / archive_name(model, version)).labels
    except ArchiveError as exc:  # the gaps need the candidate's label order; the rest does not
        logger.info("(disagreements unranked: %s)", exc)
        labels = None
    found = shadow_report_from_files(model, live_log, records, version, candidate_labels=labels)
    save_to.parent.mkdir(parents=True, exist_ok=True)
    save_to.write_text(json.dumps(found.json(), indent=2) + "\n")
    if as_json:
        emit(found.json())
    else:
        sys.stdout.write(found.text() + "\n")
    logger.info("saved to %s", save_to)
    return found


def cmd_shadow_report(args: argparse.Namespace) -> None:
    """Compare the candidate's answers to the mirrored requests with the default's (saved as JSON)."""
    from rtserve.errors import LiveError
    from rtserve.promotion.live import latest_shadow_version

    s = settings(args)
    route = _route(args, "shadow")
    version = args.version or (route.version if route else None) or latest_shadow_version(s.run.live_log)
    if version is None:
        raise LiveError(f"no shadow to report on: no shadow route and no shadow line in "
                        f"{s.run.live_log} (`make shadow MODEL_VERSION=...` first)")
    report(args.model, version, s.run.live_log, s.run.records, s.model_store, s.run.shadow_report,
           args.json)


def cmd_canary(args: argparse.Namespace) -> None:
    """Send a sticky share of live requests to a candidate; a watcher aborts it on a breach."""
    from rtserve.errors import LiveError
    from rtserve.promotion.gate import GateConfig
    from rtserve.promotion.live import KEY_HEADER, Route, watcher_pid

    s = settings(args)
    config = GateConfig.load(args.gate_config or s.gate_config)  # a bad file fails here, not later
    percent = _percent(args)
    url = _candidate(args)
    running = watcher_pid(s.run.canary_pid)
    current = _route(args, "canary")
    if running and current is not None and current.version != args.version:
        raise LiveError(f"the canary of {current.version} is watched (pid {running}): "
                        "`make canary-stop` first; nothing changed")
    _set(args, "canary", Route(args.version, percent, url, KEY_HEADER))
    _history(args).append({"action": "canary", "model": args.model, "version": args.version,
                           "percent": percent})
    if running:
        logger.info("canary %s: share now %g%% (watcher pid %d)", args.version, percent, running)
        return
    argv = [sys.executable, "-m", "rtserve", "live", "--run-dir", str(s.run.path.resolve()),
            "--gate-config", str(Path(args.gate_config or s.gate_config).resolve()),
            "watch", args.model, args.version]
    pid = start_watcher(argv, s.run)
    logger.info("canary: %g%% of %s's requests (sticky per %s) answered by %s; watcher pid %d "
                "(log %s) aborts when, over %g s, the error rate, p99 or agreement breaches "
                "config/gate.yaml's live.canary", percent, args.model, KEY_HEADER, args.version,
                pid, s.run.canary_log, config.live.canary.window_s)


def start_watcher(argv: list[str], run) -> int:
    """Start the canary watcher ``argv`` in the background (its own session, output appended to
    ``run.canary_log``) and record its PID in ``run.canary_pid``; returns the PID."""
    run.canary_log.parent.mkdir(parents=True, exist_ok=True)
    with open(run.canary_log, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    run.canary_pid.write_text(f"{proc.pid}\n")
    return proc.pid


def cmd_canary_stop(args: argparse.Namespace) -> None:
    """Stop the canary watcher (by its PID file) and set the canary's share to 0."""
    from dataclasses import replace

    from rtserve.promotion.live import stop_watcher

    s = settings(args)
    pid = stop_watcher(s.run.canary_pid)
    if pid is not None:
        logger.info("canary watcher %d stopped", pid)
    route = _route(args, "canary")
    if route is None or route.percent == 0:
        logger.info("no canary has a share (none started, or aborted or stopped already); "
                    "nothing else changed")
        return
    _set(args, "canary", replace(route, percent=0.0))
    _history(args).append({"action": "canary-stop", "model": args.model, "version": route.version,
                           "percent": route.percent})
    logger.info("canary of %s %s: share %g%% -> 0", args.model, route.version, route.percent)


def cmd_watch(args: argparse.Namespace) -> None:
    """The canary watcher (`make canary` starts it in the background)."""
    from rtserve.promotion.gate import GateConfig
    from rtserve.promotion.live import Watch
    from rtserve.server.disk import audit_cap

    s = settings(args)
    config = GateConfig.load(args.gate_config or s.gate_config)
    run_watcher(Watch(args.model, args.version, s.run.live_routes, s.run.live_log, s.run.records,
                      s.run.audit_log, _history(args), config.live.canary,
                      audit_bytes=audit_cap(s.run.path)),
                s.run.canary_pid)


def run_watcher(w, pid_file: Path, poll_s: float | None = None) -> dict | None:
    """Run the canary watcher ``w`` (:func:`rtserve.promotion.live.watch`), its lines timed on
    stdout, until it aborts the canary, sees it stopped, or gets SIGTERM; then remove
    ``pid_file`` if it still names this process. Returns the abort's event, if it aborted."""
    from rtserve.promotion.live import POLL_S, watch, watcher_pid

    def say(line: str) -> None:
        sys.stdout.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        sys.stdout.flush()

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `canary-stop`: end through finally
    try:
        return watch(w, say, poll_s=poll_s or POLL_S)
    finally:
        if watcher_pid(pid_file) == os.getpid():
            pid_file.unlink(missing_ok=True)


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "live", __doc__, parents=(client_options(),))
    model = (["model"], {})
    version = (["version"], {})
    command(commands, "shadow", cmd_shadow, model, version,
            (["--percent"], {"type": float, "default": 100.0, "help": "share mirrored (default 100)"}))
    command(commands, "shadow-report", cmd_shadow_report, model,
            (["--version"], {"help": "the candidate (default: the shadow route's)"}),
            (["--json"], {"action": "store_true", "help": "print the JSON instead of the text"}))
    command(commands, "shadow-stop", cmd_shadow_stop, model)
    command(commands, "canary", cmd_canary, model, version,
            (["--percent"], {"type": float, "required": True, "help": "share answered by the candidate"}))
    command(commands, "canary-stop", cmd_canary_stop, model)
    command(commands, "watch", cmd_watch, model, version)
