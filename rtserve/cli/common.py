"""What the command groups share: adding a command, the client options, settings from options."""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from rtserve.settings import Settings

#: Options that name a setting (``--run-dir`` is ``Settings.run_dir``, ...).
SETTING_OPTIONS = ("run_dir", "model_store", "config", "models", "model")


def group(
    groups: argparse._SubParsersAction, name: str, doc: str, parents: tuple[argparse.ArgumentParser, ...] = ()
) -> argparse._SubParsersAction:
    """Add the group ``name`` (its ``--help`` is ``doc``); returns where its commands go."""
    summary = doc.strip().split("\n\n", 1)[0].replace("\n", " ")
    parser = groups.add_parser(
        name,
        help=summary.split("``: ", 1)[-1],
        description=doc,
        parents=list(parents),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser.add_subparsers(dest="command", required=True, metavar="COMMAND")


def command(
    commands: argparse._SubParsersAction,
    name: str,
    func: Callable[[argparse.Namespace], Any],
    *arguments: tuple[list[str], dict],
    parents: tuple[argparse.ArgumentParser, ...] = (),
    **defaults: Any,
) -> argparse.ArgumentParser:
    """Add the command ``name``, run by ``func(args)`` (its docstring is the help)."""
    parser = commands.add_parser(name, help=func.__doc__, description=func.__doc__, parents=list(parents))
    for names, options in arguments:
        parser.add_argument(*names, **options)
    parser.set_defaults(func=func, **defaults)
    return parser


def named_port(text: str, names: tuple[str, ...]) -> tuple[str, int]:
    """``NAME=PORT`` with NAME one of ``names`` (an option's type: 0 asks for a free port).

    Raises:
        argparse.ArgumentTypeError: another name, or a port that is not in 0-65535.
    """
    name, _, port = text.partition("=")
    if name not in names or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PORT with NAME one of {', '.join(names)} (0: a free port), got {text!r}"
        )
    return name, int(port)


def listen_port(text: str) -> int:
    """An argument type: a port to listen on, 1-65535."""
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port in 1-65535, got {text!r}")
    return int(text)


def pod_ip(text: str) -> str:
    """An argument type: an IP address (a pod's own, ``status.podIP``), normalized."""
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address (the pod's: status.podIP), got {text!r}") from None


def heap(text: str) -> str:
    """An argument type: a JVM heap size, a whole number of MiB or GiB (``768m``, ``1g``)."""
    if not re.fullmatch(r"[1-9][0-9]*[mMgG]", text):
        raise argparse.ArgumentTypeError(f"expected a heap size such as 768m or 1g, got {text!r}")
    return text


def settings(args: argparse.Namespace) -> Settings:
    """The settings of this command: the environment's, then the options that name a setting."""
    return Settings.from_env(**{name: getattr(args, name, None) for name in SETTING_OPTIONS})


def client_options() -> argparse.ArgumentParser:
    """The options of the commands that call a running server's APIs (``client``, ``versions``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--inference", default="http://127.0.0.1:8080", help="inference API URL")
    p.add_argument("--management", default="http://127.0.0.1:8081", help="management API URL")
    # $RTSERVE_RUN_DIR is set in the container image: `kubectl exec` finds the pod's keys.
    p.add_argument(
        "--run-dir",
        help="the server's run directory (key_file.json, rollout history; default: $RTSERVE_RUN_DIR or .run)",
    )
    p.add_argument("--key-file", help="TorchServe's key_file.json (default: RUN_DIR/key_file.json)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP call")
    p.add_argument(
        "--model-store",
        help="the server's model store: archives' golden sets are read "
        "there (default: $RTSERVE_MODEL_STORE or model_store)",
    )
    p.add_argument("--gate-config", help="the gate's thresholds (default: config/gate.yaml)")
    return p


def client(args: argparse.Namespace, token: str | None = None):
    """A client for the server the options name (its key file, or a fixed ``token``)."""
    from rtserve.client.rest import Client

    if token:
        return Client(args.inference, args.management, timeout=args.timeout, token=token)
    key_file = args.key_file or settings(args).run.key_file
    return Client(args.inference, args.management, key_file=key_file, timeout=args.timeout)


def emit(value: Any) -> None:
    """Print ``value`` as indented JSON."""
    sys.stdout.write(json.dumps(value, indent=2) + "\n")


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Call ``fn`` and return (result, seconds)."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start
