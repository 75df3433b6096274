"""``python -m rtserve records``: every answered or rejected request's record (rtserve.records).

    python -m rtserve records find REQUEST_ID [--run-dir .run]          # one JSON object; exit 3: none
    python -m rtserve records list [--version V] --since 10m [--limit 100] # JSON lines, oldest first
    python -m rtserve records export --version V --since 1d --out FILE    # JSON lines for training
    python -m rtserve records ship --spool DIR --budget BYTES [--store HOST:PORT,...]

The lookups read the store the server of ``--run-dir`` was started with (or ``--store``), else its
local spool. ``ship`` is the shipper the server runs beside TorchServe (here for a look by hand).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path

from rtserve.cli.common import command, group, settings
from rtserve.errors import StoreUnavailable
from rtserve.records.lookup import Source, contact_points, export, since
from rtserve.records.shipper import Shipper, ShipperConfig, ShipperMetrics

logger = logging.getLogger(__name__)

#: ``records find``'s exit status when there is no such record.
NOT_FOUND = 3


def _quiet_driver() -> None:
    """The Cassandra driver says which data center it chose at each connect (INFO): not news."""
    logging.getLogger("cassandra").setLevel(logging.WARNING)


def _source(args: argparse.Namespace):
    _quiet_driver()
    found = Source.of(settings(args).run_dir, args.store, args.keyspace)
    print(f"(reading {found.describe()})", file=sys.stderr)
    return found


def cmd_find(args: argparse.Namespace) -> int:
    """Print the record of REQUEST_ID as one JSON object (exit 3 when there is none)."""
    record = _source(args).find(args.request_id)
    if record is None:
        print(f"no record of request {args.request_id}", file=sys.stderr)
        return NOT_FOUND
    print(json.dumps(record.document))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """Print the newest --limit records since --since (of --version), one JSON line each, oldest first."""
    model = settings(args).model
    for record in _source(args).latest(model, since(args.since), args.version, args.limit):
        print(json.dumps(record.document))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write every record since --since (of --version) to --out as JSON lines, oldest first."""
    source = _source(args)
    model = settings(args).model
    count = export(source.window(model, since(args.since), args.version), args.out, raw=args.raw)
    print(f">> {count} records of {model}{' ' + args.version if args.version else ''} since {args.since} -> {args.out}")
    return 0


def cmd_ship(args: argparse.Namespace) -> int:
    """Ship the spool's records to the store until SIGTERM, then ship what is left (the server runs it)."""
    _quiet_driver()
    config = ShipperConfig(args.spool.resolve(), args.budget, keep=args.keep, stop_seconds=args.stop_seconds)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    store = None
    if args.store:
        from rtserve.records.store import Store

        points = contact_points(args.store)
        while store is None and not stopping.is_set():
            try:
                store = Store.connect(points, keyspace=args.keyspace, ttl_seconds=int(args.ttl_days * 86400))
                store.ensure_schema()
            except StoreUnavailable as exc:
                logger.warning("records store %s not reachable yet (the spool keeps the records): %s", args.store, exc)
                store = None
                stopping.wait(5.0)
        if store is None:
            return 0
    shipper = Shipper(config, store, ShipperMetrics())
    logger.info(
        "records shipper: spool %s (budget %d bytes), %s",
        config.spool,
        config.budget,
        f"store {args.store} (keyspace {args.keyspace}, TTL {args.ttl_days:g} days)"
        if store
        else "no store: the spool is kept locally",
    )
    try:
        shipper.run(stopping)
    finally:
        if store is not None:
            store.close()
    logger.info("records shipper stopped: %s", shipper.totals)
    return 0


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return int(text)


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "records", __doc__)
    where = [
        (["--run-dir"], {"type": Path, "help": "the server's run directory (default: $RTSERVE_RUN_DIR or .run)"}),
        (
            ["--store"],
            {"help": "the store's contact points host:port[,...] (default: the server's, else its local spool)"},
        ),
        (["--keyspace"], {"help": "the store's keyspace (default: the server's, else rtserve)"}),
        (["--model"], {"help": "the model (default: $RTSERVE_MODEL or realtime-classifier)"}),
    ]
    command(commands, "find", cmd_find, (["request_id"], {"metavar": "REQUEST_ID"}), *where)
    command(
        commands,
        "list",
        cmd_list,
        (["--since"], {"required": True, "help": "30s, 10m, 2h, 1d or an ISO 8601 time"}),
        (["--version"], {"help": "only this model version"}),
        (["--limit"], {"type": _positive, "default": 100, "help": "at most this many (the newest)"}),
        *where,
    )
    command(
        commands,
        "export",
        cmd_export,
        (["--since"], {"required": True, "help": "30s, 10m, 2h, 1d or an ISO 8601 time"}),
        (["--version"], {"help": "only this model version"}),
        (["--out"], {"type": Path, "required": True, "help": "the JSON lines file to write"}),
        (
            ["--raw"],
            {"action": "store_true", "help": "inputs as stored (float32 in base64, row-major), not as numbers"},
        ),
        *where,
    )
    command(
        commands,
        "ship",
        cmd_ship,
        (["--spool"], {"type": Path, "required": True, "help": "the spool directory"}),
        (["--budget"], {"type": _positive, "required": True, "help": "the spool's byte budget"}),
        (["--store"], {"help": "the store's contact points host:port[,...] (none: keep locally)"}),
        (["--keyspace"], {"default": "rtserve"}),
        (["--ttl-days"], {"type": float, "default": 30.0, "help": "the records' time to live"}),
        (
            ["--keep"],
            {
                "type": float,
                "default": 0.5,
                "help": "keep shipped segments while the spool holds at most this share of its budget",
            },
        ),
        (
            ["--stop-seconds"],
            {"type": float, "default": 20.0, "help": "most seconds to ship what is left after SIGTERM"},
        ),
        log_format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
