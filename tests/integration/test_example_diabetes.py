"""The regression example end to end: `make example EXAMPLE_NAME=diabetes` on a real TorchServe.

examples/diabetes.py trains on scikit-learn's bundled diabetes data (no download) and packages a
``regression`` output; the Makefile trains, checks and archives it as users run it. Its answers must
equal the same training run in this process, hostile bodies get their 400s mixed with valid traffic,
the gate accepts a retrained candidate and refuses one trained on shuffled targets, drift moves when
the inputs shift and explanations attribute the prediction to the features.
"""

from __future__ import annotations

import time

import pytest
import requests
import torch

from bench import hostile_input
from examples.diabetes import OUTPUT, TARGET, holdout_mae, load_data, packaging
from handler.drift import DriftMonitor
from handler.model import ModelMetadata
from rtserve.model.archive import read_archive
from tests.integration.examples import gate_verdicts, post, scraped, served_example

pytestmark = pytest.mark.integration

NAME = "diabetes"
#: Rows in the worker's drift window (one worker); its gauges are exported every 0.2 s.
DRIFT_WINDOW = 300
#: The candidates: 2.0 retrained (another order of the rows), 3.0 trained on shuffled targets.
CANDIDATES = {"2.0": {"seed": 1}, "3.0": {"shuffle_targets": True}}


@pytest.fixture(scope="module")
def example(build_root, mar_v1, tmp_path_factory):
    """(server, the eager 1.0 trained here, {version: archive}): 1.0 built by `make example`."""
    with served_example(NAME, packaging, CANDIDATES, build_root, mar_v1, tmp_path_factory, DRIFT_WINDOW) as (ts, mars):
        yield ts, packaging()["model"], mars


def test_answers_equal_the_model_trained_in_this_process(example):
    server, model, _ = example
    _, _, x_test, y_test, _ = load_data()
    rows = x_test[:40]
    with torch.inference_mode():
        want = model(rows).squeeze(1).tolist()
    got = []
    for row in rows.tolist():
        response = post(server, f"predictions/{NAME}", {"features": row})
        assert response.status_code == 200, response.text
        body = response.json()
        assert set(body) == {"prediction", "model_version"} and body["model_version"] == "1.0"
        got.append(body["prediction"])
    assert got == pytest.approx(want, rel=1e-5, abs=1e-5)
    v2 = post(
        server,
        f"v2/models/{NAME}/infer",
        {"inputs": [{"name": "features", "datatype": "FP32", "shape": [len(rows), 10], "data": rows.tolist()}]},
    )
    assert v2.status_code == 200, v2.text
    (tensor,) = v2.json()["outputs"]
    assert (tensor["name"], tensor["shape"]) == (OUTPUT, [len(rows), 1])
    assert tensor["data"] == pytest.approx(want, rel=1e-5, abs=1e-5)
    # The model learned something: its held-out error is well under always answering the mean.
    mean_only = float((y_test - load_data()[1].mean()).abs().mean())
    assert holdout_mae(model) < 0.9 * mean_only


def test_hostile_bodies_get_400s_mixed_with_valid_traffic(example):
    server, _, _ = example
    report = hostile_input.run(server, NAME, n_bad=160, concurrency=8, n=10)
    assert report["valid_ok"] == 160 and report["valid_failed"] == 0, report["examples_wrong_status"]
    assert report["bad_expected_status"] == 160 and report["five_xx"] == 0, report["examples_wrong_status"]
    assert report["worker_pids_unchanged"]


def test_the_gate_refuses_a_candidate_trained_on_shuffled_targets_and_promotes_a_retrained_one(example):
    server, _, mars = example
    refused, promoted = gate_verdicts(server, mars, NAME)
    assert refused.kind == "regression"
    assert [f.split(":")[0] for f in refused.failures] == ["mean absolute error", "agreement"], refused.failures
    print(promoted["quality"], promoted["agreement"])
    assert promoted["outcome"] == "promoted"


def drift_after(server, model, mars, rows: torch.Tensor) -> tuple[float, float, float]:
    """Fill the window with ``rows``: (prediction drift scraped, scored here, the largest feature drift)."""
    for start in range(0, len(rows), 50):
        body = {"instances": rows[start : start + 50].tolist()}
        response = requests.post(
            f"{server.props['inference_address']}/v1/models/{NAME}:predict",
            json=body,
            headers={"Authorization": f"Bearer {server.client().keys.get('inference')}"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
    raw = read_archive(mars["1.0"]).meta
    meta = ModelMetadata(**{k: raw[k] for k in ModelMetadata.__dataclass_fields__ if k in raw})
    monitor = DriftMonitor(meta.drift_reference, DRIFT_WINDOW)
    with torch.inference_mode():
        monitor.update(rows, model(rows))
    want = monitor.scores().prediction
    deadline = time.monotonic() + 10
    got = None
    while time.monotonic() < deadline:  # the worker's exporter sets the gauges every 0.2 s
        got = scraped(server, "rtserve_prediction_drift_psi", NAME).get("")
        if got is not None and abs(got - want) < 0.01:
            break
        time.sleep(0.2)
    return got, want, max(scraped(server, "rtserve_feature_drift_psi", NAME).values())


def test_drift_stays_low_on_training_rows_and_moves_when_the_inputs_shift(example):
    server, model, mars = example
    x_train = load_data()[0]
    got, want, features = drift_after(server, model, mars, x_train[:DRIFT_WINDOW])
    assert got == pytest.approx(want, abs=0.01) and got < 0.1 and features < 0.1
    shifted = x_train[:DRIFT_WINDOW] + 1.5 * x_train.std(dim=0)  # every measurement 1.5 spreads up
    got, want, features = drift_after(server, model, mars, shifted)
    assert got == pytest.approx(want, abs=0.01) and got > 0.2 and features > 0.2


def test_explanations_attribute_the_prediction_to_the_features(example):
    server, model, _ = example
    _, _, x_test, _, names = load_data()
    for row in x_test[:3].tolist():
        response = requests.post(
            f"{server.props['inference_address']}/explanations/{NAME}",
            json={"features": row},
            headers={"Authorization": f"Bearer {server.client().keys.get('inference')}"},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["target"], body["label"]) == (0, TARGET) and list(body["attributions"]) == names
        with torch.inference_mode():
            assert body["prediction"] == pytest.approx(float(model(torch.tensor([row]))[0, 0]), rel=1e-5)
        move = body["target_value"] - body["baseline_value"]
        # Integrated Gradients' completeness: the attributions add up to the prediction's move
        assert sum(body["attributions"].values()) == pytest.approx(move, abs=0.05 * max(1.0, abs(move)))
