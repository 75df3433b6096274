"""The stream consumer against the real broker and a real TorchServe serving the Makefile-built
archive: every input offset ends up exactly once in the predictions or the dead letters (read
with read_committed), each prediction carries the model version and its source, each dead letter
names the field, and the group's committed offsets are the partitions' ends."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import zipfile

import pytest
import torch
from confluent_kafka import Consumer, TopicPartition

from handler.model import PROGRAM_FILE, ModelMetadata, load_program
from rtserve.client.rest import Client
from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import alive, wait_until
from rtserve.stream import local, service
from rtserve.stream.consumer import MAX_EVENT_BYTES
from tests.helpers import make
from tests.stream.helpers import (
    PARTITIONS,
    POISON,
    Committed,
    Stability,
    StalledPath,
    at_least_once,
    catch_open_transaction,
    exactly_once,
    letters_name_their_fields,
    member_of,
    produce,
    run_options,
    running,
    stream_topics,
    valid_events,
    wait_written,
    with_poison,
)

pytestmark = pytest.mark.stream

#: Events of the kill tests: enough that a member scoring 16 per step (about 10 ms each, its
#: commit overlapping the next step) is still mid-stream at each kill.
EVENTS = 600
#: Freezes at most (tries to catch a transaction open with outputs in it), for three kills.
KILL_TRIES = 12


def test_every_event_once_in_the_predictions_or_the_dead_letters(kafka, torchserve):
    topics = stream_topics(kafka)
    valid = 40
    sent = produce(
        kafka,
        topics["events"],
        valid_events(valid) + [(b"poison-%d" % i, value) for i, (value, _, _) in enumerate(POISON)],
    )
    member = member_of(kafka, topics, torchserve.client())
    with running(member) as worker:
        wait_written(member, worker, len(sent))
    counts = member.counts
    assert (counts.predictions, counts.dead_letters, counts.aborted, counts.errors) == (valid, len(POISON), 0, [])

    written = exactly_once(kafka, topics, sent)
    # the at-least-once check agrees on a run without a crash: nothing written twice
    assert at_least_once(kafka, topics, sent).duplicates == {}
    for record in written.predictions:
        key, value = sent[(record["source"]["partition"], record["source"]["offset"])]
        assert record["id"] == json.loads(value)["id"]
        assert record["model_version"] == "1.0" and record["label"] in ("low", "medium", "high")
        assert abs(sum(record["probabilities"]) - 1) < 1e-4 and isinstance(record["event_timestamp"], int)
    by_offset = {(r["source"]["partition"], r["source"]["offset"]): r for r in written.letters}
    by_key = {sent[c][0]: r for c, r in by_offset.items()}
    for i, (_, field, reason) in enumerate(POISON):
        letter = by_key[b"poison-%d" % i]
        assert (letter["field"], letter["reason"]) == (field, reason), letter
        assert letter["error"] and "POST" not in letter["error"]  # the handler's own words
    assert (
        by_key[b"poison-%d" % (len(POISON) - 1)]["error"]
        == f"event of {len(POISON[-1][0])} bytes is larger than {MAX_EVENT_BYTES} bytes"
    )
    # the offsets were committed with the outputs: the group's position is each partition's end
    check = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": member.config.group})
    committed = check.committed([TopicPartition(topics["events"], p) for p in range(PARTITIONS)], timeout=30)
    check.close()
    ends = {p: 1 + max(o for q, o in sent if q == p) for p in range(PARTITIONS)}
    assert {tp.partition: tp.offset for tp in committed} == ends


class CountingClient(Client):
    """TorchServe's client, recording how many rows each KServe v1 request carried."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[int] = []

    def predict_instances(self, model: str, instances: list) -> list[dict]:
        self.rows.append(len(instances))
        return super().predict_instances(model, instances)


def test_every_prediction_is_the_models_own_answer_for_its_event(kafka, torchserve, mar_v1, tmp_path):
    """Each prediction's probabilities (within 1e-5) and label are those of the archive's own
    program run in this process on the event's features, with steps of several requests each
    (a step holds more events than one request's ``instances``): no answer lands on another
    event, in a request or across the requests of a batch."""
    with zipfile.ZipFile(mar_v1) as zf:
        zf.extractall(tmp_path, [PROGRAM_FILE, "meta.json"])
    meta = ModelMetadata.load(tmp_path / "meta.json")
    forward = load_program(tmp_path / PROGRAM_FILE)  # the exported module itself (not the direct path)
    instances, requests_per_step = 8, 8
    n = 4 * instances * requests_per_step
    generator = torch.Generator().manual_seed(38)
    mean, std = torch.tensor(meta.stats["mean"]), torch.tensor(meta.stats["std"])
    rows = (mean + std * torch.randn(n, meta.n_features, generator=generator)).tolist()
    topics = stream_topics(kafka)
    sent = produce(
        kafka,
        topics["events"],
        [(b"k%d" % (i % 5), json.dumps({"features": row, "id": f"e{i}"}).encode()) for i, row in enumerate(rows)],
    )
    props = torchserve.props
    client = CountingClient(props["inference_address"], props["management_address"], key_file=torchserve.key_file)
    member = member_of(kafka, topics, client, batch=instances * requests_per_step, instances=instances)
    with running(member) as worker:
        wait_written(member, worker, len(sent))
    written = exactly_once(kafka, topics, sent)
    assert (len(written.predictions), written.letters) == (n, [])

    by_id = {f"e{i}": i for i in range(n)}
    order = [by_id[r["id"]] for r in written.predictions]
    with torch.inference_mode():
        expected = torch.softmax(forward(torch.tensor([rows[i] for i in order], dtype=torch.float32)), dim=1)
    served = torch.tensor([r["probabilities"] for r in written.predictions])
    worst = float((served - expected).abs().max())
    assert worst <= 1e-5, f"largest difference from the model's own answer: {worst:.2e}"
    top = expected.topk(2, dim=1)
    near_ties = 0
    for record, index, (first, second) in zip(written.predictions, top.indices[:, 0].tolist(), top.values.tolist()):
        assert record["model_version"] == str(meta.version)
        if first - second <= 2e-5:  # (a tie within the tolerance may go either way)
            near_ties += 1
            continue
        assert record["label"] == meta.labels[index], record
    # every request within `instances`, and steps of more than one request: on average a
    # transaction held more events than one request carries
    assert client.rows and max(client.rows) <= instances, client.rows
    assert sum(client.rows) == n and member.counts.transactions * instances < n, (
        f"{member.counts.transactions} transactions for {n} events in {len(client.rows)} requests"
    )
    print(
        f"{n} predictions equal the in-process model's (largest difference {worst:.1e}, "
        f"{near_ties} near ties); {len(client.rows)} requests of at most {instances} rows in "
        f"{member.counts.transactions} transactions"
    )


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
    written = exactly_once(kafka, topics, sent)
    assert (len(written.predictions), written.letters) == (12, [])


def test_kill_9_mid_stream_and_restarts_write_each_event_once(kafka, torchserve, tmp_path):
    """The consumer as `make stream` runs it (a process of its own), SIGKILLed three times while a
    transaction of its is open with outputs in it, then restarted. Each kill is proven to have
    caught one: right after it, an output partition holds outputs of the test's events past its
    stable end, which a read_uncommitted reader finds and a read_committed reader does not (a
    kill that fell between two transactions is not counted, and the member is started again).
    Read with read_committed at the end, each input offset is exactly once in the predictions or,
    for the poison events spread among them, in the dead letters naming the field."""
    topics = stream_topics(kafka)
    # the pipeline reads ahead: enough events that the stream lasts through the tries
    sent = produce(kafka, topics["events"], with_poison(valid_events(20 * EVENTS)))
    props = torchserve.props
    options = run_options(kafka, torchserve, topics)
    where = [
        f"STREAM_DIR={tmp_path}",
        f"KAFKA_RUN_DIR={kafka.run_dir}",
        f"RUN_DIR={torchserve.key_file.parent}",
        f"INFERENCE_URL={props['inference_address']}",
        f"MANAGEMENT_URL={props['management_address']}",
        f"STREAM_ARGS={' '.join(options[options.index('--group') :])}",
    ]
    committed = Committed(kafka, topics)
    stability = Stability(kafka, topics)
    at_kill, open_at_kill, tries = [], [], 0
    try:
        while len(open_at_kill) < 3:
            assert tries < KILL_TRIES, f"{tries} freezes caught {len(open_at_kill)} open transactions"
            pid, _ = service.start(tmp_path, options)
            before = committed.latest()  # (a predecessor's open transaction left out)
            moved = wait_until(lambda: (c := committed.latest()) > before and c, 90, poll=0.05)
            assert moved, "no progress in 90 s"
            # frozen with outputs in a transaction not yet committed (a frozen member commits nothing)
            unstable, caught = catch_open_transaction(pid, stability, lambda: committed.latest() < len(sent), 30)
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda: not alive(pid), 10), f"pid {pid} survived SIGKILL"
            tries += max(caught, 1)
            if not unstable or stability.unstable() != unstable:  # the dead member's stays open until the next
                continue
            uncommitted = stability.read("read_uncommitted", unstable)
            sources = [out.source for _, out in uncommitted]
            assert uncommitted and all(t == topics["events"] and (p, o) in sent for t, p, o in sources), sources
            assert stability.read("read_committed", unstable) == [], "a read_committed reader saw open outputs"
            at_kill.append(moved)
            open_at_kill.append(len(uncommitted))
        assert at_kill[-1] < len(sent), f"the stream ended before the last kill: {at_kill}"
        # the last run as users start and stop it
        started = make("-s", "stream", *where)
        assert started.returncode == 0 and ">> stream consumer started in " in started.stdout, started.stdout
        assert wait_until(lambda: committed() == len(sent), 240, poll=0.5), f"committed {committed()}"
    finally:
        stability.close()
        committed.close()
        stopped = make("-s", "stream-stop", *where)
        service.stop(tmp_path)
    assert re.fullmatch(
        r">> stream consumer stopped: \d+ predictions, \d+ dead letters in \d+ transactions "
        r"\(0 aborted, 0 retries\)\n",
        stopped.stdout,
    ), stopped.stdout
    written = exactly_once(kafka, topics, sent)
    letters = letters_name_their_fields(written, sent)
    assert (len(written.predictions), letters) == (len(sent) - len(POISON), len(POISON))
    print(
        f"committed offsets at each SIGKILL: {at_kill} of {len(sent)}; outputs open (produced, not "
        f"committed) at each: {open_at_kill}; {tries} freezes to catch 3"
    )


def test_kill_9_while_one_step_commits_and_the_next_has_scored(kafka, torchserve, tmp_path):
    """The window the overlapped commit opens: a step's transaction in flight while the next
    step has scored its events. The broker is frozen (SIGSTOP) mid-stream, so that the commit in
    flight cannot end while the member scores its next step from what it had fetched (its
    requests to TorchServe, on a counting loopback path, go on during the freeze); then the
    member is SIGKILLed, the broker continued, and a new member (the same transactional id)
    aborts what the dead one left open and finishes: each input offset exactly once (poison
    events among them dead-lettered, naming the field)."""
    topics = stream_topics(kafka)
    sent = produce(kafka, topics["events"], with_poison(valid_events(EVENTS)))
    path = StalledPath(torchserve.props["inference_address"], hold=False)
    options = run_options(kafka, torchserve, topics, inference=path.address)
    committed = Committed(kafka, topics)
    broker = local.pid(kafka.run_dir)
    assert broker is not None
    try:
        pid, _ = service.start(tmp_path, options)
        assert wait_until(lambda: committed.latest() > 0, 90, poll=0.05), "no progress in 90 s"
        os.kill(broker, signal.SIGSTOP)
        try:
            before = path.passed
            # every event is fetched already: the member polls and scores while its commit waits
            scored = wait_until(lambda: path.passed > before, 10, poll=0.05)
            time.sleep(1.0)  # its scored step now waits for the commit the frozen broker holds
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda: not alive(pid), 10), f"pid {pid} survived SIGKILL"
        finally:
            os.kill(broker, signal.SIGCONT)
        at_kill = committed.latest()
        assert at_kill < len(sent), f"the stream ended before the kill: {at_kill}"
        service.start(tmp_path, options)
        assert wait_until(lambda: committed() == len(sent), 180, poll=0.5), f"committed {committed()}"
        stopped = service.stop(tmp_path)
    finally:
        committed.close()
        path.close()
        service.stop(tmp_path)
    assert stopped and re.fullmatch(
        r"\d+ predictions, \d+ dead letters in \d+ transactions \(0 aborted, 0 retries\)", stopped
    ), stopped
    written = exactly_once(kafka, topics, sent)
    letters = letters_name_their_fields(written, sent)
    assert (len(written.predictions), letters) == (len(sent) - len(POISON), len(POISON))
    print(
        f"killed with {at_kill} of {len(sent)} committed, the broker frozen; requests to TorchServe "
        f"during the freeze: {'yes' if scored else 'no (the next step had scored before it)'}"
    )
