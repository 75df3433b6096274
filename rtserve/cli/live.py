"""``python -m rtserve live``: shadow and canary a candidate version on a running TorchServe.

    python -m rtserve live shadow realtime-classifier 2.0 --percent 100
    python -m rtserve live shadow-report realtime-classifier
    python -m rtserve live shadow-stop realtime-classifier
    python -m rtserve live canary realtime-classifier 2.0 --percent 10    # starts the watcher
    python -m rtserve live canary-stop realtime-classifier

The work is :mod:`rtserve.promotion.live.local`'s; see docs/versions-and-promotion.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rtserve.cli.common import client, client_options, command, emit, group, settings
from rtserve.promotion.live.evidence import ShadowReport
from rtserve.promotion.live.local import ServerLive
from rtserve.promotion.live.routes import KEY_HEADER

logger = logging.getLogger(__name__)


def _live(args: argparse.Namespace) -> ServerLive:
    """The server the options name: its settings, a client of its APIs, the gate's config."""
    s = settings(args)
    return ServerLive(s, client(args), args.inference, Path(args.gate_config or s.gate_config))


def cmd_shadow(args: argparse.Namespace) -> None:
    """Mirror a share of live requests to a registered candidate (callers see the default only)."""
    live = _live(args)
    percent = live.shadow(args.model, args.version, args.percent)
    logger.info(
        "shadow: %g%% of %s's requests mirrored to %s (routes %s, live log %s); "
        "`make shadow-report` compares the answers",
        percent,
        args.model,
        args.version,
        live.run.live_routes,
        live.run.live_log,
    )


def cmd_shadow_stop(args: argparse.Namespace) -> None:
    """Stop mirroring (the canary, if any, is kept)."""
    route = _live(args).shadow_stop(args.model)
    if route is None:
        logger.info("no shadow is on; nothing changed")
        return
    logger.info("shadow of %s %s stopped", args.model, route.version)


def show_report(found: ShadowReport, saved_to: Path, as_json: bool) -> None:
    """Print a shadow report (text or JSON) and where it was saved."""
    if as_json:
        emit(found.json())
    else:
        sys.stdout.write(found.text() + "\n")
    logger.info("saved to %s", saved_to)


def cmd_shadow_report(args: argparse.Namespace) -> None:
    """Compare the candidate's answers to the mirrored requests with the default's (saved as JSON)."""
    live = _live(args)
    show_report(live.shadow_report(args.model, args.version), live.run.shadow_report, args.json)


def cmd_canary(args: argparse.Namespace) -> None:
    """Send a sticky share of live requests to a candidate; a watcher aborts it on a breach."""
    live = _live(args)
    started = live.canary(args.model, args.version, args.percent)
    if not started.started:
        logger.info("canary %s: share now %g%% (watcher pid %d)", args.version, args.percent, started.pid)
        return
    logger.info(
        "canary: %g%% of %s's requests (sticky per %s) answered by %s; watcher pid %d "
        "(log %s) aborts when, over %g s, the error rate, p99 or agreement breaches "
        "config/gate.yaml's live.canary",
        args.percent,
        args.model,
        KEY_HEADER,
        args.version,
        started.pid,
        live.run.canary_log,
        started.window_s,
    )


def cmd_canary_stop(args: argparse.Namespace) -> None:
    """Stop the canary watcher (by its PID file) and set the canary's share to 0."""
    live = _live(args)
    pid = live.stop_watcher()
    if pid is not None:
        logger.info("canary watcher %d stopped", pid)
    route = live.canary_stop(args.model)
    if route is None:
        logger.info("no canary has a share (none started, or aborted or stopped already); nothing else changed")
        return
    logger.info("canary of %s %s: share %g%% -> 0", args.model, route.version, route.percent)


def cmd_watch(args: argparse.Namespace) -> None:
    """The canary watcher (`make canary` starts it in the background)."""
    _live(args).watch(args.model, args.version)


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "live", __doc__, parents=(client_options(),))
    model = (["model"], {})
    version = (["version"], {})
    command(
        commands,
        "shadow",
        cmd_shadow,
        model,
        version,
        (["--percent"], {"type": float, "default": 100.0, "help": "share mirrored (default 100)"}),
    )
    command(
        commands,
        "shadow-report",
        cmd_shadow_report,
        model,
        (["--version"], {"help": "the candidate (default: the shadow route's)"}),
        (["--json"], {"action": "store_true", "help": "print the JSON instead of the text"}),
    )
    command(commands, "shadow-stop", cmd_shadow_stop, model)
    command(
        commands,
        "canary",
        cmd_canary,
        model,
        version,
        (["--percent"], {"type": float, "required": True, "help": "share answered by the candidate"}),
    )
    command(commands, "canary-stop", cmd_canary_stop, model)
    command(commands, "watch", cmd_watch, model, version)
