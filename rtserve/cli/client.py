"""``python -m rtserve client``: call a running server's inference API (and print a token for curl).

python -m rtserve client token                 # the inference key, for curl
python -m rtserve client predict realtime-classifier examples/request.json
python -m rtserve client explain realtime-classifier examples/request.json --target 0
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rtserve.cli.common import client, client_options, command, emit, group
from rtserve.errors import TorchServeError


def cmd_token(args: argparse.Namespace) -> None:
    """Print a token key from the key file (for curl)."""
    api = client(args)
    key = api.keys.get(args.kind)
    if not key:
        raise TorchServeError(f"no {args.kind} key in {api.keys.path} (is the server running?)")
    sys.stdout.write(key + "\n")


def cmd_predict(args: argparse.Namespace) -> None:
    """Send a JSON file as one prediction request."""
    payload = json.loads(Path(args.file).read_text())
    emit(client(args).predict(args.model, payload, args.version))


def cmd_explain(args: argparse.Namespace) -> None:
    """Send a JSON file as one explanation request (optionally for --target)."""
    payload = json.loads(Path(args.file).read_text())
    if args.target is not None:
        payload["target"] = args.target
    emit(client(args).explain(args.model, payload, args.version))


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "client", __doc__, parents=(client_options(),))
    command(
        commands,
        "token",
        cmd_token,
        (["kind"], {"nargs": "?", "default": "inference", "choices": ["inference", "management", "API"]}),
    )
    command(commands, "predict", cmd_predict, (["model"], {}), (["file"], {}), (["--version"], {}))
    command(
        commands,
        "explain",
        cmd_explain,
        (["model"], {}),
        (["file"], {}),
        (["--version"], {}),
        (["--target"], {"type": int, "help": "class index to explain (default: the prediction)"}),
    )
