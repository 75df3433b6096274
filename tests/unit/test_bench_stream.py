"""The stream benchmark's arithmetic (bench/stream.py): the delivery checks over the outputs read
back, the latency per event, the quantiles, the CPU split per component, the consumer's counters,
the broker profile's top frames and the targets' verdicts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.stream import (
    AT_LEAST_ONCE,
    NAIVE,
    SHIPPED,
    SHIPPED_ALO,
    TRANSPORT,
    Output,
    Phase,
    consumer_counts,
    delivery,
    latencies,
    per_event,
    per_transaction,
    quantile,
    split,
    stage_times,
    summarize,
    top_frames,
)
from rtserve.stream.consumer import Timeline
from rtserve.stream.metrics import StreamMetrics

pytestmark = pytest.mark.unit


def out(partition: int, offset: int, topic: str = "predictions", arrived: float = 0.0, timestamp: int = 0) -> Output:
    """An output record as the reader keeps it: arrival (ms), topic, its event's coordinates and timestamp."""
    return Output(arrived, topic, partition, offset, timestamp)


def test_each_input_offset_once_in_the_predictions_or_the_dead_letters_is_exactly_once():
    sent = {(0, 0), (0, 1), (1, 0)}
    report = delivery(sent, [out(0, 0), out(1, 0), out(0, 1, "dlq")], "predictions")
    assert report == {
        "guarantee": "exactly-once",
        "inputs": 3,
        "not_committed": 0,
        "predictions": 2,
        "dead_letters": 1,
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "ok": True,
    }


@pytest.mark.parametrize(
    "records, broken",
    [
        ([out(0, 0), out(0, 1), out(1, 0), out(0, 1, "dlq")], {"duplicates": 1}),  # written twice
        ([out(0, 0), out(1, 0)], {"missing": 1}),  # never scored
        ([out(0, 0), out(0, 1), out(1, 0), out(1, 7)], {"unexpected": 1}),  # no such input
    ],
)
def test_a_duplicate_a_gap_or_a_stranger_breaks_it(records, broken):
    report = delivery({(0, 0), (0, 1), (1, 0)}, records, "predictions")
    assert not report["ok"]
    assert {k: v for k, v in report.items() if k in ("duplicates", "missing", "unexpected") and v} == broken


def test_only_the_inputs_the_group_committed_are_expected_and_an_output_beyond_them_breaks_exactly_once():
    sent = {(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)}
    # the window closed with (0, 2) and (1, 1) still waiting: partition 0 committed up to 2, 1 up to 1
    committed = {0: 2, 1: 1}
    report = delivery(sent, [out(0, 0), out(0, 1), out(1, 0)], "predictions", committed)
    assert report["ok"] and report["inputs"] == 3 and report["not_committed"] == 2
    # an output of an input whose offset was not committed: not atomic with its offset
    report = delivery(sent, [out(0, 0), out(0, 1), out(1, 0), out(1, 1)], "predictions", committed)
    assert not report["ok"] and report["unexpected"] == 1
    # a partition the group never committed on expects nothing yet
    assert delivery(sent, [out(0, 0), out(0, 1)], "predictions", {0: 2})["ok"]


def test_at_least_once_counts_duplicates_and_breaks_only_on_a_gap_or_a_stranger():
    sent = {(0, 0), (0, 1), (1, 0)}
    twice = delivery(sent, [out(0, 0), out(0, 0), out(0, 1), out(1, 0)], "predictions", guarantee=AT_LEAST_ONCE)
    assert twice["ok"] and twice["duplicates"] == 1 and twice["guarantee"] == AT_LEAST_ONCE
    # delivered before its offset was committed: allowed at least once
    early = delivery(sent, [out(0, 0), out(0, 1), out(1, 0)], "predictions", {0: 2}, AT_LEAST_ONCE)
    assert early["ok"] and early["unexpected"] == 0
    gap = delivery(sent, [out(0, 0), out(1, 0)], "predictions", guarantee=AT_LEAST_ONCE)
    assert not gap["ok"] and gap["missing"] == 1
    stranger = delivery(sent, [out(0, 0), out(0, 1), out(1, 0), out(3, 3)], "predictions", guarantee=AT_LEAST_ONCE)
    assert not stranger["ok"] and stranger["unexpected"] == 1


def test_latency_is_arrival_minus_the_events_timestamp_and_the_warm_up_is_left_out():
    records = [
        out(0, 0, arrived=1005.0, timestamp=1000),
        out(0, 1, arrived=2030.0, timestamp=2000),
        out(0, 2, arrived=2012.5, timestamp=2010),
    ]
    assert latencies(records, since_ms=1500) == [30.0, 2.5]
    assert quantile([30.0, 2.5, 7.0], 0.5) == 7.0 and quantile([30.0, 2.5, 7.0], 0.99) == 30.0
    assert quantile([], 0.5) is None


def test_cpu_split_per_component_and_the_rest_of_the_machine():
    before = {"broker": 10.0, "consumer": 1.0, "bench": 2.0, "machine": 100.0}
    after = {"broker": 11.0, "consumer": 1.5, "bench": 2.25, "machine": 104.0}
    seconds, pct = split(before, after, 2.0)
    assert seconds == {"broker": 1.0, "consumer": 0.5, "bench": 0.25, "others": 2.25}
    assert pct == {"broker": 50.0, "consumer": 25.0, "bench": 12.5, "others": 112.5}
    # per event: the broker, the consumer and TorchServe; the bench and the rest left out
    assert per_event({**seconds, "torchserve workers": 0.5}, 1000) == 2.0
    assert per_event(seconds, 0) is None
    # a part of a component (the broker's JIT threads) is reported, never counted twice in others
    before["broker JIT"], after["broker JIT"] = 3.0, 3.5
    seconds, pct = split(before, after, 2.0)
    assert seconds["others"] == 2.25 and seconds["broker JIT"] == 0.5 and pct["broker JIT"] == 25.0


def scrape(predictions: int, dead_letters: int, transactions: int, aborted: int = 0) -> dict[str, float]:
    """The counters as the bench reads them from a real StreamMetrics' /metrics text."""
    metrics = StreamMetrics()
    metrics.watch(
        SimpleNamespace(
            predictions=predictions, dead_letters=dead_letters, transactions=transactions, aborted=aborted, retries=0
        )
    )
    return consumer_counts(metrics.render().decode())


def test_transactions_and_events_per_transaction_come_from_the_consumers_metrics():
    before, after = scrape(100, 4, 2, aborted=1), scrape(1100, 4, 6, aborted=3)
    assert (before["events"], before["transactions"]) == (104.0, 2.0)  # committed only, not aborted
    assert per_transaction(before, after) == (4, 250.0)
    assert per_transaction(after, after) == (0, None)
    # no metrics port (the naive consumer), or it did not answer
    assert per_transaction({}, after) == (None, None)


def test_stage_times_are_each_stages_mean_and_bucket_over_the_window():
    metrics = StreamMetrics()
    metrics.stages([Timeline(1.0, polled=0.0, sent=0.001, answered=0.011, released=0.011, handed=0.011)], 0.02)
    before = consumer_counts(metrics.render().decode())
    slow = [Timeline(0.003, polled=0.0, sent=0.002, answered=0.012, released=0.012, handed=0.014) for _ in range(98)]
    metrics.stages(
        [*slow, Timeline(0.003, polled=0.0, sent=0.002, answered=0.2, released=0.2, handed=0.2)], 0.2 + 0.006
    )
    after = consumer_counts(metrics.render().decode())
    got = stage_times(before, after)
    assert list(got) == ["wait", "linger", "score", "order", "queue", "commit"]
    assert got["wait"] == {"batches": 99, "mean_ms": 3.0, "p99_within_ms": 5.0}  # the second second's only
    assert got["score"]["mean_ms"] == pytest.approx((98 * 10 + 198) / 99, abs=0.01)
    assert got["score"]["p99_within_ms"] == 250.0  # 98 of 99 at 10 ms: 98.99 % is not 99 %
    assert got["order"] == {"batches": 99, "mean_ms": 0.0, "p99_within_ms": 0.5}
    assert stage_times(after, after) == {} and stage_times({}, {}) == {}


JFR_TEXT = """\
jdk.ExecutionSample {
  startTime = 20:59:08.151
  sampledThread = "Attach Listener" (javaThreadId = 82)
  state = "STATE_RUNNABLE"
  stackTrace = [
    jdk.internal.misc.Unsafe.putByte(long, byte) line: 334
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 20:59:09.010
  sampledThread = "data-plane-kafka-request-handler-0" (javaThreadId = 51)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.util.HashMap.getNode(Object) line: 568
    java.util.HashMap.get(Object) line: 556
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 20:59:09.020
  sampledThread = "data-plane-kafka-request-handler-1" (javaThreadId = 52)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.util.HashMap.getNode(Object) line: 570
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 20:59:09.030
  sampledThread = "kafka-scheduler-3" (javaThreadId = 40)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.nio.DirectByteBuffer.ix(int) line: 290
  ]
}
"""


def test_the_profiles_top_frames_are_counted_by_method_and_its_thread_pools_and_jcmds_own_left_out():
    samples, frames, threads = top_frames(JFR_TEXT, 15)
    assert samples == 3
    assert frames == [("java.util.HashMap.getNode(Object)", 2), ("java.nio.DirectByteBuffer.ix(int)", 1)]
    assert threads == [("data-plane-kafka-request-handler", 2), ("kafka-scheduler", 1)]
    assert top_frames(JFR_TEXT, 1)[1] == [("java.util.HashMap.getNode(Object)", 2)]


def phase(p: str, who: str, events_per_s: float = 0.0, p50: float | None = None, p99: float | None = None) -> Phase:
    rate = 4000.0 if p == "fixed rate" else None
    made = Phase(
        p,
        who,
        rate,
        1000,
        1000,
        1.0,
        events_per_s or rate or 0.0,
        p50,
        p99,
        ended_by="events" if rate is None else None,
    )
    if who in (SHIPPED, SHIPPED_ALO):
        made.delivery = delivery({(0, 0)}, [out(0, 0)], "predictions", None, "exactly-once")
    return made


def test_each_target_is_met_or_missed_and_a_skipped_at_least_once_phase_says_why():
    phases = [
        phase("saturation", SHIPPED, 9000.0),
        phase("saturation", NAIVE, 4000.0),
        phase("fixed rate", TRANSPORT, p50=4.0, p99=8.0),
        phase("fixed rate", SHIPPED, p50=25.0, p99=60.0),
        phase("fixed rate", NAIVE, p50=12.0, p99=70.0),
    ]
    lines, targets, ok = summarize(phases, 200000, 20.0, "the consumer lacks the option")
    assert ok and targets["delivery"] is True
    assert targets["exactly_once_p50_ms"]["met"] is True  # at the bound: met
    assert targets["exactly_once_p99_ms"]["met"] is False
    assert targets["throughput_ratio"] == {"value": 2.25, "target": 2.0, "exactly_once": True, "met": True}
    assert targets["at_least_once_p99_ms"]["skipped"] == "the consumer lacks the option"
    text = "\n".join(lines)
    assert "p50 25.0 ms (<= 25 ms: met), p99 60.0 ms (<= 50 ms: MISSED)" in text
    assert "at least once: phase skipped, the consumer lacks the option" in text
    assert "2.25x the naive consumer's 4000 (>= 2x, exactly once: met)" in text
    assert "came through" not in text  # each kept up with the rate

    behind = phase("fixed rate", SHIPPED, 2400.0, p50=9000.0, p99=12000.0)
    lines, _, _ = summarize([behind], 200000, 20.0)
    assert "  fixed rate, shipped: 2400 of the 4000 events/s offered came through" in "\n".join(lines)

    phases.append(phase("fixed rate", SHIPPED_ALO, p50=9.0, p99=19.5))
    lines, targets, _ = summarize(phases, 200000, 20.0)
    assert targets["at_least_once_p99_ms"] == {"value": 19.5, "target": 20.0, "met": True}
    assert "p99 19.5 ms (<= 20 ms: met)" in "\n".join(lines)


def test_a_throughput_without_exactly_once_misses_its_target_and_fails_the_run():
    phases = [phase("saturation", SHIPPED, 9000.0), phase("saturation", NAIVE, 3000.0)]
    phases[0].delivery = delivery({(0, 0), (0, 1)}, [out(0, 0)], "predictions")
    lines, targets, ok = summarize(phases, 200000, 20.0)
    assert not ok and targets["throughput_ratio"]["met"] is False
    assert any(line.endswith("BROKEN") for line in lines)
