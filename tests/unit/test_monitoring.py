"""deploy/monitoring files parse, and the PromQL name extraction the integration test relies on."""

import json

import pytest
import yaml

from tests.conftest import REPO
from tests.promql import metric_names

pytestmark = pytest.mark.unit

MONITORING = REPO / "deploy" / "monitoring"


def rule_expressions() -> dict[str, str]:
    rules = yaml.safe_load((MONITORING / "rtserve-alerts.yml").read_text())
    return {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}


def dashboard_expressions() -> list[str]:
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def test_alerts_cover_what_the_issue_asks():
    exprs = rule_expressions()
    assert {"RtserveQueueLatencyP99High", "RtserveHandlerLatencyP99High", "RtserveErrorRateHigh",
            "RtserveFeatureDrift", "RtservePredictionDrift", "RtserveNotServing"} <= set(exprs)
    assert "histogram_quantile(0.99" in exprs["RtserveHandlerLatencyP99High"]


def test_dashboard_is_current_and_complete():
    from deploy.monitoring.make_dashboard import dashboard  # noqa: PLC0415

    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert board == dashboard(), "run python deploy/monitoring/make_dashboard.py"
    titles = " ".join(p["title"] for p in board["panels"])
    for word in ("p50/p95/p99", "Throughput", "status", "Batch", "Drift per input feature"):
        assert word in titles
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_scrape_config_points_at_the_rules():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rtserve-alerts.yml"]
    assert config["scrape_configs"][0]["job_name"] == "rtserve"


@pytest.mark.parametrize("expr,names", [
    ('histogram_quantile(0.99, sum by (le, Stage) (rate(HandlerStageTime_bucket[5m]))) > 5',
     {"HandlerStageTime_bucket"}),
    ('sum(rate(Requests5XX[5m])) / clamp_min(sum(rate(Requests2XX{a="b"}[5m])), 1e-9)', {"Requests5XX", "Requests2XX"}),
    ('(x > 0) unless on (model_name) (label_replace(sum by (M) (rate(y[5m])), "m", "$1", "M", "(.*)") > 0)', {"x", "y"}),
])
def test_metric_names(expr, names):
    assert metric_names(expr) == names
