"""The consumer's commit thread: a daemon thread per transaction (a call stuck in the Kafka client
never keeps the process from exiting), and a step that waits at most ``COMMIT_DEADLINE`` for it,
then gives the step up as a failed commit. The stream tier runs the real transactions; a commit
that hangs cannot be made to happen on demand against the real broker, so the step here holds a
future that never ends."""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

import pytest

from rtserve.stream import consumer as stream_consumer
from rtserve.stream.consumer import Counts, InFlight, StreamConfig, StreamConsumer, on_daemon_thread

pytestmark = pytest.mark.unit


def test_the_commit_runs_on_a_daemon_thread_and_hands_back_its_result_or_its_error():
    seen = {}

    def commit(x):
        seen["thread"] = threading.current_thread()
        return x * 2

    assert on_daemon_thread(commit, 21).result(timeout=5) == 42
    assert seen["thread"].daemon and seen["thread"].name == "stream-commit"
    with pytest.raises(ValueError, match="refused"):
        on_daemon_thread(lambda: (_ for _ in ()).throw(ValueError("refused"))).result(timeout=5)


def test_a_commit_past_its_deadline_gives_the_step_up_and_drops_the_producer(monkeypatch, caplog):
    monkeypatch.setattr(stream_consumer, "COMMIT_DEADLINE", 0.2)
    member = StreamConsumer.__new__(StreamConsumer)  # only the parts finish() reads on a failure
    member.counts, member.producer, member._unsettled = Counts(), object(), False
    member.config, member._pending, member._forming, member._released = StreamConfig("x:1"), deque(), [], []
    member._delivered = {}
    member._in_flight = InFlight([], [], Future())  # a commit that never ends
    began = time.monotonic()
    assert member.finish(settle=False) is None
    assert time.monotonic() - began < 5
    assert member.counts.aborted == 1 and member.producer is None and member._unsettled
    assert member._in_flight is None
    assert "the commit did not end within 0.2 s" in caplog.text


def test_the_pipeline_gives_a_stuck_commit_up_at_its_deadline_without_waiting_for_it(monkeypatch, caplog):
    """The loop only looks at the commit (``finish(wait=False)``); one that never ends must still be
    given up once ``COMMIT_DEADLINE`` has passed since it was handed over (a member once polled for
    240 s behind a ``send_offsets_to_transaction`` that outlived its own timeout)."""
    monkeypatch.setattr(stream_consumer, "COMMIT_DEADLINE", 0.3)
    member = StreamConsumer.__new__(StreamConsumer)
    member.counts, member.producer, member._unsettled = Counts(), object(), False
    member.config, member._pending, member._forming, member._released = StreamConfig("x:1"), deque(), [], []
    member._delivered = {}
    member._in_flight = InFlight([], [], Future())
    assert member.finish(wait=False, settle=False) == 0 and member._in_flight is not None  # not yet
    time.sleep(0.4)
    assert member.finish(wait=False, settle=False) is None
    assert member.counts.aborted == 1 and member.producer is None and member._in_flight is None
    assert "the commit did not end within 0.3 s" in caplog.text
