"""What the stream tier's tests share: topics of a test's own, producing events, running a
member in a thread, and the exactly-once check every test ends with (the outputs read with
read_committed hold each input offset once, in each partition's order)."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from rtserve.client.rest import Client
from rtserve.stream import admin
from rtserve.stream.consumer import StreamConfig, StreamConsumer
from tests.conftest import MODEL_NAME
from tests.helpers import features

PARTITIONS = 2
#: The input topics accept records up to this size (the broker's default is about 1 MB), so
#: that an oversized event reaches the consumer, which dead-letters it.
MAX_EVENT_RECORD = 8 * 1024 * 1024


def read_all(bootstrap: str, topic: str, timeout: float = 30) -> list[Message]:
    """Every committed record of ``topic``, read with read_committed to the partitions' ends."""
    cons = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    cons.subscribe([topic])
    got, ends, deadline = [], set(), time.monotonic() + timeout
    while len(ends) < PARTITIONS and time.monotonic() < deadline:
        msg = cons.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            ends.add(msg.partition())
        else:
            got.append(msg)
    cons.close()
    assert len(ends) == PARTITIONS, f"{topic}: not read to its end in {timeout} s"
    return got


def stream_topics(kafka) -> dict[str, str]:
    """Topics of this test's own (events, predictions, events.dlq), ``PARTITIONS`` each; the
    input takes records up to :data:`MAX_EVENT_RECORD`."""
    run = uuid.uuid4().hex[:8]
    topics = {name: f"{name}-{run}" for name in ("events", "predictions", "events.dlq")}
    admin.create_topics(
        kafka.bootstrap, [topics["events"]], PARTITIONS, config={"max.message.bytes": str(MAX_EVENT_RECORD)}
    )
    admin.create_topics(kafka.bootstrap, [topics["predictions"], topics["events.dlq"]], PARTITIONS)
    return topics


def produce(
    kafka, topic: str, events: list[tuple[bytes, bytes]], partition: int | None = None
) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """Send ``(key, value)`` events (into ``partition``, else where their keys hash); what landed
    where: (partition, offset) -> (key, value)."""
    into = {} if partition is None else {"partition": partition}
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True, "message.max.bytes": MAX_EVENT_RECORD}
    )
    sent = {}

    def delivered(err, msg):
        assert err is None, err
        sent[(msg.partition(), msg.offset())] = (msg.key(), msg.value())

    for key, value in events:
        producer.produce(topic, key=key, value=value, on_delivery=delivered, **into)
    assert producer.flush(30) == 0 and len(sent) == len(events)
    return sent


def valid_events(n: int, start: int = 0) -> list[tuple[bytes, bytes]]:
    return [
        (b"k%d" % (i % 5), json.dumps({"features": features(value=0.1 * (i % 7)), "id": f"e{i}"}).encode())
        for i in range(start, start + n)
    ]


def member_of(kafka, topics: dict[str, str], client: Client, name: str = "a", **settings) -> StreamConsumer:
    """A member of the test's group; each ``name`` has a transactional id of its own (two
    members with one id would fence each other)."""
    run = topics["events"].rsplit("-", 1)[1]
    config = StreamConfig(
        kafka.bootstrap,
        model=MODEL_NAME,
        group=f"stream-{run}",
        input=topics["events"],
        output=topics["predictions"],
        dead_letters=topics["events.dlq"],
        transactional_id=f"stream-{run}-{name}",
        **{"batch": 16, **settings},
    )
    return StreamConsumer(config, client)


@contextmanager
def running(member: StreamConsumer):
    """``member`` consuming in a thread until the block ends."""
    stop = threading.Event()
    # A daemon: one stuck past the join below fails its test, and must not hold the tier at exit.
    worker = threading.Thread(target=member.run, args=(stop,), daemon=True)
    worker.start()
    try:
        yield worker
    finally:
        stop.set()
        worker.join(60)
    assert not worker.is_alive(), "the consumer did not stop within 60 s"


def wait_until_counted(
    members: list[StreamConsumer], workers: list[threading.Thread], total: int, timeout: float = 120
) -> None:
    """Until ``members`` wrote ``total`` outputs (predictions and dead letters) between them."""
    deadline = time.monotonic() + timeout
    while sum(m.counts.predictions + m.counts.dead_letters for m in members) < total:
        assert all(w.is_alive() for w in workers), "a consumer ended early"
        assert time.monotonic() < deadline, f"after {timeout:.0f} s: {[m.counts for m in members]}"
        time.sleep(0.2)


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end offset, as a read_committed reader finds it."""
    cons = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}", "isolation.level": "read_committed"}
    )
    try:
        return {p: cons.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    finally:
        cons.close()


def wait_written(member: StreamConsumer, worker: threading.Thread, total: int, timeout: float = 120) -> None:
    wait_until_counted([member], [worker], total, timeout)


@dataclass
class Written:
    """What a stream wrote, read with read_committed: the records of each output topic in
    their order (output partition, then offset), decoded; ``placed``: each prediction's
    (partition, offset) in the output topic."""

    predictions: list[dict]
    letters: list[dict]
    placed: list[tuple[int, int]]

    def summary(self, sent: dict) -> str:
        return (
            f"{len(sent)} events in, {len(self.predictions)} predictions, "
            f"{len(self.letters)} dead letters, 0 duplicates, 0 gaps"
        )


def exactly_once(kafka, topics: dict[str, str], sent: dict[tuple[int, int], tuple[bytes, bytes]]) -> Written:
    """Check what the stream wrote: the input offsets are exactly the union of the predictions'
    and the dead letters' source offsets (no duplicate, no gap, nothing else); every output
    keeps its event's key; in each output partition, the outputs of one input partition follow
    its offsets. Prints (and returns) the counts."""
    decoded = {}
    for name in ("predictions", "events.dlq"):
        msgs = sorted(read_all(kafka.bootstrap, topics[name]), key=lambda m: (m.partition(), m.offset()))
        decoded[name] = [(m, json.loads(m.value())) for m in msgs]
    coordinates = [(r["source"]["partition"], r["source"]["offset"]) for name in decoded for _, r in decoded[name]]
    duplicates = len(coordinates) - len(set(coordinates))
    gaps = sorted(set(sent) - set(coordinates))
    strangers = sorted(set(coordinates) - set(sent))
    assert (duplicates, gaps[:10], strangers[:10]) == (0, [], []), (
        f"{duplicates} duplicates, {len(gaps)} gaps, {len(strangers)} outputs of no event"
    )
    for name, pairs in decoded.items():
        last: dict[tuple[int, int], int] = {}
        for msg, record in pairs:
            source = record["source"]
            assert source["topic"] == topics["events"]
            assert msg.key() == sent[(source["partition"], source["offset"])][0], "the event's key is kept"
            lane = (msg.partition(), source["partition"])
            assert source["offset"] > last.get(lane, -1), f"{name}: out of order in {lane}"
            last[lane] = source["offset"]
    written = Written(
        [r for _, r in decoded["predictions"]],
        [r for _, r in decoded["events.dlq"]],
        [(m.partition(), m.offset()) for m, _ in decoded["predictions"]],
    )
    print(written.summary(sent))
    return written


def at_least_once(
    kafka, topics: dict[str, str], sent: dict[tuple[int, int], tuple[bytes, bytes]]
) -> tuple[Written, int]:
    """The at-least-once check: every input offset is in the predictions or the dead letters at least
    once, nothing else is, each output keeps its event's key, and in each output partition an input
    partition's offsets first appear in order. Returns the outputs (each input offset's first) and the
    number of duplicates."""
    decoded = {}
    for name in ("predictions", "events.dlq"):
        msgs = sorted(read_all(kafka.bootstrap, topics[name]), key=lambda m: (m.partition(), m.offset()))
        decoded[name] = [(m, json.loads(m.value())) for m in msgs]
    seen: set[tuple[int, int]] = set()
    first: dict[str, list] = {name: [] for name in decoded}
    duplicates = 0
    for name, pairs in decoded.items():
        last: dict[tuple[int, int], int] = {}
        for msg, record in pairs:
            source = record["source"]
            coordinates = (source["partition"], source["offset"])
            assert source["topic"] == topics["events"] and coordinates in sent, f"{name}: an output of no event"
            assert msg.key() == sent[coordinates][0], "the event's key is kept"
            if coordinates in seen:
                duplicates += 1
                continue
            seen.add(coordinates)
            lane = (msg.partition(), source["partition"])
            assert source["offset"] > last.get(lane, -1), f"{name}: out of order in {lane}"
            last[lane] = source["offset"]
            first[name].append((msg, record))
    gaps = sorted(set(sent) - seen)
    assert gaps == [], f"{len(gaps)} events never written: {gaps[:10]}"
    written = Written(
        [r for _, r in first["predictions"]],
        [r for _, r in first["events.dlq"]],
        [(m.partition(), m.offset()) for m, _ in first["predictions"]],
    )
    print(
        f"{len(sent)} events in, {len(written.predictions)} predictions, {len(written.letters)} dead letters, "
        f"{duplicates} duplicates, 0 gaps"
    )
    return written, duplicates


def run_options(kafka, torchserve, topics: dict[str, str], inference: str | None = None) -> list[str]:
    """``stream run``'s options for a member of the test's group as its own process (what
    ``make stream`` starts), scoring through ``inference`` (default: the server's address)."""
    run = topics["events"].rsplit("-", 1)[1]
    props = torchserve.props
    return [
        "--bootstrap",
        kafka.bootstrap,
        "--inference",
        inference or props["inference_address"],
        "--management",
        props["management_address"],
        "--key-file",
        str(torchserve.key_file),
        "--model",
        MODEL_NAME,
        "--group",
        f"stream-{run}",
        "--input",
        topics["events"],
        "--output",
        topics["predictions"],
        "--dead-letters",
        topics["events.dlq"],
        "--batch",
        "16",
        "--metrics-port",
        "0",
    ]  # members on one machine: no metrics port each (test_metrics.py serves one)


class StalledPath:
    """A TCP path to TorchServe that holds the requests sent on it until :meth:`open` (a
    network stall on loopback; the server behind it is the real one). It lets a test act while
    a member is known to hold polled events it has not written yet."""

    def __init__(self, target: str, hold: bool = True) -> None:
        host, _, port = target.removeprefix("http://").rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.opened = threading.Event()
        if not hold:
            self.opened.set()
        self.held = 0
        #: Chunks sent on towards TorchServe (requests, or parts of them) since the start.
        self.passed = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        with conn, socket.create_connection(self.target) as upstream:
            back = threading.Thread(target=_pipe, args=(upstream, conn), daemon=True)
            back.start()
            _pipe(conn, upstream, self)
            back.join()

    def hold(self) -> None:
        """Hold what is sent from now on (requests on connections already open too)."""
        self.held = 0
        self.opened.clear()

    def open(self) -> None:
        self.opened.set()

    def close(self) -> None:
        self.listener.close()


def _pipe(src: socket.socket, dst: socket.socket, gate: StalledPath | None = None) -> None:
    """Copy ``src`` to ``dst`` until it ends; with a ``gate``, each chunk waits until it is open."""
    try:
        while data := src.recv(65536):
            if gate is not None and not gate.opened.is_set():
                gate.held += 1
                gate.opened.wait()
            dst.sendall(data)
            if gate is not None:
                gate.passed += 1
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
