"""Writes grafana-dashboard.json (run: python deploy/monitoring/make_dashboard.py).

Kept as code so the panels stay consistent; the JSON it writes is committed beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("grafana-dashboard.json")


def quantiles(metric: str, by: str) -> list[dict]:
    """p50/p95/p99 targets of a histogram."""
    return [{"expr": f"histogram_quantile({q}, sum by (le{', ' + by if by else ''}) (rate({metric}_bucket[$__rate_interval])))",
             "legendFormat": f"p{int(q * 100)}{' {{' + by + '}}' if by else ''}"} for q in (0.5, 0.95, 0.99)]


def panel(pid: int, title: str, targets: list[dict], unit: str, x: int, y: int, w: int = 12) -> dict:
    """A Grafana time-series panel."""
    return {"id": pid, "type": "timeseries", "title": title, "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": x, "y": y, "w": w, "h": 8}, "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{**t, "refId": chr(65 + i)} for i, t in enumerate(targets)]}


def dashboard() -> dict:
    """The dashboard document."""
    panels = [
        panel(1, "Queue wait per request (p50/p95/p99)", quantiles("QueueTime", ""), "ms", 0, 0),
        panel(2, "Handler time per batch and stage (p50/p95/p99)", quantiles("HandlerStageTime", "Stage"), "ms", 12, 0),
        panel(3, "Throughput (requests/s)", [
            {"expr": "sum by (model_name, model_version) (rate(ts_inference_requests_total[$__rate_interval]))",
             "legendFormat": "{{model_name}} {{model_version}}"}], "reqps", 0, 8),
        panel(4, "Mean end-to-end latency (ms)", [
            {"expr": "sum(rate(ts_inference_latency_microseconds[$__rate_interval])) / 1000 / clamp_min(sum(rate(ts_inference_requests_total[$__rate_interval])), 1e-9)",
             "legendFormat": "mean"}], "ms", 12, 8),
        panel(5, "Answers by status class (per s)", [
            {"expr": "sum(rate(Requests2XX[$__rate_interval]))", "legendFormat": "2xx"},
            {"expr": "sum(rate(Requests4XX[$__rate_interval]))", "legendFormat": "4xx"},
            {"expr": "sum(rate(Requests5XX[$__rate_interval]))", "legendFormat": "5xx"}], "reqps", 0, 16),
        panel(6, "Schema violations by reason (per s)", [
            {"expr": "sum by (Reason) (rate(SchemaViolations[$__rate_interval]))", "legendFormat": "{{Reason}}"}], "reqps", 12, 16),
        panel(7, "Batch size (mean) and fill (p50/p95)", [
            {"expr": "sum(rate(HandlerRequests[$__rate_interval])) / clamp_min(sum(rate(HandlerBatches[$__rate_interval])), 1e-9)",
             "legendFormat": "mean batch size"}] + quantiles("BatchFill", "")[:2], "short", 0, 24),
        panel(8, "Predictions by class (per s)", [
            {"expr": "sum by (ModelVersion, Class) (rate(Predictions[$__rate_interval]))",
             "legendFormat": "{{ModelVersion}} {{Class}}"}], "reqps", 12, 24),
        panel(9, "Drift per input feature (PSI; > 0.2 is a significant shift)", [
            {"expr": "max by (Feature) (FeatureDrift)", "legendFormat": "{{Feature}}"}], "short", 0, 32, 16),
        panel(10, "Prediction drift (PSI)", [
            {"expr": "max by (ModelVersion) (PredictionDrift)", "legendFormat": "{{ModelVersion}}"}], "short", 16, 32, 8),
    ]
    return {
        "title": "rtserve", "uid": "rtserve", "schemaVersion": 39, "version": 1, "editable": True,
        "time": {"from": "now-1h", "to": "now"}, "refresh": "30s", "tags": ["rtserve", "torchserve"],
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(dashboard(), indent=2) + "\n")
