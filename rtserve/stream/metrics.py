"""The stream consumer's metrics and health on one HTTP port: ``/metrics``, ``/healthz`` and ``/ready``.

Cheap on the hot path: counters are the consumer's own counts read at scrape time; lag is the last stable
offset from librdkafka's statistics minus the offset this member's transactions committed (not its read
position, which says what was read, not scored). No Kafka client or TorchServe import. See docs/streaming.md.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from rtserve.errors import StreamError

logger = logging.getLogger(__name__)

#: The port ``stream run`` serves on unless ``--metrics-port`` says otherwise (0: none). Beside
#: TorchServe's 8080-8082 and the gateway's 8086, and free on the same host as ``make serve``.
METRICS_PORT = 8088
METRICS_HOST = "127.0.0.1"
#: librdkafka's statistics interval: the lag's resolution (Prometheus scrapes every 15 s).
STATS_INTERVAL_MS = 5000
#: The loop must come round within this many seconds or ``/healthz`` answers 503. A step's
#: worst case: TorchServe's answers (the client's 30 s timeout, a few waves of concurrent
#: requests), then a transaction's calls (30 s each) and, after a failed one, a new producer.
STALL_SECONDS = 180.0
#: Event to prediction, seconds: dense around the 50 ms p99 target so that ``histogram_quantile``
#: interpolates within a few ms there, then out to minutes (a backlog after an outage).
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.06,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)

#: A micro-batch's time in each stage of the pipeline, seconds: finer than the latency's, since
#: most stages take a few ms.
STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0)
#: The stages, in order (see :meth:`StreamMetrics.stages`).
STAGES = ("wait", "linger", "score", "order", "queue", "commit")

PREFIX = "rtserve_stream_"
EVENTS = PREFIX + "events"
TRANSACTIONS = PREFIX + "transactions"
RETRIES = PREFIX + "retries"
RECREATIONS = PREFIX + "producer_recreations"
LAG = PREFIX + "consumer_lag"
ASSIGNED = PREFIX + "assigned_partitions"
LATENCY = PREFIX + "event_to_prediction_seconds"
LOOP_AGE = PREFIX + "loop_age_seconds"
STAGE = PREFIX + "stage_seconds"


class Counted(Protocol):
    """What the consumer counts (:class:`rtserve.stream.consumer.Counts`)."""

    predictions: int
    dead_letters: int
    transactions: int
    aborted: int
    retries: int


class Message(Protocol):
    """A consumed message as far as the metrics care (``confluent_kafka.Message``)."""

    def timestamp(self) -> tuple[int, int]: ...

    def topic(self) -> str: ...

    def partition(self) -> int: ...

    def offset(self) -> int: ...


Partition = tuple[str, int]


def partitions_from_stats(text: str) -> dict[Partition, tuple[int, int]]:
    """Per partition assigned to this member whose end is known, (topic, partition) -> (end, start).

    End: the last stable offset. Start: the group's committed offset fetched at the assignment (the log's
    start when the group committed none; -1 when neither is known yet).

    Raises:
        ValueError: ``text`` is not librdkafka's statistics JSON.
    """
    stats = json.loads(text)
    found = {}
    for topic, info in (stats.get("topics") or {}).items():
        for key, part in (info.get("partitions") or {}).items():
            if key == "-1" or not part.get("desired"):  # -1: librdkafka's unassigned-messages queue
                continue
            end, committed = int(part.get("ls_offset", -1)), int(part.get("committed_offset", -1))
            start = committed if committed >= 0 else int(part.get("lo_offset", -1))
            if end >= 0:
                found[(topic, int(key))] = (end, max(start, -1))
    return found


def partition_lag(
    partitions: dict[Partition, tuple[int, int]], committed: dict[Partition, int]
) -> dict[Partition, int]:
    """Per partition of ``partitions`` (:func:`partitions_from_stats`), its lag; unknown ones are left out.

    The lag is its end minus the later of its start and the offset this member committed (``committed``).
    """
    found = {}
    for tp, (end, start) in partitions.items():
        position = max(start, committed.get(tp, -1))
        if position >= 0:
            found[tp] = max(0, end - position)
    return found


class Histogram:
    """A cumulative histogram fed a step at a time (one lock per step, not per event)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values: Iterable[float]) -> int:
        """Count each value; returns how many."""
        add = [0] * len(self.counts)
        total, n = 0.0, 0
        for v in values:
            add[bisect.bisect_left(self.bounds, v)] += 1  # le: a value on a bound counts in it
            total += v
            n += 1
        if n:
            with self._lock:
                self.counts = [a + b for a, b in zip(self.counts, add)]
                self.sum += total
        return n

    def buckets(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative (le, count) pairs ending with ``+Inf``, and the sum."""
        with self._lock:
            counts, total = list(self.counts), self.sum
        out, below = [], 0
        for bound, n in zip((*map(floatToGoString, self.bounds), "+Inf"), counts):
            below += n
            out.append((bound, below))
        return out, total


class StreamMetrics:
    """One consumer's metrics and health (a prometheus_client collector in its own registry).

    The consumer calls the hooks: :meth:`consumer_settings` (merged into its Consumer's
    settings), :meth:`watch` (its counts), :meth:`producer_starting` / :meth:`producer_ready`
    around each transactional producer's ``init_transactions``, :meth:`tick` once per loop and
    :meth:`committed` after each committed transaction.

    Args:
        stall: seconds without a :meth:`tick` after which the consumer is not live.
        clock: monotonic seconds; wall: seconds since the epoch (Kafka timestamps' clock).
    """

    def __init__(
        self,
        stall: float = STALL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.stall = stall
        self.clock, self.wall = clock, wall
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(LATENCY_BUCKETS)
        self.stage = {name: Histogram(STAGE_BUCKETS) for name in STAGES}
        self.counts: Counted | None = None
        #: From the last statistics: assigned partitions -> (end, start).
        self.partitions: dict[Partition, tuple[int, int]] = {}
        #: The offsets this member's transactions committed (replaced, never changed in place:
        #: scrapes read it from another thread).
        self.positions: dict[Partition, int] = {}
        self.producers = 0
        self.producer_up = False
        self.looping = False
        self.last_tick = clock()
        self.registry.register(self)

    # -- the consumer's hooks ---------------------------------------------------------------------
    def consumer_settings(self) -> dict[str, Any]:
        """What the consumer's ``Consumer`` needs for the lag: librdkafka's statistics."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.on_stats}

    def watch(self, counts: Counted) -> None:
        self.counts = counts

    def on_stats(self, text: str) -> None:
        """Take librdkafka's statistics ``text`` (called inside ``consume()``: it must never raise)."""
        try:
            self.partitions = partitions_from_stats(text)
        except (ValueError, TypeError, AttributeError) as exc:
            logger.warning("librdkafka's statistics could not be read: %s", exc)

    def producer_starting(self) -> None:
        self.producer_up = False

    def producer_ready(self) -> None:
        self.producers += 1
        self.producer_up = True

    def tick(self) -> None:
        """Record that the loop came round (subscribed, polling)."""
        self.looping = True
        self.last_tick = self.clock()

    def committed(self, messages: Iterable[Message], at: float | None = None) -> int:
        """Record a transaction with ``messages``' outputs and offsets committed at ``at`` (wall clock; default now).

        Each event's time from its Kafka timestamp to then goes into the histogram (events without one are left
        out), and the group's new offsets are kept.

        Returns:
            How many events were timed.
        """
        now = self.wall() if at is None else at
        ages, positions = [], dict(self.positions)
        for m in messages:
            kind, ts = m.timestamp()
            if kind != 0:
                ages.append(max(0.0, now - ts / 1000.0))
            tp = (m.topic(), m.partition())
            positions[tp] = max(positions.get(tp, -1), m.offset() + 1)
        self.positions = positions
        return self.latency.observe_many(ages)

    def stages(self, timelines: Iterable[Any], committed: float) -> None:
        """Record where committed micro-batches spent their time (``committed``: monotonic, as theirs).

        Each :class:`rtserve.stream.consumer.Timeline`, one value per stage: ``wait`` from its first
        event's Kafka timestamp until the micro-batch began to form (fetched, polled, and behind a
        full micro-batch); ``linger`` until it was sent; ``score`` until its outputs were built
        (TorchServe's answer included); ``order`` until the micro-batches before it were answered
        too; ``queue`` until the commit in flight before it ended; ``commit`` until its own ended.
        """
        values: dict[str, list[float]] = {name: [] for name in STAGES}
        for t in timelines:
            if t.waited is not None:
                values["wait"].append(t.waited)
            marks = (t.polled, t.sent, t.answered, t.released, t.handed, committed)
            for name, start, end in zip(STAGES[1:], marks, marks[1:]):
                values[name].append(max(0.0, end - start))
        for name, found in values.items():
            self.stage[name].observe_many(found)

    def lag(self) -> dict[Partition, int]:
        """Per assigned partition, its end minus the group's committed offset (see the module)."""
        return partition_lag(self.partitions, self.positions)

    # -- health -----------------------------------------------------------------------------------
    def live(self) -> tuple[bool, dict]:
        """Alive: the loop came round within ``stall`` seconds (at start: since the start)."""
        age = self.clock() - self.last_tick
        return age <= self.stall, {"loop_age_seconds": round(age, 3), "stall_seconds": self.stall}

    def ready(self) -> tuple[bool, dict]:
        """Ready: live, the transactional producer initialised and the loop subscribed.

        Partitions assigned or waiting for an assignment: a member with none is still ready.
        """
        live, body = self.live()
        body.update(
            producer=self.producer_up, subscribed=self.looping, assigned=sorted(f"{t}[{p}]" for t, p in self.partitions)
        )
        return live and self.producer_up and self.looping, body

    # -- prometheus_client's collector protocol ---------------------------------------------------
    def collect(self):
        counts = self.counts
        events = CounterMetricFamily(
            EVENTS, "Events written, by outcome: a prediction or a dead letter", labels=["outcome"]
        )
        transactions = CounterMetricFamily(
            TRANSACTIONS,
            "Transactions, by result: committed or aborted (its events are scored again)",
            labels=["result"],
        )
        retries = CounterMetricFamily(
            RETRIES,
            "Steps retried after a transient failure of TorchServe "
            "(no answer, 502/503/504): nothing written, the events read again",
        )
        if counts is not None:
            events.add_metric(["predicted"], counts.predictions)
            events.add_metric(["dead_lettered"], counts.dead_letters)
            transactions.add_metric(["committed"], counts.transactions)
            transactions.add_metric(["aborted"], counts.aborted)
            retries.add_metric([], counts.retries)
        yield from (events, transactions, retries)
        yield CounterMetricFamily(
            RECREATIONS,
            "Transactional producers made anew after a fenced or failed one",
            value=max(0, self.producers - 1),
        )
        lags = GaugeMetricFamily(
            LAG,
            "Events of the partition not yet committed by the group, as this member sees it (assigned partitions only)",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted(self.lag().items()):
            lags.add_metric([topic, str(partition)], value)
        yield lags
        yield GaugeMetricFamily(
            ASSIGNED,
            "Partitions assigned to this member (0: idle, e.g. more members than partitions)",
            value=len(self.partitions),
        )
        buckets, total = self.latency.buckets()
        yield HistogramMetricFamily(
            LATENCY,
            "From the event's Kafka timestamp to the commit of the transaction holding its prediction or dead letter",
            buckets=buckets,
            sum_value=total,
        )
        stages = HistogramMetricFamily(
            STAGE,
            "A micro-batch's time in each stage: wait (event to poll), linger, score, order, queue, commit",
            labels=["stage"],
        )
        for name in STAGES:
            buckets, total = self.stage[name].buckets()
            stages.add_metric([name], buckets, sum_value=total)
        yield stages
        yield GaugeMetricFamily(
            LOOP_AGE, "Seconds since the consumer's loop last came round", value=self.clock() - self.last_tick
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)


def make_server(metrics: StreamMetrics, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server for ``metrics``: ``/metrics``, ``/healthz`` and ``/ready`` (503 when not)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._answer(200, metrics.render(), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/ready"):
                ok, body = metrics.live() if path == "/healthz" else metrics.ready()
                self._answer(200 if ok else 503, json.dumps({"ok": ok, **body}).encode() + b"\n", "application/json")
            else:
                self._answer(
                    404, b'{"error": "not found: /metrics, /healthz and /ready are served here"}\n', "application/json"
                )

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:  # probes and scrapes are not worth a line
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def serve(metrics: StreamMetrics, host: str, port: int) -> ThreadingHTTPServer:
    """Start :func:`make_server` in a daemon thread; the caller shuts it down.

    Raises:
        StreamError: ``host:port`` cannot be listened on (taken, or not this machine's).
    """
    try:
        server = make_server(metrics, host, port)
    except OSError as exc:
        raise StreamError(
            f"cannot serve metrics on {host}:{port} ({exc.strerror}): choose another --metrics-port, or 0 for none"
        ) from None
    threading.Thread(target=server.serve_forever, name="stream-metrics", daemon=True).start()
    return server
