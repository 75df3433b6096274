"""``python -m rtserve versions``: model versions on a running TorchServe, through its management API.

python -m rtserve versions register realtime-classifier 2.0
python -m rtserve versions promote realtime-classifier 2.0            # through the gate
python -m rtserve versions promote realtime-classifier 2.0 --force --reason "..."
python -m rtserve versions rollback realtime-classifier
python -m rtserve versions models realtime-classifier
python -m rtserve versions --inference http://rtserve:8080 verify realtime-classifier --archive ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from rtserve.cli.common import client, client_options, command, emit, group, settings, timed
from rtserve.errors import GateError
from rtserve.promotion.gate import ArchiveMeta, GateConfig
from rtserve.promotion.history import History
from rtserve.promotion.measure import verify_served
from rtserve.promotion.rollout import Rollout, Verification

logger = logging.getLogger(__name__)


def _rollout(args: argparse.Namespace):
    s = settings(args)
    verification = Verification(
        s.model_store, GateConfig.load(args.gate_config or s.gate_config), s.run.audit_log, s.run.path
    )
    return Rollout(client(args), History(s.run.history), args.model, verification)


def cmd_models(args: argparse.Namespace) -> None:
    """Show each version of a model: default, workers and queue."""
    rows = _rollout(args).status()
    sys.stdout.write(
        f"{'MODEL':22} {'VERSION':8} {'DEFAULT':7} {'WORKERS':9} {'MIN-MAX':7} {'QUEUED':6} {'QUEUE-FREE':10}\n"
    )
    for s in rows:
        sys.stdout.write(
            f"{args.model:22} {s.version:8} {'yes' if s.default else '':7} "
            f"{f'{s.workers_ready}/{s.workers} ready':9} {f'{s.min_workers}-{s.max_workers}':7} "
            f"{s.pending:<6} {s.queue_capacity:<10}\n"
        )


def cmd_register(args: argparse.Namespace) -> None:
    """Register <model>_<version>.mar from the model store (not made default)."""
    status, secs = timed(_rollout(args).register, args.version, args.workers)
    logger.info(
        "%s (%.1fs); the default is unchanged: `make promote MODEL_VERSION=%s` switches", status, secs, args.version
    )


def cmd_promote(args: argparse.Namespace) -> None:
    """Make a registered version the default through the gate (recorded for rollback)."""
    if args.force and not (args.reason or "").strip():
        raise GateError('--force needs --reason "why" (recorded in the rollout history)')
    previous, secs = timed(_rollout(args).promote, args.version, args.reason if args.force else None, args.requests)
    logger.info("%s default: %s -> %s (%.3fs)", args.model, previous, args.version, secs)


def cmd_verify(args: argparse.Namespace) -> None:
    """Check the version a URL serves against its archive: golden set and p99 (`make k8s-verify`)."""
    token = None
    if args.token_file:
        tokens = [
            line.strip()
            for line in Path(args.token_file).read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
        if not tokens:
            raise GateError(f"no token in {args.token_file}")
        token = tokens[0]
    api = client(args, token)
    archive = Path(args.archive)
    if archive.is_dir():  # the image's model store holds the one archive it serves
        found = sorted(archive.glob(f"{args.model}_*.mar"))
        if len(found) != 1:
            raise GateError(f"expected one {args.model}_*.mar in {archive}, found {len(found)}")
        archive = found[0]
    meta = ArchiveMeta.from_mar(archive)
    config = GateConfig.load(args.gate_config or settings(args).gate_config)
    if args.max_p99_ms is not None:
        if not 0 < args.max_p99_ms <= config.max_p99_ms:
            raise GateError(
                f"--max-p99-ms must be in (0, {config.max_p99_ms}] (the gate config's "
                f"max_p99_ms), got {args.max_p99_ms}"
            )
        config = dataclasses.replace(config, max_p99_ms=args.max_p99_ms)
    figures, secs = timed(verify_served, api, args.model, meta, config)
    logger.info("verified %s", json.dumps({**figures, "seconds": round(secs, 1)}))


def cmd_rollback(args: argparse.Namespace) -> None:
    """Return the default to the version before the last promote."""
    (old, new), secs = timed(_rollout(args).rollback)
    logger.info("%s default rolled back: %s -> %s (%.3fs)", args.model, old, new, secs)


def cmd_retire(args: argparse.Namespace) -> None:
    """Unregister a version that is not the default."""
    _, secs = timed(_rollout(args).retire, args.version)
    logger.info("%s %s unregistered (%.1fs)", args.model, args.version, secs)


def cmd_scale(args: argparse.Namespace) -> None:
    """Set the worker count of a version (default: the default version); waits for workers."""
    _, secs = timed(_rollout(args).scale, args.workers, args.version)
    logger.info("%s %s scaled to %d workers (%.1fs)", args.model, args.version or "(default)", args.workers, secs)


def cmd_history(args: argparse.Namespace) -> None:
    """Print the recorded default-version changes."""
    emit(_rollout(args).history.events(args.model))


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "versions", __doc__, parents=(client_options(),))
    model = (["model"], {})
    version = (["version"], {})
    command(commands, "models", cmd_models, model)
    command(commands, "register", cmd_register, model, version, (["--workers"], {"type": int}))
    command(
        commands,
        "promote",
        cmd_promote,
        model,
        version,
        (["--requests"], {"help": "JSON lines of recent request bodies the gate also compares on"}),
        (["--force"], {"action": "store_true", "help": "promote even if the gate refuses"}),
        (["--reason"], {"help": "why a forced promotion is needed (recorded)"}),
    )
    command(commands, "rollback", cmd_rollback, model)
    command(
        commands,
        "verify",
        cmd_verify,
        model,
        (["--archive"], {"required": True, "help": "the served .mar, or the model store holding it"}),
        (["--token-file"], {"help": "a file of shared gateway tokens (the first is used)"}),
        (["--max-p99-ms"], {"type": float, "help": "a stricter p99 bound than the gate config's"}),
    )
    command(commands, "retire", cmd_retire, model, version)
    command(commands, "scale", cmd_scale, model, (["workers"], {"type": int}), (["--version"], {}))
    command(commands, "history", cmd_history, model)
