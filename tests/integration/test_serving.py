"""Predictions over HTTP from a real TorchServe serving the archive `make archive` built."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from bench.loadgen import SteadyLoad
from rtserve.records.spool import find_local
from rtserve.server.readiness import sample_payload
from tests.conftest import MODEL_NAME
from tests.helpers import Reference, demo_eager, features, record_batches

pytestmark = pytest.mark.integration


def post(server, body: bytes, token: str | None = "inference", content_type="application/json"):
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {server.client().keys.get(token)}"
    return requests.post(
        f"{server.props['inference_address']}/predictions/{MODEL_NAME}", data=body, headers=headers, timeout=30
    )


def rows(n: int) -> list[list[float]]:
    return [[(i * 7 + j * 13) % 97 - 48.0 + 0.25 * j for j in range(32)] for i in range(n)]


def batch_log(server) -> list[tuple[int, int]]:
    """(size, valid) of every batch the handler ran (its records)."""
    return [(size, valid) for size, valid, _ in record_batches(server.files.records)]


def batches_since(server, before: int, requests: int) -> list[tuple[int, int]]:
    """The batches after the first ``before`` (the worker writes a batch's records before it
    answers, so they are all there once the answers are)."""
    batches = batch_log(server)[before:]
    assert sum(size for size, _ in batches) == requests, batches
    return batches


def test_served_archive_is_the_one_make_built(server, mar_v1):
    desc = server.client().describe(MODEL_NAME)[0]
    assert desc["modelUrl"] == mar_v1.name == "realtime-classifier_1.0.mar"
    assert desc["modelVersion"] == "1.0"
    assert server.props["model_store"] == str(mar_v1.parent)
    assert desc["batchSize"] == 32 and desc["maxBatchDelay"] == 1
    assert len([w for w in desc["workers"] if w["status"] == "READY"]) == 2


def test_predictions_match_model_run_directly(server, mar_v1):
    ref = Reference.from_mar(mar_v1, demo_eager("1.0"))
    data = rows(8)
    expected = ref.probabilities(data)
    client = server.client()
    for row, probs in zip(data, expected):
        body = client.predict(MODEL_NAME, {"features": row})
        assert body["prediction"] == int(probs.argmax())
        assert body["label"] == ref.meta.labels[body["prediction"]]
        assert body["probabilities"] == pytest.approx(probs.tolist(), abs=1e-6)
        assert body["model_version"] == "1.0"


def test_concurrent_requests_are_batched(server, mar_v1):
    before = len(batch_log(server))
    data = rows(128)
    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda r: post(server, json.dumps({"features": r}).encode()), data))
    assert [a.status_code for a in answers] == [200] * len(data)
    expected = Reference.from_mar(mar_v1, demo_eager("1.0")).probabilities(data)
    for answer, probs in zip(answers, expected):
        assert answer.json()["probabilities"] == pytest.approx(probs.tolist(), abs=1e-6)
    batches = batches_since(server, before, len(data))
    assert sum(size for size, _ in batches) == len(data)
    assert max(size for size, _ in batches) > 1, f"no batch held more than one request: {batches}"


def test_mixed_burst_gets_per_request_statuses(server):
    good = json.dumps({"features": features()}).encode()
    bad = [
        b"{oops",
        json.dumps({"features": [1.0] * 5}).encode(),
        json.dumps({"features": ["x"] * 32}).encode(),
        json.dumps({"feature": []}).encode(),
    ]
    bodies = [bad[i % 4] if i % 3 == 0 else good for i in range(96)]
    before = len(batch_log(server))
    with ThreadPoolExecutor(max_workers=32) as pool:
        answers = list(pool.map(lambda b: post(server, b), bodies))
    for body, answer in zip(bodies, answers):
        if body is good:
            assert answer.status_code == 200 and answer.json()["model_version"] == "1.0"
        else:
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]
    mixed = [(s, v) for s, v in batches_since(server, before, len(bodies)) if 0 < v < s]
    assert mixed, "no batch mixed good and bad requests"


def test_error_body_names_the_field(server):
    answer = post(server, json.dumps({"features": features()[:31] + [float("nan")]}).encode().replace(b"NaN", b"NaN"))
    assert answer.status_code == 400
    assert answer.json() == {
        "error": "features[31] must be a finite number within [-1e+06, 1e+06], got nan",
        "field": "features[31]",
    }


def test_inference_needs_the_token(server):
    good = json.dumps({"features": features()}).encode()
    for answer in (post(server, good, token=None), post(server, good, token="management")):
        assert answer.status_code == 400
        assert answer.json()["type"] == "InvalidKeyException"
    assert post(server, good).status_code == 200


def test_logs_keep_access_and_model_lines_without_per_request_chatter(server):
    """rtserve/server/log4j2.xml: one access line per request, and in ts_log.log only the worker
    threads' two lines per batch, written once; nothing per batch in model_log.log (the worker
    writes no line per batch to its stdout: the records have their own files)."""
    logs = server.log_dir
    lines = lambda name: (logs / name).read_text().splitlines()  # noqa: E731
    access = lambda: [a for a in lines("access_log.log") if f"/predictions/{MODEL_NAME} " in a]  # noqa: E731
    # An earlier test's last batch-done line may still be on its way (written after its answer
    # went out): count from once ts_log.log has been still for half a second (at most 5 s).
    settled, last, still_since = time.monotonic() + 5, -1, time.monotonic()
    while time.monotonic() < settled:
        if (now := len(lines("ts_log.log"))) != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= 0.5:
            break
        time.sleep(0.05)
    ts_before, access_before, model_before = len(lines("ts_log.log")), len(access()), len(batch_log(server))
    model_log_before = len(lines("model_log.log"))
    n = 20
    for _ in range(n):
        assert post(server, json.dumps({"features": features()}).encode()).status_code == 200
    deadline = time.monotonic() + 5
    while len(access()) < access_before + n and time.monotonic() < deadline:
        time.sleep(0.05)
    new_access = access()[access_before:]
    assert len(new_access) == n and all('" 200 ' in a for a in new_access)
    batches = batches_since(server, model_before, n)
    assert sum(size for size, _ in batches) == n
    deadline = time.monotonic() + 5  # the batch-done line is written after the answer went out
    while len(lines("ts_log.log")) < ts_before + 2 * len(batches) and time.monotonic() < deadline:
        time.sleep(0.05)
    new_ts = lines("ts_log.log")[ts_before:]
    per_batch = [t for t in new_ts if "Looping backend response at:" in t or "Backend response time:" in t]
    assert len(per_batch) == 2 * len(batches) == len(new_ts), new_ts[:6]
    assert lines("model_log.log")[model_log_before:] == []
    assert "Backend received inference at" not in (logs / "model_log.log").read_text()


def test_the_workers_run_the_direct_forward_and_the_lean_loop(server):
    """In TorchServe's real worker (its script as __main__, TorchServe 0.12.0's own sources),
    every part of handler.lean_worker applies and the direct forward runs; the log says so."""
    text = (server.log_dir / "model_log.log").read_text()
    assert text.count("forward pass: direct forward (5 operators)") >= 2, text[-2000:]
    assert text.count("lean worker: retrieve_msg, predict_response, prediction_time, inference_msg") >= 2
    assert "lean worker: per-batch log call kept" not in text and "kept:" not in text
    assert post(server, json.dumps({"features": features()}).encode()).status_code == 200


def test_a_load_with_a_sink_hands_it_every_request_and_keeps_none(server):
    """bench.loadgen's ``sink`` (what bench.soak aggregates an hour with): each request reaches it
    once, with the id the server recorded it under; ``records`` stays empty; ``max_requests``
    still bounds the load."""
    sunk = []
    key = server.client().keys.get("inference")
    load = SteadyLoad(
        f"{server.props['inference_address']}/predictions/{MODEL_NAME}",
        sample_payload(),
        lambda: key,
        rate=100,
        concurrency=2,
        max_seconds=30,
        max_requests=40,
        bad_every=4,
        sink=sunk.append,
    ).start()
    deadline = time.monotonic() + 30
    while load.done < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert load.stop() == [] and load.records == []
    assert 40 <= len(sunk) == load.done <= 41  # a thread past the check as the other reached 40
    good, bad = [r for r in sunk if not r.bad], [r for r in sunk if r.bad]
    assert (len(sunk) - 6) / 4 <= len(bad) <= len(sunk) / 4  # every 4th of each of the 2 threads
    assert {(r.status, r.version) for r in good} == {(200, "1.0")}
    assert {(r.status, r.version) for r in bad} == {(400, None)}
    assert len({r.request_id for r in sunk}) == len(sunk)
    for r in sunk:
        stored = find_local(server.files.records, r.request_id)
        assert stored is not None and (stored.status, stored.model_version) == (r.status, "1.0"), r
