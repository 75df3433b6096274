"""Explanations over HTTP from a real TorchServe serving the archive `make archive` built.

Reference attributions are Captum run directly on the weights packed in the served `.mar`
(``Reference.integrated_gradients``); tolerance as in tests/unit/test_explain.py.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from bench import explain_latency
from rtserve.model.data import make_dataset
from tests.conftest import MODEL_NAME
from tests.helpers import Reference, bench_main, demo_eager, record_batches

pytestmark = pytest.mark.integration

ATOL = 1e-5


@pytest.fixture(scope="module")
def ref(mar_v1) -> Reference:
    return Reference.from_mar(mar_v1, demo_eager("1.0"))


@pytest.fixture(scope="module")
def samples() -> list[list[float]]:
    return make_dataset().x_test[:48].tolist()


def post(server, path: str, payload) -> requests.Response:
    """POST a JSON body to the inference API with the inference token."""
    key = server.client().keys.get("inference")
    return requests.post(
        f"{server.props['inference_address']}{path}",
        data=json.dumps(payload),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        timeout=30,
    )


def batch_log(server) -> list[tuple[int, int, int]]:
    """(size, valid, explanations) of every batch the handler ran (its records)."""
    return record_batches(server.files.records)


def check_explanation(body: dict, ref: Reference, row: list[float], target: int) -> None:
    expected, delta = ref.integrated_gradients(row, target)
    assert body["target"] == target and body["label"] == ref.meta.labels[target]
    assert list(body["attributions"]) == ref.meta.feature_names
    assert list(body["attributions"].values()) == pytest.approx(expected, abs=ATOL)
    assert body["convergence_delta"] == pytest.approx(delta, abs=ATOL)
    gap = body["target_probability"] - body["baseline_probability"]
    assert sum(body["attributions"].values()) - gap == pytest.approx(delta, abs=ATOL)
    assert body["model_version"] == "1.0"


def test_explanation_route_returns_captum_attributions(server, ref, samples):
    answer = post(server, f"/explanations/{MODEL_NAME}", {"features": samples[0], "target": 1})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {
        "target",
        "label",
        "attributions",
        "baseline",
        "target_probability",
        "baseline_probability",
        "convergence_delta",
        "method",
        "n_steps",
        "prediction",
        "model_version",
    }
    check_explanation(body, ref, samples[0], 1)
    assert list(body["baseline"].values()) == pytest.approx(ref.meta.mean, rel=1e-6)
    default = server.client().explain(MODEL_NAME, {"features": samples[0]})
    assert default["target"] == default["prediction"] == int(ref.probabilities(samples[:1])[0].argmax())


def test_kserve_explain_routes_are_explanations_too(server):
    payload = {"features": make_dataset().x_test[0].tolist(), "target": 2}
    plain = post(server, f"/explanations/{MODEL_NAME}", payload).json()
    for path in (f"/v1/models/{MODEL_NAME}:explain", f"/v2/models/{MODEL_NAME}/explain"):
        answer = post(server, path, payload)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.json()["attributions"] == pytest.approx(plain["attributions"], abs=ATOL)
    prediction = post(server, f"/predictions/{MODEL_NAME}", payload).json()
    assert set(prediction) == {"prediction", "label", "probabilities", "model_version"}


def test_bad_target_gets_400_naming_the_field(server, samples):
    answer = post(server, f"/explanations/{MODEL_NAME}", {"features": samples[0], "target": 7})
    assert answer.status_code == 400
    assert answer.json() == {"error": "'target' must be a class index, an integer in [0, 2], got 7", "field": "target"}


def test_concurrent_burst_mixing_predictions_and_explanations(server, ref, samples):
    """48 requests at once, every third an explanation: each gets the answer to what it asked.

    An explanation beyond the per-batch ceiling may get 503 + Retry-After; it is then sent
    again on its own and must succeed.
    """
    jobs = [("explanations" if i % 3 == 0 else "predictions", row) for i, row in enumerate(samples)]
    before = len(batch_log(server))
    with ThreadPoolExecutor(max_workers=24) as pool:
        answers = list(pool.map(lambda job: post(server, f"/{job[0]}/{MODEL_NAME}", {"features": job[1]}), jobs))
    expected = ref.probabilities(samples)
    for (route, row), answer, probs in zip(jobs, answers, expected):
        if route == "predictions":
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert set(body) == {"prediction", "label", "probabilities", "model_version"}
            assert body["probabilities"] == pytest.approx(probs.tolist(), abs=1e-6)
            continue
        if answer.status_code == 503:
            assert answer.headers["Retry-After"] == "1"
            assert "handler.explain_max_per_batch" in answer.json()["error"]
            answer = post(server, f"/explanations/{MODEL_NAME}", {"features": row})
        assert answer.status_code == 200, answer.text
        check_explanation(answer.json(), ref, row, int(probs.argmax()))
    batches = batch_log(server)[before:]
    assert sum(size for size, _, _ in batches) >= len(jobs)
    mixed = [b for b in batches if 0 < b[2] < b[0]]
    assert mixed, f"no batch held both predictions and explanations: {batches}"


def test_explain_latency_main_on_this_server(server, mar_v1, tmp_path):
    """bench/explain_latency.py's main, tiny: in-process timings, then HTTP on this module's server."""
    rc, report = bench_main(
        explain_latency.main,
        tmp_path / "report.json",
        "--mar",
        mar_v1,
        "--attach",
        server.run_dir,
        "-n",
        5,
        "--warmup",
        1,
        "--hold",
        0.5,
        "--flood-clients",
        2,
    )
    assert rc == 0
    assert report["compute"]["one_explanation"]["n"] == 5
    assert report["compute"]["one_explanation"]["median_ms"] > 0
    http = report["http"]
    assert http["explanations"]["n"] == http["predictions"]["n"] == 5
    for phase in ("predictions_alone", "predictions_during_explanation_flood"):
        assert http[phase]["n"] > 0 and http[phase]["failed_first"] == 0, http[phase]
    flood = http["flood"]
    assert flood["explanations_answered_200"] + flood["explanations_refused_503"] > 0
    assert flood["other_statuses"] == {}, flood
