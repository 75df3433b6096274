"""Writes grafana-dashboard.json (run: python deploy/monitoring/make_dashboard.py).

Kept as code so the panels stay consistent; the JSON it writes is committed beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("grafana-dashboard.json")


def quantiles(metric: str, by: str, selector: str = "", qs: tuple = (0.5, 0.95, 0.99)) -> list[dict]:
    """p50/p95/p99 targets of a histogram."""
    return [{"expr": f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) (rate({metric}_bucket{selector}[$__rate_interval])))",
             "legendFormat": f"p{int(q * 100)}{' {{' + by + '}}' if by else ''}"} for q in qs]


def panel(pid: int, title: str, targets: list[dict], unit: str, x: int, y: int, w: int = 12) -> dict:
    """A Grafana time-series panel."""
    return {"id": pid, "type": "timeseries", "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": x, "y": y, "w": w, "h": 8}, "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{**t, "refId": chr(65 + i)} for i, t in enumerate(targets)]}


def dashboard() -> dict:
    """The dashboard document."""
    answers = "rtserve_request_duration_seconds_count"
    panels = [
        panel(1, "Request latency, arrival to answer (p50/p95/p99)",
              quantiles("rtserve_request_duration_seconds", "", '{status_class="2xx"}'), "s", 0, 0),
        panel(2, "Handler time per batch and stage (p50/p95/p99)",
              quantiles("rtserve_handler_stage_seconds", "stage"), "s", 12, 0),
        panel(3, "Throughput (requests/s)", [
            {"expr": f"sum by (model_name, model_version) (rate({answers}[$__rate_interval]))",
             "legendFormat": "{{model_name}} {{model_version}}"}], "reqps", 0, 8),
        panel(4, "Queue wait per request (p50/p95/p99)", quantiles("QueueTime", ""), "ms", 12, 8),
        panel(5, "Answers by status class (per s) and 5xx ratio", [
            {"expr": f"sum by (status_class) (rate({answers}[$__rate_interval]))", "legendFormat": "{{status_class}}"},
            {"expr": f'sum(rate({answers}{{status_class="5xx"}}[$__rate_interval])) / clamp_min(sum(rate({answers}[$__rate_interval])), 1e-9)',
             "legendFormat": "5xx ratio"}], "reqps", 0, 16),
        panel(6, "Schema violations by reason (per s)", [
            {"expr": "sum by (reason) (rate(rtserve_schema_violations_total[$__rate_interval]))",
             "legendFormat": "{{reason}}"}], "reqps", 12, 16),
        panel(7, "Batch size (mean, p50/p95)", [
            {"expr": "sum(rate(rtserve_handler_requests_total[$__rate_interval])) / clamp_min(sum(rate(rtserve_handler_batches_total[$__rate_interval])), 1e-9)",
             "legendFormat": "mean batch size"}] + quantiles("rtserve_batch_size", "", qs=(0.5, 0.95)), "short", 0, 24),
        panel(8, "Predictions by class (per s)", [
            {"expr": "sum by (model_version, class) (rate(rtserve_predictions_total[$__rate_interval]))",
             "legendFormat": "{{model_version}} {{class}}"}], "reqps", 12, 24),
        panel(9, "Drift per input feature (PSI; > 0.2 is a significant shift)", [
            {"expr": "max by (feature) (rtserve_feature_drift_psi)", "legendFormat": "{{feature}}"}], "short", 0, 32, 16),
        panel(10, "Prediction drift (PSI)", [
            {"expr": "max by (model_version) (rtserve_prediction_drift_psi)", "legendFormat": "{{model_version}}"}], "short", 16, 32, 8),
        panel(11, "Records: written, shipped, dropped (per s)", [
            {"expr": "sum(rate(rtserve_records_written_total[$__rate_interval]))", "legendFormat": "written"},
            {"expr": "sum(rate(rtserve_records_shipped_total[$__rate_interval]))", "legendFormat": "shipped"},
            {"expr": "sum(rate(rtserve_records_dropped_total[$__rate_interval]))", "legendFormat": "dropped"}],
              "reqps", 0, 40),
        panel(12, "Records: ship lag (p50/p99) and bytes waiting in the spool", quantiles(
            "rtserve_records_ship_lag_seconds", "", qs=(0.5, 0.99)) + [
            {"expr": "max(rtserve_records_pending_bytes)", "legendFormat": "pending bytes"}], "s", 12, 40),
    ]
    return {
        "title": "rtserve", "uid": "rtserve", "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "tags": ["rtserve", "torchserve"],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
