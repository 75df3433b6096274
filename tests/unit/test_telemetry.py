"""Handler telemetry through a real TorchServe metrics cache: the [METRICS] lines and audit lines."""

from __future__ import annotations

import json
import logging
import re

import pytest

from handler.rtserve_handler import RealTimeHandler
from handler.schema import parse_batch
from handler.telemetry import violation_reason
from tests.helpers import MODEL_YAML, features, json_row, make_context, raw_row, start_batch

pytestmark = pytest.mark.unit



@pytest.fixture()
def handler_ctx(trained_dir):
    cfg = {**MODEL_YAML, "handler": {**MODEL_YAML["handler"], "drift_window": 100,
                                     "drift_export_seconds": 0.1}}
    ctx = make_context(trained_dir, cfg)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    return handler, ctx


def metric_lines(caplog) -> list[tuple[str, float, str]]:
    out = []
    for rec in caplog.records:
        m = re.match(r"\[METRICS\](\w+)\.\w+:([\d.eE+-]+)\|#([^|]*)\|", rec.getMessage())
        if m:
            out.append((m.group(1), float(m.group(2)), m.group(3)))
    return out


def test_one_batch_updates_every_metric_once_and_audits_every_request(handler_ctx, caplog):
    handler, ctx = handler_ctx
    rows = [json_row({"features": features()}), raw_row(b"{x"), json_row({"features": [1.0]}),
            json_row({"instances": [features(), features(value=-40.0)]}), json_row({"features": features()})]
    start_batch(ctx, len(rows))
    with caplog.at_level(logging.INFO):
        handler.handle(rows, ctx)
    lines = metric_lines(caplog)
    names = [n for n, _, _ in lines]
    assert names.count("HandlerStageTime") == 3 and names.count("BatchFill") == 1
    assert ("HandlerRequests", 5.0) in [(n, v) for n, v, _ in lines]
    violations = {dims: v for n, v, dims in lines if n == "SchemaViolations"}
    assert sorted(violations.values()) == [1.0, 1.0]
    assert any("Reason:not_json" in d for d in violations) and any("Reason:wrong_length" in d for d in violations)
    assert sum(v for n, v, _ in lines if n == "Predictions") == 4  # 2 plain + 2 v1 instances
    audit = [json.loads(line) for rec in caplog.records if rec.name == "rtserve.audit"
             for line in rec.getMessage().splitlines()]
    assert [a["request_id"] for a in audit] == [f"req-{i}" for i in range(5)]
    assert [a["event"] for a in audit] == ["prediction", "rejected", "rejected", "prediction", "prediction"]
    assert len(audit[3]["classes"]) == 2 and audit[0]["model_version"] == "1.0"


def test_drift_gauges_are_exported_once_the_window_has_enough_rows(handler_ctx, caplog):
    handler, ctx = handler_ctx
    handler.telemetry.clock = iter(range(1000)).__next__  # each record is 1 s after the last
    handler.telemetry._last_export = -1
    with caplog.at_level(logging.INFO):
        for _ in range(4):
            batch = [json_row({"features": features(value=v)}) for v in range(30)]
            start_batch(ctx, len(batch))
            handler.handle(batch, ctx)
    drift = [n for n, _, _ in metric_lines(caplog) if n == "FeatureDrift"]
    assert len(drift) == 32 * 1  # exported after 120 rows >= the 100-row window, not before


@pytest.mark.parametrize("body,reason", [
    (b"{", "not_json"), (b"", "empty_body"), (b"[1]", "not_an_object"), (b"{}", "missing_field"),
    (b'{"features": 3}', "not_a_list"), (b'{"features": [1]}', "wrong_length"),
    (json.dumps({"features": ["a"] + [1.0] * 31}).encode(), "not_a_number"),
    (b'{"features": [NaN' + b", 1.0" * 31 + b"]}", "non_finite"),
    (json.dumps({"features": [1e9] + [1.0] * 31}).encode(), "out_of_range"),
])
def test_violation_reasons_follow_the_real_messages(body, reason):
    batch = parse_batch([raw_row(body)], 32)
    assert violation_reason(batch.errors[0]) == reason
