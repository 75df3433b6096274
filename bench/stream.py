"""Kafka stream scoring: rtserve's stream consumer against the naive one, on one broker.

One run starts a single-node Kafka broker (``rtserve.stream.local``, fresh, on free loopback
ports) and a TorchServe serving the ``.mar`` (:func:`bench.common.serving`), then measures,
back to back so that the ratio is fair on a busy machine:

1. **Saturation.** The input topic is filled with ``--events`` events first; then the consumer
   starts and every output is read back with ``read_committed``. Events/s are the outputs
   after the first one over the time from the first output to the last (the group join and
   the consumer's start are left out). The shipped consumer (``python -m rtserve stream run``,
   what ``make stream`` starts, scoring through TorchServe) reads all ``--events``; the naive
   one (:mod:`bench.stream_naive`: one message at a time, in-process model) reads what it gets
   through in ``--naive-seconds``, once producing its results asynchronously (``naive``) and
   once waiting for each delivery (``naive-flush``).
2. **Fixed rate.** Half the shipped consumer's saturation, offered by a paced producer
   (``linger.ms`` 5, the client's default) for ``--seconds`` to the shipped and the naive consumer in turn (after
   200 warm-up events, left out). Latency per event: the output's arrival at a
   ``read_committed`` reader (wall clock) minus the event's timestamp (its CreateTime, set by
   the producer when it was produced), both on this host's clock; p50 and p99 over the phase.
   Before them, the same producer and reader alone at that rate (``transport``: the reader
   reads the input, no consumer in the path) give the transport's floor: the producer's linger,
   the broker, the reader's fetch and this process's turn on a core.

Exactly once (shipped consumer, each phase): after the consumer stopped, both outputs are read
to their ends with ``read_committed``; the input offsets must equal the union of the
predictions' and dead letters' source offsets, with no duplicate. (The naive consumer is not
checked: it commits offsets on a timer, it has no such guarantee.)

CPU per phase (saturation: from the first output to the last; fixed rate: from the first
paced event to the last output), from ``/proc/<pid>/stat`` of the processes
started here (:func:`bench.perf.tree_cpu`): the broker's JVM, the consumer, TorchServe's
frontend and its Python workers, this script (the producer and the reader), and the rest of
the machine. Output: a table on stdout and JSON (default ``bench/results/stream.json``).

    make bench-stream
    .venv/bin/python -m bench.stream --kafka-libs ~/.cache/rtserve/kafka/4.4.0/libs --events 5000 --seconds 10
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from bench import common
from bench.perf import busy_cpu, tree_cpu
from bench.stream_naive import STARTED as NAIVE_STARTED
from rtserve.errors import StreamError
from rtserve.runtime.process import PidFile, spawn, tail, terminate, wait_until
from rtserve.server.torchserve import TorchServe
from rtserve.stream import admin, local, service
from rtserve.stream.broker import Layout

logger = logging.getLogger("bench.stream")

PARTITIONS = 4
WARMUP_EVENTS = 200
REQUEST = common.REPO / "examples" / "request.json"
#: The targets of issue 25: throughput against the naive consumer, p99 at the fixed rate.
TARGET_RATIO = 5.0
TARGET_P99_MS = 50.0
#: The CPU split's components (``others``: the rest of the machine).
COMPONENTS = ("broker", "consumer", "torchserve frontend", "torchserve workers", "bench", "others")
#: The components that do the stream's work (the CPU per event counts these).
SERVING = COMPONENTS[:4]


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
    #: CPU seconds per component over the measured window, and the same as % of one core.
    cpu_s: dict = field(default_factory=dict)
    cpu_pct: dict = field(default_factory=dict)
    #: CPU ms per event written of the broker, the consumer and TorchServe together.
    cpu_ms_per_event: float | None = None
    load_before: list = field(default_factory=list)
    load_after: list = field(default_factory=list)
    exactly_once: dict | None = None
    consumer_said: str = ""


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
    used["others"] = max(0.0, machine - sum(used.values()))
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
        terminate(self.pid, 30, program=self.pid_file.program())
        self.pid_file.remove()
        return tail(self.log, 1)


# --------------------------------------------------------------------------- topics and records


def topics(bootstrap: str, name: str) -> dict[str, str]:
    """Fresh input, output and dead-letter topics for one phase."""
    run = f"{name}-{uuid.uuid4().hex[:6]}"
    names = {"input": f"events-{run}", "output": f"predictions-{run}", "dead_letters": f"dlq-{run}"}
    admin.create_topics(bootstrap, names.values(), PARTITIONS)
    if not wait_until(lambda: set(names.values()) <= set(admin.topics(bootstrap)), 30, poll=0.2):
        raise StreamError(f"topics {sorted(names.values())} not led within 30 s")
    return names


def event_values(n: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    """``n`` valid events (the example request's features, an ``id`` each), keyed by ``id``."""
    features = json.loads(REQUEST.read_text())["features"]
    return [
        (f"e{i}".encode(), json.dumps({"features": features, "id": f"e{i}"}).encode()) for i in range(start, start + n)
    ]


class Sender:
    """A producer whose delivered events' coordinates are kept (the exactly-once check's inputs)."""

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

    def send(self, topic: str, events: list[tuple[bytes, bytes]]) -> None:
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

    def flush(self) -> None:
        if self.producer.flush(60) != 0 or self.failed:
            raise StreamError(f"events not delivered: {self.failed[:3] or 'flush timed out'}")


class Reader:
    """A ``read_committed`` reader of the output topics from their beginnings, keeping each
    record's arrival time (wall clock, ms: when the poll that brought it returned) and value.
    With ``floor``, it reads that topic (the input) too: each event's timestamp and arrival, the
    transport's own latency (:meth:`Bench.transport`)."""

    def __init__(self, bootstrap: str, outputs: list[str], floor: str | None = None) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 50,
                "log_level": 4,
            }
        )
        self.consumer.assign(
            [TopicPartition(t, p, OFFSET_BEGINNING) for t in outputs for p in range(PARTITIONS)]
            + [TopicPartition(floor, p, OFFSET_BEGINNING) for p in range(PARTITIONS) if floor]
        )
        self.parts = len(outputs) * PARTITIONS
        self.floor_topic = floor
        self.records: list[tuple[float, str, dict]] = []
        #: The input's events: (timestamp, arrival) in ms.
        self.floor: list[tuple[float, float]] = []
        self.eof: set[tuple[str, int]] = set()

    def poll(self, timeout: float = 0.1) -> int:
        """Read what is there (up to 500 records): at most ``timeout`` for the first, then only
        those already fetched (``consume(500, timeout)`` returns when 500 came or the timeout
        passed: below 5,000 records/s each arrival was counted up to 100 ms late); returns how
        many outputs came."""
        got = 0
        polled = self.consumer.consume(1, timeout)
        if polled:
            polled += self.consumer.consume(499, 0)
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
            self.records.append((now, msg.topic(), json.loads(msg.value())))
            got += 1
        return got

    def until(
        self, count: int, first_timeout: float, window: float, on_first: Callable[[], object] | None = None
    ) -> tuple[float, int] | None:
        """Read until ``count`` records came: the first within ``first_timeout``, the rest within
        ``window`` after it (``on_first`` is called as soon as the first came). Returns when the
        first poll with records returned and how many it had (None: nothing came)."""
        deadline = time.monotonic() + first_timeout
        first = None
        while len(self.records) < count and time.monotonic() < deadline:
            if self.poll() and first is None:
                first = (time.monotonic(), len(self.records))
                if on_first is not None:
                    on_first()
                deadline = first[0] + window
        return first

    def to_end(self, timeout: float = 60) -> None:
        """Read until every partition said it is at its end (with nothing read since)."""
        deadline = time.monotonic() + timeout
        while len(self.eof) < self.parts:
            if time.monotonic() > deadline:
                raise StreamError(f"outputs not read to their ends in {timeout:.0f} s")
            self.poll()

    def close(self) -> None:
        self.consumer.close()


def exactly_once(sent: set[tuple[int, int]], records: list[tuple[float, str, dict]], output: str) -> dict:
    """The input offsets against the union of prediction and dead-letter source offsets."""
    seen = [(r["source"]["partition"], r["source"]["offset"]) for _, _, r in records]
    unique = set(seen)
    report = {
        "inputs": len(sent),
        "predictions": sum(1 for _, t, _ in records if t == output),
        "dead_letters": sum(1 for _, t, _ in records if t != output),
        "duplicates": len(seen) - len(unique),
        "missing": len(sent - unique),
        "unexpected": len(unique - sent),
    }
    report["ok"] = report["duplicates"] == report["missing"] == report["unexpected"] == 0
    return report


def per_event(cpu_s: dict[str, float], events: int) -> float | None:
    """CPU ms per event of the broker, the consumer and TorchServe together."""
    return round(1000 * sum(cpu_s.get(c, 0.0) for c in SERVING) / events, 3) if events else None


def latencies(records: list[tuple[float, str, dict]], since_ms: float) -> list[float]:
    """Each output's arrival minus its event's timestamp, in ms, for events produced from
    ``since_ms`` on (the warm-up before is left out)."""
    return [arrived - r["event_timestamp"] for arrived, _, r in records if r["event_timestamp"] >= since_ms]


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


# --------------------------------------------------------------------------- phases


class Bench:
    """One run: the broker, the server, and a consumer started per phase."""

    def __init__(self, args, bootstrap: str, procs: Processes) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.procs = procs
        self.work = args.run_root / "bench-stream"

    def start(self, who: str, names: dict[str, str]) -> object:
        """Start ``who``'s consumer on ``names``; returns what stops it."""
        group = f"bench-{names['input']}"
        if who.startswith("naive"):
            naive = Naive(
                self.work / names["input"],
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
                    *(["--flush-each"] if who == "naive-flush" else []),
                ],
            )
            self.procs.consumer = naive.pid
            return naive.stop
        props = self.procs.server.props
        stream_dir = self.work / names["input"]
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
            ],
        )
        self.procs.consumer = pid
        return lambda: service.stop(stream_dir) or ""

    def finish(self, phase: Phase, stop, reader: Reader, sender: Sender, names: dict[str, str]) -> Phase:
        """Stop the consumer; for the shipped one, read both outputs to their ends and check
        that each input offset is there exactly once."""
        phase.consumer_said = stop().strip()
        self.procs.consumer = None
        if phase.consumer == "shipped":
            reader.to_end()
            phase.exactly_once = exactly_once(sender.sent, reader.records, names["output"])
        reader.close()
        phase.load_after = [round(x, 2) for x in os.getloadavg()]
        return phase

    def saturation(self, who: str, events: int, window: float) -> Phase:
        """``events`` waiting in the input; the consumer reads what it gets through in ``window``
        seconds after its first output."""
        names = topics(self.bootstrap, f"sat-{who}")
        sender = Sender(self.bootstrap, linger_ms=5)
        sender.send(names["input"], event_values(events))
        sender.flush()
        reader = Reader(self.bootstrap, [names["output"], names["dead_letters"]])
        load = [round(x, 2) for x in os.getloadavg()]
        logger.info(">> saturation, %s consumer: %d events waiting", who, events)
        stop = self.start(who, names)
        cpu: list[dict] = []
        try:
            first = reader.until(events, 120, window, on_first=lambda: cpu.append(self.procs.cpu()))
            end, after = time.monotonic(), self.procs.cpu()
        except BaseException:
            stop()
            raise
        if first is None:
            stop()
            raise StreamError(f"the {who} consumer wrote nothing in 120 s")
        seconds = end - first[0]
        counted = len(reader.records) - first[1]
        phase = Phase(
            "saturation",
            who,
            None,
            events,
            len(reader.records),
            round(seconds, 2),
            round(counted / seconds, 1) if seconds > 0 else 0.0,
            load_before=load,
        )
        phase.cpu_s, phase.cpu_pct = split(cpu[0], after, seconds)
        phase.cpu_ms_per_event = per_event(phase.cpu_s, counted)
        return self.finish(phase, stop, reader, sender, names)

    def fixed_rate(self, who: str, rate: float, seconds: float) -> Phase:
        """``rate`` events/s for ``seconds`` (after a warm-up); latency per event."""
        names = topics(self.bootstrap, f"rate-{who}")
        sender = Sender(self.bootstrap, linger_ms=5)
        reader = Reader(self.bootstrap, [names["output"], names["dead_letters"]])
        stop = self.start(who, names)
        try:
            sender.send(names["input"], event_values(WARMUP_EVENTS))
            sender.flush()
            if reader.until(WARMUP_EVENTS, 120, 120) is None or len(reader.records) < WARMUP_EVENTS:
                raise StreamError(f"the {who} consumer did not score the {WARMUP_EVENTS} warm-up events")
            n = int(rate * seconds)
            paced = event_values(n, WARMUP_EVENTS)
            logger.info(">> fixed rate, %s consumer: %d events at %.0f/s", who, n, rate)
            load = [round(x, 2) for x in os.getloadavg()]
            since_ms, before, begin = time.time() * 1000, self.procs.cpu(), time.monotonic()
            # the producer paces in a thread of its own; this one reads the outputs as they come
            pacer = threading.Thread(target=sender.paced, args=(names["input"], paced, rate))
            pacer.start()
            reader.until(WARMUP_EVENTS + n, 60, seconds + max(30.0, seconds))
            pacer.join()
            sender.flush()
            end, after = time.monotonic(), self.procs.cpu()
        except BaseException:
            stop()
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
            load_before=load,
        )
        phase.cpu_s, phase.cpu_pct = split(before, after, end - begin)
        phase.cpu_ms_per_event = per_event(phase.cpu_s, read)
        return self.finish(phase, stop, reader, sender, names)

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
            paced = event_values(n, WARMUP_EVENTS)
            logger.info(">> fixed rate, transport only: %d events at %.0f/s", n, rate)
            load = [round(x, 2) for x in os.getloadavg()]
            since_ms, before, begin = time.time() * 1000, self.procs.cpu(), time.monotonic()
            pacer = threading.Thread(target=sender.paced, args=(names["input"], paced, rate))
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
            "transport",
            round(rate, 1),
            n,
            read,
            round(end - begin, 2),
            round(read / (end - begin), 1),
            quantile(values, 0.5),
            quantile(values, 0.99),
            round(max(values), 1) if values else None,
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
        f"{'phase':24} {'consumer':11} {'events':>6} {'read':>6} {'s':>6} {'events/s':>9} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'CPU ms/ev':>9}  " + " ".join(f"{h:>10}" for h in HEADS) + "  load",
        f"{'':24} {'':11} {'':>6} {'':>6} {'':>6} {'':>9} {'':>7} {'':>7} {'':>9}  "
        + f"{'CPU % of one core over the phase (' + str(cpus) + ' cores)':^65}",
    ]
    for p in phases:
        name = p.phase if p.offered_per_s is None else f"{p.phase} {p.offered_per_s:.0f}/s"
        lines.append(
            f"{name:24} {p.consumer:11} {p.events:>6} {p.read:>6} {p.seconds:>6.1f} "
            f"{p.events_per_s:>9.1f} {_ms(p.p50_ms):>7} {_ms(p.p99_ms):>7} {p.cpu_ms_per_event or 0:>9.3f}  "
            + " ".join(f"{p.cpu_pct.get(c, 0):>10.1f}" for c in COMPONENTS)
            + f"  {p.load_before[0] if p.load_before else '':}"
        )
    return "\n".join(lines + [""] + summary)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def summarize(phases: list[Phase], rate_given: bool = False) -> tuple[list[str], dict, bool]:
    by = {(p.phase, p.consumer): p for p in phases}
    shipped = by[("saturation", "shipped")]
    out, targets = [], {}
    for name in ("naive", "naive-flush"):
        naive = by.get(("saturation", name))
        if naive and naive.events_per_s:
            ratio = shipped.events_per_s / naive.events_per_s
            targets[f"throughput_ratio_{name}"] = round(ratio, 2)
            out.append(
                f"throughput: shipped {shipped.events_per_s:.0f} events/s, {name} {naive.events_per_s:.0f} "
                f"events/s: {ratio:.2f}x (target >= {TARGET_RATIO:.0f}x: "
                f"{'met' if ratio >= TARGET_RATIO else 'MISSED'})"
            )
    rate = by.get(("fixed rate", "shipped"))
    if rate and rate.p99_ms is not None:
        targets["p99_ms_at_fixed_rate"] = rate.p99_ms
        why = "as given" if rate_given else "half the shipped saturation"
        out.append(
            f"latency at {rate.offered_per_s:.0f} events/s ({why}): shipped p50 "
            f"{rate.p50_ms} ms, p99 {rate.p99_ms} ms (target < {TARGET_P99_MS:.0f} ms: "
            f"{'met' if rate.p99_ms < TARGET_P99_MS else 'MISSED'})"
        )
    floor = by.get(("fixed rate", "transport"))
    if floor and floor.p99_ms is not None:
        out.append(
            f"transport floor at {floor.offered_per_s:.0f} events/s (the paced producer and the reader, no "
            f"consumer): p50 {floor.p50_ms} ms, p99 {floor.p99_ms} ms"
        )
    ok = True
    for p in phases:
        if p.exactly_once is not None:
            e = p.exactly_once
            ok = ok and e["ok"]
            out.append(
                f"exactly once, shipped, {p.phase}: {e['inputs']} input offsets = {e['predictions']} "
                f"predictions + {e['dead_letters']} dead letters, {e['duplicates']} duplicates, "
                f"{e['missing']} missing: {'ok' if e['ok'] else 'BROKEN'}"
            )
        if p.consumer == "shipped" and p.read < p.events:
            ok = False
            out.append(f"the shipped consumer wrote {p.read} of {p.events} events in the {p.phase} phase")
    targets["exactly_once"] = ok
    return out, targets, ok


def main(argv: list[str] | None = None) -> int:
    common.log_to_stdout()
    p = common.parser(__doc__, "stream.json")
    p.add_argument("--kafka-libs", type=Path, required=True, help="the jars of make kafka-deps")
    p.add_argument("--kafka-heap", default="512m")
    p.add_argument("--events", type=int, default=20000, help="events waiting for the shipped consumer")
    p.add_argument(
        "--naive-seconds",
        type=float,
        default=20.0,
        help="how long the naive consumer reads the same backlog (after its first output)",
    )
    p.add_argument("--seconds", type=float, default=20.0, help="length of each fixed-rate phase")
    p.add_argument("--rate", type=float, help="the fixed rate (default: half the shipped saturation)")
    p.add_argument(
        "--stream-option",
        action="append",
        default=[],
        help="an option of `rtserve stream run` for the shipped consumer (repeat: "
        "--stream-option=--batch --stream-option=128)",
    )
    args = p.parse_args(argv)
    load_start = [round(x, 2) for x in os.getloadavg()]
    layout = start_broker(args)
    phases: list[Phase] = []
    try:
        with common.serving(args, "bench-stream/ts") as server:
            bench = Bench(args, layout.bootstrap, Processes(local.pid(layout.run_dir), server))
            phases.append(bench.saturation("shipped", args.events, 600))
            phases.append(bench.saturation("naive", args.events, args.naive_seconds))
            phases.append(bench.saturation("naive-flush", args.events, args.naive_seconds))
            rate = args.rate or phases[0].events_per_s / 2
            phases.append(bench.transport(rate, args.seconds))
            phases.append(bench.fixed_rate("shipped", rate, args.seconds))
            phases.append(bench.fixed_rate("naive", rate, args.seconds))
    finally:
        logger.info(">> %s", local.stop(layout.run_dir))
    summary, targets, ok = summarize(phases, rate_given=args.rate is not None)
    load_end = [round(x, 2) for x in os.getloadavg()]
    summary.append(
        f"load average (1, 5, 15 min): {load_start} at the start, {load_end} at the end; "
        f"{psutil.cpu_count()} cores shared with other work"
    )
    report = {
        "phases": [asdict(ph) for ph in phases],
        "targets": targets,
        "settings": {
            "events": args.events,
            "naive_seconds": args.naive_seconds,
            "seconds": args.seconds,
            "partitions": PARTITIONS,
            "stream_options": args.stream_option,
            "latency": "output arrival at a read_committed reader minus the event's CreateTime",
        },
        "load_start": load_start,
        "load_end": load_end,
        "cpus": psutil.cpu_count(),
    }
    return common.finish(report, args.out, render(phases, summary, psutil.cpu_count()), ok)


if __name__ == "__main__":
    sys.exit(main())
