"""Handler telemetry: Prometheus metrics (read from the handler's registry), drift, records."""

from __future__ import annotations

import json
import time

import pytest
import torch

from handler.drift import DriftMonitor, fit_reference
from handler.errors import ConfigError
from handler.rtserve_handler import RealTimeHandler
from handler.schema import parse_batch
from handler.telemetry import DriftBuffer, violation_reason
from tests.helpers import MODEL_YAML, features, json_row, make_context, raw_row, records, start_batch

pytestmark = pytest.mark.unit

IDS = {"model_name": "realtime-classifier", "model_version": "1.0"}


def drift_handler(trained_dir, **settings) -> tuple[RealTimeHandler, object]:
    """The handler with a small drift window (and ``settings``), initialized."""
    cfg = {**MODEL_YAML, "handler": {**MODEL_YAML["handler"], "drift_window": 100, "drift_flush_rows": 16, **settings}}
    ctx = make_context(trained_dir, cfg)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    return handler, ctx


@pytest.fixture()
def handler_ctx(trained_dir, server_env):
    """Drift exported by hand (its thread waits an hour): the test decides when."""
    handler, ctx = drift_handler(trained_dir, drift_export_seconds=3600.0)
    yield handler, ctx
    handler.telemetry.close()


def value(handler, name: str, **labels) -> float:
    found = handler.telemetry.metrics.registry.get_sample_value(name, {**IDS, **labels})
    return 0.0 if found is None else found


def test_one_batch_updates_every_metric_once_and_records_every_request(handler_ctx, server_env):
    handler, ctx = handler_ctx
    rows = [
        json_row({"features": features()}),
        raw_row(b"{x"),
        json_row({"features": [1.0]}),
        json_row({"instances": [features(), features(value=-40.0)]}),
        json_row({"features": features()}),
    ]
    start_batch(ctx, len(rows))
    handler.handle(rows, ctx)
    for stage in ("preprocess", "inference", "postprocess"):
        assert value(handler, "rtserve_handler_stage_seconds_count", stage=stage) == 1
        assert 0 < value(handler, "rtserve_handler_stage_seconds_sum", stage=stage) < 1
    assert value(handler, "rtserve_batch_size_count") == 1
    assert value(handler, "rtserve_batch_size_sum") == 5
    assert value(handler, "rtserve_batch_size_bucket", le="4.0") == 0
    assert value(handler, "rtserve_batch_size_bucket", le="8.0") == 1
    assert value(handler, "rtserve_handler_requests_total") == 5
    assert value(handler, "rtserve_handler_batches_total") == 1
    assert value(handler, "rtserve_schema_violations_total", reason="not_json") == 1
    assert value(handler, "rtserve_schema_violations_total", reason="wrong_length") == 1
    predicted = sum(value(handler, "rtserve_predictions_total", **{"class": label}) for label in handler.meta.labels)
    assert predicted == 4  # 2 plain + 2 v1 instances
    assert value(handler, "rtserve_records_written_total") == 5
    assert value(handler, "rtserve_records_dropped_total") == 0
    lines = records(server_env / "records")
    assert [a["request_id"] for a in lines] == [f"req-{i}" for i in range(5)]
    assert [a["event"] for a in lines] == ["prediction", "rejected", "rejected", "prediction", "prediction"]
    assert len(lines[3]["classes"]) == 2 and lines[0]["model_version"] == "1.0"
    assert {a["batch"] for a in lines} == {lines[0]["batch"]} and lines[0]["batch_size"] == 5
    assert list(lines[0]) == [
        "request_id",
        "time",
        "model",
        "model_version",
        "route",
        "status",
        "event",
        "batch",
        "batch_size",
        "handler_ms",
        "class",
        "label",
        "answer",
        "inputs",
    ]
    assert list(lines[1]) == [
        "request_id",
        "time",
        "model",
        "model_version",
        "route",
        "status",
        "event",
        "batch",
        "batch_size",
        "handler_ms",
        "reason",
        "answer",
        "inputs",
    ]
    assert lines[1]["status"] == 400 and lines[1]["reason"] == "not_json"
    assert lines[1]["answer"] == {"error": "request body is not valid JSON"}
    assert lines[1]["inputs"] == "{x"  # what it sent, as text
    assert lines[2]["answer"]["field"] == "features" and lines[2]["inputs"] == {"features": [1.0]}
    assert lines[0]["label"] == handler.meta.labels[lines[0]["class"]]
    assert lines[0]["answer"]["label"] == lines[0]["label"] and lines[0]["inputs"] == features()
    assert lines[3]["inputs"] == [features(), features(value=-40.0)]


def test_record_ids_with_quotes_stay_valid_json(handler_ctx, server_env):
    handler, ctx = handler_ctx
    start_batch(ctx, 1)
    ctx.request_ids = {0: 'odd "id" \\ é'}
    handler.handle([json_row({"features": features()})], ctx)
    assert records(server_env / "records")[-1]["request_id"] == 'odd "id" \\ é'


@pytest.mark.parametrize("inputs", [True, False])
def test_a_batch_of_plain_predictions_is_recorded_as_the_general_loop_records_it(handler_ctx, monkeypatch, inputs):
    """The common batch (every request a plain prediction of one row) takes a shorter path in
    ``Recorder.lines``: byte for byte the lines of the general loop, routes included."""
    import handler.records as records_module
    from handler.records import Recorder
    from tests.helpers import route_headers

    handler, ctx = handler_ctx
    rows = [json_row({"features": features(value=v)}) for v in (0.5, -3.0, 40.0)]
    start_batch(ctx, len(rows), [route_headers(False)] * len(rows))
    batch = handler.preprocess(rows)
    answers = handler.postprocess(handler.inference(batch))
    ids = [f"{n:08d}-1111-2222-3333-444444444444" for n in range(len(rows))]
    assert batch.routes == ["predictions"] * 3
    assert records_module._plain_batch(batch, answers, ids, batch.routes)
    recorder = Recorder(handler.recorder.spool, "realtime-classifier", "1.0", handler.meta.labels, inputs)
    at = 1_780_000_000.9996  # the milliseconds round down, as iso_time's do
    plain = recorder.lines(batch, rows, answers, ids, batch.routes, 0.0012345, now=at)
    monkeypatch.setattr(records_module, "_plain_batch", lambda *args: False)
    recorder.batches = 0
    general = recorder.lines(batch, rows, answers, ids, batch.routes, 0.0012345, now=at)
    assert plain == general
    assert json.loads(plain[1])["time"] == records_module.iso_time(at)
    assert ("inputs" in json.loads(plain[0])) is inputs


def test_only_the_common_batch_takes_the_plain_path(handler_ctx):
    """Errors, protocol requests, ids that need escaping or are missing: the general loop."""
    from handler.records import _plain_batch

    handler, ctx = handler_ctx

    def plain(rows, ids=None) -> bool:
        start_batch(ctx, len(rows))
        batch = handler.preprocess(rows)
        answers = handler.postprocess(handler.inference(batch))
        ids = ids or [f"req-{n}" for n in range(len(rows))]
        return _plain_batch(batch, answers, ids, batch.routes)

    ok = json_row({"features": features()})
    assert plain([ok, ok])
    assert not plain([ok, raw_row(b"{x")])
    assert not plain([ok, json_row({"instances": [features()]})])
    assert not plain([ok, ok], ["req-0", 'odd "id"'])
    assert not plain([ok, ok], ["req-0", ""])


def drift_gauge(handler) -> float | None:
    return handler.telemetry.metrics.registry.get_sample_value("rtserve_feature_drift_psi", {**IDS, "feature": "f00"})


def test_drift_gauges_are_exported_once_the_window_has_enough_rows(handler_ctx):
    handler, ctx = handler_ctx
    exported = []
    for _ in range(4):
        batch = [json_row({"features": features(value=v)}) for v in range(30)]
        start_batch(ctx, len(batch))
        handler.handle(batch, ctx)
        handler.telemetry.export_drift()  # what the exporter thread does every interval
        exported.append(drift_gauge(handler))
    # exported once 120 rows >= the 100-row window, not before
    assert exported[:3] == [None, None, None] and exported[3] > 0.2
    # nothing new arrived: the next export leaves the gauges as they are
    assert handler.telemetry.export_drift() is False


def test_drift_is_exported_on_a_timer_after_the_traffic_stops(trained_dir, server_env):
    """A burst, then silence: the exporter thread scores every row of the burst (those still
    buffered below drift_flush_rows too) without waiting for a later batch."""
    handler, ctx = drift_handler(trained_dir, drift_export_seconds=0.1, drift_flush_rows=64)
    try:
        telemetry = handler.telemetry
        assert telemetry.exporter.thread.is_alive()
        batch = [json_row({"features": features(value=v)}) for v in range(30)]
        for _ in range(4):  # 120 rows: 64 flushed by the request path, 56 still buffered
            start_batch(ctx, len(batch))
            handler.handle(batch, ctx)
        deadline = time.monotonic() + 5
        while drift_gauge(handler) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert drift_gauge(handler) > 0.2
        assert telemetry.buffer._rows == 0 and telemetry.drift.rows == 100  # all 120 scored
        expected = DriftMonitor(handler.meta.drift_reference, 100)
        x = torch.tensor([features(value=v) for v in range(30)] * 4)
        expected.update(x, handler.model(x).argmax(dim=1))
        assert drift_gauge(handler) == pytest.approx(round(expected.scores().features[0], 6))
    finally:
        handler.telemetry.close()
    assert not handler.telemetry.exporter.thread.is_alive()


def test_drift_buffer_is_exact():
    """Buffered bulk updates give the very same window as one update per batch."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 6, generator=gen)
    classes = torch.randint(0, 3, (2000,), generator=gen)
    reference = fit_reference(x, classes, 3)
    direct, bulk = DriftMonitor(reference, 500), DriftMonitor(reference, 500)
    buffer = DriftBuffer(bulk, 64)
    shifted = torch.randn(900, 6, generator=gen) + torch.tensor([0, 0, 2.0, 0, 0, 0])
    pred = torch.randint(0, 3, (900,), generator=gen)
    for start in range(0, 900, 7):
        direct.update(shifted[start : start + 7], pred[start : start + 7])
        buffer.add(shifted[start : start + 7], pred[start : start + 7])
    buffer.flush()
    a, b = direct.scores(), bulk.scores()
    assert a.rows == b.rows == 500
    assert b.features == pytest.approx(a.features, abs=1e-6)
    assert b.prediction == pytest.approx(a.prediction, abs=1e-6)
    assert b.features[2] > 0.2 > max(b.features[:2] + b.features[3:])


def test_metrics_without_a_metrics_directory_fail_the_load(trained_dir, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    with pytest.raises(ConfigError, match="PROMETHEUS_MULTIPROC_DIR"):
        RealTimeHandler().initialize(make_context(trained_dir, MODEL_YAML))


@pytest.mark.parametrize(
    "body,reason",
    [
        (b"{", "not_json"),
        (b"", "empty_body"),
        (b"[1]", "not_an_object"),
        (b"{}", "missing_field"),
        (b'{"features": 3}', "not_a_list"),
        (b'{"features": [1]}', "wrong_length"),
        (json.dumps({"features": ["a"] + [1.0] * 31}).encode(), "not_a_number"),
        (b'{"features": [NaN' + b", 1.0" * 31 + b"]}", "non_finite"),
        (json.dumps({"features": [1e9] + [1.0] * 31}).encode(), "out_of_range"),
    ],
)
def test_violation_reasons_follow_the_real_messages(body, reason):
    batch = parse_batch([raw_row(body)], 32)
    assert violation_reason(batch.errors[0]) == reason


@pytest.mark.parametrize("required", [False, True])
def test_records_that_do_not_fit_the_spool_are_dropped_and_counted_or_refused(
    trained_dir, server_env, monkeypatch, required
):
    monkeypatch.setenv("RTSERVE_SPOOL_BYTES", "4096")  # a spool of about five records
    ctx = make_context(trained_dir, {**MODEL_YAML, "records": {"required": required}})
    handler = RealTimeHandler()
    handler.initialize(ctx)
    try:
        statuses = []
        for _ in range(4):
            start_batch(ctx, 3)
            out = handler.handle([json_row({"features": features()})] * 3, ctx)
            statuses.append([ctx.get_response_status(i)[0] for i in range(3)])
            last = [json.loads(o) for o in out]
        kept = records(server_env / "records")
        written = value(handler, "rtserve_records_written_total")
        dropped = value(handler, "rtserve_records_dropped_total")
        assert written == len(kept) and 0 < written < 12 and written + dropped == 12
        if required:
            assert statuses[0] == [200] * 3 and statuses[-1] == [503] * 3
            assert (
                last
                == [
                    {
                        "error": "the request's record cannot be kept (the records spool is full: "
                        "the records store has been away too long) and records.required is set: "
                        "retry shortly"
                    }
                ]
                * 3
            )
        else:
            assert statuses[-1] == [200] * 3  # answered anyway
            assert all(answer["model_version"] == "1.0" for answer in last)
    finally:
        handler.telemetry.close()
