"""Command-line client for a running TorchServe (see ``python -m rtserve --help``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from rtserve.client import Client, TorchServeError

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent


def _client(args: argparse.Namespace) -> Client:
    return Client(args.inference, args.management, key_file=args.key_file, timeout=args.timeout)


def _emit(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def cmd_token(args: argparse.Namespace) -> None:
    """Print a token key from the key file (for curl)."""
    key = _client(args).keys.get(args.kind)
    if not key:
        raise TorchServeError(f"no {args.kind} key in {args.key_file} (is the server running?)")
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
    """List models, or describe every version of one."""
    client = _client(args)
    _emit(client.describe(args.model, "all") if args.model else client.list_models())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (one sub-command per operation)."""
    parser = argparse.ArgumentParser(prog="python -m rtserve", description=__doc__)
    parser.add_argument("--inference", default="http://127.0.0.1:8080", help="inference API URL")
    parser.add_argument("--management", default="http://127.0.0.1:8081", help="management API URL")
    parser.add_argument("--key-file", default=str(REPO / ".run" / "key_file.json"),
                        help="TorchServe's key_file.json (token authorization)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("token", help=cmd_token.__doc__)
    p.add_argument("kind", nargs="?", default="inference", choices=["inference", "management", "API"])
    p.set_defaults(func=cmd_token)

    p = sub.add_parser("predict", help=cmd_predict.__doc__)
    p.add_argument("model")
    p.add_argument("file")
    p.add_argument("--version")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("explain", help=cmd_explain.__doc__)
    p.add_argument("model")
    p.add_argument("file")
    p.add_argument("--target", type=int, help="class index to explain (default: the prediction)")
    p.add_argument("--version")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("models", help=cmd_models.__doc__)
    p.add_argument("model", nargs="?")
    p.set_defaults(func=cmd_models)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; errors print one clear line and exit 1."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except TorchServeError as exc:
        logger.error("error: %s", exc)
        return 1
    return 0
