"""The image example end to end: `make example EXAMPLE_NAME=digits` on a real TorchServe.

examples/digits.py trains a small CNN on scikit-learn's bundled 8x8 digits (no download) and packages
one named input ``image`` ``[1, 8, 8]`` with an image encoding; the Makefile trains, checks and
archives it as users run it. Its answers must equal the same training run in this process for images
sent as arrays, as base64 PNG, as raw PNG bytes and as OIP v2 tensors; hostile arrays and images get
their 400s mixed with valid traffic; the gate accepts a retrained candidate and refuses one trained on
shuffled labels; drift moves when the images change; explanations attribute the digit to pixels.
"""

from __future__ import annotations

import base64
import io
import json
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import torch
from PIL import Image

from bench import hostile_input
from examples.digits import INPUT, PIXEL_MAX, holdout_accuracy, load_data, packaging, to_png
from tests.integration.examples import gate_verdicts, post, served_example, settled

pytestmark = pytest.mark.integration

NAME = "digits"
DRIFT_WINDOW = 300
#: The candidates: 2.0 retrained (another order of the rows), 3.0 trained on shuffled labels.
CANDIDATES = {"2.0": {"seed": 1}, "3.0": {"shuffle_labels": True}}


@pytest.fixture(scope="module")
def example(build_root, mar_v1, tmp_path_factory):
    """(server, the eager 1.0 trained here, {version: archive}): 1.0 built by `make example`."""
    with served_example(NAME, packaging, CANDIDATES, build_root, mar_v1, tmp_path_factory, DRIFT_WINDOW) as (ts, mars):
        yield ts, packaging()["model"], mars


def decoded(png: bytes) -> torch.Tensor:
    """What the server makes of a PNG: its 8-bit pixels at the input's scale, ``[1, 8, 8]``."""
    pixels = np.asarray(Image.open(io.BytesIO(png)).convert("L"), dtype=np.float32)
    return torch.from_numpy(pixels).unsqueeze(0) * (PIXEL_MAX / 255)


def test_answers_equal_the_model_for_arrays_pngs_and_tensors(example):
    server, model, _ = example
    _, _, x_test, y_test = load_data()
    images = x_test[:30]
    with torch.inference_mode():
        want = torch.softmax(model(images), dim=1)
    pngs = [to_png(image) for image in images]
    with torch.inference_mode():
        want_png = torch.softmax(model(torch.stack([decoded(p) for p in pngs])), dim=1)
    for i, image in enumerate(images):
        forms = {
            "array": (post(server, f"predictions/{NAME}", {INPUT: image.tolist()}), want[i]),
            "b64": (
                post(server, f"predictions/{NAME}", {INPUT: {"b64": base64.b64encode(pngs[i]).decode()}}),
                want_png[i],
            ),
            "raw": (
                post(server, f"predictions/{NAME}", data=pngs[i], headers={"Content-Type": "image/png"}),
                want_png[i],
            ),
        }
        for form, (response, expected) in forms.items():
            assert response.status_code == 200, (form, response.text)
            body = response.json()
            assert body["model_version"] == "1.0" and body["label"] == str(body["prediction"])
            assert body["probabilities"] == pytest.approx(expected.tolist(), abs=1e-5), form
    v2 = post(
        server,
        f"v2/models/{NAME}/infer",
        {"inputs": [{"name": INPUT, "datatype": "FP32", "shape": [len(images), 1, 8, 8], "data": images.tolist()}]},
    )
    assert v2.status_code == 200, v2.text
    outputs = {o["name"]: o for o in v2.json()["outputs"]}
    assert outputs["probabilities"]["data"] == pytest.approx(want.flatten().tolist(), abs=1e-5)
    metadata = requests.get(
        f"{server.props['inference_address']}/v2/models/{NAME}",
        headers={"Authorization": f"Bearer {server.client().keys.get('inference')}"},
        timeout=10,
    ).json()
    assert metadata["inputs"] == [{"name": INPUT, "datatype": "FP32", "shape": [-1, 1, 8, 8]}]
    assert holdout_accuracy(model) > 0.9  # it learned: chance is 0.1


def hostile_images(rng: random.Random, good: list) -> tuple[bytes, str]:
    """One bad image request: (body, content type)."""
    kind = rng.randrange(6)
    if kind == 0:  # a PNG of another size
        return to_png(torch.zeros(1, rng.choice([7, 9, 16]), 8)), "image/png"
    if kind == 1:  # a color image
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "PNG")
        return buf.getvalue(), "image/png"
    if kind == 2:  # a truncated PNG
        data = to_png(torch.rand(1, 8, 8) * 16)
        return data[: rng.randrange(9, len(data) // 2)], "image/png"  # inside the pixel data, not IEND
    if kind == 3:  # not base64
        return json.dumps({INPUT: {"b64": "***" + "A" * rng.randrange(4)}}).encode(), "application/json"
    if kind == 4:  # a ragged array
        bad = json.loads(json.dumps(good))
        bad[0][rng.randrange(8)] = bad[0][0][: rng.randrange(8)]
        return json.dumps({INPUT: bad}).encode(), "application/json"
    bad = json.loads(json.dumps(good))  # a non-number pixel
    bad[0][rng.randrange(8)][rng.randrange(8)] = rng.choice([None, "7", True, [1]])
    return json.dumps({INPUT: bad}).encode(), "application/json"


def test_hostile_arrays_and_images_get_400s_mixed_with_valid_traffic(example):
    server, _, _ = example
    report = hostile_input.run(server, NAME, n_bad=160, concurrency=8, n=64)
    assert report["valid_ok"] == 160 and report["valid_failed"] == 0, report["examples_wrong_status"]
    assert report["bad_expected_status"] == 160 and report["five_xx"] == 0, report["examples_wrong_status"]
    pids = hostile_input.worker_pids(server, NAME)
    rng = random.Random(0)
    good = load_data()[2][0].tolist()
    items = [(hostile_images(rng, good), False) for _ in range(120)]
    items += [((to_png(load_data()[2][i % 50]), "image/png"), True) for i in range(120)]
    rng.shuffle(items)

    def send(item):
        (data, ctype), valid = item
        response = post(server, f"predictions/{NAME}", data=data, headers={"Content-Type": ctype})
        return valid, response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(send, items))
    assert all(status == 200 for valid, status, _ in results if valid)
    wrong = [
        (s, body) for valid, s, body in results if not valid and not (s == 400 and body["field"].startswith(INPUT))
    ]
    assert not wrong, wrong[:5]
    assert report["worker_pids_unchanged"] and hostile_input.worker_pids(server, NAME) == pids


def test_the_gate_refuses_a_candidate_trained_on_shuffled_labels_and_promotes_a_retrained_one(example):
    server, _, mars = example
    refused, promoted = gate_verdicts(server, mars, NAME)
    assert refused.kind == "classification"
    assert {f.split(":")[0] for f in refused.failures} >= {"accuracy"}, refused.failures
    assert promoted["outcome"] == "promoted"


def fill_window(server, images: torch.Tensor) -> None:
    for start in range(0, len(images), 50):
        instances = [{INPUT: image.tolist()} for image in images[start : start + 50]]
        response = post(server, f"v1/models/{NAME}:predict", {"instances": instances})
        assert response.status_code == 200, response.text


def test_drift_stays_low_on_training_images_and_moves_when_they_change(example):
    server, _, _ = example
    x_train = load_data()[0]
    fill_window(server, x_train[:DRIFT_WINDOW])
    pixels, prediction = (
        settled(server, "rtserve_feature_drift_psi", NAME),
        settled(server, "rtserve_prediction_drift_psi", NAME),
    )
    print("training images: largest pixel PSI", max(pixels.values()), "prediction PSI", prediction[""])
    assert max(pixels.values()) < 0.25 and prediction[""] < 0.1, (max(pixels.values()), prediction)
    faded = (x_train[:DRIFT_WINDOW] * 0.4).round()  # a faded scanner: every stroke at 40%
    fill_window(server, faded)
    pixels, prediction = (
        settled(server, "rtserve_feature_drift_psi", NAME),
        settled(server, "rtserve_prediction_drift_psi", NAME),
    )
    print("faded images: tenth largest pixel PSI", sorted(pixels.values())[-10], "prediction PSI", prediction[""])
    assert sorted(pixels.values())[-10] > 0.2, sorted(pixels.values())[-10:]
    assert "image[0,3,4]" in pixels and pixels["image.intensity[0]"] > 0.2, pixels["image.intensity[0]"]


def test_explanations_attribute_the_digit_to_pixels(example):
    server, model, _ = example
    _, _, x_test, _ = load_data()
    for image in x_test[:3]:
        response = post(server, f"explanations/{NAME}", {INPUT: image.tolist()})
        assert response.status_code == 200, response.text
        body = response.json()
        with torch.inference_mode():
            assert body["prediction"] == int(model(image.unsqueeze(0)).argmax())
        assert len(body["attributions"]) == 64 and "image[0,7,7]" in body["attributions"]
        move = body["target_probability"] - body["baseline_probability"]
        assert sum(body["attributions"].values()) == pytest.approx(move, abs=0.05)
