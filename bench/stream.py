"""Kafka stream scoring: rtserve's stream consumer against the transport and a naive consumer, on one broker.

One run starts a single-node Kafka broker (``rtserve.stream.local``, fresh, on free loopback
ports) and a TorchServe serving the ``.mar`` (:func:`bench.common.serving`), then measures,
back to back so that the comparison is fair on a busy machine:

0. **Warm-up** (reported, not a target). A backlog of ``--events`` events plus
   :data:`BACKLOG_HEAD` is produced into one input topic, then the shipped consumer scores
   ``--warmup-events`` waiting events of a topic of their own: the broker's JVM has compiled its
   produce, fetch and transaction paths (and TorchServe its own) before the first measured phase.
1. **Saturation.** Each consumer in turn reads that backlog from its beginning into outputs of
   its own, read back by a ``read_committed`` reader: the shipped consumer (``python -m rtserve
   stream run``, what ``make stream`` starts, exactly once through TorchServe), then the naive one
   (:mod:`bench.stream_naive`: one message at a time, in-process model) producing its results
   asynchronously (``naive``) and waiting for each delivery (``naive-flush``). The window opens at
   the reader's first output (the start and the group join are left out) and closes once
   ``--events`` more came or ``--window`` seconds passed, whichever comes first; events/s are the
   outputs counted over it.
2. **Fixed rate.** ``--rate`` events/s (default 4,000, whatever the consumers' saturation, so that
   a faster consumer does not raise its own bar), offered by a paced producer (``linger.ms`` 5, the
   client's default) for ``--seconds``, after :data:`WARMUP_EVENTS` warm-up events (left out):
   first the producer and the reader alone, the reader reading the input (``transport``: the
   floor, no consumer in the path), then the shipped consumer exactly once, the shipped consumer
   with ``--guarantee at-least-once`` (``shipped-alo``; skipped, and said so, when ``stream run
   --help`` does not list that option), and the naive consumer. Latency per event: the output's
   arrival at the ``read_committed`` reader (wall clock) minus the event's timestamp (its
   CreateTime, set by the producer when it was produced), both on this host's clock; p50 and p99.

Transactions: the shipped consumer's committed transactions over each window, read from its
``/metrics`` (``rtserve_stream_transactions_total`` with ``committed``; the bench gives it a free
``--metrics-port``), and its events written (``rtserve_stream_events_total``) per transaction.

Delivery (the shipped consumer, each phase): after it stopped, both outputs are read to their
ends with ``read_committed``, and the input offsets below the group's committed offsets (a
saturation window may end before the backlog does) are set against the predictions' and dead
letters' source offsets. Exactly once: each once, nothing else. At least once: each at least
once, duplicates counted (none are expected without a crash). The naive consumer is not checked:
it commits offsets on a timer, it has no such guarantee.

Targets (issue 38), each printed met or missed: exactly once at the fixed rate p50 <=
:data:`TARGET_EO_P50_MS` and p99 <= :data:`TARGET_EO_P99_MS`; at least once p99 <=
:data:`TARGET_ALO_P99_MS`; saturation throughput exactly once >= :data:`TARGET_RATIO` times the
naive consumer's.

CPU per phase (saturation: over its window; fixed rate: from the first paced event to the last
output), from ``/proc/<pid>/stat`` of the processes started here (:func:`bench.perf.tree_cpu`):
the broker's JVM, the consumer, TorchServe's frontend and its Python workers, this script (the
producer and the reader), and the rest of the machine; and, as a part of the broker's, its JIT
compiler threads' (whether it was warm). With ``--profile-broker``, a Java Flight Recorder
recording of the broker (``jcmd JFR.start`` with Java stack samples only, then ``JFR.stop``) spans
the exactly-once fixed-rate phase; its file is kept beside the report (``stream-broker.jfr``), its
top frames (``jfr print --events jdk.ExecutionSample``, by the sampled stack's top frame) and the
broker's CPU by thread (``/proc``: GC, JIT and native code included) are printed.
Output: a table on stdout and JSON (default ``bench/results/stream.json``); the exit status is 1
when a delivery check failed (the targets are reported, not enforced).

    make bench-stream
    .venv/bin/python -m bench.stream --kafka-libs ~/.cache/rtserve/kafka/4.4.0/libs \\
        --events 5000 --window 3 --warmup-events 2000 --seconds 3
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from bench import common
from bench.perf import busy_cpu, tree_cpu
from bench.stream_naive import STARTED as NAIVE_STARTED
from rtserve.errors import RtserveError, StreamError
from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import PidFile, run, spawn, tail, terminate, wait_until
from rtserve.server.torchserve import TorchServe
from rtserve.stream import admin, local, service
from rtserve.stream.broker import Layout
from rtserve.stream.metrics import EVENTS, STAGE, STAGES, TRANSACTIONS

logger = logging.getLogger("bench.stream")

PARTITIONS = 4
#: Events before each fixed-rate phase's measure (left out): the consumer's group joined, its path warm.
WARMUP_EVENTS = 200
#: Events in the saturation backlog beyond the window's ``--events``: the reader's first poll (at
#: most :data:`Reader.POLL_MAX` outputs) opens the window and is not counted.
BACKLOG_HEAD = 1000
REQUEST = common.REPO / "examples" / "request.json"
#: The consumers: the shipped one per guarantee, the naive one in its two forms, and no consumer.
SHIPPED, SHIPPED_ALO, NAIVE, NAIVE_FLUSH, TRANSPORT = "shipped", "shipped-alo", "naive", "naive-flush", "transport"
EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
GUARANTEE = {SHIPPED: EXACTLY_ONCE, SHIPPED_ALO: AT_LEAST_ONCE}
#: The targets of issue 38: latency at the fixed rate per guarantee, throughput against the naive consumer.
TARGET_EO_P50_MS = 25.0
TARGET_EO_P99_MS = 50.0
TARGET_ALO_P99_MS = 20.0
TARGET_RATIO = 2.0
DEFAULT_RATE = 4000.0
#: A fixed-rate phase whose producer offered less than this share of ``--rate`` is flagged.
PACE_SHARE = 0.99
#: The CPU split's components (``others``: the rest of the machine).
COMPONENTS = ("broker", "consumer", "torchserve frontend", "torchserve workers", "bench", "others")
#: The components that do the stream's work (the CPU per event counts these).
SERVING = COMPONENTS[:4]
#: The broker's JIT compiler threads (``C1 CompilerThread0``, ``C2 ...``): a part of ``broker``,
#: reported to show whether the broker was warm.
BROKER_JIT = "broker JIT"
JIT_THREAD = "CompilerThre"
#: Parts of a component, kept out of ``others``.
PARTS = (BROKER_JIT,)
#: The consumer's counters (rtserve.stream.metrics) the bench reads from its ``/metrics``.
TRANSACTIONS_TOTAL = TRANSACTIONS + "_total"
EVENTS_TOTAL = EVENTS + "_total"
#: The broker profile: its recording's name and file, and how many top frames are printed.
PROFILE_NAME = "rtserve-bench-stream"
PROFILE_FILE = "stream-broker.jfr"
PROFILE_TOP = 15
#: The recording's settings: Java stack samples only, every 10 ms per running thread. JFR's own
#: ``profile`` settings also time file and socket I/O, which instruments the JDK's classes and
#: sets the broker's JIT compiling again during the phase it records (docs/streaming.md).
PROFILE_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="rtserve bench-stream" description="Java CPU samples only (bench/stream.py)">
  <event name="jdk.ExecutionSample">
    <setting name="enabled">true</setting>
    <setting name="period">10 ms</setting>
  </event>
</configuration>
"""
#: The JVM's thread that runs ``jcmd``'s commands (the recording's own start and dump).
RECORDER_THREAD = "Attach Listener"


@dataclass
class Phase:
    """One consumer in one phase."""

    phase: str
    consumer: str
    offered_per_s: float | None
    events: int
    read: int
    seconds: float
    events_per_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    #: Saturation: what closed the window (``events``, ``seconds`` or ``backlog``: it ran out).
    ended_by: str | None = None
    #: Fixed rate: the rate the paced producer achieved.
    produced_per_s: float | None = None
    #: The shipped consumer's committed transactions over the window and its events per transaction.
    transactions: int | None = None
    events_per_transaction: float | None = None
    #: CPU seconds per component over the measured window, and the same as % of one core.
    cpu_s: dict = field(default_factory=dict)
    cpu_pct: dict = field(default_factory=dict)
    #: CPU ms per event written of the broker, the consumer and TorchServe together.
    cpu_ms_per_event: float | None = None
    load_before: list = field(default_factory=list)
    load_after: list = field(default_factory=list)
    #: The shipped consumer's delivery check (:func:`delivery`).
    delivery: dict | None = None
    broker_profiled: bool = False
    consumer_said: str = ""
    #: The shipped consumer's micro-batches per stage over the window (:func:`stage_times`).
    stages: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- processes


class Processes:
    """The PIDs whose CPU is split: broker, consumer, TorchServe (frontend, workers)."""

    def __init__(self, broker: int, server: TorchServe) -> None:
        self.broker = broker
        self.server = server
        self.consumer: int | None = None

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of each component, this process and the whole machine."""
        ts_total, ts_frontend = tree_cpu(self.server.pid())
        me = psutil.Process().cpu_times()
        return {
            "broker": tree_cpu(self.broker)[0],
            BROKER_JIT: sum(v for k, v in jvm_threads_cpu(self.broker).items() if JIT_THREAD in k),
            "consumer": tree_cpu(self.consumer)[0] if self.consumer else 0.0,
            "torchserve frontend": ts_frontend,
            "torchserve workers": ts_total - ts_frontend,
            "bench": me.user + me.system,
            "machine": busy_cpu(),
        }


def split(before: dict[str, float], after: dict[str, float], seconds: float) -> tuple[dict, dict]:
    """CPU seconds per component between two readings, and % of one core; ``others`` is the
    machine's busy time not spent in them."""
    used = {k: max(0.0, after[k] - before[k]) for k in before}
    machine = used.pop("machine")
    parts = {k: used.pop(k) for k in PARTS if k in used}
    used["others"] = max(0.0, machine - sum(used.values()))
    used.update(parts)
    return (
        {k: round(v, 2) for k, v in used.items()},
        {k: round(100 * v / seconds, 1) if seconds > 0 else 0.0 for k, v in used.items()},
    )


class Naive:
    """:mod:`bench.stream_naive` as a process of its own, stopped by its PID."""

    def __init__(self, run_dir: Path, options: list[str]) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.log = run_dir / "naive.log"
        self.pid_file = PidFile(run_dir / "naive.pid", check_program=True)
        proc = spawn([sys.executable, "-m", "bench.stream_naive", *options], self.log, self.pid_file, cwd=common.REPO)
        self.pid = proc.pid

        def started() -> bool:
            if proc.poll() is not None:
                raise StreamError(f"the naive consumer exited with {proc.returncode}:\n{tail(self.log, 20)}")
            return NAIVE_STARTED in self.log.read_text(errors="replace")

        if not wait_until(started, 120, poll=0.2):
            self.stop()
            raise StreamError(f"the naive consumer did not start in 120 s:\n{tail(self.log, 20)}")

    def stop(self) -> str:
        terminate(self.pid, 30, poll=0.1, program=self.pid_file.program())
        self.pid_file.remove()
        return tail(self.log, 1)


@dataclass
class Running:
    """A consumer started for one phase: its PID, what stops it, its group and its metrics port."""

    who: str
    pid: int
    stop: Callable[[], str]
    group: str
    metrics_port: int | None = None

    def counts(self) -> dict[str, float]:
        """Its counters now (:func:`consumer_counts`); empty without a metrics port or an answer."""
        if not self.metrics_port:
            return {}
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as answer:
                return consumer_counts(answer.read().decode())
        except OSError as exc:
            logger.warning("the %s consumer's /metrics did not answer: %s", self.who, exc)
            return {}


def consumer_counts(text: str) -> dict[str, float]:
    """From the consumer's ``/metrics`` text: ``transactions`` committed and ``events`` written
    (predictions and dead letters) so far, and its stage histogram (``count STAGE``, ``sum
    STAGE``, ``le STAGE BOUND``); a counter it lacks is left out."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == TRANSACTIONS_TOTAL and "committed" in sample.labels.values():
                found["transactions"] = found.get("transactions", 0.0) + sample.value
            elif sample.name == EVENTS_TOTAL:
                found["events"] = found.get("events", 0.0) + sample.value
            elif sample.name in (STAGE + "_count", STAGE + "_sum"):
                found[f"{sample.name.rsplit('_', 1)[1]} {sample.labels['stage']}"] = sample.value
            elif sample.name == STAGE + "_bucket":
                found[f"le {sample.labels['stage']} {sample.labels['le']}"] = sample.value
    return found


def stage_times(before: dict[str, float], after: dict[str, float]) -> dict[str, dict]:
    """Per stage of the consumer's pipeline (rtserve.stream.metrics.STAGES), between two
    :func:`consumer_counts`: the micro-batches committed, their mean ms in it, and the bucket
    bound (ms) that 99 % of them stayed within (None: above the last bound)."""
    out = {}
    for name in STAGES:
        n = after.get(f"count {name}", 0.0) - before.get(f"count {name}", 0.0)
        if n <= 0:
            continue
        total = after.get(f"sum {name}", 0.0) - before.get(f"sum {name}", 0.0)
        prefix = f"le {name} "
        bounds = sorted(
            (float(key[len(prefix) :]), value - before.get(key, 0.0))
            for key, value in after.items()
            if key.startswith(prefix)
        )
        p99 = next((bound for bound, below in bounds if below >= 0.99 * n), None)
        out[name] = {
            "batches": int(n),
            "mean_ms": round(total / n * 1000, 2),
            "p99_within_ms": None if p99 is None or p99 == float("inf") else round(p99 * 1000, 1),
        }
    return out


def per_transaction(before: dict[str, float], after: dict[str, float]) -> tuple[int | None, float | None]:
    """Committed transactions between two :func:`consumer_counts` and the events written per
    transaction (None where a reading lacks them, or no transaction committed)."""
    if "transactions" not in before or "transactions" not in after:
        return None, None
    transactions = int(after["transactions"] - before["transactions"])
    if transactions <= 0 or "events" not in before or "events" not in after:
        return transactions, None
    return transactions, round((after["events"] - before["events"]) / transactions, 1)


def takes_guarantee() -> bool:
    """Whether ``python -m rtserve stream run`` has ``--guarantee`` (its ``--help`` lists it)."""
    done = run([sys.executable, "-m", "rtserve", "stream", "run", "--help"], 120, cwd=common.REPO, check=False)
    return done.returncode == 0 and "--guarantee" in done.stdout


# --------------------------------------------------------------------------- topics and records


def topics(bootstrap: str, name: str) -> dict[str, str]:
    """Fresh input, output and dead-letter topics for one phase."""
    run_name = f"{name}-{uuid.uuid4().hex[:6]}"
    names = {"input": f"events-{run_name}", "output": f"predictions-{run_name}", "dead_letters": f"dlq-{run_name}"}
    admin.create_topics(bootstrap, names.values(), PARTITIONS)
    if not wait_until(lambda: set(names.values()) <= set(admin.topics(bootstrap)), 30, poll=0.2):
        raise StreamError(f"topics {sorted(names.values())} not led within 30 s")
    return names


def event_values(n: int, start: int = 0) -> Iterator[tuple[bytes, bytes]]:
    """``n`` valid events (the example request's features, an ``id`` each), keyed by ``id``."""
    features = json.loads(REQUEST.read_text())["features"]
    for i in range(start, start + n):
        yield f"e{i}".encode(), json.dumps({"features": features, "id": f"e{i}"}).encode()


class Sender:
    """A producer whose delivered events' coordinates are kept (the delivery check's inputs)."""

    def __init__(self, bootstrap: str, linger_ms: int) -> None:
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": linger_ms, "log_level": 3}
        )
        self.sent: set[tuple[int, int]] = set()
        self.failed: list[str] = []

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.sent.add((msg.partition(), msg.offset()))

    def send(self, topic: str, events: Iterable[tuple[bytes, bytes]]) -> None:
        for key, value in events:
            while True:
                try:
                    self.producer.produce(topic, key=key, value=value, on_delivery=self._delivered)
                    break
                except BufferError:  # the local queue is full: let it drain
                    self.producer.poll(0.05)
            self.producer.poll(0)

    def paced(self, topic: str, events: list[tuple[bytes, bytes]], rate: float) -> float:
        """Send ``events`` at ``rate`` per second, on schedule (an open loop: never waiting for
        an answer); returns the seconds it took."""
        begin = time.monotonic()
        i = 0
        while i < len(events):
            now = time.monotonic() - begin
            due = min(len(events), int(now * rate) + 1)
            if due > i:
                self.send(topic, events[i:due])
                i = due
            else:
                time.sleep(max(0.0, i / rate - now))
        return time.monotonic() - begin

    def flush(self, timeout: float = 120) -> None:
        if self.producer.flush(timeout) != 0 or self.failed:
            raise StreamError(f"events not delivered: {self.failed[:3] or 'flush timed out'}")


class Output(NamedTuple):
    """An output as the reader keeps it: its arrival (wall clock, ms), its topic, and its event's
    coordinates and timestamp (ms)."""

    arrived: float
    topic: str
    partition: int
    offset: int
    event_timestamp: float


class Window(NamedTuple):
    """A saturation window: when its first poll returned, the outputs read by then, when it closed and why."""

    begin: float
    first: int
    end: float
    ended_by: str


class Reader:
    """A ``read_committed`` reader of the output topics from their beginnings, keeping each
    output's arrival time (wall clock, ms: when the poll that brought it returned). With
    ``floor``, it reads that topic (the input) too: each event's timestamp and arrival, the
    transport's own latency (:meth:`Bench.transport`)."""

    #: Records taken per poll: the first waited for, the rest those already fetched.
    POLL_MAX = 500

    def __init__(self, bootstrap: str, outputs: list[str], floor: str | None = None) -> None:
        self.settings = {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
            "log_level": 4,
        }
        self.consumer = Consumer(self.settings)
        self.consumer.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t in outputs for p in range(PARTITIONS)]
            + [TopicPartition(floor, p, OFFSET_BEGINNING) for p in range(PARTITIONS) if floor]
        )
        self.outputs = outputs
        self.parts = len(outputs) * PARTITIONS
        self.floor_topic = floor
        self.records: list[Output] = []
        #: The input's events: (timestamp, arrival) in ms.
        self.floor: list[tuple[float, float]] = []
        self.eof: set[tuple[str, int]] = set()

    def poll(self, timeout: float = 0.1) -> int:
        """Read what is there (up to :data:`POLL_MAX` records): at most ``timeout`` for the first,
        then only those already fetched (``consume(500, timeout)`` returns when 500 came or the
        timeout passed: below 5,000 records/s each arrival was counted up to 100 ms late); returns
        how many outputs came."""
        got = 0
        polled = self.consumer.consume(1, timeout)
        if polled:
            polled += self.consumer.consume(self.POLL_MAX - 1, 0)
        now = time.time() * 1000
        for msg in polled:
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise StreamError(f"reading {msg.topic()}: {msg.error()}")
                if msg.topic() != self.floor_topic:
                    self.eof.add((msg.topic(), msg.partition()))
                continue
            if msg.topic() == self.floor_topic:
                self.floor.append((msg.timestamp()[1], now))
                continue
            self.eof.discard((msg.topic(), msg.partition()))
            value = json.loads(msg.value())
            source = value["source"]
            self.records.append(
                Output(now, msg.topic(), source["partition"], source["offset"], value["event_timestamp"])
            )
            got += 1
        return got

    def until(self, count: int, first_timeout: float, window: float) -> bool:
        """Read until ``count`` records came: the first within ``first_timeout``, the rest within
        ``window`` after it. Returns whether any came."""
        deadline = time.monotonic() + first_timeout
        first = False
        while len(self.records) < count and time.monotonic() < deadline:
            if self.poll() and not first:
                first = True
                deadline = time.monotonic() + window
        return first

    def window(
        self, events: int, seconds: float, backlog: int, first_timeout: float, on_first: Callable[[], object]
    ) -> Window | None:
        """Read a saturation window: it opens when a poll first brings outputs (``on_first`` is
        called then) and closes once ``events`` more came, ``seconds`` passed or all ``backlog``
        came, whichever is first. None: nothing came within ``first_timeout``."""
        deadline = time.monotonic() + first_timeout
        begin, first = 0.0, -1
        while True:
            now = time.monotonic()
            if first >= 0 and len(self.records) - first >= events:
                return Window(begin, first, now, "events")
            if len(self.records) >= backlog:
                return Window(begin, first, now, "backlog")
            if now >= deadline:
                return Window(begin, first, now, "seconds") if first >= 0 else None
            if self.poll() and first < 0:
                begin, first = time.monotonic(), len(self.records)
                on_first()
                deadline = begin + seconds

    def to_end(self, timeout: float = 120) -> None:
        """Read the outputs to their ends as they stand now (the consumer stopped): until every
        partition said it is at its end.

        A new client goes on from this one's positions: this one may have said "end" before the
        consumer's last transactions committed, and says it only once per end it reaches.
        """
        parts = [TopicPartition(t, p) for t in self.outputs for p in range(PARTITIONS)]
        positions = self.consumer.position(parts)
        self.consumer.close()
        self.consumer = Consumer(self.settings)
        self.consumer.assign(
            [
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
                for tp in positions
            ]
        )
        self.eof = set()
        deadline = time.monotonic() + timeout
        while len(self.eof) < self.parts:
            if time.monotonic() > deadline:
                raise StreamError(f"outputs not read to their ends in {timeout:.0f} s")
            self.poll()

    def close(self) -> None:
        self.consumer.close()


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` committed on ``topic``'s partitions (those with none left out)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "log_level": 4,
        }
    )
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def delivery(
    sent: set[tuple[int, int]],
    records: list[Output],
    output: str,
    committed: dict[int, int] | None = None,
    guarantee: str = EXACTLY_ONCE,
) -> dict:
    """The input offsets against the union of prediction and dead-letter source offsets.

    Args:
        sent: the input's (partition, offset) pairs.
        records: the outputs read to their ends.
        output: the predictions' topic (the rest are dead letters).
        committed: the group's committed offset per partition: only the inputs below them are
            expected (None: all of ``sent``).
        guarantee: exactly once (each expected input once, nothing else: an output of an input
            not committed is ``unexpected``) or at least once (each expected input at least once,
            duplicates counted; an output of an input sent but not yet committed is allowed).
    """
    expected = sent if committed is None else {(p, o) for p, o in sent if o < committed.get(p, 0)}
    seen = [(r.partition, r.offset) for r in records]
    unique = set(seen)
    report = {
        "guarantee": guarantee,
        "inputs": len(expected),
        "not_committed": len(sent) - len(expected),
        "predictions": sum(1 for r in records if r.topic == output),
        "dead_letters": sum(1 for r in records if r.topic != output),
        "duplicates": len(seen) - len(unique),
        "missing": len(expected - unique),
        "unexpected": len(unique - (expected if guarantee == EXACTLY_ONCE else sent)),
    }
    broken = ("missing", "unexpected") if guarantee == AT_LEAST_ONCE else ("duplicates", "missing", "unexpected")
    report["ok"] = not any(report[k] for k in broken)
    return report


def per_event(cpu_s: dict[str, float], events: int) -> float | None:
    """CPU ms per event of the broker, the consumer and TorchServe together."""
    return round(1000 * sum(cpu_s.get(c, 0.0) for c in SERVING) / events, 3) if events else None


def latencies(records: list[Output], since_ms: float) -> list[float]:
    """Each output's arrival minus its event's timestamp, in ms, for events produced from
    ``since_ms`` on (the warm-up before is left out)."""
    return [r.arrived - r.event_timestamp for r in records if r.event_timestamp >= since_ms]


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


# --------------------------------------------------------------------------- the broker's profile


def jdk_tool(name: str, java: str) -> str | None:
    """The JDK's ``name`` tool beside ``java`` (the broker's), else on the PATH; None: neither."""
    found = shutil.which(java)
    if found:
        beside = Path(found).resolve().parent / name
        if beside.is_file():
            return str(beside)
    return shutil.which(name)


class BrokerProfile:
    """A Java Flight Recorder recording of the broker's JVM, started and stopped with ``jcmd``
    (:data:`PROFILE_SETTINGS`, written to ``settings``)."""

    def __init__(self, pid: int, path: Path, java: str, settings: Path) -> None:
        self.pid, self.path, self.settings = pid, path.resolve(), settings.resolve()
        self.jcmd, self.jfr = jdk_tool("jcmd", java), jdk_tool("jfr", java)
        #: Why no recording was made (a tool missing, ``jcmd`` refused), or None.
        self.failed: str | None = None
        #: The broker's threads' CPU seconds at the start, then over the recording.
        self.threads: dict[str, float] = {}
        self.begin = self.seconds = 0.0
        if self.jcmd is None or self.jfr is None:
            self.failed = f"the JDK's jcmd and jfr are neither beside {java} nor on the PATH"

    def start(self) -> bool:
        """Start recording; False (and :attr:`failed` says why) when it cannot."""
        if self.failed:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self.settings.write_text(PROFILE_SETTINGS)
        try:
            run([self.jcmd, self.pid, "JFR.start", f"name={PROFILE_NAME}", f"settings={self.settings}"], 120)
        except RtserveError as exc:
            self.failed = f"JFR.start failed: {exc}"
            logger.warning(">> broker profile not recorded: %s", self.failed)
            return False
        self.begin, self.threads = time.monotonic(), jvm_threads_cpu(self.pid)
        return True

    def stop(self) -> None:
        """Stop recording and write the file."""
        after, self.seconds = jvm_threads_cpu(self.pid), time.monotonic() - self.begin
        self.threads = {k: round(v - self.threads.get(k, 0.0), 2) for k, v in after.items()}
        try:
            run([self.jcmd, self.pid, "JFR.stop", f"name={PROFILE_NAME}", f"filename={self.path}"], 120)
        except RtserveError as exc:
            self.failed = f"JFR.stop failed: {exc}"
            logger.warning(">> broker profile not written: %s", self.failed)

    def top(self, n: int = PROFILE_TOP) -> dict:
        """The recording's CPU samples by top frame and by thread (:func:`top_frames`), or why there are none."""
        if self.failed or not self.path.is_file():
            return {"file": None, "error": self.failed or f"{self.path} was not written"}
        done = run([self.jfr, "print", "--events", "jdk.ExecutionSample", self.path], 600, apart=True)
        samples, frames, threads = top_frames(done.stdout, n)
        return {
            "file": str(self.path),
            "seconds": round(self.seconds, 1),
            "samples": samples,
            "top_frames": frames,
            "top_threads": threads,
            "thread_cpu_total_s": round(sum(v for v in self.threads.values() if v > 0), 2),
            "thread_cpu_s": sorted(((k, v) for k, v in self.threads.items() if v > 0), key=lambda kv: -kv[1])[:n],
        }


def pool(name: str) -> str:
    """A thread's name without its number in the pool (``kafka-scheduler-3``: ``kafka-scheduler``)."""
    return re.sub(r"[-_# ]?\d+$", "", name)


def top_frames(text: str, n: int) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """``jfr print --events jdk.ExecutionSample``'s text: how many samples, the ``n`` most frequent
    top frames (the method, its line number dropped) and threads (:func:`pool`), each with its
    count. The samples of :data:`RECORDER_THREAD` (``jcmd``'s own work) are left out."""
    frames: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    samples, counted, top_next = 0, False, False
    for line in text.splitlines():
        item = line.strip()
        if item.startswith("jdk.ExecutionSample"):
            counted = False
        elif item.startswith("sampledThread = "):
            name = item.split('"')[1] if item.count('"') >= 2 else item.removeprefix("sampledThread = ")
            counted = name != RECORDER_THREAD
            if counted:
                samples += 1
                threads[pool(name)] += 1
        elif item.startswith("stackTrace = ["):
            top_next = counted
        elif top_next:
            top_next = False
            if item not in ("]", "..."):
                frames[re.sub(r"\s+line: \d+.*$", "", item)] += 1
    return samples, frames.most_common(n), threads.most_common(n)


def jvm_threads_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of process ``pid``'s threads by name (``/proc/<pid>/task/*/comm``: at
    most 15 characters, :func:`pool`): native ones (GC, JIT) and time in native code included."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = pool(comm)
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


# --------------------------------------------------------------------------- phases


class Bench:
    """One run: the broker, the server, and a consumer started per phase."""

    def __init__(self, args, bootstrap: str, procs: Processes, profile: BrokerProfile | None = None) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.procs = procs
        self.profile = profile
        self.work = args.run_root / "bench-stream"

    def start(self, who: str, names: dict[str, str]) -> Running:
        """Start ``who``'s consumer on ``names``."""
        group = f"bench-{names['output']}"
        if who.startswith(NAIVE):
            naive = Naive(
                self.work / names["output"],
                [
                    "--bootstrap",
                    self.bootstrap,
                    "--mar",
                    str(self.args.model_store / f"{self.args.model}_{self.args.version}.mar"),
                    "--group",
                    group,
                    "--input",
                    names["input"],
                    "--output",
                    names["output"],
                    *(["--flush-each"] if who == NAIVE_FLUSH else []),
                ],
            )
            self.procs.consumer = naive.pid
            return Running(who, naive.pid, naive.stop, group)
        props = self.procs.server.props
        stream_dir = self.work / names["output"]
        (port,) = free_ports(1)
        pid, _ = service.start(
            stream_dir,
            [
                "--bootstrap",
                self.bootstrap,
                "--inference",
                props["inference_address"],
                "--management",
                props["management_address"],
                "--key-file",
                str(self.procs.server.key_file),
                "--model",
                self.args.model,
                "--group",
                group,
                "--transactional-id",
                group,
                "--input",
                names["input"],
                "--output",
                names["output"],
                "--dead-letters",
                names["dead_letters"],
                *self.args.stream_option,
                # after the user's options: the last --metrics-port is the one taken
                "--metrics-port",
                str(port),
                *(["--guarantee", AT_LEAST_ONCE] if who == SHIPPED_ALO else []),
            ],
        )
        self.procs.consumer = pid
        return Running(who, pid, lambda: service.stop(stream_dir) or "", group, port)

    def finish(self, phase: Phase, running: Running, reader: Reader, sent: set, names: dict[str, str]) -> Phase:
        """Stop the consumer; for the shipped one, read both outputs to their ends and check its
        delivery against what its group committed."""
        phase.consumer_said = running.stop().strip()
        self.procs.consumer = None
        if running.who in GUARANTEE:
            reader.to_end()
            committed = committed_offsets(self.bootstrap, running.group, names["input"])
            phase.delivery = delivery(sent, reader.records, names["output"], committed, GUARANTEE[running.who])
        reader.close()
        phase.load_after = [round(x, 2) for x in os.getloadavg()]
        return phase

    def backlog(self, events: int, name: str = "backlog") -> tuple[str, set[tuple[int, int]]]:
        """An input topic with ``events`` waiting; returns its name and their coordinates."""
        names = topics(self.bootstrap, name)
        sender = Sender(self.bootstrap, linger_ms=5)
        begin = time.monotonic()
        sender.send(names["input"], event_values(events))
        sender.flush()
        logger.info(">> %d events produced into %s in %.1f s", events, names["input"], time.monotonic() - begin)
        return names["input"], sender.sent

    def saturation(
        self,
        who: str,
        backlog: tuple[str, set[tuple[int, int]]],
        events: int,
        window: float,
        phase_name: str = "saturation",
    ) -> Phase:
        """``who`` reads ``backlog`` from its beginning; measured over a window of ``events``
        outputs or ``window`` seconds, whichever comes first (from its first output on)."""
        names = {**topics(self.bootstrap, f"sat-{who}"), "input": backlog[0]}
        waiting = len(backlog[1])
        reader = Reader(self.bootstrap, [names["output"], names["dead_letters"]])
        load = [round(x, 2) for x in os.getloadavg()]
        logger.info(">> %s, %s consumer: %d events waiting", phase_name, who, waiting)
        running = self.start(who, names)
        at_first: list[tuple[dict, dict]] = []
        try:
            seen = reader.window(
                events, window, waiting, 120, on_first=lambda: at_first.append((self.procs.cpu(), running.counts()))
            )
            if seen is None:
                raise StreamError(f"the {who} consumer wrote nothing in 120 s")
            after, counts = self.procs.cpu(), running.counts()
        except BaseException:
            running.stop()
            reader.close()
            raise
        seconds = seen.end - seen.begin
        counted = len(reader.records) - seen.first
        phase = Phase(
            phase_name,
            who,
            None,
            waiting,
            counted,
            round(seconds, 2),
            round(counted / seconds, 1) if seconds > 0 else 0.0,
            ended_by=seen.ended_by,
            load_before=load,
        )
        phase.transactions, phase.events_per_transaction = per_transaction(at_first[0][1], counts)
        phase.stages = stage_times(at_first[0][1], counts)
        phase.cpu_s, phase.cpu_pct = split(at_first[0][0], after, seconds)
        phase.cpu_ms_per_event = per_event(phase.cpu_s, counted)
        return self.finish(phase, running, reader, backlog[1], names)

    def warm_up(self, events: int) -> Phase:
        """The shipped consumer scores ``events`` waiting ones (not a target: the broker's JVM and
        TorchServe warmed before the first measured phase)."""
        return self.saturation(SHIPPED, self.backlog(events, "warm"), events, float("inf"), "warm-up")

    def fixed_rate(self, who: str, rate: float, seconds: float, profile: bool = False) -> Phase:
        """``rate`` events/s for ``seconds`` (after a warm-up); latency per event. With
        ``profile``, the broker is recorded over the phase (:class:`BrokerProfile`)."""
        names = topics(self.bootstrap, f"rate-{who}")
        sender = Sender(self.bootstrap, linger_ms=5)
        reader = Reader(self.bootstrap, [names["output"], names["dead_letters"]])
        running = self.start(who, names)
        profiling = False
        try:
            sender.send(names["input"], event_values(WARMUP_EVENTS))
            sender.flush()
            if not reader.until(WARMUP_EVENTS, 120, 120) or len(reader.records) < WARMUP_EVENTS:
                raise StreamError(f"the {who} consumer did not score the {WARMUP_EVENTS} warm-up events")
            n = int(rate * seconds)
            paced = list(event_values(n, WARMUP_EVENTS))
            if profile and self.profile is not None:
                profiling = self.profile.start()
            logger.info(">> fixed rate, %s consumer: %d events at %.0f/s", who, n, rate)
            load = [round(x, 2) for x in os.getloadavg()]
            counts = running.counts()
            since_ms, before, begin = time.time() * 1000, self.procs.cpu(), time.monotonic()
            # the producer paces in a thread of its own; this one reads the outputs as they come
            took: list[float] = []
            pacer = threading.Thread(target=lambda: took.append(sender.paced(names["input"], paced, rate)))
            pacer.start()
            reader.until(WARMUP_EVENTS + n, 60, seconds + max(30.0, seconds))
            pacer.join()
            sender.flush()
            end, after, counts_after = time.monotonic(), self.procs.cpu(), running.counts()
            if profiling:
                profiling = False
                self.profile.stop()
        except BaseException:
            if profiling:
                self.profile.stop()
            running.stop()
            reader.close()
            raise
        values = latencies(reader.records, since_ms)
        read = len(reader.records) - WARMUP_EVENTS
        phase = Phase(
            "fixed rate",
            who,
            round(rate, 1),
            n,
            read,
            round(end - begin, 2),
            round(read / (end - begin), 1),
            quantile(values, 0.5),
            quantile(values, 0.99),
            round(max(values), 1) if values else None,
            produced_per_s=round(n / took[0], 1) if took and took[0] > 0 else None,
            load_before=load,
            broker_profiled=profile and self.profile is not None and not self.profile.failed,
        )
        phase.transactions, phase.events_per_transaction = per_transaction(counts, counts_after)
        phase.stages = stage_times(counts, counts_after)
        phase.cpu_s, phase.cpu_pct = split(before, after, end - begin)
        phase.cpu_ms_per_event = per_event(phase.cpu_s, read)
        return self.finish(phase, running, reader, sender.sent, names)

    def transport(self, rate: float, seconds: float) -> Phase:
        """The paced producer and the reader alone at ``rate`` for ``seconds`` (after a warm-up),
        the reader reading the input: each event's arrival minus its timestamp, the floor under
        the consumers' latency (a phase of its own, so that its reading costs them nothing)."""
        names = topics(self.bootstrap, "rate-transport")
        sender = Sender(self.bootstrap, linger_ms=5)
        reader = Reader(self.bootstrap, [], floor=names["input"])
        try:
            sender.send(names["input"], event_values(WARMUP_EVENTS))
            sender.flush()
            n = int(rate * seconds)
            paced = list(event_values(n, WARMUP_EVENTS))
            logger.info(">> fixed rate, transport only: %d events at %.0f/s", n, rate)
            load = [round(x, 2) for x in os.getloadavg()]
            since_ms, before, begin = time.time() * 1000, self.procs.cpu(), time.monotonic()
            took: list[float] = []
            pacer = threading.Thread(target=lambda: took.append(sender.paced(names["input"], paced, rate)))
            pacer.start()
            deadline = time.monotonic() + seconds + max(30.0, seconds)
            while len(reader.floor) < WARMUP_EVENTS + n and time.monotonic() < deadline:
                reader.poll()
            pacer.join()
            sender.flush()
            end, after = time.monotonic(), self.procs.cpu()
        finally:
            reader.close()
        values = [arrived - stamp for stamp, arrived in reader.floor if stamp >= since_ms]
        read = len(reader.floor) - WARMUP_EVENTS
        phase = Phase(
            "fixed rate",
            TRANSPORT,
            round(rate, 1),
            n,
            read,
            round(end - begin, 2),
            round(read / (end - begin), 1),
            quantile(values, 0.5),
            quantile(values, 0.99),
            round(max(values), 1) if values else None,
            produced_per_s=round(n / took[0], 1) if took and took[0] > 0 else None,
            load_before=load,
        )
        phase.cpu_s, phase.cpu_pct = split(before, after, end - begin)
        phase.load_after = [round(x, 2) for x in os.getloadavg()]
        return phase


def start_broker(args) -> Layout:
    """A fresh broker on free ports under ``--run-root`` (stopped by the caller)."""
    run_dir = args.run_root / "bench-stream" / "kafka"
    layout = Layout(
        run_dir, args.kafka_libs, local.resolve_ports(run_dir, {}), heap=args.kafka_heap, partitions=PARTITIONS
    )
    took = local.start(layout, fresh=True, topics=())
    logger.info(">> Kafka ready at %s in %.1f s", layout.bootstrap, sum(took.values()))
    return layout


# --------------------------------------------------------------------------- report

HEADS = ("broker", "consumer", "TS front", "TS workers", "bench", "others")


def render(phases: list[Phase], summary: list[str], cpus: int) -> str:
    lines = [
        f"{'phase':20} {'consumer':11} {'events':>7} {'read':>7} {'s':>6} {'events/s':>9} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'txns':>6} {'ev/txn':>7} {'CPU ms/ev':>9}  "
        + " ".join(f"{h:>10}" for h in HEADS)
        + "  load",
        f"{'':20} {'':11} {'':>7} {'':>7} {'':>6} {'':>9} {'':>7} {'':>7} {'':>6} {'':>7} {'':>9}  "
        + f"{'CPU % of one core over the phase (' + str(cpus) + ' cores)':^65}",
    ]
    for p in phases:
        name = p.phase if p.offered_per_s is None else f"{p.phase} {p.offered_per_s:.0f}/s"
        lines.append(
            f"{name:20} {p.consumer:11} {p.events:>7} {p.read:>7} {p.seconds:>6.1f} "
            f"{p.events_per_s:>9.1f} {_ms(p.p50_ms):>7} {_ms(p.p99_ms):>7} "
            f"{'-' if p.transactions is None else p.transactions:>6} {_ms(p.events_per_transaction):>7} "
            f"{p.cpu_ms_per_event or 0:>9.3f}  "
            + " ".join(f"{p.cpu_pct.get(c, 0):>10.1f}" for c in COMPONENTS)
            + f"  {p.load_before[0] if p.load_before else '':}"
        )
    return "\n".join(lines + [""] + summary)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _stage(t: dict) -> str:
    """``4.2 (<= 10)``: a stage's mean ms and the bucket bound 99 % of its micro-batches stayed within."""
    within = "over the last bucket" if t["p99_within_ms"] is None else f"<= {t['p99_within_ms']:g}"
    return f"{t['mean_ms']:g} ({within})"


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def summarize(
    phases: list[Phase], events: int, window: float, alo_skipped: str | None = None
) -> tuple[list[str], dict, bool]:
    """The targets met or missed, the figures beside them and the delivery checks.

    Returns:
        The lines, the targets (name -> value, target and whether met) and whether every
        delivery check held.
    """
    by = {(p.phase, p.consumer): p for p in phases}
    out, targets = ["targets (issue 38):"], {}
    eo = by.get(("fixed rate", SHIPPED))
    if eo is not None and eo.p99_ms is not None:
        targets["exactly_once_p50_ms"] = {"value": eo.p50_ms, "target": TARGET_EO_P50_MS}
        targets["exactly_once_p99_ms"] = {"value": eo.p99_ms, "target": TARGET_EO_P99_MS}
        out.append(
            f"  exactly once at {eo.offered_per_s:.0f} events/s: p50 {eo.p50_ms} ms (<= {TARGET_EO_P50_MS:.0f} ms: "
            f"{_verdict(eo.p50_ms <= TARGET_EO_P50_MS)}), p99 {eo.p99_ms} ms (<= {TARGET_EO_P99_MS:.0f} ms: "
            f"{_verdict(eo.p99_ms <= TARGET_EO_P99_MS)})"
            + (" (broker profiled meanwhile)" if eo.broker_profiled else "")
        )
    alo = by.get(("fixed rate", SHIPPED_ALO))
    if alo is not None and alo.p99_ms is not None:
        targets["at_least_once_p99_ms"] = {"value": alo.p99_ms, "target": TARGET_ALO_P99_MS}
        out.append(
            f"  at least once at {alo.offered_per_s:.0f} events/s: p50 {alo.p50_ms} ms, p99 {alo.p99_ms} ms "
            f"(<= {TARGET_ALO_P99_MS:.0f} ms: {_verdict(alo.p99_ms <= TARGET_ALO_P99_MS)})"
        )
    elif alo_skipped:
        targets["at_least_once_p99_ms"] = {"value": None, "target": TARGET_ALO_P99_MS, "skipped": alo_skipped}
        out.append(f"  at least once: phase skipped, {alo_skipped}")
    shipped = by.get(("saturation", SHIPPED))
    naive = by.get(("saturation", NAIVE))
    if shipped is not None and naive is not None and naive.events_per_s:
        ratio = shipped.events_per_s / naive.events_per_s
        held = shipped.delivery is not None and shipped.delivery["ok"]
        targets["throughput_ratio"] = {"value": round(ratio, 2), "target": TARGET_RATIO, "exactly_once": held}
        out.append(
            f"  saturation, exactly once: shipped {shipped.events_per_s:.0f} events/s, {ratio:.2f}x the naive "
            f"consumer's {naive.events_per_s:.0f} (>= {TARGET_RATIO:.0f}x, exactly once: "
            f"{_verdict(ratio >= TARGET_RATIO and held)})"
        )
    for name in ("exactly_once_p50_ms", "exactly_once_p99_ms", "at_least_once_p99_ms"):
        if name in targets and targets[name]["value"] is not None:
            targets[name]["met"] = targets[name]["value"] <= targets[name]["target"]
    if "throughput_ratio" in targets:
        t = targets["throughput_ratio"]
        t["met"] = t["value"] >= t["target"] and t["exactly_once"]
    out.append("beside them:")
    flush = by.get(("saturation", NAIVE_FLUSH))
    if shipped is not None and flush is not None and flush.events_per_s:
        out.append(
            f"  saturation: naive-flush {flush.events_per_s:.0f} events/s (the shipped consumer "
            f"{shipped.events_per_s / flush.events_per_s:.2f}x)"
        )
    closed = {
        "events": f"--events {events}",
        "seconds": f"--window {window:g} s",
        "backlog": "the backlog's end: raise --events",
    }
    for p in phases:
        if p.phase == "saturation":
            out.append(
                f"  saturation window, {p.consumer}: {p.read} events in {p.seconds} s (closed by {closed[p.ended_by]})"
            )
    for who, what in ((TRANSPORT, "transport floor (the paced producer and the reader, no consumer)"), (NAIVE, NAIVE)):
        p = by.get(("fixed rate", who))
        if p is not None and p.p99_ms is not None:
            out.append(f"  {what} at {p.offered_per_s:.0f} events/s: p50 {p.p50_ms} ms, p99 {p.p99_ms} ms")
    for p in phases:
        if p.produced_per_s is not None and p.offered_per_s and p.produced_per_s < PACE_SHARE * p.offered_per_s:
            out.append(
                f"  fixed rate, {p.consumer}: the producer offered only {p.produced_per_s:.0f} of "
                f"{p.offered_per_s:.0f} events/s (the machine is busy)"
            )
        elif p.offered_per_s and p.events_per_s < PACE_SHARE * p.offered_per_s:
            out.append(
                f"  fixed rate, {p.consumer}: {p.events_per_s:.0f} of the {p.offered_per_s:.0f} events/s offered "
                f"came through (a backlog built up: its latency is mostly the backlog's age)"
            )
    for p in phases:
        if p.stages:
            batches = max(t["batches"] for t in p.stages.values())
            out.append(
                f"  {p.phase}, {p.consumer}: ms per stage of its {batches} micro-batches, mean (99 % within): "
                + ", ".join(f"{name} {_stage(t)}" for name, t in p.stages.items())
            )
    jit = [f"{p.phase} {p.consumer} {p.cpu_pct[BROKER_JIT]:.0f}" for p in phases if BROKER_JIT in p.cpu_pct]
    if jit:
        out.append(f"  the broker's JIT compiler threads, % of one core (part of its CPU): {', '.join(jit)}")
    ok = True
    out.append("delivery (the shipped consumer, read back with read_committed after it stopped):")
    for p in phases:
        if p.delivery is not None:
            d = p.delivery
            ok = ok and d["ok"]
            rest = f", {d['not_committed']} left in the input" if d["not_committed"] else ""
            out.append(
                f"  {d['guarantee']}, {p.phase}: {d['inputs']} committed input offsets -> {d['predictions']} "
                f"predictions + {d['dead_letters']} dead letters, {d['duplicates']} duplicates, "
                f"{d['missing']} missing, {d['unexpected']} unexpected{rest}: {'ok' if d['ok'] else 'BROKEN'}"
            )
        if p.consumer in GUARANTEE and p.phase == "fixed rate" and p.read < p.events:
            ok = False
            out.append(f"  the {p.consumer} consumer wrote {p.read} of {p.events} events in the {p.phase} phase")
    targets["delivery"] = ok
    return out, targets, ok


def profile_lines(profile: dict) -> list[str]:
    """The broker profile's top frames and threads, as shares of its samples."""
    if profile.get("error"):
        return [f"broker profile: none ({profile['error']})"]
    total = profile["samples"] or 1
    lines = [
        f"broker profile ({profile['file']}, over the exactly-once fixed-rate phase): {profile['samples']} Java "
        f"CPU samples (jdk.ExecutionSample); top {len(profile['top_frames'])} top frames:"
    ]
    lines += [f"  {100 * n / total:5.1f}%  {n:>6}  {frame}" for frame, n in profile["top_frames"]]
    lines.append("the same samples by thread:")
    lines += [f"  {100 * n / total:5.1f}%  {n:>6}  {name}" for name, n in profile["top_threads"]]
    cpu = profile["thread_cpu_total_s"] or 1.0
    lines.append(
        f"the broker's CPU by thread over the recording's {profile['seconds']} s: {profile['thread_cpu_total_s']} s "
        f"(/proc; names cut at 15 characters; GC, JIT and native code included):"
    )
    lines += [f"  {100 * v / cpu:5.1f}%  {v:>6.2f} s  {name}" for name, v in profile["thread_cpu_s"]]
    return lines


def main(argv: list[str] | None = None) -> int:
    common.log_to_stdout()
    p = common.parser(__doc__, "stream.json")
    p.add_argument("--kafka-libs", type=Path, required=True, help="the jars of make kafka-deps")
    p.add_argument("--kafka-heap", default="512m")
    p.add_argument(
        "--events",
        type=int,
        default=200_000,
        help="the saturation window's events: it closes after this many outputs or --window seconds, "
        "whichever comes first (the backlog holds these and a few more)",
    )
    p.add_argument("--window", type=float, default=20.0, help="the saturation window's seconds")
    p.add_argument(
        "--warmup-events",
        type=int,
        default=30_000,
        help="events the shipped consumer scores before the first measured phase (the broker warmed)",
    )
    p.add_argument("--seconds", type=float, default=20.0, help="length of each fixed-rate phase")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE, help="the fixed rate offered, events/s")
    p.add_argument(
        "--profile-broker",
        action="store_true",
        help=f"record the broker with Java Flight Recorder over the exactly-once fixed-rate phase "
        f"({PROFILE_FILE} beside --out) and print its top frames",
    )
    p.add_argument(
        "--stream-option",
        action="append",
        default=[],
        help="an option of `rtserve stream run` for the shipped consumer (repeat: "
        "--stream-option=--batch --stream-option=128)",
    )
    args = p.parse_args(argv)
    load_start = [round(x, 2) for x in os.getloadavg()]
    alo = takes_guarantee()
    alo_skipped = None if alo else "the consumer lacks the option (`rtserve stream run --help` lists no --guarantee)"
    if alo_skipped:
        logger.info(">> at-least-once phase skipped: %s", alo_skipped)
    layout = start_broker(args)
    phases: list[Phase] = []
    profiled = None
    try:
        profile = None
        if args.profile_broker:
            profile = BrokerProfile(
                local.pid(layout.run_dir), args.out.parent / PROFILE_FILE, layout.java, layout.run_dir / "samples.jfc"
            )
        with common.serving(args, "bench-stream/ts") as server:
            bench = Bench(args, layout.bootstrap, Processes(local.pid(layout.run_dir), server), profile)
            backlog = bench.backlog(args.events + BACKLOG_HEAD)
            phases.append(bench.warm_up(args.warmup_events))
            for who in (SHIPPED, NAIVE, NAIVE_FLUSH):
                phases.append(bench.saturation(who, backlog, args.events, args.window))
            del backlog
            phases.append(bench.transport(args.rate, args.seconds))
            phases.append(bench.fixed_rate(SHIPPED, args.rate, args.seconds, profile=profile is not None))
            if alo:
                phases.append(bench.fixed_rate(SHIPPED_ALO, args.rate, args.seconds))
            phases.append(bench.fixed_rate(NAIVE, args.rate, args.seconds))
        if profile is not None:
            profiled = profile.top()
    finally:
        logger.info(">> %s", local.stop(layout.run_dir))
    summary, targets, ok = summarize(phases, args.events, args.window, alo_skipped)
    if profiled is not None:
        summary += profile_lines(profiled)
    load_end = [round(x, 2) for x in os.getloadavg()]
    summary.append(
        f"load average (1, 5, 15 min): {load_start} at the start, {load_end} at the end; "
        f"{psutil.cpu_count()} cores shared with other work"
    )
    report = {
        "phases": [asdict(ph) for ph in phases],
        "targets": targets,
        "broker_profile": profiled,
        "settings": {
            "events": args.events,
            "window_s": args.window,
            "warmup_events": args.warmup_events,
            "seconds": args.seconds,
            "rate": args.rate,
            "partitions": PARTITIONS,
            "stream_options": args.stream_option,
            "at_least_once": "run" if alo else alo_skipped,
            "latency": "output arrival at a read_committed reader minus the event's CreateTime",
        },
        "load_start": load_start,
        "load_end": load_end,
        "cpus": psutil.cpu_count(),
    }
    return common.finish(report, args.out, render(phases, summary, psutil.cpu_count()), ok)


if __name__ == "__main__":
    sys.exit(main())
