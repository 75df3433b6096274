"""The shipper: sends the spool's records to the store in batches and makes room; the request path never waits.

One per server (``python -m rtserve records ship``). The checkpoint moves only after the store acknowledged a
batch, so a crash loses nothing and a resend rewrites the same row. Closed segments stay while the spool holds at
most :attr:`ShipperConfig.keep` of its budget (without a store, nothing is sent). See docs/records.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rtserve.errors import RecordsError, StoreUnavailable
from rtserve.records.record import Record, parse_line
from rtserve.records.spool import Segment, count_lines, load_checkpoint, save_checkpoint, segments, spool_usage
from rtserve.runtime.logs import complete_lines

logger = logging.getLogger(__name__)

#: Lag buckets, seconds: from a record's time to the store's acknowledgement.
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)


class RecordStore(Protocol):
    """What the shipper needs of a store (:class:`rtserve.records.store.Store`)."""

    def write(self, records: Sequence[Record]) -> None: ...


@dataclass(frozen=True)
class ShipperConfig:
    """How the shipper works.

    Attributes:
        spool: the spool directory.
        budget: the spool's byte budget (the workers' ``RTSERVE_SPOOL_BYTES``).
        keep: closed, shipped segments stay while the spool holds at most this share of its
            budget (oldest deleted first).
        batch_records, batch_bytes: most records / bytes of lines per write to the store.
        poll: seconds between looks when nothing is new.
        stop_seconds: most seconds the last shipping takes after SIGTERM.
        retry_max: the longest pause between tries while the store is away.
    """

    spool: Path
    budget: int
    keep: float = 0.5
    batch_records: int = 500
    batch_bytes: int = 1 << 20
    poll: float = 0.05
    stop_seconds: float = 20.0
    retry_max: float = 5.0


class ShipperMetrics:
    """The shipper's Prometheus metrics.

    In the workers' multiprocess directory when the server set one, so the metrics exporter serves them with the
    workers'.
    """

    def __init__(self, registry=None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        reg = {"registry": registry if registry is not None else CollectorRegistry()}
        self.shipped = Counter("rtserve_records_shipped", "Records the store acknowledged", **reg)
        self.evicted = Counter(
            "rtserve_records_evicted",
            "Records deleted from the spool to make room without a store (the local spool's retention)",
            **reg,
        )
        self.torn = Counter(
            "rtserve_records_torn", "Torn last lines of segments whose writer died mid-write (never answered)", **reg
        )
        self.invalid = Counter("rtserve_records_invalid", "Spool lines that are not records (skipped)", **reg)
        self.store_errors = Counter(
            "rtserve_records_store_errors",
            "Writes the store refused or never answered (the records wait in the spool)",
            **reg,
        )
        self.lag = Histogram(
            "rtserve_records_ship_lag_seconds",
            "Seconds from a record's time to the store's acknowledgement",
            buckets=LAG_BUCKETS,
            **reg,
        )
        self.spool_bytes = Gauge(
            "rtserve_records_spool_bytes", "Bytes in the records spool", multiprocess_mode="livemax", **reg
        )
        self.pending_bytes = Gauge(
            "rtserve_records_pending_bytes", "Bytes of the spool not shipped yet", multiprocess_mode="livemax", **reg
        )
        self.store_up = Gauge(
            "rtserve_records_store_up",
            "1 while the last write to the store succeeded (0: records wait in the spool)",
            multiprocess_mode="livemax",
            **reg,
        )


@dataclass
class Shipper:
    """Ships one spool; on :meth:`run`'s stop, drains what is left within ``stop_seconds``.

    Args:
        config: where and how.
        store: the records store; None: no store, the spool is kept locally.
        metrics: where to count (None: not counted).
        clock: wall-clock seconds (a record's lag).
    """

    config: ShipperConfig
    store: RecordStore | None = None
    metrics: ShipperMetrics | None = None
    clock: Callable[[], float] = time.time
    shipped: dict[str, int] = field(default_factory=dict, init=False)
    totals: dict[str, int] = field(
        default_factory=lambda: {"shipped": 0, "torn": 0, "invalid": 0, "evicted": 0, "store_errors": 0}, init=False
    )
    _failures: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.shipped = load_checkpoint(self.config.spool)

    # -- one step --------------------------------------------------------------------------------
    def _collect(self, found: list[Segment]) -> tuple[list[Record], dict[str, int]]:
        """The next batch of records after the checkpoint, and where each segment's read ended.

        A closed segment's torn last line is passed over: its writer died before answering.
        """
        batch: list[Record] = []
        advance: dict[str, int] = {}
        room = self.config.batch_bytes
        for segment in found:
            offset = self.shipped.get(segment.name, 0)
            if offset >= segment.size:
                continue
            lines, end = complete_lines(segment.path, offset, room)
            if not lines and segment.closed:
                logger.warning(
                    "%s: torn last line of %d bytes left by a writer that died "
                    "(that batch was never answered): passed over",
                    segment.name,
                    segment.size - offset,
                )
                self._count("torn", 1)
                advance[segment.name] = segment.size
                continue
            take = self.config.batch_records - len(batch)
            if len(lines) > take:  # the rest waits for the next batch
                lines = lines[:take]
                end = offset + sum(len(raw) + 1 for raw in lines)
            for raw in lines:
                try:
                    batch.append(parse_line(raw.decode("utf-8", "replace")))
                except RecordsError as exc:
                    logger.warning("%s: %s", segment.name, exc)
                    self._count("invalid", 1)
            advance[segment.name] = end
            room -= end - offset
            if len(batch) >= self.config.batch_records or room <= 0:
                break
        return batch, advance

    def step(self) -> int:
        """Ship the next batch and move the checkpoint; make room.

        Returns:
            How many records were shipped (0: nothing new, or no store).

        Raises:
            StoreUnavailable: the store refused the write or never answered (nothing moved).
        """
        if self.store is None:  # nothing to ship: only make room (the segments listed when due)
            self.make_room(None)
            return 0
        found = segments(self.config.spool)
        shipped = 0
        batch, advance = self._collect(found)
        if batch:
            try:
                self.store.write(batch)
            except StoreUnavailable:
                self._count("store_errors", 1)
                if self.metrics is not None:
                    self.metrics.store_up.set(0)
                raise
            now = self.clock()
            if self.metrics is not None:
                self.metrics.store_up.set(1)
                for record in batch:
                    self.metrics.lag.observe(max(0.0, now - record.time.timestamp()))
            self._count("shipped", len(batch))
            shipped = len(batch)
        if advance:
            self.shipped.update(advance)
            save_checkpoint(self.config.spool, self._known(found))
        self.make_room(found)
        return shipped

    def _known(self, found: list[Segment]) -> dict[str, int]:
        names = {s.name for s in found}
        self.shipped = {k: v for k, v in self.shipped.items() if k in names}
        return self.shipped

    def pending(self, found: list[Segment] | None = None) -> int:
        """Bytes not shipped yet (0 without a store)."""
        if self.store is None:
            return 0
        found = segments(self.config.spool) if found is None else found
        return sum(max(0, s.size - self.shipped.get(s.name, 0)) for s in found)

    def make_room(self, found: list[Segment] | None) -> int:
        """Delete the oldest shipped closed segments while the spool holds more than ``keep`` of its budget.

        Without a store, all closed segments may go. ``found``: the spool's segments (None: listed here when
        some must go).

        Returns:
            How many were deleted.
        """
        used = spool_usage(self.config.spool)
        limit = self.config.keep * self.config.budget
        deleted = 0
        if found is None:
            found = segments(self.config.spool) if used > limit else []
        for segment in found:
            if used <= limit:
                break
            if not segment.closed:
                continue
            if self.store is not None and self.shipped.get(segment.name, 0) < segment.size:
                continue
            if self.store is None:
                self._count("evicted", count_lines(segment.path))
            try:
                segment.path.unlink()
            except FileNotFoundError:
                pass
            self.shipped.pop(segment.name, None)
            used -= segment.size
            deleted += 1
        if deleted and self.store is not None:
            save_checkpoint(self.config.spool, self.shipped)
        if self.metrics is not None:
            self.metrics.spool_bytes.set(max(used, 0))
            self.metrics.pending_bytes.set(self.pending(found))
        return deleted

    def _count(self, name: str, n: int) -> None:
        self.totals[name] += n
        if self.metrics is not None:
            getattr(self.metrics, name).inc(n)

    # -- running -----------------------------------------------------------------------------------
    def run(self, stopping: threading.Event) -> None:
        """Ship until ``stopping`` is set, then :meth:`drain`."""
        pause = self.config.poll
        while not stopping.is_set():
            try:
                shipped = self.step()
            except StoreUnavailable as exc:
                if not self._failures:
                    logger.warning(
                        "records store unavailable (the records wait in the spool, %d bytes pending): %s",
                        self.pending(),
                        exc,
                    )
                self._failures += 1
                pause = min(self.config.retry_max, max(self.config.poll, pause * 2))
                stopping.wait(pause)
                continue
            except Exception:  # noqa: BLE001 - a bug or a disk error: say it, keep the records, go on
                logger.exception("records shipper: a step failed (the records stay in the spool)")
                stopping.wait(self.config.retry_max)
                continue
            if self._failures:
                logger.info("records store back after %d failed write(s): shipping", self._failures)
                self._failures = 0
            pause = self.config.poll
            if not shipped:
                stopping.wait(self.config.poll)
        self.drain(time.monotonic() + self.config.stop_seconds)

    def drain(self, deadline: float) -> bool:
        """Ship every complete line there is, until nothing is pending or ``deadline`` (monotonic) passes.

        Returns:
            Whether nothing is left.
        """
        if self.store is None:
            return True
        while time.monotonic() < deadline:
            try:
                if not self.step() and not self._unread():
                    logger.info("records: everything shipped (%d records this run)", self.totals["shipped"])
                    return True
            except StoreUnavailable as exc:
                logger.warning("records store unavailable while stopping: %s", exc)
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        left = self.pending()
        logger.warning(
            "records: %d bytes not shipped at the stop's deadline (they stay in the spool for the next start)", left
        )
        return left == 0

    def _unread(self) -> bool:
        """Whether a segment still has a complete line after its checkpoint."""
        for segment in segments(self.config.spool):
            offset = self.shipped.get(segment.name, 0)
            if offset < segment.size and complete_lines(segment.path, offset, 1)[0]:
                return True
        return False
