"""deploy/monitoring: the rules pass promtool (syntax and one unit test per alert), the dashboard
is current, the local Prometheus/Alertmanager configs derive from the shipped one, and the PromQL
name extraction the integration tests rely on."""

import json
import subprocess

import pytest
import yaml

from rtserve.observability.monitor import MonitorConfig, alertmanager_config, prometheus_config
from tests.conftest import REPO
from tests.promql import metric_names

pytestmark = pytest.mark.unit

MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "rtserve-alerts.yml"
RULE_TESTS = sorted((MONITORING / "tests").glob("*.test.yml"))


def rule_expressions(groups: tuple[str, ...] | None = None) -> dict[str, str]:
    """Each alert's expression, of the rule ``groups`` given (default: all)."""
    rules = yaml.safe_load((MONITORING / "rtserve-alerts.yml").read_text())
    return {r["alert"]: r["expr"] for g in rules["groups"] if groups is None or g["name"] in groups for r in g["rules"]}


def dashboard_expressions() -> list[str]:
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in board["panels"] for t in p["targets"]]


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_alerts_cover_what_the_issue_asks():
    exprs = rule_expressions()
    assert {
        "RtserveRequestLatencyP99High",
        "RtserveQueueLatencyP99High",
        "RtserveHandlerLatencyP99High",
        "RtserveErrorRateHigh",
        "RtserveFeatureDrift",
        "RtservePredictionDrift",
        "RtserveNotServing",
    } <= set(exprs)
    assert "histogram_quantile(0.99" in exprs["RtserveHandlerLatencyP99High"]
    assert "rtserve_request_duration_seconds_bucket" in exprs["RtserveRequestLatencyP99High"]
    assert "rtserve_request_duration_seconds_count" in exprs["RtserveErrorRateHigh"]


def test_promtool_accepts_the_rules(promtool):
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_every_alert_has_a_rule_test_that_fires_after_for_and_stays_quiet(promtool):
    """One test file per alert; each shows the alert quiet (before ``for:`` has passed, or for
    the calm series) and firing after ``for:``; promtool runs them all."""
    tested = {}
    for path in RULE_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../rtserve-alerts.yml"], path
        cases = [c for t in doc["tests"] for c in t["alert_rule_test"]]
        names = {c["alertname"] for c in cases}
        assert len(names) == 1, f"{path.name}: one alert per file, not {names}"
        name = names.pop()
        tested[name] = path
        assert any(not c["exp_alerts"] for c in cases), f"{path.name}: never shows the alert quiet"
        assert any(c["exp_alerts"] for c in cases), f"{path.name}: never shows the alert firing"
        rule = next(r for r in rules() if r["alert"] == name)
        window = int(str(rule["for"]).rstrip("m"))  # the rules' for: are whole minutes
        firing_at = min(int(str(c["eval_time"]).rstrip("m")) for c in cases if c["exp_alerts"])
        assert firing_at > window, f"{path.name}: fires at {firing_at}m, before for: {window}m"
        for case in cases:
            for alert in case["exp_alerts"]:
                assert alert["exp_labels"]["severity"] == rule["labels"]["severity"]
                assert alert["exp_annotations"]["summary"]
    assert set(tested) == {r["alert"] for r in rules()}, "every alert needs a test file"
    out = subprocess.run(
        [promtool, "test", "rules", *map(str, RULE_TESTS)], capture_output=True, text=True, cwd=MONITORING
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(RULE_TESTS)


def test_dashboard_is_current_and_complete():
    from deploy.monitoring.make_dashboard import dashboard  # noqa: PLC0415

    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert board == dashboard(), "run python deploy/monitoring/make_dashboard.py"
    titles = " ".join(p["title"] for p in board["panels"])
    for word in ("Request latency", "p50/p95/p99", "Throughput", "status", "Batch", "Drift per input feature"):
        assert word in titles
    latency = board["panels"][0]
    assert [t["expr"].split("(", 2)[1] for t in latency["targets"]] == [
        "0.5, sum by ",
        "0.95, sum by ",
        "0.99, sum by ",
    ]
    assert all("rtserve_request_duration_seconds_bucket" in t["expr"] for t in latency["targets"])
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])


def test_scrape_config_points_at_the_rules():
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    assert config["rule_files"] == ["rtserve-alerts.yml"]
    assert config["scrape_configs"][0]["job_name"] == "rtserve"


def test_local_configs_derive_from_the_shipped_one(tmp_path):
    shipped = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    cfg = MonitorConfig(dir=tmp_path, target="127.0.0.1:8082", alertmanager_port=19093)
    local = prometheus_config(shipped, cfg)
    assert local["global"] == shipped["global"]
    assert local["rule_files"] == [str(RULES)]
    assert local["scrape_configs"] == [
        {"job_name": "rtserve", "metrics_path": "/metrics", "static_configs": [{"targets": ["127.0.0.1:8082"]}]}
    ]
    assert local["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:19093"]
    fast = prometheus_config(
        shipped, MonitorConfig(dir=tmp_path, target="t:1", interval="1s", rules=(tmp_path / "r.yml",))
    )
    assert fast["global"]["scrape_interval"] == fast["global"]["evaluation_interval"] == "1s"
    assert fast["rule_files"] == [str(tmp_path / "r.yml")]
    assert "webhook_configs" not in alertmanager_config(cfg)["receivers"][0]
    hooked = alertmanager_config(MonitorConfig(dir=tmp_path, target="t:1", webhook="http://127.0.0.1:9/x"))
    assert hooked["receivers"][0]["webhook_configs"][0]["url"] == "http://127.0.0.1:9/x"


@pytest.mark.parametrize(
    "expr,names",
    [
        (
            "histogram_quantile(0.99, sum by (le, stage) (rate(rtserve_handler_stage_seconds_bucket[5m]))) > 0.005",
            {"rtserve_handler_stage_seconds_bucket"},
        ),
        (
            'sum(rate(x_count{status_class="5xx"}[5m])) / clamp_min(sum(rate(y_total{a="b"}[5m])), 1e-9)',
            {"x_count", "y_total"},
        ),
        (
            '(x > 0) unless on (model_name) (label_replace(sum by (M) (rate(y[5m])), "m", "$1", "M", "(.*)") > 0)',
            {"x", "y"},
        ),
    ],
)
def test_metric_names(expr, names):
    assert metric_names(expr) == names


def test_stream_alerts_name_what_the_consumer_exports():
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    from rtserve.stream.consumer import Counts  # noqa: PLC0415
    from rtserve.stream.metrics import StreamMetrics  # noqa: PLC0415

    scraped = StreamMetrics()
    scraped.watch(Counts())
    scraped.partitions = {("events", 0): (5, 0)}  # one assigned partition, so the lag has a series
    exported = {s.name for f in text_string_to_metric_families(scraped.render().decode()) for s in f.samples}
    stream = {name: expr for name, expr in rule_expressions().items() if name.startswith("RtserveStream")}
    assert set(stream) == {"RtserveStreamLagHigh", "RtserveStreamDeadLettersHigh", "RtserveStreamRetrying"}
    for name, expr in stream.items():
        assert metric_names(expr) <= exported, name
