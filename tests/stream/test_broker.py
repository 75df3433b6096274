"""The local broker (`make kafka`): it answers metadata with the stream's three topics, carries a
transactional produce-consume round trip read with ``read_committed`` (an aborted transaction
stays invisible, consumed offsets commit inside the transaction), and `make kafka-stop` leaves no
process while a restart keeps the data."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from rtserve.stream import admin, local
from tests.helpers import make
from tests.stream.conftest import broker_processes

pytestmark = pytest.mark.stream

TOPICS = {"events": 4, "predictions": 4, "events.dlq": 4}


def consumer(bootstrap: str, group: str, **extra: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            **extra,
        }
    )


def drain(cons: Consumer, topic: str, marker: bytes, want: int, timeout: float = 30) -> list:
    """The records of ``topic`` whose key starts with ``marker``, read until ``want`` are in and
    the consumer reached the partitions' ends (or ``timeout``)."""
    cons.subscribe([topic])
    got, at_end, deadline = [], set(), time.monotonic() + timeout
    partitions = TOPICS[topic]
    while time.monotonic() < deadline and (len(got) < want or len(at_end) < partitions):
        msg = cons.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                at_end.add(msg.partition())
                continue
            raise AssertionError(f"consumer error: {msg.error()}")
        if (msg.key() or b"").startswith(marker):
            got.append(msg)
    return got


def test_make_kafka_starts_a_broker_that_answers_with_the_three_topics(kafka):
    assert re.search(
        r"^>> Kafka ready in [\d.]+ s \(format [\d.]+ s, broker ready [\d.]+ s, topics [\d.]+ s\)",
        kafka.start_output,
        re.M,
    ), kafka.start_output
    assert f"  bootstrap: {kafka.bootstrap}\n" in kafka.start_output
    assert kafka.bootstrap.startswith("127.0.0.1:")
    assert admin.topics(kafka.bootstrap) == TOPICS
    status = make("-s", "kafka-status", *kafka.make_vars)
    assert status.returncode == 0, status.stdout
    assert f"  kafka      running (pid {local.pid(kafka.run_dir)})\n" in status.stdout
    assert (
        "  topics     events (4 partitions), events.dlq (4 partitions), predictions (4 partitions)\n" in status.stdout
    )
    assert (kafka.run_dir / "data" / "meta.properties").is_file()
    assert (kafka.run_dir / "logs" / "kafka.log").stat().st_size > 0


def test_transactional_round_trip_read_committed(kafka):
    """events -> predictions in one transaction with the consumed offsets (as the stream consumer
    will), beside an aborted transaction that no read_committed reader sees."""
    marker = uuid.uuid4().hex.encode()
    boot = kafka.bootstrap
    plain = Producer({"bootstrap.servers": boot, "enable.idempotence": True})
    for i in range(20):
        plain.produce("events", key=marker + b"-%d" % i, value=b'{"features": [%d]}' % i)
    assert plain.flush(30) == 0

    group = f"round-trip-{marker.decode()}"
    cons = consumer(boot, group, **{"enable.partition.eof": True})
    events = drain(cons, "events", marker, 20)
    assert sorted(int(m.key().split(b"-")[1]) for m in events) == list(range(20))

    txn = Producer({"bootstrap.servers": boot, "transactional.id": f"test-{marker.decode()}"})
    txn.init_transactions(30)
    txn.begin_transaction()
    for msg in events:
        txn.produce("predictions", key=msg.key(), value=b"scored " + msg.value())
    positions = cons.position(cons.assignment())
    txn.send_offsets_to_transaction(positions, cons.consumer_group_metadata(), 30)
    txn.commit_transaction(30)

    txn.begin_transaction()
    for i in range(5):
        txn.produce("predictions", key=marker + b"-aborted-%d" % i, value=b"never seen")
    txn.flush(30)  # written to the log, then aborted
    txn.abort_transaction(30)
    cons.close()

    reader = consumer(boot, f"reader-{marker.decode()}", **{"enable.partition.eof": True})
    outputs = drain(reader, "predictions", marker, 20)
    reader.close()
    assert sorted(m.key() for m in outputs) == sorted(m.key() for m in events)
    assert all(m.value().startswith(b"scored {") for m in outputs)
    # the offsets were committed with the outputs: the group resumes after every event it scored
    again = consumer(boot, group)
    committed = again.committed([TopicPartition("events", p) for p in range(4)], timeout=30)
    again.close()
    by_partition = {tp.partition: tp.offset for tp in positions}
    assert {tp.partition: tp.offset for tp in committed} == by_partition
    assert all(by_partition[m.partition()] > m.offset() for m in events)


def test_make_kafka_stop_leaves_no_process_and_a_restart_keeps_the_data(kafka):
    marker = uuid.uuid4().hex.encode()
    before = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": f"keep-{marker.decode()}"})
    before.init_transactions(30)
    before.begin_transaction()
    before.produce("events.dlq", key=marker, value=b"kept")
    before.commit_transaction(30)
    del before  # its connection would outlive the broker
    pid = local.pid(kafka.run_dir)
    assert pid is not None and broker_processes(kafka.run_dir) == [pid]

    stopped = make("-s", "kafka-stop", *kafka.make_vars)
    assert stopped.returncode == 0, stopped.stdout
    assert re.fullmatch(
        rf">> kafka \(pid {pid}\) stopped in [\d.]+ s; data kept in {kafka.run_dir}\n", stopped.stdout
    ), stopped.stdout
    assert broker_processes(kafka.run_dir) == [] and local.pid(kafka.run_dir) is None
    assert not admin.listening(kafka.bootstrap)
    status = make("-s", "kafka-status", *kafka.make_vars)
    assert status.returncode != 0 and "  kafka      stopped\n" in status.stdout, status.stdout
    again = make("-s", "kafka-stop", *kafka.make_vars)
    assert again.returncode == 0 and again.stdout == f">> no Kafka broker runs from {kafka.run_dir}\n"

    restarted = make("-s", "kafka", *kafka.make_vars)
    assert restarted.returncode == 0, restarted.stdout
    assert "(broker ready" in restarted.stdout and "format" not in restarted.stdout, restarted.stdout
    assert f"  bootstrap: {kafka.bootstrap}\n" in restarted.stdout  # the same address again
    assert admin.topics(kafka.bootstrap) == TOPICS
    reader = consumer(kafka.bootstrap, f"after-{marker.decode()}", **{"enable.partition.eof": True})
    kept = drain(reader, "events.dlq", marker, 1)
    reader.close()
    assert [(m.key(), m.value()) for m in kept] == [(marker, b"kept")]


def test_kafka_run_is_make_kafkas_start_in_the_foreground_and_stops_on_sigterm(kafka_libs, tmp_path):
    """`python -m rtserve kafka run` (the in-cluster broker's command, deploy/k8s/components/kafka)
    on free ports: the JVM's output is its own, the ``ready`` file appears once the three topics
    are led, SIGTERM stops the broker and the command exits 0 with no JVM left and no ready file."""
    import signal
    import subprocess
    import sys

    from rtserve.runtime.ports import free_ports
    from rtserve.stream import broker

    port, controller = free_ports(2)
    run_dir = tmp_path / "run"
    out = tmp_path / "out.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rtserve",
                "kafka",
                "run",
                "--libs",
                str(kafka_libs),
                "--run-dir",
                str(run_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--controller-port",
                str(controller),
                "--heap",
                "256m",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        begin = time.monotonic()
        while not (run_dir / broker.READY_FILE).exists():
            assert proc.poll() is None, out.read_text()[-3000:]
            assert time.monotonic() - begin < 120, out.read_text()[-3000:]
            time.sleep(0.2)
        ready = time.monotonic() - begin
        bootstrap = f"127.0.0.1:{port}"
        assert admin.topics(bootstrap) == TOPICS
        text = out.read_text()
        assert re.search(rf"^>> Kafka ready at {bootstrap} \(format .* s, broker ready .* s, topics .* s\)", text, re.M)
        assert "Kafka Server started" in text or "started (kafka.server" in text, (
            "the JVM's output is not the command's"
        )
        assert broker_processes(run_dir), "no JVM names the run directory"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, out.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert re.search(r"^>> stopping the Kafka broker: kafka \(pid \d+\) stopped in", out.read_text(), re.M)
    assert broker_processes(run_dir) == [] and not (run_dir / broker.READY_FILE).exists()
    print(f"kafka run: ready in {ready:.1f} s, stopped by SIGTERM")
