"""The promotion gate's decision (rtserve.promotion.gate): pure functions, no server."""

from __future__ import annotations

import json

import pytest

from rtserve.errors import GateError
from rtserve.promotion.gate import (
    DEFAULT_CONFIG,
    ArchiveMeta,
    GateConfig,
    Measured,
    Row,
    decide,
    gate_rows,
    golden_mismatches,
    percentile,
    read_requests,
)

pytestmark = pytest.mark.unit

CONFIG = GateConfig.load()


def rows(labels):
    return [Row([0.0], y, "golden" if y else "requests") for y in labels]


def measured(version, predicted, latency_ms):
    return Measured(version, list(predicted), [latency_ms] * 10)


def test_thresholds_file_is_complete_and_typed(tmp_path):
    assert CONFIG.thresholds() == {
        k: getattr(CONFIG, k) for k in ("max_accuracy_drop", "min_agreement", "max_latency_ratio")
    }
    raw = DEFAULT_CONFIG.read_text()
    bad = tmp_path / "gate.yaml"
    bad.write_text(raw.replace("min_agreement:", "min_agreemnt:"))
    with pytest.raises(GateError, match=r"missing \['min_agreement'\], unknown \['min_agreemnt'\]"):
        GateConfig.load(bad)
    bad.write_text(raw.replace("burst_requests: ", "burst_requests: -"))
    with pytest.raises(GateError, match="burst_requests must be a non-negative int"):
        GateConfig.load(bad)
    bad.write_text(raw.replace("min_agreement: ", "min_agreement: 1"))
    with pytest.raises(GateError, match="shares in"):
        GateConfig.load(bad)


def test_same_answers_pass():
    truth = ["a", "b", "a", "b"]
    report = decide(CONFIG, "m", rows(truth), measured("1", truth, 2.0), measured("2", truth, 2.0))
    assert report.passed and report.failures == []
    assert report.accuracy == {"default": 1.0, "candidate": 1.0, "drop": 0.0, "rows": 4}
    assert report.agreement["on"].startswith("rows (none unlabelled")


def test_each_threshold_refuses_with_its_reason():
    n = 200
    truth = ["a"] * n
    drop = round(n * CONFIG.max_accuracy_drop) + 1  # one row past the allowed drop
    worse = ["b"] * drop + ["a"] * (n - drop)
    report = decide(CONFIG, "m", rows(truth), measured("1", truth, 2.0), measured("2", worse, 2.0))
    assert [f.split(":")[0] for f in report.failures] == ["accuracy"]

    unlabelled = [None] * n
    differ = round(n * (1 - CONFIG.min_agreement)) + 1
    other = ["b"] * differ + ["a"] * (n - differ)
    report = decide(CONFIG, "m", rows(unlabelled), measured("1", truth, 2.0), measured("2", other, 2.0))
    assert [f.split(":")[0] for f in report.failures] == ["agreement"]
    assert report.agreement["on"] == "unlabelled rows" and report.accuracy["candidate"] is None

    slow = 2.0 * CONFIG.max_latency_ratio * 1.01
    report = decide(CONFIG, "m", rows(truth), measured("1", truth, 2.0), measured("2", truth, slow))
    assert [f.split(":")[0] for f in report.failures] == ["latency"]
    assert report.latency_ms["ratio"] == pytest.approx(slow / 2.0, rel=1e-3)
    assert "FAILED latency" in report.text() and "outcome: refused" in report.text()


def test_limits_themselves_pass():
    """Accuracy exactly max_accuracy_drop lower and p99 exactly max_latency_ratio times the
    default's pass, with the shipped thresholds (agreement here is 0.99, above its limit)."""
    n = 100
    truth = ["a"] * n
    allowed = round(n * CONFIG.max_accuracy_drop)
    at_limit = ["b"] * allowed + ["a"] * (n - allowed)
    report = decide(
        CONFIG, "m", rows(truth), measured("1", truth, 2.0), measured("2", at_limit, 2.0 * CONFIG.max_latency_ratio)
    )
    assert report.passed, report.failures
    assert report.accuracy["drop"] == pytest.approx(CONFIG.max_accuracy_drop)
    assert report.latency_ms["ratio"] == pytest.approx(CONFIG.max_latency_ratio)


@pytest.mark.parametrize("differ,passed", [(10, True), (11, False)], ids=["exactly min_agreement", "one row below"])
def test_agreement_at_and_just_below_its_limit(differ, passed):
    """On 100 unlabelled rows the candidate gives another class than the default on ``differ``:
    10 is agreement 0.90, exactly the shipped min_agreement (passes); 11 is 0.89 (refused)."""
    assert CONFIG.min_agreement == 0.9, "the row counts below are for min_agreement 0.9"
    n = 100
    default = ["a"] * n
    candidate = ["b"] * differ + ["a"] * (n - differ)
    report = decide(CONFIG, "m", rows([None] * n), measured("1", default, 2.0), measured("2", candidate, 2.0))
    assert report.agreement["value"] == pytest.approx((n - differ) / n)
    assert report.agreement["on"] == "unlabelled rows"
    assert report.passed is passed
    assert [f.split(":")[0] for f in report.failures] == ([] if passed else ["agreement"])


def test_event_is_one_json_line_with_figures_and_thresholds():
    truth = ["a", "b"]
    report = decide(CONFIG, "m", rows(truth), measured("1", truth, 1.0), measured("2", truth, 1.0))
    event = json.loads(json.dumps(report.event()))
    assert event["event"] == "gate" and event["thresholds"] == CONFIG.thresholds()
    assert (event["default"], event["candidate"], event["passed"]) == ("1", "2", True)


def test_golden_mismatches_and_percentile():
    want = [[0.2, 0.8], [0.5, 0.5], [1.0, 0.0]]
    got = [[0.2, 0.8 + 1e-7], [0.5, 0.5 + 1e-3], [1.0, 0.0]]
    assert golden_mismatches(want, got, 1e-5) == [1]
    assert golden_mismatches(want, got[:2], 1e-5) == [1, 2]
    assert percentile(list(range(1, 101)), 99) == 99 and percentile([5.0], 50) == 5.0


def test_rows_and_requests(tmp_path):
    meta = ArchiveMeta(
        "1", ["a", "b"], 2, {"features": [[1, 2], [3, 4]], "labels": [1, 0], "probabilities": [[0, 1], [1, 0]]}
    )
    unlabelled = ArchiveMeta("2", ["a", "b"], 2, {**meta.golden, "labels": None})
    got = gate_rows(meta, unlabelled, [[5.0, 6.0]])
    assert [(r.label, r.source) for r in got] == [
        ("b", "golden 1"),
        ("a", "golden 1"),
        (None, "golden 2"),
        (None, "golden 2"),
        (None, "requests"),
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text('{"features": [1, 2]}\n\n{"instances": [[3, 4], [5, 6]]}\n')
    assert read_requests(path, 2, 10) == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert read_requests(path, 2, 2) == [[1.0, 2.0], [3.0, 4.0]]
    path.write_text('{"features": [1, 2, 3]}\n')
    with pytest.raises(GateError, match="requests.jsonl:1: a row must be 2 numbers"):
        read_requests(path, 2, 10)
