"""The stream benchmark's arithmetic (bench/stream.py): the exactly-once check over the outputs
read back, the latency per event, the quantiles and the CPU split per component."""

from __future__ import annotations

import pytest

from bench.stream import exactly_once, latencies, per_event, quantile, split

pytestmark = pytest.mark.unit


def out(
    partition: int, offset: int, topic: str = "predictions", arrived: float = 0.0, timestamp: int = 0
) -> tuple[float, str, dict]:
    """An output record as the reader keeps it: arrival (ms), topic, decoded value."""
    return (
        arrived,
        topic,
        {"source": {"topic": "events", "partition": partition, "offset": offset}, "event_timestamp": timestamp},
    )


def test_each_input_offset_once_in_the_predictions_or_the_dead_letters_is_exactly_once():
    sent = {(0, 0), (0, 1), (1, 0)}
    report = exactly_once(sent, [out(0, 0), out(1, 0), out(0, 1, "dlq")], "predictions")
    assert report == {
        "inputs": 3,
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
    report = exactly_once({(0, 0), (0, 1), (1, 0)}, records, "predictions")
    assert not report["ok"]
    assert {k: v for k, v in report.items() if k in ("duplicates", "missing", "unexpected") and v} == broken


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
