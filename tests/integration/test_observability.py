"""Metrics, drift and audit on a real TorchServe, scraped from its Prometheus listener."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
import yaml

from rtserve.model.data import make_dataset
from tests.conftest import MODEL_NAME, REPO, make_archive
from tests.helpers import records
from tests.integration.conftest import serve
from tests.promql import metric_names, scrape_names
from tests.unit.test_monitoring import dashboard_expressions, rule_expressions

pytestmark = pytest.mark.integration

WINDOW = 300
DIMS = f'model_name="{MODEL_NAME}",model_version="1.0"'
#: The frontend's labels for requests to the default route (no version in the path).
ROUTE = f'model_name="{MODEL_NAME}",model_version="default"'


@pytest.fixture(scope="module")
def obs_server(tmp_path_factory):
    """The default archive, but with a small drift window exported often (so a test can fill it)."""
    root = tmp_path_factory.mktemp("obs")
    config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    config["handler"].update(drift_window=WINDOW, drift_export_seconds=0.2)
    (root / "model-config.yaml").write_text(yaml.safe_dump(config))
    mar = make_archive(root, "1.0", MODEL_CONFIG=str(root / "model-config.yaml"))
    with serve(tmp_path_factory.mktemp("run"), mar) as ts:
        yield ts


def scrape(server) -> str:
    return requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text


LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def value(text: str, name: str, labels: str = DIMS) -> float:
    """Sum of the series of ``name`` that carry every label of ``labels`` (in any order)."""
    wanted = set(LABEL.findall(labels))
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            series, number = line.rsplit(" ", 1)
            if wanted <= set(LABEL.findall(series)):
                total += float(number)
    return total


def send(server, bodies: list, workers: int = 16) -> list[requests.Response]:
    url = f"{server.props['inference_address']}/predictions/{MODEL_NAME}"
    key = server.client().keys.get("inference")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda b: requests.post(url, data=b, headers=headers, timeout=30), bodies))


def rows(x: torch.Tensor) -> list[bytes]:
    return [json.dumps({"features": r}).encode() for r in x.tolist()]


def test_counts_histograms_and_version_labels_match_exactly(obs_server):
    before = scrape(obs_server)
    valid = rows(make_dataset().x_test[:60])
    bad = (
        [b"{nope"] * 3
        + [json.dumps({"features": [1.0] * 5}).encode()] * 4
        + [json.dumps({"features": ["x"] * 32}).encode()] * 2
    )
    answers = send(obs_server, valid + bad)
    assert [a.status_code for a in answers] == [200] * 60 + [400] * 9

    def delta(name: str, labels: str = DIMS) -> float:
        return value(after, name, labels) - value(before, name, labels)

    # The end-to-end histogram comes from the access log, which the frontend writes
    # asynchronously: scrape until it has counted all 69 answers (or 10 s have passed).
    deadline = time.monotonic() + 10
    while True:
        after = scrape(obs_server)
        counted = sum(
            delta("rtserve_request_duration_seconds_count", f'{ROUTE},status_class="{c}"') for c in ("2xx", "4xx")
        )
        if counted >= 69 or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    assert delta("rtserve_handler_requests_total") == 69
    for reason, n in {"not_json": 3, "wrong_length": 4, "not_a_number": 2}.items():
        assert delta("rtserve_schema_violations_total", f'{DIMS},reason="{reason}"') == n, reason
    labels = Counter(a.json()["label"] for a in answers[:60])
    for label, n in labels.items():
        assert delta("rtserve_predictions_total", f'{DIMS},class="{label}"') == n, label
    batches = delta("rtserve_handler_batches_total")
    assert 1 <= batches <= 69
    for stage in ("preprocess", "inference", "postprocess"):
        assert delta("rtserve_handler_stage_seconds_count", f'{DIMS},stage="{stage}"') == batches, stage
    assert delta("rtserve_batch_size_count") == batches
    assert delta("rtserve_batch_size_sum") == 69
    # the end-to-end histogram (from the access log) counts every answer once, by status class
    assert delta("rtserve_request_duration_seconds_count", f'{ROUTE},status_class="2xx"') == 60
    assert delta("rtserve_request_duration_seconds_count", f'{ROUTE},status_class="4xx"') == 9
    # the frontend labels requests to the default route with model_version="default"
    assert value(after, "ts_inference_requests_total", f'model_name="{MODEL_NAME}",model_version="default"') >= 69


def test_drift_stays_low_in_distribution_and_rises_on_shift(obs_server):
    data = make_dataset()
    send(obs_server, rows(data.x_test[: WINDOW + 50]))
    time.sleep(0.6)
    send(obs_server, rows(data.x_test[WINDOW + 50 : WINDOW + 60]))  # triggers an export
    time.sleep(0.5)
    calm = scrape(obs_server)
    features = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'rtserve_feature_drift_psi\{[^}]*feature="(f\d\d)"[^}]*\} ([\d.eE+-]+)', calm)
    }
    assert len(features) == 32 and max(features.values()) < 0.2, features

    shifted = data.x_test[: WINDOW + 50].clone()
    shifted[:, 5] = shifted[:, 5] + 3 * torch.tensor(data.x_train[:, 5].std().item())
    send(obs_server, rows(shifted))
    time.sleep(0.6)
    send(obs_server, rows(shifted[:10]))
    time.sleep(0.5)
    drift = scrape(obs_server)
    assert value(drift, "rtserve_feature_drift_psi", f'{DIMS},feature="f05"') > 0.2
    others = [value(drift, "rtserve_feature_drift_psi", f'{DIMS},feature="f{i:02d}"') for i in range(32) if i != 5]
    assert max(others) < 0.2


def test_records_have_one_line_per_request_with_client_request_ids(obs_server):
    valid = rows(make_dataset().x_test[:25])
    answers = send(obs_server, valid + [b"[]"] * 5)
    ids = {a.headers["x-request-id"]: a for a in answers}
    time.sleep(0.5)
    events = {}
    for event in records(obs_server.files.records):
        assert event["request_id"] not in events, f"a second record of {event['request_id']}"
        events[event["request_id"]] = event
    mine = {rid: events[rid] for rid in ids if rid in events}
    assert len(mine) == 30, "every request has exactly one record"
    for rid, answer in ids.items():
        event = mine[rid]
        assert event["model"] == MODEL_NAME and event["model_version"] == "1.0"
        assert re.fullmatch(r"\d+-\d+", event["batch"]), event  # <worker pid>-<batch number>
        assert event["status"] == answer.status_code and event["route"] == "predictions"
        assert event["answer"] == answer.json()  # what the client received
        if answer.status_code == 200:
            assert event["event"] == "prediction" and event["class"] == answer.json()["prediction"]
            assert event["handler_ms"] > 0 and len(event["inputs"]) == 32
        else:
            assert event["event"] == "rejected" and event["reason"] == "not_an_object"
            assert event["inputs"] == []


def test_every_rule_and_panel_metric_exists_in_a_real_scrape(obs_server):
    send(obs_server, rows(make_dataset().x_test[: WINDOW + 10]) + [b"{"])
    time.sleep(0.6)
    send(obs_server, [b"{"] * 2 + rows(make_dataset().x_test[:5]))
    client = obs_server.client(timeout=120)
    client.scale(MODEL_NAME, 0)  # no worker: a real 503, so the 5xx series exist
    try:
        assert send(obs_server, rows(make_dataset().x_test[:1]))[0].status_code == 503
    finally:
        client.scale(MODEL_NAME, 2)
    time.sleep(0.5)
    names = scrape_names(scrape(obs_server))
    used = set()
    # The server's rules (the rtserve-stream group's metrics come from the stream consumer's own
    # port: tests/stream/test_metrics.py scrapes them, tests/unit/test_monitoring.py checks the names).
    for expr in list(rule_expressions(("rtserve",)).values()) + dashboard_expressions():
        used |= metric_names(expr)
    missing = used - names
    assert not missing, f"metrics used by rules/dashboard but not scraped: {sorted(missing)}"
    assert {
        "rtserve_request_duration_seconds_bucket",
        "rtserve_handler_stage_seconds_bucket",
        "QueueTime_bucket",
        "rtserve_feature_drift_psi",
        "rtserve_predictions_total",
    } <= used
