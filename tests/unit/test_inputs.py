"""Named inputs (``rtserve-model/2``): export, ``meta.json`` and the handler's parsing of every input form.

Two models are exported with ``inputs=``: a mixed one (an 8x8 image, three ids of a vocabulary of 10,
two booleans) and a one-input image model. The handler answers named bodies, the flat ``features``
form, base64 PNG and JPEG, raw PNG bytes, KServe v1 objects and OIP v2 tensors (JSON and binary) with
the model run in this process to 1e-5, and gives each hostile request its own 400 naming the input
and the index at fault, beside good requests in the same batch.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from handler.errors import ConfigError
from handler.inputs import InputSpec, specs_from_meta
from handler.model import FORMAT_V2, ModelMetadata
from handler.rtserve_handler import RealTimeHandler
from rtserve.model.package import PackagingError, check, export
from tests.helpers import MODEL_YAML, make_context, route_headers, start_batch

pytestmark = pytest.mark.unit

SCALE = 16 / 255
LABELS = ["a", "b", "c"]


class Mixed(nn.Module):
    """image [1, 8, 8] float, ids [3] int64 (vocabulary 10), flag [2] bool -> 3 logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(2 * 64 + 3 * 4 + 2, 3)

    def forward(self, image: torch.Tensor, ids: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        parts = [torch.relu(self.conv(image)).flatten(1), self.embed(ids).flatten(1), flag.float()]
        return self.out(torch.cat(parts, dim=1))


class Digits(nn.Module):
    """One image input [1, 8, 8] -> 3 logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.out = nn.Linear(3 * 64, 3)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.conv(image)).flatten(1))


def mixed_inputs(n: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "image": torch.rand(n, 1, 8, 8, generator=g) * 16,
        "ids": torch.randint(0, 10, (n, 3), generator=g),
        "flag": torch.rand(n, 2, generator=g) > 0.5,
    }


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("inputs")
    train = mixed_inputs(200)
    inputs = {"image": {"rows": train["image"], "image": {"scale": SCALE}}, "ids": train["ids"], "flag": train["flag"]}
    outputs = {"letter": {"kind": "classification", "labels": LABELS}}
    holdout = (mixed_inputs(40, seed=1), torch.randint(0, 3, (40,)))
    export(Mixed(), inputs=inputs, outputs=outputs, version="0.1", out_dir=root / "mixed", holdout=holdout)
    image = {"image": {"rows": train["image"], "image": {"scale": SCALE}}}
    export(Digits(), image, outputs=outputs, version="0.1", out_dir=root / "digits")
    return {"mixed": root / "mixed", "digits": root / "digits"}


@pytest.fixture(scope="module")
def handlers(artifacts) -> dict:
    out = {}
    for name, directory in artifacts.items():
        ctx = make_context(directory, MODEL_YAML, version="0.1")
        handler = RealTimeHandler()
        handler.initialize(ctx)
        out[name] = (handler, ctx)
    return out


def run(handler, ctx, rows, headers=None):
    start_batch(ctx, len(rows), headers)
    out = handler.handle(rows, ctx)
    return [ctx.get_response_status(i)[0] for i in range(len(rows))], out


def probabilities(model: nn.Module, **named) -> list[float]:
    with torch.inference_mode():
        return torch.softmax(model(**{k: v.unsqueeze(0) for k, v in named.items()}), dim=1)[0].tolist()


def png(pixels: np.ndarray, fmt: str = "PNG", mode: str = "L") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels.astype("uint8"), mode=mode if mode != "L" else None).convert(mode).save(buf, fmt)
    return buf.getvalue()


def good_body(seed: int = 2) -> tuple[dict, dict]:
    """(request body, the same inputs as tensors)."""
    one = {k: v[0] for k, v in mixed_inputs(1, seed).items()}
    return {"image": one["image"].tolist(), "ids": one["ids"].tolist(), "flag": one["flag"].tolist()}, one


# --------------------------------------------------------------------------- export and meta.json


def test_export_writes_each_input_with_dtype_shape_and_encoding(artifacts):
    meta = check(artifacts["mixed"])
    assert meta.format == FORMAT_V2
    assert meta.inputs == [
        {"name": "image", "dtype": "float32", "shape": [1, 8, 8], "image": {"scale": SCALE, "offset": 0.0}},
        {"name": "ids", "dtype": "int64", "shape": [3], "vocabulary": 10},
        {"name": "flag", "dtype": "bool", "shape": [2]},
    ]
    assert meta.n_features == 64 + 3 + 2
    assert meta.feature_names[:2] == ["image[0,0,0]", "image[0,0,1]"] and meta.feature_names[-1] == "flag[1]"
    assert meta.accuracy is not None and len(meta.golden["features"][0]) == 69


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"image": torch.rand(5, 1, 8, 8), "ids": torch.randint(0, 9, (4, 3))}, "same number of rows"),
        ({"picture": torch.rand(5, 1, 8, 8)}, r"model.forward must take the inputs by name \(picture\)"),
        ({"image": {"rows": torch.rand(5, 2), "vocabulary": 3}}, "a vocabulary is for integer ids"),
        ({"image": {"rows": torch.rand(5, 2, 8, 8), "image": {}}}, r"image needs a float32 input of shape \[1 or 3"),
        ({"ids": -torch.ones(5, 3, dtype=torch.long)}, "ids must be at least 0"),
        ({"features": torch.rand(5, 3)}, "the name 'features' is reserved"),
    ],
)
def test_export_refuses_bad_inputs_naming_the_input(tmp_path, inputs, message):
    class Any_(nn.Module):
        def forward(self, image=None, ids=None, features=None):
            return torch.zeros(len(image if image is not None else ids if ids is not None else features), 2)

    with pytest.raises(PackagingError, match=message):
        export(Any_(), inputs=inputs, labels=["x", "y"], version="1", out_dir=tmp_path)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "dtype": "float16", "shape": [2]}, "dtype must be one of"),
        ({"name": "x", "dtype": "float32", "shape": [0]}, "shape must be a list of positive sizes"),
        ({"name": "x", "dtype": "float32", "shape": [2], "vocabulary": 5}, "vocabulary must be an integer"),
        ({"name": "x", "dtype": "int64", "shape": [2], "vocabulary": 2**25}, "vocabulary must be an integer"),
        ({"name": "x", "dtype": "float32", "shape": [3, 4, 4], "image": {"scale": 1}}, "image must be"),
    ],
)
def test_meta_refuses_bad_input_specs(entry, message):
    with pytest.raises(ConfigError, match=message):
        specs_from_meta([entry])


def test_meta_refuses_inputs_whose_width_differs_from_the_feature_names(artifacts, tmp_path):
    raw = json.loads((artifacts["mixed"] / "meta.json").read_text())
    raw["inputs"][1]["shape"] = [4]
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match="the inputs hold 70 numbers per row but feature_names names 69"):
        ModelMetadata.load(tmp_path / "meta.json")


def test_element_names_are_row_major():
    assert InputSpec("t", "float32", (2, 2)).element_names() == ["t[0,0]", "t[0,1]", "t[1,0]", "t[1,1]"]


# --------------------------------------------------------------------------- the handler


def test_every_form_answers_the_model_in_process(handlers):
    handler, ctx = handlers["mixed"]
    body, one = good_body()
    model = Mixed()
    want = probabilities(model, **one)
    flat = one["image"].flatten().tolist() + [float(v) for v in one["ids"]] + [float(v) for v in one["flag"]]
    v1 = {"instances": [body, flat]}
    tensors = [
        {"name": "flag", "datatype": "BOOL", "shape": [1, 2], "data": body["flag"]},
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": body["ids"]},
        {"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": body["image"]},
    ]
    rows = [{"body": body}, {"body": {"features": flat}}, {"body": v1}, {"body": {"inputs": tensors}}]
    statuses, out = run(handler, ctx, rows)
    assert statuses == [200] * 4, out
    answers = [json.loads(o) for o in out]
    for got in (answers[0], answers[1], *answers[2]["predictions"]):
        assert got["probabilities"] == pytest.approx(want, abs=1e-5)
    v2 = {o["name"]: o for o in answers[3]["outputs"]}
    assert v2["probabilities"]["data"] == pytest.approx(want, abs=1e-5)


def test_oip_binary_tensors_carry_each_input_in_its_dtype(handlers):
    handler, ctx = handlers["mixed"]
    _, one = good_body(seed=3)
    parts = [
        one["image"].numpy().astype("<f4").tobytes(),
        one["ids"].numpy().astype("<i8").tobytes(),
        one["flag"].numpy().astype("?").tobytes(),
    ]
    header = {
        "inputs": [
            {"name": n, "datatype": d, "shape": s, "parameters": {"binary_data_size": len(p)}}
            for n, d, s, p in zip(
                ("image", "ids", "flag"), ("FP32", "INT64", "BOOL"), ([1, 1, 8, 8], [1, 3], [1, 2]), parts
            )
        ]
    }
    head = json.dumps(header).encode()
    rows = [{"body": head + b"".join(parts)}]
    headers = [{"Inference-Header-Content-Length": str(len(head))}]
    statuses, out = run(handler, ctx, rows, headers)
    assert statuses == [200], out
    answer = json.loads(out[0])
    got = {o["name"]: o for o in answer["outputs"]}["probabilities"]["data"]
    assert got == pytest.approx(probabilities(Mixed(), **one), abs=1e-5)


def image_of(pixels: np.ndarray) -> torch.Tensor:
    """What the model sees for 8-bit ``pixels`` [8, 8]."""
    return torch.tensor(pixels, dtype=torch.float32).unsqueeze(0) * SCALE


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_an_image_comes_as_base64_or_raw_bytes(handlers, fmt):
    handler, ctx = handlers["digits"]
    pixels = np.random.default_rng(4).integers(0, 256, (8, 8))
    data = png(pixels, fmt)
    decoded = np.asarray(Image.open(io.BytesIO(data)).convert("L"))  # JPEG is lossy: what the server decodes
    want = probabilities(Digits(), image=image_of(decoded))
    rows = [{"body": {"image": {"b64": base64.b64encode(data).decode()}}}, {"body": bytearray(data)}]
    statuses, out = run(handler, ctx, rows)
    assert statuses == [200, 200], out
    for text in out:
        assert json.loads(text)["probabilities"] == pytest.approx(want, abs=1e-5)


def hostile_mixed() -> list[tuple[dict, str, str]]:
    body, _ = good_body()
    nan_image = json.loads(json.dumps(body["image"]))
    nan_image[0][2][5] = float("nan")
    huge_image = json.loads(json.dumps(body["image"]))
    huge_image[0][1][1] = 10**400  # a JSON integer beyond float64
    return [
        ({**body, "ids": [1, 2, 10]}, "ids[2]", "out_of_vocabulary"),
        ({**body, "ids": [1, 2.5, 3]}, "ids[1]", "not_an_integer"),
        ({**body, "ids": [1, True, 3]}, "ids[1]", "not_an_integer"),
        ({**body, "flag": [1, 0]}, "flag[0]", "not_a_boolean"),
        ({**body, "image": body["image"][0]}, "image", "wrong_shape"),
        ({**body, "image": [body["image"][0][:7]]}, "image[0]", "wrong_shape"),
        ({**body, "image": [nan_image[0]]}, "image[0][2][5]", "non_finite"),
        ({**body, "image": huge_image}, "image[0][1][1]", "out_of_range"),
        ({**body, "image": {"b64": "%%%"}}, "image.b64", "not_base64"),
        ({**body, "image": {"b64": base64.b64encode(b"GIF89a....").decode()}}, "image.b64", "not_an_image"),
        ({k: v for k, v in body.items() if k != "ids"}, "ids", "missing_field"),
        ({"features": [0.5] * 69}, "features[64]", "not_an_integer"),
    ]


@pytest.mark.parametrize(("body", "field", "reason"), hostile_mixed())
def test_a_hostile_input_gets_its_own_400_naming_the_field(handlers, body, field, reason):
    handler, ctx = handlers["mixed"]
    good, _ = good_body()
    statuses, out = run(handler, ctx, [{"body": good}, {"body": body}, {"body": good}])
    assert statuses == [200, 400, 200], out
    error = json.loads(out[1])
    assert error["field"] == field and field.split("[")[0].split(".")[0] in error["error"], error
    assert ctx.get_response_headers(1)["X-Rtserve-Reason"] == reason


@pytest.mark.parametrize(
    ("data", "field", "reason"),
    [
        (lambda: png(np.zeros((9, 8))), "image", "wrong_size"),
        (lambda: png(np.zeros((8, 8, 3)), mode="RGB"), "image", "wrong_channels"),
        (lambda: png(np.zeros((8, 8)))[:40], "image", "bad_image"),
    ],
)
def test_a_bad_image_gets_a_400_naming_size_or_channels(handlers, data, field, reason):
    handler, ctx = handlers["digits"]
    statuses, out = run(handler, ctx, [{"body": bytearray(data())}, {"body": {"image": {"b64": ""}}}])
    assert statuses == [400, 400], out
    error = json.loads(out[0])
    assert error["field"] == field, error
    assert ctx.get_response_headers(0)["X-Rtserve-Reason"] == reason


def test_explanations_attribute_pixels_and_refuse_ids_with_501(handlers):
    handler, ctx = handlers["digits"]
    pixels = np.random.default_rng(5).integers(0, 256, (8, 8))
    headers = [route_headers(explain=True)]
    statuses, out = run(handler, ctx, [{"body": {"image": {"b64": base64.b64encode(png(pixels)).decode()}}}], headers)
    assert statuses == [200], out
    explanation = json.loads(out[0])
    assert len(explanation["attributions"]) == 64 and "image[0,3,4]" in explanation["attributions"]
    mixed, mctx = handlers["mixed"]
    body, _ = good_body()
    statuses, out = run(mixed, mctx, [{"body": body}], headers)
    assert statuses == [501], out
    assert "'ids' (int64), 'flag' (bool) are not float32" in json.loads(out[0])["error"]
