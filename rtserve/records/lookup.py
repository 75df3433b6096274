"""Look records up by request id, by time and version, or a whole window for a training job.

They are read from the store the server's effective ``config.properties`` names (``rtserve_records_store``),
else from its local spool; an explicit store overrides both.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rtserve.errors import RecordsError
from rtserve.records.record import Record, parse_time
from rtserve.records.spool import find_local, local_records, select
from rtserve.server.properties import RECORDS_KEYSPACE_KEY, RECORDS_STORE_KEY, read_properties
from rtserve.settings import RunDir

_SPAN = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def since(text: str, now: datetime | None = None) -> datetime:
    """A window's start: a span back from now (``30s``, ``10m``, ``2h``, ``1d``) or an ISO 8601 time with offset.

    Raises:
        RecordsError: neither.
    """
    found = _SPAN.match(text.strip())
    if found:
        now = now or datetime.now(UTC)
        return now - timedelta(seconds=float(found.group(1)) * _UNITS[found.group(2)])
    try:
        return parse_time(text)
    except RecordsError:
        raise RecordsError(
            f"--since must be a span back from now (30s, 10m, 2h, 1d) or an ISO 8601 time with its offset, got {text!r}"
        ) from None


def contact_points(text: str) -> list[str]:
    """``host:port,host:port`` as a list (each checked).

    Raises:
        RecordsError: an entry is not ``host:port``.
    """
    points = [p.strip() for p in text.split(",") if p.strip()]
    for point in points:
        host, _, port = point.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RecordsError(
                f"the records store's contact points must be host:port[,host:port...], got {point!r} in {text!r}"
            )
    if not points:
        raise RecordsError("no contact point given for the records store")
    return points


@dataclass(frozen=True)
class Source:
    """Where records are read: a store's contact points and keyspace, or a local spool.

    Attributes:
        store: contact points (None: read ``spool``).
        keyspace: the store's keyspace.
        spool: the local spool directory.
    """

    store: list[str] | None
    keyspace: str
    spool: Path

    @classmethod
    def of(cls, run_dir: Path, store: str | None = None, keyspace: str | None = None) -> Source:
        """The source for the server of ``run_dir``.

        ``store`` when given, else the store its effective config names, else its spool.

        Raises:
            RecordsError: a contact point is not ``host:port``.
        """
        files = RunDir(Path(run_dir))
        props = read_properties(files.config) if files.config.exists() else {}
        text = store if store is not None else props.get(RECORDS_STORE_KEY, "").strip()
        space = keyspace or props.get(RECORDS_KEYSPACE_KEY, "").strip() or "rtserve"
        return cls(contact_points(text) if text else None, space, files.records)

    def describe(self) -> str:
        """One line: where the records are read."""
        if self.store:
            return f"the records store {','.join(self.store)} (keyspace {self.keyspace})"
        return f"the local spool {self.spool} (no records store configured)"

    def _store(self):
        from rtserve.records.store import Store

        return Store.connect(self.store, keyspace=self.keyspace)

    def find(self, request_id: str) -> Record | None:
        """The record of ``request_id``, or None.

        Raises:
            StoreUnavailable: the store cannot be reached.
        """
        if not self.store:
            return find_local(self.spool, request_id)
        with self._store() as store:
            return store.find(request_id)

    def latest(self, model: str, start: datetime, version: str | None, limit: int) -> list[Record]:
        """The newest ``limit`` records of ``model`` (and ``version``) since ``start``, in time order.

        Raises:
            StoreUnavailable: the store cannot be reached.
        """
        if not self.store:
            return select(local_records(self.spool), model, start, None, version)[-limit:]
        with self._store() as store:
            return list(store.latest(model, start, version=version, limit=limit))

    def window(
        self, model: str, start: datetime, version: str | None, until: datetime | None = None
    ) -> Iterator[Record]:
        """Every record of ``model`` (and ``version``) from ``start`` (to ``until``), in time order.

        Raises:
            StoreUnavailable: the store cannot be reached.
        """
        if not self.store:
            yield from select(local_records(self.spool), model, start, until, version)
            return
        with self._store() as store:
            yield from store.records(model, start, until=until, version=version)


def export(records: Iterator[Record], out: Path, raw: bool = False) -> int:
    """Write ``records`` as JSON lines to ``out``, via a temporary file renamed over it when complete.

    Inputs are written as numbers, or with ``raw`` as stored (float32, base64: faster to write and to read
    with numpy).

    Returns:
        How many were written.
    """
    out = Path(out)
    tmp = out.with_name(out.name + ".part")
    count = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write((record.line if raw else json.dumps(record.document, separators=(",", ":"))) + "\n")
            count += 1
    tmp.replace(out)
    return count
