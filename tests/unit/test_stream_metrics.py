"""The stream consumer's metrics and health (rtserve.stream.metrics) without a broker: lag from
librdkafka's statistics text (fields as librdkafka 2.x writes them), the histogram, the scrape's
families and the HTTP endpoints on a real loopback server."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from rtserve.cli import build_parser
from rtserve.errors import StreamError
from rtserve.stream import metrics
from rtserve.stream.consumer import Counts, Timeline
from rtserve.stream.metrics import Histogram, StreamMetrics, partition_lag, partitions_from_stats

pytestmark = pytest.mark.unit

INVALID = -1001  # librdkafka's RD_KAFKA_OFFSET_INVALID
CREATE_TIME = 1  # confluent_kafka.TIMESTAMP_CREATE_TIME; 0 is TIMESTAMP_NOT_AVAILABLE


def partition(desired=True, ls=100, committed=INVALID, lo=0, hi=None, app=INVALID) -> dict:
    """One partition's entry as librdkafka's statistics hold it (a subset of its fields)."""
    return {
        "desired": desired,
        "unknown": False,
        "fetch_state": "active" if desired else "none",
        "lo_offset": lo,
        "hi_offset": ls if hi is None else hi,
        "ls_offset": ls,
        "app_offset": app,
        "next_offset": max(app, committed, 0),
        "committed_offset": committed,
        "consumer_lag": -1,
    }


def stats(**partitions: dict) -> str:
    """Statistics text of one topic, ``events``, with the given partitions (p0=..., p1=...)."""
    parts = {name[1:]: value for name, value in partitions.items()}
    parts["-1"] = partition(desired=False, ls=INVALID)  # the unassigned-messages queue, always there
    return json.dumps(
        {
            "name": "rdkafka#consumer-1",
            "type": "consumer",
            "cgrp": {"state": "up", "join_state": "steady", "assignment_size": len(parts) - 1},
            "topics": {"events": {"topic": "events", "partitions": parts}},
        }
    )


class Message:
    """What the metrics read of a confluent_kafka.Message: ``timestamp()`` -> (kind, ms), and its
    topic, partition and offset."""

    def __init__(
        self, ms: int, kind: int = CREATE_TIME, partition: int = 0, offset: int = 0, topic: str = "events"
    ) -> None:
        self._ts, self._where = (kind, ms), (topic, partition, offset)

    def timestamp(self) -> tuple[int, int]:
        return self._ts

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def families(m: StreamMetrics) -> dict[str, list]:
    """name -> samples [(name, labels, value)] of one scrape, parsed as Prometheus would."""
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(m.render().decode())
    }


def test_lag_is_the_last_stable_offset_minus_the_groups_committed_offset():
    text = stats(
        p0=partition(ls=120, committed=100, app=116),  # read up to 115: still lag from 100
        p1=partition(ls=40, committed=INVALID, lo=12),  # the group never committed: log start
        p2=partition(desired=False, ls=500),  # another member's
        p3=partition(ls=INVALID),  # end not known yet
        p4=partition(ls=7, hi=9, committed=7),  # an input transaction open: not lag
        p5=partition(ls=30, committed=INVALID, lo=INVALID),
    )  # no start known yet
    partitions = partitions_from_stats(text)
    assert partitions == {
        ("events", 0): (120, 100),
        ("events", 1): (40, 12),
        ("events", 4): (7, 7),
        ("events", 5): (30, -1),
    }
    assert partition_lag(partitions, {}) == {("events", 0): 20, ("events", 1): 28, ("events", 4): 0}
    # this member's transactions moved the offsets on; an older one of its own (a partition that
    # left and came back, committed further by another member meanwhile) does not move them back
    mine = {("events", 0): 118, ("events", 1): 10, ("events", 5): 25}
    assert partition_lag(partitions, mine) == {("events", 0): 2, ("events", 1): 28, ("events", 4): 0, ("events", 5): 5}


def test_lag_of_nothing_assigned_is_empty_and_bad_statistics_raise_value_error():
    assert partitions_from_stats(json.dumps({"type": "consumer", "topics": {}})) == {}
    assert partitions_from_stats(json.dumps({"type": "consumer"})) == {}
    with pytest.raises(ValueError):
        partitions_from_stats("not json")


def test_histogram_counts_a_value_on_a_bound_in_that_bucket():
    h = Histogram((0.01, 0.05, 1.0))
    assert h.observe_many([0.004, 0.01, 0.02, 0.05, 0.7, 3.0]) == 6
    assert h.observe_many([]) == 0
    buckets, total = h.buckets()
    assert buckets == [("0.01", 2), ("0.05", 4), ("1.0", 5), ("+Inf", 6)]
    assert total == pytest.approx(3.784)


def test_latency_buckets_are_dense_around_the_50_ms_target():
    bounds = metrics.LATENCY_BUCKETS
    assert list(bounds) == sorted(set(bounds))
    near = [b for b in bounds if 0.02 <= b <= 0.1]
    assert 0.05 in bounds and len(near) >= 7 and max(bounds) >= 60


def test_a_scrape_reads_the_consumers_counts_lag_and_latency():
    wall = Clock(1_800_000_000.0)
    m = StreamMetrics(wall=wall)
    empty = families(m)
    assert empty["rtserve_stream_events"] == [] and empty["rtserve_stream_consumer_lag"] == []
    assert empty["rtserve_stream_producer_recreations"] == [("rtserve_stream_producer_recreations_total", {}, 0)]

    counts = Counts(predictions=40, dead_letters=6, transactions=3, aborted=1, retries=2)
    m.watch(counts)
    m.producer_ready()
    m.producer_ready()  # a fenced producer made anew
    m.on_stats(stats(p0=partition(ls=50, committed=40), p1=partition(ls=9, committed=6)))
    now_ms = int(wall.now * 1000)
    assert (
        m.committed(
            [
                Message(now_ms - 12, offset=40),
                Message(now_ms - 48, offset=41),
                Message(now_ms - 2500, offset=42),
                Message(now_ms + 5, offset=44),  # the producer's clock ahead: counted as 0
                Message(0, kind=0, partition=1, offset=8),
            ]
        )
        == 4
    )  # no timestamp: not timed
    got = families(m)
    assert got["rtserve_stream_events"] == [
        ("rtserve_stream_events_total", {"outcome": "predicted"}, 40),
        ("rtserve_stream_events_total", {"outcome": "dead_lettered"}, 6),
    ]
    assert got["rtserve_stream_transactions"] == [
        ("rtserve_stream_transactions_total", {"result": "committed"}, 3),
        ("rtserve_stream_transactions_total", {"result": "aborted"}, 1),
    ]
    assert got["rtserve_stream_retries"] == [("rtserve_stream_retries_total", {}, 2)]
    assert got["rtserve_stream_producer_recreations"] == [("rtserve_stream_producer_recreations_total", {}, 1)]
    assert got["rtserve_stream_consumer_lag"] == [
        ("rtserve_stream_consumer_lag", {"topic": "events", "partition": "0"}, 5),  # 50 - (44 + 1)
        ("rtserve_stream_consumer_lag", {"topic": "events", "partition": "1"}, 0),
    ]  # 9 - (8 + 1)
    assert got["rtserve_stream_assigned_partitions"] == [("rtserve_stream_assigned_partitions", {}, 2)]
    buckets = {s[1]["le"]: s[2] for s in got["rtserve_stream_event_to_prediction_seconds"] if s[0].endswith("_bucket")}
    assert (buckets["0.005"], buckets["0.015"], buckets["0.05"], buckets["2.5"], buckets["+Inf"]) == (1, 2, 3, 4, 4)
    count = [s[2] for s in got["rtserve_stream_event_to_prediction_seconds"] if s[0].endswith("_count")]
    assert count == [4]

    counts.predictions += 10  # the consumer counts on: the next scrape shows it, nothing else to call
    assert families(m)["rtserve_stream_events"][0][2] == 50
    m.on_stats(stats(p1=partition(ls=9, committed=6)))  # p0 revoked: its series goes
    assert [s[1]["partition"] for s in families(m)["rtserve_stream_consumer_lag"]] == ["1"]


def test_each_committed_micro_batch_adds_its_time_in_each_stage():
    m = StreamMetrics()
    first = Timeline(0.004, polled=10.0, sent=10.002, answered=10.012, released=10.013, handed=10.033)
    untimed = Timeline(None, polled=10.1, sent=10.1, answered=10.15, released=10.15, handed=10.16)
    m.stages([first, untimed], committed=10.2)
    got = {
        (s[1]["stage"], s[0].rsplit("_", 1)[1]): s[2]
        for s in families(m)["rtserve_stream_stage_seconds"]
        if not s[0].endswith("_bucket")
    }
    expected = {
        "wait": [0.004],  # the second has no Kafka timestamp
        "linger": [0.002, 0.0],
        "score": [0.01, 0.05],
        "order": [0.001, 0.0],
        "queue": [0.02, 0.01],
        "commit": [0.167, 0.04],
    }
    assert set(expected) == set(metrics.STAGES)
    for stage, values in expected.items():
        assert got[(stage, "count")] == len(values), stage
        assert got[(stage, "sum")] == pytest.approx(sum(values), abs=1e-9), stage
    buckets = {
        s[1]["le"]: s[2]
        for s in families(m)["rtserve_stream_stage_seconds"]
        if s[0].endswith("_bucket") and s[1]["stage"] == "commit"
    }
    assert (buckets["0.03"], buckets["0.05"], buckets["0.1"], buckets["0.25"]) == (0, 1, 1, 2)


def test_statistics_that_cannot_be_read_keep_the_last_lag_and_never_raise():
    m = StreamMetrics()
    m.on_stats(stats(p0=partition(ls=5, committed=2)))
    m.on_stats("{truncated")
    m.on_stats(json.dumps({"topics": {"events": {"partitions": {"0": {"desired": True, "ls_offset": "x"}}}}}))
    m.on_stats(json.dumps({"topics": ["not", "a", "mapping"]}))
    assert m.lag() == {("events", 0): 3}


def test_live_while_the_loop_comes_round_ready_once_subscribed_with_a_producer():
    clock = Clock()
    m = StreamMetrics(stall=60, clock=clock)
    assert m.live()[0] and not m.ready()[0]  # starting: alive, not ready
    m.producer_ready()
    assert not m.ready()[0], "not subscribed yet"
    m.tick()
    ok, body = m.ready()
    assert ok and body["assigned"] == [] and body["producer"] and body["subscribed"]  # waiting for partitions
    m.on_stats(stats(p3=partition(ls=1, committed=1)))
    assert m.ready()[1]["assigned"] == ["events[3]"]
    m.producer_starting()  # a fenced producer being made anew
    assert not m.ready()[0] and m.live()[0]
    m.producer_ready()
    clock.now += 60
    assert m.live()[0] and m.ready()[0]
    clock.now += 0.5
    ok, body = m.live()
    assert not ok and body == {"loop_age_seconds": 60.5, "stall_seconds": 60}
    assert not m.ready()[0]
    m.tick()
    assert m.live()[0]


def get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_the_port_serves_metrics_healthz_and_ready():
    clock = Clock()
    m = StreamMetrics(stall=30, clock=clock)
    m.watch(Counts(predictions=3))
    server = metrics.serve(m, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        status, kind, body = get(base + "/metrics")
        assert status == 200 and kind == CONTENT_TYPE_LATEST
        assert b'rtserve_stream_events_total{outcome="predicted"} 3.0' in body
        assert get(base + "/healthz")[:2] == (200, "application/json")
        status, _, body = get(base + "/ready")
        assert status == 503 and json.loads(body)["ok"] is False and json.loads(body)["producer"] is False
        m.producer_ready()
        m.tick()
        status, _, body = get(base + "/ready?verbose=1")
        assert status == 200 and json.loads(body)["ok"] is True
        clock.now += 31
        status, _, body = get(base + "/healthz")
        assert status == 503 and json.loads(body) == {"ok": False, "loop_age_seconds": 31.0, "stall_seconds": 30}
        status, _, body = get(base + "/nope")
        assert status == 404 and json.loads(body) == {
            "error": "not found: /metrics, /healthz and /ready are served here"
        }
    finally:
        server.shutdown()
        server.server_close()


def test_a_taken_port_is_a_stream_error_naming_the_option():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StreamError, match=f"cannot serve metrics on 127.0.0.1:{port} .*--metrics-port"):
            metrics.serve(StreamMetrics(), "127.0.0.1", port)


def test_the_commands_help_names_the_modules_defaults():
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["stream"]._subparsers._group_actions[0].choices["run"]
    helps = {a.dest: a.help for a in run._actions}
    assert f"default: {metrics.METRICS_PORT};" in helps["metrics_port"]
    assert f"default: {metrics.METRICS_HOST};" in helps["metrics_host"]
    assert f"default: {metrics.STALL_SECONDS:.0f})" in helps["stall_seconds"]
