"""A real Prometheus and Alertmanager (Debian's packages) with the shipped rules, scraping a real
TorchServe under traffic, every second, on free loopback ports (rtserve.observability.monitor, as `make
monitor` runs them)."""

from __future__ import annotations

import http.client
import json
import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
import requests
import torch
import yaml
from prometheus_client.utils import floatToGoString

from rtserve.model.data import make_dataset
from rtserve.observability.monitor import Monitor, MonitorConfig
from rtserve.observability.request_latency import BUCKETS, Answer, parse_line
from rtserve.runtime.ports import free_ports
from tests.conftest import MODEL_NAME, monitoring_binary
from tests.integration.test_observability import WINDOW, obs_server, rows, send  # noqa: F401
from tests.unit.test_monitoring import RULES, dashboard_expressions, rule_expressions

pytestmark = pytest.mark.integration

#: The alert whose test copy has its for: shortened to FAST_FOR, so it reaches the webhook.
TRAVELLER = "RtserveFeatureDrift"
FAST_FOR = "2s"
#: Load client: concurrent connections x requests each (bounded).
CONCURRENCY, PER_CONNECTION = 4, 300
#: The p99 bound: histogram_quantile can only place the p99 inside its bucket (it interpolates
#: linearly there), so the histogram's p99 may exceed the client's by the width of the bucket
#: holding the client's p99, plus the access log's resolution (1 ms).
RESOLUTION = 0.001


def bucket_width(seconds: float) -> float:
    """Width of the histogram bucket that holds ``seconds``."""
    bounds = (0.0,) + BUCKETS
    for low, high in zip(bounds, bounds[1:]):
        if seconds <= high:
            return high - low
    return math.inf


SELF = f'model_name="{MODEL_NAME}"'


class Webhook:
    """Alertmanager's receiver: keeps every JSON body posted to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def webhook():
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def prom(obs_server, webhook, tmp_path_factory):  # noqa: F811 - the imported fixture
    """Prometheus + Alertmanager: the shipped rules, plus a test copy of one alert with a short
    for:, scraping and evaluating every second."""
    monitoring_binary("prometheus")
    monitoring_binary("prometheus-alertmanager", "alertmanager")
    root = tmp_path_factory.mktemp("monitor")
    shipped = yaml.safe_load(RULES.read_text())
    rule = next(r for g in shipped["groups"] for r in g["rules"] if r["alert"] == TRAVELLER)
    copy = root / "test-copy.yml"
    copy.write_text(yaml.safe_dump({"groups": [{"name": "rtserve-test-copy", "rules": [{**rule, "for": FAST_FOR}]}]}))
    ports = free_ports(2)
    cfg = MonitorConfig(
        dir=root,
        target=urlsplit(obs_server.props["metrics_address"]).netloc,
        rules=(RULES, copy),
        prometheus_port=ports[0],
        alertmanager_port=ports[1],
        interval="1s",
        webhook=webhook.url,
        group_wait="1s",
        group_interval="1s",
    )
    monitor = Monitor(cfg)
    monitor.start()
    try:
        yield cfg
    finally:
        monitor.stop()


def query(cfg: MonitorConfig, expr: str, at: float | None = None) -> list[dict]:
    """An instant query through Prometheus's HTTP API (invalid PromQL fails the test)."""
    params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
    body = requests.get(f"{cfg.prometheus_url}/api/v1/query", params=params, timeout=10).json()
    assert body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def scalar(cfg: MonitorConfig, expr: str, at: float | None = None) -> float | None:
    result = query(cfg, expr, at)
    return float(result[0]["value"][1]) if result else None


def wait_for(check, timeout: float = 30.0, every: float = 0.25):
    """Poll ``check`` until it returns something truthy (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


def load(server, bodies: list[bytes]) -> list[float]:
    """CONCURRENCY keep-alive connections, each sending its share of ``bodies`` one after the
    other; returns each request's seconds as this client saw them (all must answer 200)."""
    address = urlsplit(server.props["inference_address"])
    headers = {"Authorization": f"Bearer {server.client().keys.get('inference')}", "Content-Type": "application/json"}
    seconds: list[float] = []
    failures: list[int] = []

    def run(share: list[bytes]) -> None:
        conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
        for body in share:
            start = time.perf_counter()
            conn.request("POST", f"/predictions/{MODEL_NAME}", body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            seconds.append(time.perf_counter() - start)
            if resp.status != 200:
                failures.append(resp.status)
        conn.close()

    threads = [threading.Thread(target=run, args=(bodies[i::CONCURRENCY],)) for i in range(CONCURRENCY)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not failures and len(seconds) == len(bodies)
    return seconds


def answered(cfg: MonitorConfig, status_class: str) -> float:
    return scalar(cfg, f'sum(rtserve_request_duration_seconds_count{{{SELF},status_class="{status_class}"}})') or 0.0


def exported(server, status_class: str) -> float:
    """The exporter's own count right now (what the next scrape will see)."""
    text = requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("rtserve_request_duration_seconds_count{")
        and SELF in line
        and f'status_class="{status_class}"' in line
    )


def scraped(cfg: MonitorConfig, server, status_class: str = "2xx") -> float:
    """Wait until Prometheus has scraped every answer the exporter has counted; return the count."""
    time.sleep(0.3)  # the access log's asynchronous appender
    want = exported(server, status_class)
    assert wait_for(lambda: answered(cfg, status_class) == want, timeout=15), (want, answered(cfg, status_class))
    return want


def test_prometheus_scrapes_the_server_with_every_rule_healthy(prom):
    def healthy():
        groups = requests.get(f"{prom.prometheus_url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        evaluated = [r for g in groups for r in g["rules"] if r.get("lastEvaluation", "0001").startswith("20")]
        return groups if len(evaluated) == len(rule_expressions()) + 1 else None

    groups = wait_for(healthy)
    assert groups, "the rules were not all evaluated"
    rules = {(g["name"], r["name"]): r for g in groups for r in g["rules"]}
    assert {name for _, name in rules} == set(rule_expressions())
    for key, rule in rules.items():
        assert rule["health"] == "ok", (key, rule.get("lastError"))

    def targets():
        found = requests.get(f"{prom.prometheus_url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        return found if [t["health"] for t in found] == ["up"] else None

    assert wait_for(targets), requests.get(f"{prom.prometheus_url}/api/v1/targets", timeout=10).text


def logged_answers(server) -> list[Answer]:
    """This model's 2xx inference answers in TorchServe's access log, oldest first: what the
    exporter builds rtserve_request_duration_seconds from."""
    found = map(parse_line, (server.log_dir / "access_log.log").read_text().splitlines())
    return [a for a in found if a and a.model == MODEL_NAME and a.status_class == "2xx"]


def test_latency_histogram_is_exactly_the_access_log_and_its_p99_within_the_clients(prom, obs_server):
    before = scraped(prom, obs_server)
    logged = len(logged_answers(obs_server))
    t0 = time.time()
    data = make_dataset()
    bodies = rows(data.x_test[: CONCURRENCY * PER_CONNECTION])
    client = sorted(load(obs_server, bodies))

    # The frontend's asynchronous appender writes each answer's line: wait for all of them.
    def all_logged():
        found = logged_answers(obs_server)[logged:]
        return found if len(found) >= len(bodies) else None

    new = wait_for(all_logged, timeout=15)
    assert new and len(new) == len(bodies), "every request is in the access log once"
    after = scraped(prom, obs_server)
    t1 = time.time()
    assert after - before == len(bodies), "every request is counted once"
    # Exactly: each bucket Prometheus holds for the run counts the access log's lines at or
    # under its bound (and +Inf all of them), read from the log itself.
    bucket = f'rtserve_request_duration_seconds_bucket{{{SELF},status_class="2xx"}}'
    increase = {
        r["metric"]["le"]: float(r["value"][1])
        for r in query(prom, f"sum by (le) ({bucket}) - sum by (le) ({bucket} @ {t0:.3f})", t1)
    }
    from_log = {floatToGoString(b): float(sum(1 for a in new if a.seconds <= b)) for b in BUCKETS}
    assert increase == {**from_log, "+Inf": float(len(new))}
    # The client's own p99 bounds the histogram's from above: the frontend's time is part of the
    # client's (which adds its own work and the wire), up to the bucket holding the client's p99
    # (histogram_quantile interpolates inside it) and the log's resolution. No lower bound: a
    # busy machine inflates the client's side alone.
    server_p99 = scalar(
        prom, f"histogram_quantile(0.99, sum by (le) ({bucket}) - sum by (le) ({bucket} @ {t0:.3f}))", t1
    )
    client_p99 = client[math.ceil(0.99 * len(client)) - 1]
    tolerance = bucket_width(client_p99) + RESOLUTION
    print(
        f"p99 over {len(client)} requests at c={CONCURRENCY}: load client {client_p99 * 1000:.2f} ms, "
        f"Prometheus histogram_quantile {server_p99 * 1000:.2f} ms, difference "
        f"{(server_p99 - client_p99) * 1000:+.2f} ms, tolerance {tolerance * 1000:.1f} ms; "
        f"client p50 {client[len(client) // 2] * 1000:.2f} ms"
    )
    assert server_p99 - client_p99 <= tolerance, (server_p99, client_p99, tolerance)


def test_a_shifted_feature_shows_as_its_drift_in_prometheus(prom, obs_server):
    data = make_dataset()
    shifted = data.x_test[: WINDOW + 50].clone()
    shifted[:, 5] = shifted[:, 5] + 3 * torch.tensor(data.x_train[:, 5].std().item())
    send(obs_server, rows(shifted))
    time.sleep(0.3)  # past drift_export_seconds: the next batch exports
    send(obs_server, rows(shifted[:10]))
    drift = f'max by (feature) (rtserve_feature_drift_psi{{{SELF},model_version="1.0"}})'

    def shown():
        result = {r["metric"]["feature"]: float(r["value"][1]) for r in query(prom, drift)}
        return result if result.get("f05", 0) > 0.2 else None

    features = wait_for(shown)
    assert features, query(prom, drift)
    assert len(features) == 32
    assert max(v for f, v in features.items() if f != "f05") < 0.2, features


def test_an_alert_travels_to_alertmanager_and_the_webhook(prom, webhook):
    def delivered():
        for body in webhook.bodies:
            for alert in body["alerts"]:
                if alert["labels"].get("alertname") == TRAVELLER and alert["status"] == "firing":
                    return alert
        return None

    alert = wait_for(delivered, timeout=45)
    assert alert, f"no {TRAVELLER} at the webhook: {webhook.bodies}"
    assert alert["labels"] == {
        "alertname": TRAVELLER,
        "severity": "warning",
        "model_name": MODEL_NAME,
        "model_version": "1.0",
        "feature": "f05",
    }
    summary = re.fullmatch(
        r"input feature f05 drifted \(PSI ([0-9.]+)\) from the training data", alert["annotations"]["summary"]
    )
    assert summary and float(summary.group(1)) > 0.2, alert["annotations"]
    # the shipped rule (for: 15m) holds the same alert pending, not firing
    alerts = requests.get(f"{prom.prometheus_url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    states = {a["state"] for a in alerts if a["labels"]["alertname"] == TRAVELLER and a["labels"]["feature"] == "f05"}
    assert states == {"pending", "firing"}


def test_provoked_5xx_show_in_the_error_rate(prom, obs_server):
    before = scraped(prom, obs_server, "5xx")
    client = obs_server.client(timeout=120)
    client.scale(MODEL_NAME, 0)  # no worker: TorchServe answers 503
    try:
        answers = send(obs_server, rows(make_dataset().x_test[:5]), workers=1)
    finally:
        client.scale(MODEL_NAME, 2)
    assert [a.status_code for a in answers] == [503] * 5
    assert scraped(prom, obs_server, "5xx") - before == 5
    error_rate = rule_expressions()["RtserveErrorRateHigh"].rsplit(">", 1)[0]
    result = {r["metric"]["model_name"]: float(r["value"][1]) for r in query(prom, error_rate)}
    assert result[MODEL_NAME] > 0, result


#: Series with no sample unless the server ships its records to a store (this tier's servers
#: keep them in their spool): the records tier's servers show them (tests/records/test_faults.py).
NEEDS_A_RECORDS_STORE = ("rtserve_records_ship_lag_seconds",)


def test_every_dashboard_query_returns_data(prom, obs_server):
    data = make_dataset()
    send(obs_server, rows(data.x_test[:200]) + [b"{nope"] * 3)  # fresh traffic for the rates
    scraped(prom, obs_server)
    time.sleep(2)  # a second sample of every series inside the rate window
    empty = []
    for expr in dashboard_expressions():
        if any(name in expr for name in NEEDS_A_RECORDS_STORE):
            continue
        result = query(prom, expr.replace("$__rate_interval", "1m"))
        if not any(not math.isnan(float(r["value"][1])) for r in result):
            empty.append(expr)
    assert not empty, f"panels without data: {empty}"
