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


# --------------------------------------------------------------------------- sequences


class Tokens(nn.Module):
    """ids [length] (padding 0) and a float pair -> 3 logits; the padding masked, so its answer ignores it."""

    def __init__(self, mean_over_padding: bool = False) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.embed = nn.Embedding(30, 8, padding_idx=0)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.out = nn.Linear(8 + 2 + 1, 3)
        self.mean_over_padding = mean_over_padding

    def forward(self, extra: torch.Tensor, tokens: torch.Tensor, tokens_lengths: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(self.embed(tokens).transpose(1, 2)))
        pooled = h.mean(dim=2) if self.mean_over_padding else h.masked_fill((tokens == 0).unsqueeze(1), 0).amax(dim=2)
        return self.out(torch.cat([pooled, extra, tokens_lengths.unsqueeze(1).float() / 16], dim=1))


def token_rows(n: int, seed: int = 0, longest: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    rows = torch.zeros(n, longest, dtype=torch.long)
    for i, length in enumerate(torch.randint(1, longest + 1, (n,), generator=g).tolist()):
        rows[i, :length] = torch.randint(1, 30, (length,), generator=g)
    return rows


def sequence_inputs(model_rows: int = 200, **options) -> dict:
    tokens = {"rows": token_rows(model_rows), "padding": 0, "max_length": 16, "vocabulary": 30, "lengths": True}
    return {"tokens": {**tokens, **options}, "extra": torch.rand(model_rows, 2)}


@pytest.fixture(scope="module")
def sequence(tmp_path_factory) -> tuple:
    directory = tmp_path_factory.mktemp("sequence")
    export(Tokens(), inputs=sequence_inputs(), labels=LABELS, version="0.1", out_dir=directory)
    ctx = make_context(directory, MODEL_YAML, version="0.1")
    handler = RealTimeHandler()
    handler.initialize(ctx)
    return directory, handler, ctx


def test_a_sequence_is_the_last_input_padded_to_max_length(sequence):
    meta = check(sequence[0])
    assert [spec["name"] for spec in meta.inputs] == ["extra", "tokens"]
    assert meta.inputs[1] == {
        "name": "tokens",
        "dtype": "int64",
        "shape": [-1],
        "vocabulary": 30,
        "max_length": 16,
        "padding": 0,
    }
    assert meta.n_features == 2 + 16 and meta.feature_names[-1] == "tokens[15]"


def test_sequences_of_any_length_in_one_batch_answer_as_each_alone(sequence):
    _, handler, ctx = sequence
    model = Tokens()
    lengths = [1, 3, 16, 2, 7]
    bodies = [
        {"tokens": token_rows(1, seed=s, longest=n)[0].clamp(min=1).tolist(), "extra": [0.2, 0.7]}
        for s, n in enumerate(lengths)
    ]
    statuses, out = run(handler, ctx, [{"body": b} for b in bodies])
    assert statuses == [200] * len(bodies), out
    assert "cut after its longest sequence" in handler.model.forward_path
    for body, text in zip(bodies, out):
        ids = torch.tensor([body["tokens"]])
        with torch.inference_mode():
            want = torch.softmax(model(torch.tensor([body["extra"]]), ids, torch.tensor([ids.shape[1]])), dim=1)
        assert json.loads(text)["probabilities"] == pytest.approx(want[0].tolist(), abs=1e-5)


@pytest.mark.parametrize(
    ("tokens", "field", "reason"),
    [
        ([5] * 17, "tokens", "too_long"),
        ([], "tokens", "wrong_shape"),
        ([5, 30], "tokens[1]", "out_of_vocabulary"),
        ([5, -1], "tokens[1]", "out_of_vocabulary"),
        ([5, 2.5], "tokens[1]", "not_an_integer"),
        ("abc", "tokens", "wrong_shape"),
    ],
)
def test_a_bad_sequence_gets_its_own_400(sequence, tokens, field, reason):
    _, handler, ctx = sequence
    good = {"tokens": [4, 5, 6], "extra": [0.1, 0.2]}
    statuses, out = run(handler, ctx, [{"body": good}, {"body": {**good, "tokens": tokens}}])
    assert statuses == [200, 400], out
    assert json.loads(out[1])["field"] == field
    assert ctx.get_response_headers(1)["X-Rtserve-Reason"] == reason


def test_export_refuses_a_model_whose_answer_depends_on_the_padding(tmp_path):
    with pytest.raises(PackagingError, match="cut after its longest 'tokens'"):
        export(Tokens(mean_over_padding=True), inputs=sequence_inputs(), labels=LABELS, version="1", out_dir=tmp_path)


def test_export_refuses_sequences_longer_than_max_length(tmp_path):
    with pytest.raises(PackagingError, match="rows are 12 long, beyond max_length 8"):
        export(Tokens(), inputs=sequence_inputs(max_length=8), labels=LABELS, version="1", out_dir=tmp_path)


def test_oip_v2_sends_sequences_padded_to_the_batch_s_longest(sequence):
    _, handler, ctx = sequence
    model = Tokens()
    ids = [[4, 5, 6, 0, 0], [7, 8, 9, 10, 11]]
    v2 = {
        "inputs": [
            {"name": "tokens", "datatype": "INT64", "shape": [2, 5], "data": ids},
            {"name": "extra", "datatype": "FP32", "shape": [2, 2], "data": [0.1, 0.2, 0.3, 0.4]},
        ]
    }
    too_long = {
        "inputs": [
            {**v2["inputs"][0], "shape": [1, 17], "data": [4] * 17},
            {**v2["inputs"][1], "shape": [1, 2], "data": [0.1, 0.2]},
        ]
    }
    statuses, out = run(
        handler, ctx, [{"body": v2}, {"body": too_long}], [{"explain": "False"}] * 2
    )  # a KServe REST route
    assert statuses == [200, 400], out
    with torch.inference_mode():
        want = torch.softmax(
            model(torch.tensor([[0.1, 0.2], [0.3, 0.4]]), torch.tensor(ids), torch.tensor([3, 5])), dim=1
        )
    got = {o["name"]: o for o in json.loads(out[0])["outputs"]}["probabilities"]["data"]
    assert got == pytest.approx(want.flatten().tolist(), abs=1e-5)
    assert "L in [1, 16] (rows padded with 0)" in json.loads(out[1])["error"]


# --------------------------------------------------------------------------- drift per input kind


def test_an_image_s_channel_intensity_drifts_when_the_images_fade(artifacts):
    from handler.drift import DriftMonitor, drift_names

    meta = ModelMetadata.load(artifacts["digits"] / "meta.json")
    reference = meta.drift_reference
    assert drift_names(reference) == ["image.intensity[0]"]
    monitor = DriftMonitor(reference, window=200)
    train = mixed_inputs(200)["image"].flatten(1)  # the rows the archive was exported from
    monitor.update(train, torch.zeros(200, dtype=torch.long))
    assert monitor.scores().features[-1] < 0.1
    monitor.update(train * 0.5, torch.zeros(200, dtype=torch.long))
    assert monitor.scores().features[-1] > 1.0


def test_a_sequence_s_length_and_token_shares_drift(sequence):
    from handler.drift import DriftMonitor, drift_names

    meta = ModelMetadata.load(sequence[0] / "meta.json")
    assert drift_names(meta.drift_reference) == ["tokens.length", "tokens.tokens"]
    rows = token_rows(200)
    x = torch.cat([torch.rand(200, 2), torch.nn.functional.pad(rows, (0, 4)).float()], dim=1)
    monitor = DriftMonitor(meta.drift_reference, window=200)
    monitor.update(x, torch.zeros(200, dtype=torch.long))
    length, tokens = monitor.scores().features[-2:]
    assert length < 0.1 and tokens < 0.1, (length, tokens)
    short = x.clone()
    short[:, 4:] = 0  # every sequence two tokens long
    monitor.update(short, torch.zeros(200, dtype=torch.long))
    assert monitor.scores().features[-2] > 1.0
    one_token = x.clone()
    one_token[:, 2:] = torch.where(one_token[:, 2:] != 0, 7.0, 0.0)  # the same length, one token
    monitor.update(one_token, torch.zeros(200, dtype=torch.long))
    length, tokens = monitor.scores().features[-2:]
    assert length < 0.1 and tokens > 1.0, (length, tokens)


def test_a_vocabulary_per_column_refuses_each_column_s_own_ids():
    from handler.errors import InvalidInput
    from handler.inputs import NamedInputs

    (spec,) = specs_from_meta([{"name": "category", "dtype": "int64", "shape": [2], "vocabulary": [3, 2]}])
    named = NamedInputs([spec])
    assert named.row({"category": [2, 1]}, 1e6) == [2, 1]
    for body, field in (
        ({"category": [3, 1]}, "category[0]"),
        ({"category": [0, 2]}, "category[1]"),
        ({"features": [1.0, 2.0]}, "features[1]"),
    ):
        with pytest.raises(InvalidInput) as info:
            named.row(body, 1e6)
        assert info.value.field == field and info.value.reason == "out_of_vocabulary", info.value.message
    with pytest.raises(ConfigError, match="one per column of its last dimension"):
        specs_from_meta([{"name": "category", "dtype": "int64", "shape": [2], "vocabulary": [3, 2, 4]}])
