"""The dense + categorical example end to end: `make example EXAMPLE_NAME=penguins` on a real TorchServe.

examples/penguins.py trains on the Palmer penguins data read from the ``palmerpenguins`` wheel (no
download) and packages two named inputs: ``measurements`` float32 ``[4]`` and ``category`` int64 ``[2]``
(island id, sex id; vocabularies 3 and 2) summed through an embedding bag. The Makefile trains, checks and
archives it as users run it. Its answers must equal the same training run in this process for named
bodies, the flat ``features`` row, KServe v1 instances and OIP v2 tensors (JSON and binary); hostile
values of each input get their 400 naming the input and index, mixed with valid traffic; the gate
accepts a retrained candidate and refuses one trained on shuffled labels; the measurements' drift
gauges move when they shift and the ids' do not; explanations are refused (501) for the id input.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from bench import hostile_input
from examples.penguins import CATEGORY, DENSE, SPECIES, VOCABULARY, holdout_accuracy, load_data, packaging
from tests.integration.examples import gate_verdicts, post, served_example, settled

pytestmark = pytest.mark.integration

NAME = "penguins"
#: Rows in the worker's drift window (one worker): the training split holds 266.
DRIFT_WINDOW = 200
#: The candidates: 2.0 retrained (another order of the rows), 3.0 trained on shuffled labels.
CANDIDATES = {"2.0": {"seed": 1}, "3.0": {"shuffle_labels": True}}
#: Bad bodies per input kind in the fuzz test, each beside a valid one.
N_BAD = 120


@pytest.fixture(scope="module")
def example(build_root, mar_v1, tmp_path_factory):
    """(server, the eager 1.0 trained here, {version: archive}): 1.0 built by `make example`."""
    with served_example(NAME, packaging, CANDIDATES, build_root, mar_v1, tmp_path_factory, DRIFT_WINDOW) as (ts, mars):
        yield ts, packaging()["model"], mars


def softmax(model, dense: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.softmax(model(dense, category), dim=1)


def named(dense: torch.Tensor, category: torch.Tensor, i: int) -> dict:
    return {DENSE: dense[i].tolist(), CATEGORY: category[i].tolist()}


def oip_tensors(dense: torch.Tensor, category: torch.Tensor) -> list[dict]:
    return [
        {"name": DENSE, "datatype": "FP32", "shape": list(dense.shape)},
        {"name": CATEGORY, "datatype": "INT64", "shape": list(category.shape)},
    ]


def binary_body(dense: torch.Tensor, category: torch.Tensor) -> tuple[bytes, dict]:
    """An OIP v2 request with binary tensor data: (body, its headers)."""
    parts = [dense.numpy().astype("<f4").tobytes(), category.numpy().astype("<i8").tobytes()]
    tensors = [{**t, "parameters": {"binary_data_size": len(p)}} for t, p in zip(oip_tensors(dense, category), parts)]
    head = json.dumps({"inputs": tensors}).encode()
    return head + b"".join(parts), {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }


def assert_oip_answer(response: requests.Response, want: torch.Tensor) -> None:
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["class"]["data"] == want.argmax(dim=1).tolist()
    assert outputs["probabilities"]["shape"] == [len(want), len(SPECIES)]
    assert outputs["probabilities"]["data"] == pytest.approx(want.flatten().tolist(), abs=1e-5)


def test_answers_equal_the_model_for_named_flat_v1_and_oip_bodies(example):
    server, model, _ = example
    _, _, x_test, _ = load_data()
    dense, category = x_test[DENSE], x_test[CATEGORY]
    want = softmax(model, dense, category)
    for i in range(len(dense)):
        forms = {"named": named(dense, category, i), "flat": {"features": dense[i].tolist() + category[i].tolist()}}
        for form, body in forms.items():
            response = post(server, f"predictions/{NAME}", body)
            assert response.status_code == 200, (form, response.text)
            answer = response.json()
            assert answer["model_version"] == "1.0" and answer["label"] == SPECIES[answer["prediction"]], answer
            assert answer["probabilities"] == pytest.approx(want[i].tolist(), abs=1e-5), form
    for start in range(0, len(dense), 40):  # KServe v1: at most handler.max_instances (64) per request
        rows = range(start, min(start + 40, len(dense)))
        response = post(server, f"v1/models/{NAME}:predict", {"instances": [named(dense, category, i) for i in rows]})
        assert response.status_code == 200, response.text
        predictions = response.json()["predictions"]
        assert [p["label"] for p in predictions] == [SPECIES[int(want[i].argmax())] for i in rows]
        got = [v for p in predictions for v in p["probabilities"]]
        assert got == pytest.approx(want[start : rows.stop].flatten().tolist(), abs=1e-5)
    n = 60
    tensors = oip_tensors(dense[:n], category[:n])
    tensors[0]["data"], tensors[1]["data"] = dense[:n].tolist(), category[:n].flatten().tolist()  # nested, flat
    assert_oip_answer(post(server, f"v2/models/{NAME}/infer", {"inputs": tensors}), want[:n])
    data, headers = binary_body(dense[:n], category[:n])
    assert_oip_answer(post(server, f"v2/models/{NAME}/infer", data=data, headers=headers), want[:n])
    metadata = requests.get(
        f"{server.props['inference_address']}/v2/models/{NAME}",
        headers={"Authorization": f"Bearer {server.client().keys.get('inference')}"},
        timeout=10,
    ).json()
    assert metadata["inputs"] == [
        {"name": DENSE, "datatype": "FP32", "shape": [-1, 4]},
        {"name": CATEGORY, "datatype": "INT64", "shape": [-1, 2]},
    ]
    assert holdout_accuracy(model) > 0.95  # chance is 0.44 (always Adelie)


def hostile_measurements(rng: random.Random, good: dict) -> tuple[dict, str]:
    """One body whose ``measurements`` are bad, and the field its 400 must name."""
    body = {DENSE: list(good[DENSE]), CATEGORY: good[CATEGORY]}
    i = rng.randrange(4)
    kind = rng.randrange(6)
    if kind == 0:  # not finite (JSON's NaN and Infinity extensions)
        body[DENSE][i] = rng.choice([float("nan"), float("inf"), float("-inf")])
    elif kind == 1:  # beyond handler.feature_limit (1e6), a JSON integer beyond float64 too
        body[DENSE][i] = rng.choice([1e7, -3.4e38, 1e300, 10**400, -(10**20)])
    elif kind == 2:  # not a number
        body[DENSE][i] = rng.choice(["39.1", "", True, False, None, [39.1], {"mm": 39.1}])
    elif kind == 3:  # the wrong length
        body[DENSE] = body[DENSE][: rng.choice([0, 1, 3])] if rng.random() < 0.7 else body[DENSE] + [1.0]
        return body, DENSE
    elif kind == 4:  # not an array
        body[DENSE] = rng.choice(["39.1 18.7 181 3750", 39.1, None, {"bill_length_mm": 39.1}])
        return body, DENSE
    else:  # missing
        del body[DENSE]
        return body, DENSE
    return body, f"{DENSE}[{i}]"


def hostile_category(rng: random.Random, good: dict) -> tuple[dict, str]:
    """One body whose ``category`` ids are bad, and the field its 400 must name."""
    body = {DENSE: good[DENSE], CATEGORY: list(good[CATEGORY])}
    column = rng.randrange(2)
    kind = rng.randrange(7)
    if kind == 0:  # beyond its column's vocabulary (3 islands, 2 sexes), or a huge id
        body[CATEGORY][column] = rng.choice([VOCABULARY[column], 4, 255, 2**31, 2**70])
    elif kind == 1:  # negative
        body[CATEGORY][column] = rng.choice([-1, -2, -(2**63)])
    elif kind == 2:  # a float, whole or not
        body[CATEGORY][column] = rng.choice([0.5, 1.5, 1.0, 2.0, 1e-9])
    elif kind == 3:  # a boolean or a string or null as an id
        body[CATEGORY][column] = rng.choice([True, False, "1", "Dream", "", None, [1], {"id": 1}])
    elif kind == 4:  # the wrong length
        body[CATEGORY] = rng.choice([[], [0], [0, 1, 0], [[0, 1]]])
        return body, CATEGORY
    elif kind == 5:  # not an array
        body[CATEGORY] = rng.choice(["Dream", 1, None, {"island": 0, "sex": 1}])
        return body, CATEGORY
    else:  # missing
        del body[CATEGORY]
        return body, CATEGORY
    return body, f"{CATEGORY}[{column}]"


@pytest.mark.parametrize("hostile", [hostile_measurements, hostile_category], ids=["float32", "int64"])
def test_hostile_values_of_each_input_get_400s_naming_it_mixed_with_valid_traffic(example, hostile):
    server, model, _ = example
    _, _, x_test, _ = load_data()
    dense, category = x_test[DENSE], x_test[CATEGORY]
    want = softmax(model, dense, category)
    pids = hostile_input.worker_pids(server, NAME)
    rng = random.Random(0)
    items = [(*hostile(rng, named(dense, category, rng.randrange(len(dense)))), None) for _ in range(N_BAD)]
    items += [(named(dense, category, i % len(dense)), None, i % len(dense)) for i in range(N_BAD)]
    rng.shuffle(items)

    def send(item):
        body, _, _ = item
        response = post(server, f"predictions/{NAME}", body)
        return response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=8) as pool:  # bad and good requests share batches
        results = list(pool.map(send, items))
    wrong = []
    for (body, field, row), (status, answer) in zip(items, results):
        if row is not None:
            ok = status == 200 and answer["probabilities"] == pytest.approx(want[row].tolist(), abs=1e-5)
        else:
            ok = status == 400 and answer.get("field") == field and field.split("[")[0] in answer["error"]
        if not ok:
            wrong.append((body, field, status, answer))
    assert not wrong, wrong[:5]
    statuses = [status for status, _ in results]
    print(f"{hostile.__name__}: {statuses.count(400)} x 400, {statuses.count(200)} x 200 of {len(items)}")
    assert hostile_input.worker_pids(server, NAME) == pids


def test_protocol_bodies_with_a_bad_id_get_a_400_naming_the_input(example):
    server, _, _ = example
    _, _, x_test, _ = load_data()
    dense, category = x_test[DENSE][:3], x_test[CATEGORY][:3].clone()
    instances = [named(dense, category, i) for i in range(3)]
    instances[1][CATEGORY][0] = 3
    response = post(server, f"v1/models/{NAME}:predict", {"instances": instances})
    assert (response.status_code, response.json()) == (
        400,
        {"error": "instances[1]: category[0] must be an id in [0, 2] (the vocabulary of input 'category'), got 3"},
    )
    category[2, 1] = -1
    tensors = oip_tensors(dense, category)
    tensors[0]["data"], tensors[1]["data"] = dense.tolist(), category.tolist()
    want = {
        "error": "inputs[1].data[5] must be an id in [0, 1] (the vocabulary of input 'category'), got -1",
        "field": "inputs[1].data[5]",
    }
    data, headers = binary_body(dense, category)
    for response in (
        post(server, f"v2/models/{NAME}/infer", {"inputs": tensors}),
        post(server, f"v2/models/{NAME}/infer", data=data, headers=headers),
    ):
        assert (response.status_code, response.json()) == (400, want)


def test_the_gate_refuses_a_candidate_trained_on_shuffled_labels_and_promotes_a_retrained_one(example):
    server, _, mars = example
    refused, promoted = gate_verdicts(server, mars, NAME)
    assert refused.kind == "classification"
    assert {f.split(":")[0] for f in refused.failures} >= {"accuracy", "agreement"}, refused.failures
    assert promoted["outcome"] == "promoted"


def fill_window(server, dense: torch.Tensor, category: torch.Tensor) -> None:
    for start in range(0, len(dense), 50):
        instances = [named(dense, category, i) for i in range(start, min(start + 50, len(dense)))]
        response = post(server, f"v1/models/{NAME}:predict", {"instances": instances})
        assert response.status_code == 200, response.text


def test_drift_stays_low_on_training_rows_and_moves_when_the_measurements_shift(example):
    server, _, _ = example
    x_train = load_data()[0]
    dense, category = x_train[DENSE][:DRIFT_WINDOW], x_train[CATEGORY][:DRIFT_WINDOW]
    measured = [f"{DENSE}[{i}]" for i in range(4)]
    ids = [f"{CATEGORY}[{i}]" for i in range(2)]
    fill_window(server, dense, category)
    features, prediction = (
        settled(server, "rtserve_feature_drift_psi", NAME),
        settled(server, "rtserve_prediction_drift_psi", NAME),
    )
    print("training rows: feature PSI", features, "prediction PSI", prediction[""])
    assert sorted(features) == sorted(measured + ids)
    assert max(features.values()) < 0.1 and prediction[""] < 0.1, (features, prediction)
    shifted = dense + 1.5 * x_train[DENSE].std(dim=0)  # every measurement 1.5 spreads up; ids as they were
    fill_window(server, shifted, category)
    features, prediction = (
        settled(server, "rtserve_feature_drift_psi", NAME),
        settled(server, "rtserve_prediction_drift_psi", NAME),
    )
    print("shifted measurements: feature PSI", features, "prediction PSI", prediction[""])
    assert min(features[f] for f in measured) > 0.2, features
    assert max(features[f] for f in ids) < 0.1, features


def test_explanations_are_refused_with_a_501_naming_the_id_input(example):
    server, _, _ = example
    _, _, x_test, _ = load_data()
    for body in (named(x_test[DENSE], x_test[CATEGORY], 0), {"features": [39.1, 18.7, 181.0, 3750.0, 2, 1]}):
        response = post(server, f"explanations/{NAME}", body)
        assert (response.status_code, response.json()) == (
            501,
            {
                "error": "explanations are not available for this model: its input(s) 'category' (int64) are not "
                "float32, and Integrated Gradients need inputs that vary continuously; ask /predictions instead"
            },
        )
