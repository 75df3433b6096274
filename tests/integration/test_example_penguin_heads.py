"""Several outputs end to end: `make example EXAMPLE_NAME=penguin-heads` on a real TorchServe.

examples/penguin_heads.py trains one network with three heads on the Palmer penguins (measurements
float32 ``[3]`` and island/sex ids int64 ``[2]`` in): ``species`` (classification), ``body_mass``
(regression, grams) and ``embedding`` (8 numbers). Every output's answer must equal the same training run
in this process (1e-5) over named bodies, KServe v1 instances and OIP v2 tensors (JSON and binary, the
request choosing outputs and their order); the server's golden replay must check every output (a golden
mass 1 g off, or one embedding number, is a mismatch); a bad input inside a batch gets its 400 while its
neighbours get every output; the gate compares the first output (a candidate trained on shuffled truth is
refused, a retrain promoted); explanations are refused with a 501.
"""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from examples.penguin_heads import EMBEDDING, MASS, OUTPUTS, SPECIES_OUT, WIDTH, holdout_scores, load_data, packaging
from examples.penguins import CATEGORY, DENSE, SPECIES
from rtserve.errors import GoldenMismatch
from rtserve.promotion.gate import ArchiveMeta, GateConfig
from rtserve.promotion.measure import check_golden
from tests.integration.examples import gate_verdicts, post, served_example

pytestmark = pytest.mark.integration

NAME = "penguin-heads"
CANDIDATES = {"2.0": {"seed": 1}, "3.0": {"shuffle_labels": True}}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def example(build_root, mar_v1, tmp_path_factory):
    """(server, {output: what the eager 1.0 trained here answers for the holdout}, {version: archive})."""
    with served_example(NAME, packaging, CANDIDATES, build_root, mar_v1, tmp_path_factory, 200) as (ts, mars):
        model = packaging()["model"]
        x_test = load_data()[2]
        with torch.inference_mode():
            logits, grams, embedding = model(**x_test)
        yield ts, {SPECIES_OUT: torch.softmax(logits, dim=1), MASS: grams, EMBEDDING: embedding}, mars


def named(i: int) -> dict:
    x_test = load_data()[2]
    return {DENSE: x_test[DENSE][i].tolist(), CATEGORY: x_test[CATEGORY][i].tolist()}


def assert_outputs(answer: dict, want: dict, i: int) -> None:
    """``answer`` (one row's ``outputs``) carries every output of holdout row ``i`` as its kind answers it."""
    assert list(answer) == list(OUTPUTS), answer
    species = answer[SPECIES_OUT]
    assert species["label"] == SPECIES[species["prediction"]] == SPECIES[int(want[SPECIES_OUT][i].argmax())]
    assert species["probabilities"] == pytest.approx(want[SPECIES_OUT][i].tolist(), abs=TOLERANCE)
    assert answer[MASS]["prediction"] == pytest.approx(float(want[MASS][i]), rel=TOLERANCE)  # one target: a number
    assert answer[EMBEDDING]["embedding"] == pytest.approx(want[EMBEDDING][i].tolist(), abs=TOLERANCE)


def oip_inputs(rows: range) -> list[dict]:
    x_test = load_data()[2]
    dense, category = x_test[DENSE][rows.start : rows.stop], x_test[CATEGORY][rows.start : rows.stop]
    return [
        {"name": DENSE, "datatype": "FP32", "shape": list(dense.shape), "data": dense.flatten().tolist()},
        {"name": CATEGORY, "datatype": "INT64", "shape": list(category.shape), "data": category.tolist()},
    ]


def test_every_output_equals_the_model_over_named_v1_and_oip_bodies(example):
    server, want, _ = example
    n = len(want[MASS])
    for i in range(n):
        response = post(server, f"predictions/{NAME}", named(i))
        assert response.status_code == 200, response.text
        assert response.json()["model_version"] == "1.0"
        assert_outputs(response.json()["outputs"], want, i)
    for start in range(0, n, 40):
        rows = range(start, min(start + 40, n))
        response = post(server, f"v1/models/{NAME}:predict", {"instances": [named(i) for i in rows]})
        assert response.status_code == 200, response.text
        for i, prediction in zip(rows, response.json()["predictions"], strict=True):
            assert_outputs(prediction["outputs"], want, i)
    rows = range(0, 50)
    chosen = [{"name": EMBEDDING}, {"name": SPECIES_OUT}]  # a subset, in the request's order
    answer = post(server, f"v2/models/{NAME}/infer", {"inputs": oip_inputs(rows), "outputs": chosen})
    assert answer.status_code == 200, answer.text
    tensors = answer.json()["outputs"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in tensors] == [
        (EMBEDDING, "FP32", [50, WIDTH]),
        (SPECIES_OUT, "FP32", [50, len(SPECIES)]),
    ]
    assert tensors[0]["data"] == pytest.approx(want[EMBEDDING][:50].flatten().tolist(), abs=TOLERANCE)
    assert tensors[1]["data"] == pytest.approx(want[SPECIES_OUT][:50].flatten().tolist(), abs=TOLERANCE)
    inputs = oip_inputs(rows)  # binary tensor data in and out, every output
    parts = [
        torch.tensor(inputs[0]["data"]).numpy().astype("<f4").tobytes(),
        torch.tensor(inputs[1]["data"]).numpy().astype("<i8").tobytes(),
    ]
    for tensor, part in zip(inputs, parts):
        tensor.pop("data")
        tensor["parameters"] = {"binary_data_size": len(part)}
    head = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    answer = post(
        server,
        f"v2/models/{NAME}/infer",
        data=head + b"".join(parts),
        headers={"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"},
    )
    assert answer.status_code == 200, answer.text[:500]
    length = int(answer.headers["Inference-Header-Content-Length"])
    header, data = json.loads(answer.content[:length]), answer.content[length:]
    offset = 0
    for tensor in header["outputs"]:
        size = tensor["parameters"]["binary_data_size"]
        got = torch.frombuffer(bytearray(data[offset : offset + size]), dtype=torch.float32).reshape(tensor["shape"])
        offset += size
        assert got.flatten().tolist() == pytest.approx(want[tensor["name"]][:50].flatten().tolist(), abs=TOLERANCE), (
            tensor["name"]
        )
    assert [t["name"] for t in header["outputs"]] == list(OUTPUTS) and offset == len(data)
    metadata = requests.get(
        f"{server.props['inference_address']}/v2/models/{NAME}",
        headers={"Authorization": f"Bearer {server.client().keys.get('inference')}"},
        timeout=10,
    ).json()
    assert [(o["name"], o["shape"]) for o in metadata["outputs"]] == [
        (SPECIES_OUT, [-1, len(SPECIES)]),
        (MASS, [-1, 1]),
        (EMBEDDING, [-1, WIDTH]),
    ]
    accuracy, mae = holdout_scores(packaging()["model"])
    print(f"held-out species accuracy {accuracy:.3f}, body mass MAE {mae:.0f} g")
    assert accuracy > 0.95 and mae < 400  # chance: 0.44 (always Adelie); the mass's spread is about 800 g


@pytest.mark.parametrize("column", [len(SPECIES), len(SPECIES) + 1 + WIDTH - 1], ids=["mass", "embedding"])
def test_the_golden_replay_checks_every_output_on_the_server(example, column):
    server, _, mars = example
    meta = ArchiveMeta.from_mar(mars["1.0"])
    config = GateConfig.load()
    assert check_golden(server.client(timeout=60), NAME, "1.0", meta, config) == len(meta.golden["features"])
    tampered = copy.deepcopy(meta)
    tampered.golden["outputs"][5][column] += 1.0 if column == len(SPECIES) else 0.01  # 1 g, or 0.01
    with pytest.raises(GoldenMismatch, match=r"answers 1 of \d+ golden rows differently .*rows \[5\]"):
        check_golden(server.client(timeout=60), NAME, "1.0", tampered, config)


def test_a_bad_input_inside_a_batch_gets_its_400_and_its_neighbours_every_output(example):
    server, want, _ = example
    bad = [
        ({DENSE: named(0)[DENSE], CATEGORY: [3, 0]}, f"{CATEGORY}[0]"),  # island id beyond the vocabulary
        ({DENSE: named(1)[DENSE], CATEGORY: [0, 2]}, f"{CATEGORY}[1]"),  # sex id beyond the vocabulary
        ({DENSE: named(2)[DENSE][:2], CATEGORY: [0, 1]}, DENSE),  # two measurements of three
        ({DENSE: [float("nan"), 18.0, 190.0], CATEGORY: [0, 1]}, f"{DENSE}[0]"),
        ({CATEGORY: [0, 1]}, DENSE),
    ]
    items = [(body, field, None) for body, field in bad * 8] + [(named(i), None, i) for i in range(40)]
    items = items[::2] + items[1::2]  # bad and good interleaved, so they share batches

    def send(item):
        response = post(server, f"predictions/{NAME}", item[0])
        return response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(send, items))
    for (_, field, row), (status, answer) in zip(items, results):
        if row is None:
            assert (status, answer.get("field")) == (400, field), answer
        else:
            assert status == 200, answer
            assert_outputs(answer["outputs"], want, row)


def test_the_gate_compares_the_first_output_refusing_shuffled_truth_and_promoting_a_retrain(example):
    server, _, mars = example
    refused, promoted = gate_verdicts(server, mars, NAME)
    assert refused.kind == "classification"
    assert {f.split(":")[0] for f in refused.failures} >= {"accuracy", "agreement"}, refused.failures
    assert promoted["outcome"] == "promoted"


def test_explanations_are_refused_with_a_501(example):
    server, _, _ = example
    response = post(server, f"explanations/{NAME}", named(0))
    assert response.status_code == 501, response.text
    print(response.json()["error"])
    assert "ask /predictions instead" in response.json()["error"]
