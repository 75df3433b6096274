"""Command-line client for a running TorchServe: predictions, explanations and model versions.

    python -m rtserve predict realtime-classifier examples/request.json
    python -m rtserve explain realtime-classifier examples/request.json --target 0
    python -m rtserve register realtime-classifier 2.0
    python -m rtserve promote realtime-classifier 2.0            # through the gate
    python -m rtserve promote realtime-classifier 2.0 --force --reason "..."
    python -m rtserve rollback realtime-classifier
    python -m rtserve models realtime-classifier
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from rtserve.client import Client, TorchServeError
from rtserve.gate import ArchiveMeta, GateConfig, GateError
from rtserve.measure import verify_served
from rtserve.rollout import HISTORY_FILE, History, Rollout, Verification, timed

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent


def _client(args: argparse.Namespace) -> Client:
    key_file = args.key_file or Path(args.run_dir) / "key_file.json"
    return Client(args.inference, args.management, key_file=key_file, timeout=args.timeout)


def _rollout(args: argparse.Namespace) -> Rollout:
    verification = Verification(Path(args.model_store), GateConfig.load(args.gate_config),
                                Path(args.run_dir) / "logs" / "audit.log")
    return Rollout(_client(args), History(Path(args.run_dir) / HISTORY_FILE), args.model,
                   verification)


def _emit(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def cmd_token(args: argparse.Namespace) -> None:
    """Print a token key from the key file (for curl)."""
    client = _client(args)
    key = client.keys.get(args.kind)
    if not key:
        raise TorchServeError(f"no {args.kind} key in {client.keys.path} (is the server running?)")
    sys.stdout.write(key + "\n")


def cmd_predict(args: argparse.Namespace) -> None:
    """Send a JSON file as one prediction request."""
    payload = json.loads(Path(args.file).read_text())
    _emit(_client(args).predict(args.model, payload, args.version))


def cmd_explain(args: argparse.Namespace) -> None:
    """Send a JSON file as one explanation request (optionally for --target)."""
    payload = json.loads(Path(args.file).read_text())
    if args.target is not None:
        payload["target"] = args.target
    _emit(_client(args).explain(args.model, payload, args.version))


def cmd_models(args: argparse.Namespace) -> None:
    """Show each version of a model: default, workers and queue."""
    rows = _rollout(args).status()
    sys.stdout.write(f"{'MODEL':22} {'VERSION':8} {'DEFAULT':7} {'WORKERS':9} {'MIN-MAX':7} "
                     f"{'QUEUED':6} {'QUEUE-FREE':10}\n")
    for s in rows:
        sys.stdout.write(
            f"{args.model:22} {s.version:8} {'yes' if s.default else '':7} "
            f"{f'{s.workers_ready}/{s.workers} ready':9} {f'{s.min_workers}-{s.max_workers}':7} "
            f"{s.pending:<6} {s.queue_capacity:<10}\n")


def cmd_register(args: argparse.Namespace) -> None:
    """Register <model>_<version>.mar from the model store (not made default)."""
    status, secs = timed(_rollout(args).register, args.version, args.workers)
    logger.info("%s (%.1fs); the default is unchanged: `make promote MODEL_VERSION=%s` switches",
                status, secs, args.version)


def cmd_promote(args: argparse.Namespace) -> None:
    """Make a registered version the default through the gate (recorded for rollback)."""
    if args.force and not (args.reason or "").strip():
        raise GateError("--force needs --reason \"why\" (recorded in the rollout history)")
    previous, secs = timed(_rollout(args).promote, args.version,
                           args.reason if args.force else None, args.requests)
    logger.info("%s default: %s -> %s (%.3fs)", args.model, previous, args.version, secs)


def cmd_verify(args: argparse.Namespace) -> None:
    """Check the version a URL serves against its archive: golden set and p99 (`make k8s-verify`)."""
    token = None
    if args.token_file:
        tokens = [line.strip() for line in Path(args.token_file).read_text().splitlines()
                  if line.strip() and not line.lstrip().startswith("#")]
        if not tokens:
            raise GateError(f"no token in {args.token_file}")
        token = tokens[0]
    client = (Client(args.inference, args.management, timeout=args.timeout, token=token) if token
              else _client(args))
    archive = Path(args.archive)
    if archive.is_dir():  # the image's model store holds the one archive it serves
        found = sorted(archive.glob(f"{args.model}_*.mar"))
        if len(found) != 1:
            raise GateError(f"expected one {args.model}_*.mar in {archive}, found {len(found)}")
        archive = found[0]
    meta = ArchiveMeta.from_mar(archive)
    figures, secs = timed(verify_served, client, args.model, meta, GateConfig.load(args.gate_config))
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
    logger.info("%s %s scaled to %d workers (%.1fs)", args.model, args.version or "(default)",
                args.workers, secs)


def cmd_history(args: argparse.Namespace) -> None:
    """Print the recorded default-version changes."""
    _emit(_rollout(args).history.events(args.model))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one sub-command per operation)."""
    parser = argparse.ArgumentParser(prog="python -m rtserve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inference", default="http://127.0.0.1:8080", help="inference API URL")
    parser.add_argument("--management", default="http://127.0.0.1:8081", help="management API URL")
    # $RTSERVE_RUN_DIR is set in the container image: `kubectl exec` finds the pod's keys.
    parser.add_argument("--run-dir", default=os.environ.get("RTSERVE_RUN_DIR", str(REPO / ".run")),
                        help="the server's run directory (key_file.json, rollout history; "
                             "default: $RTSERVE_RUN_DIR or .run)")
    parser.add_argument("--key-file", help="TorchServe's key_file.json (default: RUN_DIR/key_file.json)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call")
    parser.add_argument("--model-store", default=os.environ.get("RTSERVE_MODEL_STORE",
                                                                str(REPO / "model_store")),
                        help="the server's model store: archives' golden sets are read there")
    parser.add_argument("--gate-config", help="the gate's thresholds (default: config/gate.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name, func, *arguments):
        p = sub.add_parser(name, help=func.__doc__, description=func.__doc__)
        for arg in arguments:
            p.add_argument(*arg[0], **arg[1])
        p.set_defaults(func=func)

    model = (["model"], {})
    version = (["version"], {})
    add("token", cmd_token, (["kind"], {"nargs": "?", "default": "inference",
                                        "choices": ["inference", "management", "API"]}))
    add("predict", cmd_predict, model, (["file"], {}), (["--version"], {}))
    add("explain", cmd_explain, model, (["file"], {}), (["--version"], {}),
        (["--target"], {"type": int, "help": "class index to explain (default: the prediction)"}))
    add("models", cmd_models, model)
    add("register", cmd_register, model, version, (["--workers"], {"type": int}))
    add("promote", cmd_promote, model, version,
        (["--requests"], {"help": "JSON lines of recent request bodies the gate also compares on"}),
        (["--force"], {"action": "store_true", "help": "promote even if the gate refuses"}),
        (["--reason"], {"help": "why a forced promotion is needed (recorded)"}))
    add("rollback", cmd_rollback, model)
    add("verify", cmd_verify, model, (["--archive"], {"required": True, "help": "the served .mar, or the model store holding it"}),
        (["--token-file"], {"help": "a file of shared gateway tokens (the first is used)"}))
    add("retire", cmd_retire, model, version)
    add("scale", cmd_scale, model, (["workers"], {"type": int}), (["--version"], {}))
    add("history", cmd_history, model)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; errors print one clear line and exit 1."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (TorchServeError, GateError) as exc:
        logger.error("error: %s", exc)
        return 1
    return 0
