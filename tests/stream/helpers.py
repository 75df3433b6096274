"""What the stream tier's tests share: topics of a test's own, producing events (valid and
poison), running a member in a thread, the group's committed offsets, the broker brought back
however a test left it, the outputs of a transaction still open, and the exactly-once check every
test ends with (the outputs read with read_committed hold each input offset once, in each
partition's order)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from rtserve.client.rest import Client
from rtserve.runtime.process import wait_until
from rtserve.stream import admin, local
from rtserve.stream.consumer import StreamConfig, StreamConsumer
from tests.conftest import MODEL_NAME
from tests.helpers import features, make
from tests.stream.oracle import OUTPUTS, Output, Written, at_least_once_of, exactly_once_of

PARTITIONS = 2
#: The input topics accept records up to this size (the broker's default is about 1 MB), so
#: that an oversized event reaches the consumer, which dead-letters it.
MAX_EVENT_RECORD = 8 * 1024 * 1024

#: Poison events: (value, the dead letter's field, its reason); the wrong count is refused by
#: TorchServe itself (the consumer is not told the model's feature count here).
POISON = [
    (b"not json", None, "not_json"),
    (b"", None, "empty_body"),
    (b'{"features": [1, 2]}', "features", "wrong_length"),
    (json.dumps({"features": [0.5] * 31 + [float("nan")]}).encode(), "features[31]", "non_finite"),
    (json.dumps({"features": [0.5] * 31 + [float("inf")]}).encode(), "features[31]", "non_finite"),
    (b'{"features": [' + b"0.5, " * 31 + b"1e999]}", "features[31]", "non_finite"),  # JSON's overflow: inf
    (json.dumps({"features": [0.5] * 31 + [1e308]}).encode(), "features[31]", "out_of_range"),
    (b'{"id": 3}', "features", "missing_field"),
    # 5 MB: valid features and a huge id (a prediction would echo it: over Kafka's 1 MB record)
    (json.dumps({"features": [0.5] * 32, "id": "x" * 5_000_000}).encode(), None, "too_large"),
]


def read_all(bootstrap: str, topic: str, timeout: float = 30, partitions: int = PARTITIONS) -> list[Message]:
    """Every committed record of ``topic`` (of ``partitions``), read with read_committed to the partitions' ends."""
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
    while len(ends) < partitions and time.monotonic() < deadline:
        msg = cons.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            ends.add(msg.partition())
        else:
            got.append(msg)
    cons.close()
    assert len(ends) == partitions, f"{topic}: not read to its end in {timeout} s"
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


def poison_events() -> list[tuple[bytes, bytes]]:
    """Each of :data:`POISON` as an event, keyed ``poison-<i>``."""
    return [(b"poison-%d" % i, value) for i, (value, _, _) in enumerate(POISON)]


def with_poison(events: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``events`` with :func:`poison_events` put in among them, evenly spread (none first or last)."""
    poison = poison_events()
    mixed = list(events)
    step = len(events) // (len(poison) + 1)
    assert step > 0, f"{len(events)} events are too few to spread {len(poison)} poison events in"
    for i in reversed(range(len(poison))):  # (from the end: the earlier positions stay put)
        mixed.insert((i + 1) * step, poison[i])
    return mixed


def letters_name_their_fields(written: Written, sent: dict[tuple[int, int], tuple[bytes, bytes]]) -> int:
    """Check that exactly the poison events of ``sent`` were dead-lettered, each letter naming the
    field and reason :data:`POISON` gives for its event. Returns how many."""
    expected = {value: (field, reason) for value, field, reason in POISON}
    poisoned = {coords: expected[value] for coords, (_, value) in sent.items() if value in expected}
    got = {(r["source"]["partition"], r["source"]["offset"]): (r["field"], r["reason"]) for r in written.letters}
    wrong = {c: (got.get(c), poisoned.get(c)) for c in set(got) | set(poisoned) if got.get(c) != poisoned.get(c)}
    assert not wrong, f"dead letters (field, reason) as written / as expected, by input offset: {wrong}"
    assert all(r["error"] for r in written.letters), "a dead letter without its error"
    return len(poisoned)


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


def written_outputs(kafka, topics: dict[str, str]) -> dict[str, list[Output]]:
    """Every committed record of the output topics (read with read_committed), decoded, by role."""
    return {
        name: [
            Output(m.partition(), m.offset(), m.key(), json.loads(m.value()))
            for m in read_all(kafka.bootstrap, topics[name])
        ]
        for name in OUTPUTS
    }


def exactly_once(kafka, topics: dict[str, str], sent: dict[tuple[int, int], tuple[bytes, bytes]]) -> Written:
    """Check what the stream wrote (:func:`tests.stream.oracle.exactly_once_of`): each input
    offset once in the predictions or the dead letters, nothing else, keys kept, each input
    partition's outputs in its order. Prints (and returns) the counts."""
    written = exactly_once_of(written_outputs(kafka, topics), sent, topics["events"])
    print(written.summary(sent))
    return written


def at_least_once(kafka, topics: dict[str, str], sent: dict[tuple[int, int], tuple[bytes, bytes]]) -> Written:
    """Check what the stream wrote (:func:`tests.stream.oracle.at_least_once_of`): each input
    offset at least once, nothing else, keys kept, first appearances in each input partition's
    order; the duplicates are counted (``Written.duplicates``). Prints (and returns) the counts."""
    written = at_least_once_of(written_outputs(kafka, topics), sent, topics["events"])
    print(written.summary(sent))
    return written


class Committed:
    """The group's committed events of the test's input (watchers of the group's offsets)."""

    def __init__(self, kafka, topics: dict[str, str]) -> None:
        run = topics["events"].rsplit("-", 1)[1]
        self.watcher = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"stream-{run}"})
        # read_uncommitted: librdkafka asks for the offsets without waiting for open transactions
        self.progress = Consumer(
            {"bootstrap.servers": kafka.bootstrap, "group.id": f"stream-{run}", "isolation.level": "read_uncommitted"}
        )
        self.partitions = [TopicPartition(topics["events"], p) for p in range(PARTITIONS)]

    def __call__(self) -> int | None:
        """The committed events; None while an open transaction holds offsets (a killed
        member's until the next one aborts it, or a running member's commit in flight: the
        broker answers UNSTABLE_OFFSET_COMMIT)."""
        try:
            return sum(max(tp.offset, 0) for tp in self.watcher.committed(self.partitions, timeout=5))
        except KafkaException:
            return None

    def latest(self) -> int:
        """The committed events, open transactions left out (a running member nearly always has
        one in flight, its commit overlapping its next step: the stable answer waits for a gap)."""
        return sum(self.each().values())

    def each(self) -> dict[int, int]:
        """:meth:`latest` per input partition."""
        return {tp.partition: max(tp.offset, 0) for tp in self.progress.committed(self.partitions, timeout=5)}

    def close(self) -> None:
        self.watcher.close()
        self.progress.close()


def restore_broker(kafka) -> str | None:
    """The tier's one broker running and answering, however a test left it: continued if frozen
    (SIGSTOP), started again (`make kafka`, the same data and ports) if stopped or killed.

    Returns:
        What was done; None when it answered already.
    """
    pid = local.pid(kafka.run_dir)
    if pid is not None:
        os.kill(pid, signal.SIGCONT)  # (nothing, unless a test froze it)
        if wait_until(lambda: admin.answers(kafka.bootstrap), 30, poll=0.5):
            return None
        local.stop(kafka.run_dir)  # alive, but no answer in 30 s: stopped, then started afresh
    started = make("-s", "kafka", *kafka.make_vars)
    assert started.returncode == 0 and kafka.bootstrap in started.stdout, started.stdout
    return f"started again (it was {'not answering' if pid else 'not running'})"


@contextmanager
def broker_restored(kafka):
    """The block may stop, freeze or kill the broker: at its end, however it ends, the broker runs
    again (:func:`restore_broker`), so that one failure does not fail the tier's later tests."""
    try:
        yield
    finally:
        restore_broker(kafka)


class Stability:
    """Each output partition's stable end (where a read_committed reader's end is: the first
    offset of a transaction still open) beside its high watermark (a read_uncommitted reader's
    end): outputs between the two are produced but not committed."""

    def __init__(self, kafka, topics: dict[str, str]) -> None:
        self.bootstrap = kafka.bootstrap
        self.partitions = [(name, TopicPartition(topics[name], p)) for name in OUTPUTS for p in range(PARTITIONS)]
        self.readers = {level: self._reader(level) for level in ("read_committed", "read_uncommitted")}

    def _reader(self, level: str, **extra) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"check-{uuid.uuid4().hex}",
                "isolation.level": level,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                **extra,
            }
        )

    def unstable(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Each output partition whose high watermark is past its stable end: (stable end, high)."""
        found = {}
        for name, tp in self.partitions:
            stable = self.readers["read_committed"].get_watermark_offsets(tp, timeout=10, cached=False)[1]
            high = self.readers["read_uncommitted"].get_watermark_offsets(tp, timeout=10, cached=False)[1]
            if high > stable:
                found[(name, tp.partition)] = (stable, high)
        return found

    def read(
        self, level: str, unstable: dict[tuple[str, int], tuple[int, int]], wait: float = 2.0
    ) -> list[tuple[str, Output]]:
        """What a reader at ``level`` finds from each unstable partition's stable end on, as
        (role, output); it reads for ``wait`` seconds more once it reached the end it may read to
        (a read_committed reader must find nothing more meanwhile)."""
        topics = dict(self.partitions)
        roles = {tp.topic: name for name, tp in self.partitions}
        reader = self._reader(level)
        got: list[tuple[str, Output]] = []

        def take(msg: Message) -> None:
            got.append((roles[msg.topic()], Output(msg.partition(), msg.offset(), msg.key(), json.loads(msg.value()))))

        try:
            reader.assign(
                [TopicPartition(topics[name].topic, p, stable) for (name, p), (stable, _) in unstable.items()]
            )
            ended: set[tuple[str, int]] = set()
            deadline = time.monotonic() + 30
            while len(ended) < len(unstable) and time.monotonic() < deadline:
                msg = reader.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                    ended.add((msg.topic(), msg.partition()))
                else:
                    take(msg)
            assert len(ended) == len(unstable), f"a {level} reader did not reach the ends of {unstable}"
            end = time.monotonic() + wait
            while time.monotonic() < end:
                msg = reader.poll(0.2)
                if msg is not None and not msg.error():
                    take(msg)
        finally:
            reader.close()
        return got

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


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


def catch_open_transaction(pid: int, stability: Stability, going, timeout: float = 120) -> tuple[dict, int]:
    """Freeze ``pid`` (SIGSTOP) at a moment an output partition holds outputs past its stable
    end, and keep it frozen if, two seconds on, they are still there and the stable ends have not
    moved (a commit it had sent would have ended by then); else continue it and try again while
    ``going()``. Returns the unstable partitions (empty if none was caught) and the tries."""
    deadline, tries = time.monotonic() + timeout, 0
    while time.monotonic() < deadline and going():
        if not stability.unstable():
            continue
        os.kill(pid, signal.SIGSTOP)
        tries += 1
        time.sleep(1.0)
        first = stability.unstable()
        time.sleep(1.0)
        if first and stability.unstable() == first:
            return first, tries
        os.kill(pid, signal.SIGCONT)
    return {}, tries
