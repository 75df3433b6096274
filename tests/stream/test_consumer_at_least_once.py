"""The consumer's at-least-once mode (``--guarantee at-least-once``) against the real broker and TorchServe:
no transactions, the offsets committed once the outputs are delivered. Every input offset is written at
least once; a clean run and a rebalance write none twice (a revoke waits for the commit in flight); a
member SIGKILLed between an output's delivery and its offset's commit leaves duplicates, counted here,
which the next member writes again after the committed offsets."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time

import pytest

from rtserve.runtime.process import alive, wait_until
from rtserve.stream import service
from tests.stream.helpers import (
    POISON,
    Committed,
    at_least_once,
    member_of,
    produce,
    read_all,
    run_options,
    running,
    stream_topics,
    valid_events,
    wait_until_counted,
    wait_written,
)

pytestmark = pytest.mark.stream

GUARANTEE = {"guarantee": "at-least-once"}
EVENTS = 600


def test_a_clean_run_writes_every_event_once_and_commits_the_ends(kafka, torchserve):
    topics = stream_topics(kafka)
    valid = 200
    sent = produce(
        kafka,
        topics["events"],
        valid_events(valid) + [(b"poison-%d" % i, value) for i, (value, _, _) in enumerate(POISON)],
    )
    member = member_of(kafka, topics, torchserve.client(), **GUARANTEE)
    watch = Committed(kafka, topics)  # the group's committed events
    with running(member) as worker:
        wait_written(member, worker, len(sent))
        assert wait_until(lambda: watch.latest() == len(sent), 30, poll=0.2)
    watch.close()
    assert (member.counts.predictions, member.counts.dead_letters, member.counts.aborted) == (valid, len(POISON), 0)
    written = at_least_once(kafka, topics, sent)
    assert written.duplicates == {} and len(written.predictions) == valid
    by_key = {sent[(r["source"]["partition"], r["source"]["offset"])][0]: r for r in written.letters}
    for i, (_, field, reason) in enumerate(POISON):
        assert (by_key[b"poison-%d" % i]["field"], by_key[b"poison-%d" % i]["reason"]) == (field, reason)
    # no transaction: a read_uncommitted reader sees exactly what a read_committed one does
    assert len(read_all(kafka.bootstrap, topics["predictions"])) == valid


def test_a_rebalance_writes_no_event_twice(kafka, torchserve):
    """A second member joins and leaves while events arrive (20 every 0.1 s): the revoke waits for
    the commit in flight and drops the rest, so nothing is delivered without its offset."""
    topics = stream_topics(kafka)
    sent: dict = {}
    done = threading.Event()

    def feed() -> None:
        for start in range(0, EVENTS, 20):
            sent.update(produce(kafka, topics["events"], valid_events(20, start)))
            time.sleep(0.1)
        done.set()

    first = member_of(kafka, topics, torchserve.client(), **GUARANTEE)
    second = member_of(kafka, topics, torchserve.client(), name="b", **GUARANTEE)
    feeder = threading.Thread(target=feed, daemon=True)
    with running(first) as worker:
        feeder.start()
        assert wait_until(lambda: first.counts.predictions >= 32, 60)
        with running(second) as other:
            assert wait_until(lambda: len(second.assigned) == 1 and len(first.assigned) == 1, 60)
            assert wait_until(lambda: second.counts.predictions >= 16 or not other.is_alive(), 60)
        assert wait_until(lambda: len(first.assigned) == 2, 60)
        feeder.join(120)
        assert done.is_set(), "the feeder did not finish"
        wait_until_counted([first, second], [worker], len(sent))
    written = at_least_once(kafka, topics, sent)
    assert written.duplicates == {} and len(written.predictions) == len(sent) == EVENTS
    print(f"first member {first.counts.predictions}, second {second.counts.predictions} predictions")


def test_kill_9_mid_stream_writes_every_event_at_least_once(kafka, torchserve, tmp_path):
    """`stream run --guarantee at-least-once` as its own process, SIGKILLed three times once its
    offsets moved, then run to the end: every input offset is written at least once, and the
    duplicates are only events a killed member delivered after its last offset commit (so at most
    what was in flight)."""
    topics = stream_topics(kafka)
    # the pipeline reads ahead: 600 events were all committed before the third kill in a run here
    sent = produce(kafka, topics["events"], valid_events(20 * EVENTS))
    options = [*run_options(kafka, torchserve, topics), "--guarantee", "at-least-once"]
    at_kill, delivered = [], []
    watch = Committed(kafka, topics)  # the group's committed events
    try:
        for _ in range(3):
            pid, _ = service.start(tmp_path, options)
            before = watch.latest()
            assert wait_until(lambda: watch.latest() > before, 90, poll=0.05), "no progress in 90 s"
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda: not alive(pid), 10), f"pid {pid} survived SIGKILL"
            at_kill.append(watch.latest())
            delivered.append(len(read_all(kafka.bootstrap, topics["predictions"])))
        assert at_kill[-1] < len(sent), f"the stream ended before the last kill: {at_kill}"
        service.start(tmp_path, options)
        assert wait_until(lambda: watch.latest() == len(sent), 180, poll=0.5), "not all committed"
        stopped = service.stop(tmp_path)
    finally:
        watch.close()
        service.stop(tmp_path)
    assert stopped and re.fullmatch(r"\d+ predictions, 0 dead letters in \d+ commits \(0 aborted, 0 retries\)", stopped)
    written = at_least_once(kafka, topics, sent)
    duplicates = sum(written.duplicates.values())
    assert len({(r["source"]["partition"], r["source"]["offset"]) for r in written.predictions}) == len(sent)
    # a kill can only repeat what was delivered past the committed offsets at that moment
    past_commit = sum(d - c for d, c in zip(delivered, at_kill))
    assert duplicates <= past_commit, (duplicates, delivered, at_kill)
    for record in written.predictions:
        assert record["id"] == json.loads(sent[(record["source"]["partition"], record["source"]["offset"])][1])["id"]
    print(
        f"committed at each SIGKILL: {at_kill}, delivered then: {delivered} of {len(sent)}; "
        f"{duplicates} duplicates written again by the next member"
    )
