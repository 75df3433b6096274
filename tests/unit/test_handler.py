"""The handler with a real ts.context.Context, no server."""

from __future__ import annotations

import gc
import json
import math

import pytest
import torch

from handler.errors import ConfigError
from handler.model import ModelMetadata
from handler.rtserve_handler import RealTimeHandler
from tests.helpers import MODEL_YAML, Reference, features, json_row, make_context, raw_row, start_batch

pytestmark = pytest.mark.unit


def run(handler, ctx, rows):
    """Call the handler the way ts.service.Service.predict does; return (statuses, bodies)."""
    start_batch(ctx, len(rows))
    out = handler.handle(rows, ctx)
    assert isinstance(out, list) and len(out) == len(rows)
    statuses = [ctx.get_response_status(i)[0] for i in range(len(rows))]
    for i in range(len(rows)):
        assert ctx.get_response_content_type(i) == "application/json"
    return statuses, [json.loads(o) for o in out]


def test_valid_batch_matches_reference(handler_ctx, trained_dir):
    handler, ctx = handler_ctx
    rows = [features(value=v) for v in (-50.0, 0.0, 3.5, 40.0)]
    statuses, bodies = run(handler, ctx, [json_row({"features": r}) for r in rows])
    assert statuses == [200] * 4
    ref = Reference.demo(trained_dir)
    expected = ref.probabilities(rows)
    for body, probs in zip(bodies, expected):
        assert set(body) == {"prediction", "label", "probabilities", "model_version"}
        assert body["model_version"] == "1.0"
        assert body["prediction"] == int(probs.argmax())
        assert body["label"] == ref.meta.labels[body["prediction"]]
        assert body["probabilities"] == pytest.approx(probs.tolist(), abs=1e-6)
        assert math.isclose(sum(body["probabilities"]), 1.0, abs_tol=1e-5)


def test_bytes_and_text_bodies_are_parsed(handler_ctx):
    handler, ctx = handler_ctx
    payload = json.dumps({"features": features()})
    statuses, _ = run(handler, ctx, [raw_row(payload.encode()), {"data": payload}])
    assert statuses == [200, 200]


BAD = [
    ("not json", raw_row(b"{not json"), "request body is not valid JSON", None),
    ("not utf-8", raw_row(b"\xff\xfe\xfd"), "request body is not valid UTF-8 JSON", None),
    ("empty", raw_row(b"  "), "request body is empty", None),
    ("no body", {}, "request body is empty or not JSON", None),
    ("array", json_row([1, 2]), "request body must be a JSON object with a 'features' field, got array", "features"),
    ("missing", json_row({"x": 1}), "missing required field 'features'", "features"),
    ("not list", json_row({"features": "1,2"}), "'features' must be a list of 32 numbers, got string", "features"),
    ("short", json_row({"features": [1.0] * 31}), "'features' must have exactly 32 numbers, got 31", "features"),
    ("long", json_row({"features": [1.0] * 33}), "'features' must have exactly 32 numbers, got 33", "features"),
    (
        "string",
        json_row({"features": features()[:5] + ["x"] + features()[6:]}),
        "features[5] must be a number, got string",
        "features[5]",
    ),
    (
        "bool",
        json_row({"features": [True] + features()[1:]}),
        "features[0] must be a number, got boolean",
        "features[0]",
    ),
    (
        "null",
        json_row({"features": features()[:31] + [None]}),
        "features[31] must be a number, got null",
        "features[31]",
    ),
    (
        "nested",
        json_row({"features": [[1.0]] + features()[1:]}),
        "features[0] must be a number, got array",
        "features[0]",
    ),
    (
        "nan",
        json_row({"features": [float("nan")] + features()[1:]}),
        "features[0] must be a finite number",
        "features[0]",
    ),
    (
        "inf",
        json_row({"features": features()[:2] + [float("inf")] + features()[3:]}),
        "features[2] must be a finite number",
        "features[2]",
    ),
    ("huge", json_row({"features": [10**400] + features()[1:]}), "features[0] must be in range", "features[0]"),
]


@pytest.mark.parametrize("name,row,message,field", BAD, ids=[b[0] for b in BAD])
def test_each_bad_request_gets_its_own_400(handler_ctx, name, row, message, field):
    handler, ctx = handler_ctx
    statuses, bodies = run(handler, ctx, [row])
    assert statuses == [400]
    assert bodies[0]["error"].startswith(message)
    assert bodies[0].get("field") == field
    phrase = ctx.get_response_status(0)[1]
    assert phrase.startswith(message[:40]) and phrase.isascii() and "\n" not in phrase


def test_mixed_batch_keeps_good_requests(handler_ctx, trained_dir):
    handler, ctx = handler_ctx
    good = [features(value=v) for v in (1.0, -20.0, 60.0)]
    rows = [
        json_row({"features": good[0]}),
        raw_row(b"oops"),
        json_row({"features": good[1]}),
        json_row({"features": [1.0]}),
        json_row({"features": good[2]}),
    ]
    statuses, bodies = run(handler, ctx, rows)
    assert statuses == [200, 400, 200, 400, 200]
    ref = Reference.demo(trained_dir)
    expected = ref.probabilities(good)
    for body, probs in zip([bodies[0], bodies[2], bodies[4]], expected):
        assert body["probabilities"] == pytest.approx(probs.tolist(), abs=1e-6)
    assert "error" in bodies[1] and "error" in bodies[3]


@pytest.mark.parametrize(
    "bad,message",
    [
        (float("nan"), "features[3] must be a finite number"),
        (-1e7, "features[3] must be in range"),
        (10**400, "features[3] must be in range"),
    ],
)
def test_out_of_range_value_fails_only_its_own_request(handler_ctx, trained_dir, bad, message):
    """Types are fine, so these pass the fast checks and are caught by the batch-wide range check."""
    handler, ctx = handler_ctx
    good = [features(value=v) for v in (1.0, -20.0)]
    rows = [
        json_row({"features": good[0]}),
        json_row({"features": features()[:3] + [bad] + features()[4:]}),
        json_row({"features": good[1]}),
    ]
    statuses, bodies = run(handler, ctx, rows)
    assert statuses == [200, 400, 200]
    assert bodies[1]["error"].startswith(message) and bodies[1]["field"] == "features[3]"
    ref = Reference.demo(trained_dir)
    for body, probs in zip([bodies[0], bodies[2]], ref.probabilities(good)):
        assert body["probabilities"] == pytest.approx(probs.tolist(), abs=1e-6)


def test_answers_are_json_dumps_of_the_fields(handler_ctx):
    """The preassembled answer is byte for byte what json.dumps writes."""
    handler, ctx = handler_ctx
    start_batch(ctx, 1)
    out = handler.handle([json_row({"features": features()})], ctx)[0]
    body = json.loads(out)
    assert out == json.dumps(
        {
            "prediction": body["prediction"],
            "label": body["label"],
            "probabilities": body["probabilities"],
            "model_version": "1.0",
        }
    )


def test_all_bad_batch_skips_inference(handler_ctx, monkeypatch):
    """A batch with no valid request never calls the model (counted by a wrapper around the
    loaded program); a valid batch through the same wrapper calls it once."""
    handler, ctx = handler_ctx
    calls = []
    program = handler.model

    def counted(x):
        calls.append(tuple(x.shape))
        return program(x)

    monkeypatch.setattr(handler, "model", counted)
    statuses, bodies = run(handler, ctx, [raw_row(b"x")] * 3)
    assert statuses == [400] * 3 and all("error" in b for b in bodies)
    assert calls == []
    statuses, _ = run(handler, ctx, [json_row({"features": features()})] * 2)
    assert statuses == [200, 200] and calls == [(2, 32)]


@pytest.mark.parametrize("size", [1, 2, 7, 32])
def test_output_length_equals_batch_length(handler_ctx, size):
    handler, ctx = handler_ctx
    rows = [json_row({"features": features()}) if i % 3 else raw_row(b"bad") for i in range(size)]
    statuses, bodies = run(handler, ctx, rows)
    assert len(bodies) == size
    assert statuses == [200 if i % 3 else 400 for i in range(size)]


def test_training_statistics_and_normalization_inside_the_program(handler_ctx, trained_dir):
    """meta.json's statistics are the training rows'; the handler sends raw rows to the program,
    whose first layer standardizes them with those statistics."""
    handler, _ = handler_ctx
    meta = ModelMetadata.load(trained_dir / "meta.json")
    from rtserve.model.data import make_dataset

    x = make_dataset().x_train
    assert meta.stats["mean"] == pytest.approx(x.double().mean(dim=0).tolist(), rel=1e-6)
    assert meta.stats["std"] == pytest.approx(x.double().std(dim=0).tolist(), rel=1e-6)
    assert meta.stats["min"] == pytest.approx(x.min(dim=0).values.tolist())
    norm = Reference.demo(trained_dir).model.norm
    assert norm.mean.tolist() == pytest.approx(meta.stats["mean"], rel=1e-5)
    rows = x[:64]
    with torch.inference_mode():
        assert torch.allclose(handler.model(rows), Reference.demo(trained_dir).model(rows), atol=1e-5)


@pytest.mark.parametrize(
    "handler_cfg,message",
    [
        ({"num_thread": 1}, "unknown handler setting(s): num_thread"),
        ({"num_threads": "2"}, "handler.num_threads must be int"),
        ({"num_threads": 0}, "handler.num_threads must be in [1, 64]"),
        ({"torchscript": True}, "retired handler setting(s): torchscript (TorchScript is deprecated"),
        ({"quantize": False}, "retired handler setting(s): quantize (torch.ao dynamic quantization"),
        ({"feature_limit": -1.0}, "handler.feature_limit must be a positive number"),
    ],
)
def test_bad_config_fails_initialize(trained_dir, handler_cfg, message):
    ctx = make_context(trained_dir, {"handler": handler_cfg})
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")
    ):
        RealTimeHandler().initialize(ctx)


def test_missing_or_corrupt_artifacts_fail_initialize(trained_dir, tmp_path):
    (tmp_path / "meta.json").write_text((trained_dir / "meta.json").read_text())
    with pytest.raises(ConfigError, match="model program not found"):
        RealTimeHandler().initialize(make_context(tmp_path, MODEL_YAML))
    (tmp_path / "model.pt2").write_bytes(b"not a torch file")
    with pytest.raises(ConfigError, match="is not a torch.export archive"):
        RealTimeHandler().initialize(make_context(tmp_path, MODEL_YAML))
    (tmp_path / "meta.json").unlink()
    with pytest.raises(ConfigError, match="model metadata not found"):
        RealTimeHandler().initialize(make_context(tmp_path, MODEL_YAML))


def test_initialize_freezes_what_it_loaded_out_of_later_collections(handler_ctx):
    """torch, the program and the handler are frozen (a full collection would walk them all,
    a stall of tens of ms in every batch then waiting), and full collections are rare."""
    assert gc.get_freeze_count() > 50_000, gc.get_freeze_count()
    assert gc.get_threshold()[2] >= 1000, gc.get_threshold()
