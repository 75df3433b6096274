"""The stream consumer against the real broker and a real TorchServe serving the Makefile-built
archive: every input offset ends up exactly once in the predictions or the dead letters (read
with read_committed), each prediction carries the model version and its source, each dead letter
names the field, and the group's committed offsets are the partitions' ends."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from rtserve.client.rest import Client
from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import alive, wait_until
from rtserve.stream import admin, service
from rtserve.stream.consumer import StreamConfig, StreamConsumer
from rtserve.testing.server import serving
from tests.conftest import MODEL_NAME
from tests.helpers import features, make

pytestmark = pytest.mark.stream

PARTITIONS = 2
#: Poison events: (value, the dead letter's field, its reason); the wrong count is refused by
#: TorchServe itself (the consumer is not told the model's feature count here).
POISON = [
    (b"not json", None, "not_json"),
    (b"", None, "empty_body"),
    (b'{"features": [1, 2]}', "features", "wrong_length"),
    (json.dumps({"features": [0.5] * 31 + [float("nan")]}).encode(), "features[31]", "non_finite"),
    (json.dumps({"features": [0.5] * 31 + [1e300]}).encode(), "features[31]", "out_of_range"),
    (b'{"id": 3}', "features", "missing_field"),
]


@pytest.fixture(scope="module")
def torchserve(mar_v1, tmp_path_factory):
    with serving(tmp_path_factory.mktemp("ts"), mar_v1.parent, [f"{MODEL_NAME}={mar_v1.name}"]) as ts:
        yield ts


def read_all(bootstrap: str, topic: str, timeout: float = 30) -> list:
    """Every committed record of ``topic``, read with read_committed to the partitions' ends."""
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
                     "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                     "enable.partition.eof": True, "enable.auto.commit": False})
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
    """Topics of this test's own (events, predictions, events.dlq), ``PARTITIONS`` each."""
    run = uuid.uuid4().hex[:8]
    topics = {name: f"{name}-{run}" for name in ("events", "predictions", "events.dlq")}
    admin.create_topics(kafka.bootstrap, topics.values(), PARTITIONS)
    return topics


def produce(kafka, topic: str, events: list[tuple[bytes, bytes]]) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """Send ``(key, value)`` events; what landed where: (partition, offset) -> (key, value)."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
    sent = {}

    def delivered(err, msg):
        assert err is None, err
        sent[(msg.partition(), msg.offset())] = (msg.key(), msg.value())

    for key, value in events:
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
    assert producer.flush(30) == 0 and len(sent) == len(events)
    return sent


def valid_events(n: int) -> list[tuple[bytes, bytes]]:
    return [(b"k%d" % (i % 5), json.dumps({"features": features(value=0.1 * (i % 7)), "id": f"e{i}"}).encode())
            for i in range(n)]


def member_of(kafka, topics: dict[str, str], client: Client) -> StreamConsumer:
    run = topics["events"].rsplit("-", 1)[1]
    config = StreamConfig(kafka.bootstrap, model=MODEL_NAME, group=f"stream-{run}", input=topics["events"],
                          output=topics["predictions"], dead_letters=topics["events.dlq"],
                          transactional_id=f"stream-{run}", batch=16)
    return StreamConsumer(config, client)


@contextmanager
def running(member: StreamConsumer):
    """``member`` consuming in a thread until the block ends."""
    stop = threading.Event()
    worker = threading.Thread(target=member.run, args=(stop,))
    worker.start()
    try:
        yield worker
    finally:
        stop.set()
        worker.join(60)
    assert not worker.is_alive(), "the consumer did not stop within 60 s"


def wait_written(member: StreamConsumer, worker: threading.Thread, total: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while member.counts.predictions + member.counts.dead_letters < total:
        assert worker.is_alive(), "the consumer ended early"
        assert time.monotonic() < deadline, f"after {timeout:.0f} s: {member.counts}"
        time.sleep(0.2)


def test_every_event_once_in_the_predictions_or_the_dead_letters(kafka, torchserve):
    topics = stream_topics(kafka)
    valid = 40
    sent = produce(kafka, topics["events"], valid_events(valid)
                   + [(b"poison-%d" % i, value) for i, (value, _, _) in enumerate(POISON)])
    member = member_of(kafka, topics, torchserve.client())
    with running(member) as worker:
        wait_written(member, worker, len(sent))
    counts = member.counts
    assert (counts.predictions, counts.dead_letters, counts.aborted, counts.errors) == (valid, len(POISON), 0, [])

    predictions = read_all(kafka.bootstrap, topics["predictions"])
    letters = read_all(kafka.bootstrap, topics["events.dlq"])
    records = [json.loads(m.value()) for m in predictions + letters]
    coordinates = [(r["source"]["partition"], r["source"]["offset"]) for r in records]
    assert sorted(coordinates) == sorted(sent), "each input offset exactly once, no gaps"
    assert all(r["source"]["topic"] == topics["events"] for r in records)

    for msg in predictions:
        record = json.loads(msg.value())
        key, value = sent[(record["source"]["partition"], record["source"]["offset"])]
        assert msg.key() == key and record["id"] == json.loads(value)["id"]
        assert record["model_version"] == "1.0" and record["label"] in ("low", "medium", "high")
        assert abs(sum(record["probabilities"]) - 1) < 1e-4 and isinstance(record["event_timestamp"], int)
    by_key = {m.key(): json.loads(m.value()) for m in letters}
    for i, (_, field, reason) in enumerate(POISON):
        letter = by_key[b"poison-%d" % i]
        assert (letter["field"], letter["reason"]) == (field, reason), letter
        assert letter["error"] and "POST" not in letter["error"]  # the handler's own words
    # order: within an output partition, the outputs of one input partition follow its offsets
    for output in (predictions, letters):
        last: dict[tuple[int, int], int] = {}
        for msg in sorted(output, key=lambda m: (m.partition(), m.offset())):
            source = json.loads(msg.value())["source"]
            lane = (msg.partition(), source["partition"])
            assert source["offset"] > last.get(lane, -1), f"out of order in {lane}"
            last[lane] = source["offset"]
    # the offsets were committed with the outputs: the group's position is each partition's end
    check = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": member.config.group})
    committed = check.committed([TopicPartition(topics["events"], p) for p in range(PARTITIONS)], timeout=30)
    check.close()
    ends = {p: 1 + max(o for q, o in sent if q == p) for p in range(PARTITIONS)}
    assert {tp.partition: tp.offset for tp in committed} == ends


def test_torchserve_unreachable_is_retried_never_dead_lettered(kafka, torchserve):
    """While TorchServe refuses connections (a port nothing listens on), nothing is written and
    the step is retried with backoff; once it answers, every event is scored exactly once."""
    topics = stream_topics(kafka)
    sent = produce(kafka, topics["events"], valid_events(12))
    nowhere = f"http://127.0.0.1:{free_ports(1)[0]}"
    member = member_of(kafka, topics, Client(nowhere, nowhere, key_file=torchserve.key_file, timeout=2))
    with running(member) as worker:
        deadline = time.monotonic() + 60
        while member.counts.retries < 3:
            assert worker.is_alive() and time.monotonic() < deadline, f"no 3 retries in 60 s: {member.counts}"
            time.sleep(0.1)
        assert (member.counts.predictions, member.counts.dead_letters, member.counts.transactions) == (0, 0, 0)
        member.client = torchserve.client()  # TorchServe is back
        wait_written(member, worker, len(sent))
    assert (member.counts.predictions, member.counts.dead_letters, member.counts.aborted) == (12, 0, 0)
    assert read_all(kafka.bootstrap, topics["events.dlq"]) == []
    outputs = [json.loads(m.value()) for m in read_all(kafka.bootstrap, topics["predictions"])]
    assert sorted((r["source"]["partition"], r["source"]["offset"]) for r in outputs) == sorted(sent)


def test_kill_9_mid_stream_and_restarts_write_each_event_once(kafka, torchserve, tmp_path):
    """The consumer as `make stream` runs it (a process of its own), SIGKILLed three times just
    after a transaction committed (so mid-step: scoring or inside the next transaction), then
    restarted: read with read_committed, each input offset is in the predictions exactly once."""
    topics = stream_topics(kafka)
    sent = produce(kafka, topics["events"], valid_events(240))
    run = topics["events"].rsplit("-", 1)[1]
    props = torchserve.props
    options = ["--bootstrap", kafka.bootstrap, "--inference", props["inference_address"],
               "--management", props["management_address"], "--key-file", str(torchserve.key_file),
               "--model", MODEL_NAME, "--group", f"stream-{run}", "--input", topics["events"],
               "--output", topics["predictions"], "--dead-letters", topics["events.dlq"], "--batch", "16",
               "--metrics-port", "0"]
    where = [f"STREAM_DIR={tmp_path}", f"KAFKA_RUN_DIR={kafka.run_dir}", f"RUN_DIR={torchserve.key_file.parent}",
             f"INFERENCE_URL={props['inference_address']}", f"MANAGEMENT_URL={props['management_address']}",
             f"STREAM_ARGS={' '.join(options[options.index('--group'):])}"]
    watcher = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": f"stream-{run}"})
    partitions = [TopicPartition(topics["events"], p) for p in range(PARTITIONS)]

    def committed() -> int | None:
        """The group's committed events; None while a killed member's open transaction holds
        offsets (the broker answers UNSTABLE_OFFSET_COMMIT until it is aborted)."""
        try:
            return sum(max(tp.offset, 0) for tp in watcher.committed(partitions, timeout=5))
        except KafkaException:
            return None

    def stable() -> int:
        count = wait_until(lambda: (c := committed()) is not None and c + 1, 90, poll=0.2)
        assert count, "the group's offsets stayed unstable for 90 s"
        return count - 1

    at_kill = []
    try:
        for _ in range(3):
            pid, _ = service.start(tmp_path, options)
            before = stable()  # (the new member aborted its predecessor's open transaction)
            moved = wait_until(lambda: (c := committed()) is not None and c > before and c, 90, poll=0.05)
            assert moved, "no progress in 90 s"
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda: not alive(pid), 10), f"pid {pid} survived SIGKILL"
            at_kill.append(moved)
        assert at_kill[-1] < len(sent), f"the stream ended before the last kill: {at_kill}"
        # the last run as users start and stop it
        started = make("-s", "stream", *where)
        assert started.returncode == 0 and ">> stream consumer started in " in started.stdout, started.stdout
        assert wait_until(lambda: committed() == len(sent), 180, poll=0.5), f"committed {committed()}"
    finally:
        watcher.close()
        stopped = make("-s", "stream-stop", *where)
        service.stop(tmp_path)
    assert re.fullmatch(r">> stream consumer stopped: \d+ predictions, 0 dead letters in \d+ transactions "
                        r"\(0 aborted, 0 retries\)\n", stopped.stdout), stopped.stdout
    outputs = [json.loads(m.value()) for m in read_all(kafka.bootstrap, topics["predictions"])]
    coordinates = sorted((r["source"]["partition"], r["source"]["offset"]) for r in outputs)
    assert len(coordinates) == len(set(coordinates)), "a prediction written twice"
    assert coordinates == sorted(sent), "an event never scored"
    assert read_all(kafka.bootstrap, topics["events.dlq"]) == []
    print(f"committed offsets at each SIGKILL: {at_kill} of {len(sent)}")
