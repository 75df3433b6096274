"""Output kinds (``rtserve-model/2``): export validation, meta round-trips and the handler's answers per kind.

A multi-label, a regression (one target and two named ones) and an embedding model are exported with
``outputs=``; the handler answers each with the model run in this process (sigmoid or raw) to 1e-5, also
beside a bad request in the same batch, over rtserve's body, KServe v1 and OIP v2. A classifier exported
with ``labels=`` keeps ``rtserve-model/1`` byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from handler.drift import DriftMonitor
from handler.errors import ConfigError
from handler.model import FORMAT, FORMAT_V2, ModelMetadata
from handler.records import Recorder
from handler.rtserve_handler import RealTimeHandler
from handler.signature import output_values, target_names
from rtserve.model.package import PackagingError, check, export
from tests.conftest import REPO
from tests.helpers import MODEL_YAML, json_row, make_context, route_headers, start_batch
from tests.unit.test_explain import explain_calls
from tests.unit.test_fuzz import json_values
from tests.unit.test_package import random_model, random_rows

pytestmark = pytest.mark.unit

NAMES = [f"x{i}" for i in range(7)]
MULTI = {"tags": {"kind": "multi_label", "labels": ["w", "x", "y", "z"], "threshold": 0.4}}
REGRESSION = {"score": {"kind": "regression"}}
TWO_TARGETS = {"dose": {"kind": "regression", "targets": ["low", "high"]}}
EMBEDDING = {"vector": {"kind": "embedding"}}
#: A KServe REST route's headers (TorchServe sets ``explain``; no ``url_path``).
REST = {"explain": "False"}
KINDS = {"multi": (MULTI, 4), "regression": (REGRESSION, 1), "two": (TWO_TARGETS, 2), "embedding": (EMBEDDING, 16)}


def model_of(width: int) -> nn.Module:
    return random_model(n_classes=width, seed=width)


def exported(root: Path, kind: str, train_rows: int = 300, **overrides) -> tuple[Path, nn.Module]:
    outputs, width = KINDS[kind]
    model = model_of(width)
    kwargs = dict(feature_names=NAMES, outputs=outputs, version="0.1", out_dir=root / kind)
    kwargs.update(overrides)
    export(model, random_rows(train_rows), **kwargs)
    return Path(kwargs["out_dir"]), model


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("kinds")
    return {kind: exported(root, kind) for kind in KINDS}


def expected(kind: str, model: nn.Module, rows) -> torch.Tensor:
    with torch.inference_mode():
        raw = model(torch.tensor(rows, dtype=torch.float32))
    return torch.sigmoid(raw) if kind == "multi" else raw


# --------------------------------------------------------------------------- export and meta.json


def test_a_classifier_exported_with_labels_keeps_format_1_byte_for_byte(tmp_path):
    export(random_model(), random_rows(), feature_names=NAMES, labels=list("abcde"), version="0.1", out_dir=tmp_path)
    text = (tmp_path / "meta.json").read_text()
    raw = json.loads(text)
    assert raw["format"] == FORMAT and "outputs" not in raw
    meta = ModelMetadata.load(tmp_path / "meta.json")
    assert meta.kind == "classification" and meta.outputs is None
    meta.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text
    assert check(tmp_path).format == FORMAT


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_writes_format_2_with_its_signature_and_golden_outputs(artifacts, kind):
    directory, model = artifacts[kind]
    outputs, width = KINDS[kind]
    ((name, spec),) = outputs.items()
    raw = json.loads((directory / "meta.json").read_text())
    assert raw["format"] == FORMAT_V2
    assert raw["outputs"] == [
        {"name": name, "width": width, **spec, **({"threshold": spec["threshold"]} if "threshold" in spec else {})}
    ]
    assert raw["labels"] == spec.get("labels", [])
    assert "probabilities" not in raw["golden"] and raw["accuracy"] is None
    assert "class_expected" not in raw["drift_reference"]
    assert raw["drift_reference"]["prediction"]["kind"] == spec["kind"]
    golden = torch.tensor(raw["golden"]["outputs"])
    assert torch.allclose(golden, expected(kind, model, raw["golden"]["features"]), atol=1e-6)
    meta = check(directory)  # reloads and replays the golden set per kind
    assert meta.kind == spec["kind"] and meta.output["name"] == name
    meta.save(directory / "again.json")
    assert (directory / "again.json").read_text() == (directory / "meta.json").read_text()


@pytest.mark.parametrize(
    "outputs,width,message",
    [
        (
            {"t": {"kind": "ranking"}},
            1,
            "outputs['t'].kind must be one of classification, multi_label, regression, embedding, got 'ranking'",
        ),
        (
            {"t": {"kind": "multi_label", "labels": ["a", "b"]}},
            3,
            "outputs['t'].labels has 2 entries but the model returns 3 values per row",
        ),
        (
            {"t": {"kind": "multi_label", "labels": ["a", "b"], "threshold": 1.0}},
            2,
            "outputs['t'].threshold must be a number in (0, 1), got 1.0",
        ),
        (
            {"t": {"kind": "multi_label", "labels": ["a", "b"], "threshold": 0}},
            2,
            "outputs['t'].threshold must be a number in (0, 1), got 0",
        ),
        ({"t": {"kind": "multi_label"}}, 2, "outputs['t'].labels is required for a multi_label output"),
        (
            {"t": {"kind": "regression", "targets": ["a", "b"]}},
            3,
            "outputs['t'].targets has 2 entries but the model returns 3 values per row",
        ),
        ({"t": {"kind": "embedding", "labels": ["a"]}}, 2, "outputs['t']: 'labels' is not a key of a embedding"),
        ({"t": {"kind": "classification", "labels": ["a"]}}, 1, "outputs['t'].labels must name at least two"),
        ([1], 1, "outputs must be a dict"),
    ],
)
def test_bad_outputs_are_refused_naming_the_field(tmp_path, outputs, width, message):
    with pytest.raises(PackagingError) as info:
        export(
            model_of(width),
            random_rows(),
            feature_names=NAMES,
            outputs=outputs,
            version="0.1",
            out_dir=tmp_path / "out",
        )
    assert message in str(info.value)
    assert not (tmp_path / "out" / "meta.json").exists()


def export_holdout(out_dir: Path, kind: str, truth, rows: int = 40):
    """Export ``kind``'s model with a holdout of ``rows`` rows and ``truth``; its meta.json."""
    outputs, width = KINDS[kind]
    features = random_rows(rows, seed=9)
    export(
        model_of(width),
        random_rows(),
        feature_names=NAMES,
        outputs=outputs,
        version="0.1",
        out_dir=out_dir,
        holdout=(features, truth),
    )
    return features, json.loads((out_dir / "meta.json").read_text())


def test_a_holdout_keeps_its_truth_per_kind_in_the_golden_set(tmp_path):
    """A regression's targets (floats; a list per row for several), a multi-label's 0/1 rows; an
    embedding keeps the features only. ``model check`` validates them."""
    targets = torch.randn(40, dtype=torch.float64) * 1000
    features, raw = export_holdout(tmp_path / "regression", "regression", targets)
    assert raw["golden"]["features"] == features.tolist() and raw["golden"]["labels"] == targets.tolist()
    assert raw["accuracy"] is None
    assert check(tmp_path / "regression").kind == "regression"

    two = [[float(i), -2.5 * i] for i in range(40)]
    _, raw = export_holdout(tmp_path / "two", "two", two)
    assert raw["golden"]["labels"] == two

    column = targets.reshape(40, 1).numpy()  # [rows, 1] for one target: kept as one number a row
    _, raw = export_holdout(tmp_path / "column", "regression", column)
    assert raw["golden"]["labels"] == targets.tolist()

    tags = (torch.arange(160).reshape(40, 4) % 3 == 0).int().tolist()
    _, raw = export_holdout(tmp_path / "multi", "multi", tags)
    assert raw["golden"]["labels"] == tags and check(tmp_path / "multi").kind == "multi_label"

    _, raw = export_holdout(tmp_path / "embedding", "embedding", [0.0] * 40)
    assert raw["golden"]["labels"] is None
    _, raw = export_holdout(tmp_path / "embedding-none", "embedding", None)
    assert raw["golden"]["labels"] is None


@pytest.mark.parametrize(
    "kind,truth,message",
    [
        ("regression", [1.0, 2.0, 3.0], r"one target per row, got \[40, 7\] and 3 targets"),
        ("regression", [[1.0, 2.0]] * 40, r"holdout targets must be 1 numbers per row .*, got shape \[40, 2\]"),
        ("two", [1.0] * 40, r"holdout targets must be 2 numbers per row .*, got shape \[40\]"),
        ("regression", [float("nan")] + [1.0] * 39, "holdout targets must be finite numbers: row 0 is not"),
        ("regression", ["a"] * 40, "holdout targets must be numbers, one row per holdout row"),
        ("multi", [[0, 1, 2, 0]] + [[0, 1, 0, 0]] * 39, "holdout labels must be 0 or 1 per label: row 0 is not"),
        ("multi", [[0, 1, 0]] * 40, r"holdout labels must be 4 numbers per row .*, got shape \[40, 3\]"),
        ("regression", 7, "holdout targets must be one entry per row"),
    ],
    ids=["rows", "width 1", "width 2", "not finite", "not numbers", "not 0/1", "labels", "not a list"],
)
def test_a_holdout_whose_truth_does_not_fit_the_output_is_refused_naming_it(tmp_path, kind, truth, message):
    with pytest.raises(PackagingError, match=message):
        export_holdout(tmp_path / "out", kind, truth)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_model_check_refuses_golden_labels_that_do_not_fit(artifacts, tmp_path):
    directory, _ = artifacts["two"]
    for name in ("model.pt2", "meta.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    raw = json.loads((tmp_path / "meta.json").read_text())
    raw["golden"]["labels"] = [[1.0, 2.0]] * (len(raw["golden"]["features"]) - 1) + [[1.0]]
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    row = len(raw["golden"]["features"]) - 1
    with pytest.raises(PackagingError) as info:
        check(tmp_path)
    assert f"golden.labels[{row}] must be a list of 2 finite numbers (the targets) for a regression" in str(info.value)


def test_labels_and_outputs_together_or_neither_are_refused(tmp_path):
    for extra in ({}, {"labels": list("abcd"), "outputs": MULTI}):
        with pytest.raises(PackagingError, match="give either labels .* or outputs"):
            export(model_of(4), random_rows(), feature_names=NAMES, version="0.1", out_dir=tmp_path, **extra)


class Infinite(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x[:, :1] > 3, torch.full_like(x[:, :1], float("inf")), x[:, :1])


def test_non_finite_outputs_are_refused(tmp_path):
    with pytest.raises(PackagingError, match="non-finite outputs on training rows .output 'score'"):
        export(Infinite(), random_rows(), feature_names=NAMES, outputs=REGRESSION, version="0.1", out_dir=tmp_path)


def test_a_tampered_signature_is_refused_at_load(artifacts, tmp_path):
    directory, _ = artifacts["multi"]
    raw = json.loads((directory / "meta.json").read_text())
    for field, value, message in (
        ("threshold", 2, "threshold must be a number in .0, 1."),
        ("width", 3, "width must be the number of labels"),
        ("kind", "ranking", "kind must be one of"),
    ):
        bad = json.loads(json.dumps(raw))
        bad["outputs"][0][field] = value
        (tmp_path / "meta.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match=message):
            ModelMetadata.load(tmp_path / "meta.json")
    bad = dict(raw, format=FORMAT)
    (tmp_path / "meta.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="outputs is required in 'rtserve-model/2' and absent"):
        ModelMetadata.load(tmp_path / "meta.json")


def test_a_golden_set_that_differs_fails_check(artifacts, tmp_path):
    directory, _ = artifacts["embedding"]
    for name in ("model.pt2", "meta.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    raw = json.loads((tmp_path / "meta.json").read_text())
    raw["golden"]["outputs"][3][0] += 0.01
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(PackagingError, match=r"differ from the golden set .*rows \[3\]"):
        check(tmp_path)


# --------------------------------------------------------------------------- the handler


class Handlers(dict):
    """(handler, context, eager model) per kind, each initialized when a test first asks for it."""

    def __init__(self, artifacts: dict) -> None:
        super().__init__()
        self.artifacts = artifacts

    def __missing__(self, kind: str) -> tuple:
        directory, model = self.artifacts[kind]
        ctx = make_context(directory, MODEL_YAML, version="0.1")
        handler = RealTimeHandler()
        handler.initialize(ctx)
        self[kind] = (handler, ctx, model)
        return self[kind]


@pytest.fixture(scope="module")
def handlers(artifacts) -> Handlers:
    return Handlers(artifacts)


def run(handler, ctx, rows, headers=None):
    start_batch(ctx, len(rows), headers)
    out = handler.handle(rows, ctx)
    assert isinstance(out, list) and len(out) == len(rows)
    return [ctx.get_response_status(i)[0] for i in range(len(rows))], [json.loads(o) for o in out]


def answer_of(kind: str, values: list[float], output: dict) -> dict:
    """What the handler must answer for one row whose kind's values are ``values``."""
    if kind == "multi":
        return {
            "labels": [lab for lab, p in zip(output["labels"], values) if p >= output["threshold"]],
            "probabilities": dict(zip(output["labels"], values)),
            "model_version": "0.1",
        }
    if kind in ("regression", "two"):
        return {"prediction": values[0] if len(values) == 1 else values, "model_version": "0.1"}
    return {"embedding": values, "model_version": "0.1"}


@pytest.mark.parametrize("kind", list(KINDS))
def test_answers_equal_the_model_in_process_beside_a_bad_request(handlers, kind):
    handler, ctx, model = handlers[kind]
    rows = random_rows(4).tolist()
    body = [
        json_row({"features": rows[0]}),
        json_row({"features": [1.0, 2.0]}),
        json_row({"features": rows[1]}),
        json_row({"features": rows[2]}),
    ]
    statuses, answers = run(handler, ctx, body)
    assert statuses == [200, 400, 200, 200]
    assert answers[1]["error"] == "'features' must have exactly 7 numbers, got 2"
    want = expected(kind, model, [rows[0], rows[1], rows[2]])
    for got, values in zip([answers[0], answers[2], answers[3]], want.tolist()):
        reference = answer_of(kind, values, handler.output)
        assert set(got) == set(reference)
        assert output_values(handler.output, got) == pytest.approx(output_values(handler.output, reference), abs=1e-5)
        if kind == "multi":
            assert got["labels"] == reference["labels"]


def test_a_multi_label_answer_is_sigmoid_not_softmax(handlers):
    handler, ctx, model = handlers["multi"]
    row = random_rows(1).tolist()[0]
    _, (got,) = run(handler, ctx, [json_row({"features": row})])
    probabilities = list(got["probabilities"].values())
    softmax = torch.softmax(model(torch.tensor([row])), dim=1)[0].tolist()
    assert probabilities != pytest.approx(softmax, abs=1e-3)
    assert probabilities == pytest.approx(torch.sigmoid(model(torch.tensor([row])))[0].tolist(), abs=1e-5)


@pytest.mark.parametrize("kind", list(KINDS))
def test_kserve_v1_and_oip_v2_carry_the_kinds_output(handlers, kind):
    handler, ctx, model = handlers[kind]
    rows = random_rows(3).tolist()
    want = expected(kind, model, rows).tolist()
    name, width = handler.output["name"], handler.output["width"]
    v2 = {"id": "r1", "inputs": [{"name": "features", "datatype": "FP32", "shape": [3, 7], "data": rows}]}
    bad_output = {**v2, "outputs": [{"name": "probabilities"}]}
    statuses, (v1_answer, v2_answer, refused) = run(
        handler, ctx, [json_row({"instances": rows}), json_row(v2), json_row(bad_output)], [REST] * 3
    )
    assert statuses == [200, 200, 400]
    assert [output_values(handler.output, a) for a in v1_answer["predictions"]] == [
        pytest.approx(w, abs=1e-5) for w in want
    ]
    (tensor,) = v2_answer["outputs"]
    assert (tensor["name"], tensor["datatype"], tensor["shape"]) == (name, "FP32", [3, width])
    assert tensor["data"] == pytest.approx([v for w in want for v in w], abs=1e-5)
    assert v2_answer["id"] == "r1" and v2_answer["model_version"] == "0.1"
    assert refused["error"] == f"outputs[0].name must be one of '{name}', got 'probabilities'"


# --------------------------------------------------------------------------- explanations

#: The kinds with explanations, and the request headers of each route.
EXPLAINED = ("multi", "regression", "two")
PREDICT, EXPLAIN = route_headers(False), route_headers(True)
#: Attributions and values agree with Captum run directly to this (absolute; the handler's batched pass
#: over the exported program and Captum's single-row pass over the eager model differ in float32 rounding).
ATOL = 1e-5
#: The start of the 400 a bad ``target`` gets, per kind.
BAD_TARGET = {
    "multi": "'target' must be a label index, an integer in [0, 3], or a label name ('w', 'x', 'y', 'z')",
    "regression": "'target' must be a target index, an integer in [0, 0], or a target name ('score')",
    "two": "'target' must be a target index, an integer in [0, 1], or a target name ('low', 'high')",
}
EMBEDDING_501 = (
    "explanations are not available for an embedding model: it has no single scalar output to attribute "
    "(an embedding's numbers mean something only together); ask /predictions instead"
)


def captum(kind: str, model: nn.Module, mean: list[float], row: list[float], target: int) -> tuple:
    """Captum run directly on the eager model's explained value for one row alone.

    Returns (attributions, convergence delta, the value at ``row``, the value at the baseline).
    """
    from captum.attr import IntegratedGradients

    def forward(x: torch.Tensor) -> torch.Tensor:
        raw = model(x)
        return torch.sigmoid(raw) if kind == "multi" else raw

    x, base = torch.tensor([row]), torch.tensor([mean])
    attributions, delta = IntegratedGradients(forward).attribute(
        x, baselines=base, target=target, n_steps=50, return_convergence_delta=True
    )
    with torch.no_grad():
        values = forward(torch.cat([x, base]))[:, target].tolist()
    return attributions[0].tolist(), float(delta[0]), values[0], values[1]


def assert_explains(handler, model: nn.Module, kind: str, body: dict, row: list[float], target: int) -> None:
    """``body`` explains ``target`` as Captum does, completely, and carries the row's prediction."""
    attributions, delta, value, baseline = captum(kind, model, handler.meta.mean, row, target)
    key = "probability" if kind == "multi" else "value"
    prediction = answer_of(kind, expected(kind, model, [row])[0].tolist(), handler.output)
    assert set(body) == {
        "target",
        "label",
        "attributions",
        "baseline",
        f"target_{key}",
        f"baseline_{key}",
        "convergence_delta",
        "method",
        "n_steps",
    } | set(prediction)
    assert body["target"] == target and body["label"] == target_names(handler.output)[target]
    assert list(body["attributions"]) == NAMES
    assert list(body["attributions"].values()) == pytest.approx(attributions, abs=ATOL)
    assert list(body["baseline"].values()) == pytest.approx(handler.meta.mean, rel=1e-6)
    assert body[f"target_{key}"] == pytest.approx(value, abs=ATOL)
    assert body[f"baseline_{key}"] == pytest.approx(baseline, abs=ATOL)
    assert body["convergence_delta"] == pytest.approx(delta, abs=ATOL)
    # completeness: the attributions share out (value - baseline value), up to the delta
    total = sum(body["attributions"].values())
    assert total - (body[f"target_{key}"] - body[f"baseline_{key}"]) == pytest.approx(
        body["convergence_delta"], abs=ATOL
    )
    assert abs(body["convergence_delta"]) < 0.01 * max(1.0, abs(value - baseline))
    assert (body["method"], body["n_steps"]) == ("integrated_gradients", 50)
    assert output_values(handler.output, body) == pytest.approx(output_values(handler.output, prediction), abs=ATOL)


@pytest.mark.parametrize("kind", EXPLAINED)
def test_explanations_equal_captum_for_a_target_by_index_by_name_and_by_default(handlers, kind, monkeypatch):
    handler, ctx, model = handlers[kind]
    calls = explain_calls(monkeypatch, handler)
    names = target_names(handler.output)
    last = len(names) - 1
    rows = random_rows(3, seed=11).tolist()
    bodies = [
        {"features": rows[0], "target": last},
        {"features": rows[1], "target": names[last]},
        {"features": rows[2]},
    ]
    statuses, answers = run(handler, ctx, [json_row(b) for b in bodies], [EXPLAIN] * 3)
    assert statuses == [200, 200, 200]
    assert calls == [3], "the batch's explanations share one Captum call"
    # the default: the label of the highest probability (multi-label), the first target (regression)
    default = int(expected(kind, model, rows[2:])[0].argmax()) if kind == "multi" else 0
    for body, row, target in zip(answers, rows, [last, last, default]):
        assert_explains(handler, model, kind, body, row, target)


BAD_TARGETS = [
    ("multi", 4, "got 4"),
    ("multi", -1, "got -1"),
    ("multi", "v", "got 'v'"),
    ("multi", "W", "got 'W'"),
    ("multi", 1.0, "got number"),
    ("multi", True, "got boolean"),
    ("multi", None, "got null"),
    ("regression", 1, "got 1"),
    ("regression", "low", "got 'low'"),
    ("two", 2, "got 2"),
    ("two", "mid", "got 'mid'"),
    ("two", ["low"], "got array"),
    ("two", 10**30, "got 1000000000000000000000000000000"),
]


@pytest.mark.parametrize("kind,target,got", BAD_TARGETS)
def test_a_bad_target_gets_its_own_400_naming_target(handlers, kind, target, got):
    handler, ctx, _ = handlers[kind]
    row = random_rows(1, seed=12).tolist()[0]
    statuses, answers = run(
        handler, ctx, [json_row({"features": row, "target": target}), json_row({"features": row})], [EXPLAIN] * 2
    )
    assert statuses == [400, 200]
    assert answers[0] == {"error": f"{BAD_TARGET[kind]}, {got}", "field": "target"}
    assert ctx.get_response_status(0)[1].startswith("'target' must be a")
    assert "attributions" in answers[1]


@pytest.mark.parametrize("kind", ["multi", "two"])
def test_a_mixed_batch_is_answered_per_request(handlers, kind, monkeypatch):
    handler, ctx, model = handlers[kind]
    calls = explain_calls(monkeypatch, handler)
    rows = random_rows(6, seed=13).tolist()
    name = target_names(handler.output)[1]
    v2 = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 7], "data": rows[4:6]}]}
    requests = [
        (PREDICT, {"features": rows[0]}),
        (EXPLAIN, {"features": rows[1], "target": name}),
        (EXPLAIN, {"features": [1.0, 2.0]}),
        (EXPLAIN, {"features": rows[2], "target": 99}),
        (PREDICT, {"features": rows[3], "target": 99}),  # a prediction ignores 'target'
        ({"explain": "True"}, {"instances": [rows[0]]}),  # KServe's :explain route with a v1 body
        (REST, v2),
        (EXPLAIN, {"features": rows[3]}),
        ({}, {"features": rows[2]}),  # no explain header (gRPC): a prediction
    ]
    statuses, answers = run(handler, ctx, [json_row(b) for _, b in requests], [h for h, _ in requests])
    assert statuses == [200, 200, 400, 400, 200, 400, 200, 200, 200]
    assert calls == [2]
    want = expected(kind, model, rows).tolist()
    for idx, row in ((0, 0), (4, 3), (8, 2)):
        reference = answer_of(kind, want[row], handler.output)
        assert set(answers[idx]) == set(reference)
        assert output_values(handler.output, answers[idx]) == pytest.approx(want[row], abs=1e-5)
    assert_explains(handler, model, kind, answers[1], rows[1], 1)
    default = int(torch.tensor(want[3]).argmax()) if kind == "multi" else 0
    assert_explains(handler, model, kind, answers[7], rows[3], default)
    assert answers[2] == {"error": "'features' must have exactly 7 numbers, got 2", "field": "features"}
    assert answers[3] == {"error": f"{BAD_TARGET[kind]}, got 99", "field": "target"}
    assert answers[5] == {"error": 'explanations take a {"features": [...]} body, not a KServe v1/v2 request'}
    (tensor,) = answers[6]["outputs"]
    assert tensor["data"] == pytest.approx([v for w in want[4:6] for v in w], abs=1e-5)


def test_explanations_past_the_ceiling_get_503_and_predictions_are_kept(handlers, monkeypatch):
    handler, ctx, _ = handlers["regression"]
    limit = handler.config.explain_max_per_batch
    calls = explain_calls(monkeypatch, handler)
    rows = random_rows(limit + 2, seed=14).tolist()
    statuses, answers = run(
        handler, ctx, [json_row({"features": row}) for row in rows], [PREDICT] + [EXPLAIN] * (limit + 1)
    )
    assert statuses == [200] * (limit + 1) + [503]
    assert calls == [limit]
    assert set(answers[0]) == {"prediction", "model_version"} and "attributions" in answers[limit]
    assert "explain_max_per_batch" in answers[-1]["error"]


valid_row = st.lists(st.floats(-1e3, 1e3, allow_nan=False) | st.integers(-1000, 1000), min_size=7, max_size=7)
hostile_targets = st.one_of(
    st.integers(-2, 5), st.integers(), st.sampled_from(["w", "x", "y", "z", "W", "", "zz"]), json_values
)
hostile_bodies = st.one_of(
    st.tuples(valid_row, hostile_targets).map(lambda t: {"features": t[0], "target": t[1]}),
    valid_row.map(lambda f: {"features": f}),
    st.lists(st.floats(-1e3, 1e3), max_size=9).map(lambda f: {"features": f}),  # mostly wrong lengths
    valid_row.map(lambda f: {"instances": [f]}),  # a KServe v1 body
)


def hostile_oracle(body: dict, explain: bool) -> int:
    """The status a multi-label request must get (independent of handler code), before the ceiling."""
    features = body.get("features")
    if features is None:
        return 400 if explain else 200  # explanations take {"features": [...]} only
    if len(features) != 7 or any(f != f for f in features):
        return 400
    target = body.get("target", 0)
    valid = (type(target) is int and 0 <= target < 4) or (type(target) is str and target in "wxyz" and len(target) == 1)
    return 200 if valid or not explain else 400


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(st.tuples(hostile_bodies, st.booleans()), min_size=1, max_size=8))
def test_hostile_multi_label_explain_batches_get_answers_or_their_own_errors(handlers, batch):
    handler, ctx, _ = handlers["multi"]
    headers = [EXPLAIN if explain else PREDICT for _, explain in batch]
    headers = [h if "instances" not in b else {"explain": str(e)} for h, (b, e) in zip(headers, batch)]
    start_batch(ctx, len(batch), headers)
    out = handler.handle([json_row(b) for b, _ in batch], ctx)
    assert len(out) == len(batch)
    explained = 0
    for idx, ((body, explain), text) in enumerate(zip(batch, out)):
        status = ctx.get_response_status(idx)[0]
        answer = json.loads(text)
        json.dumps(answer, allow_nan=False)
        want = hostile_oracle(body, explain)
        if want == 200 and explain:
            explained += 1
            if explained > handler.config.explain_max_per_batch:
                want = 503
        assert status == want, (body, explain, answer)
        if status == 400:
            assert answer["error"]
        elif status == 200 and explain:
            total = sum(answer["attributions"].values())
            gap = answer["target_probability"] - answer["baseline_probability"]
            assert abs(total - gap - answer["convergence_delta"]) < 1e-4


def test_an_embedding_explanation_answers_501_saying_why_and_predictions_still_answer(handlers):
    handler, ctx, model = handlers["embedding"]
    assert handler.explainer is None
    rows = random_rows(2, seed=15).tolist()
    statuses, answers = run(
        handler,
        ctx,
        [
            json_row({"features": rows[0]}),
            json_row({"features": rows[1]}),
            json_row({"features": rows[0], "target": 3}),
            json_row({"instances": [rows[1]]}),
            json_row({"features": [1.0]}),
        ],
        [EXPLAIN, PREDICT, EXPLAIN, {"explain": "True"}, EXPLAIN],
    )
    assert statuses == [501, 200, 501, 501, 400]
    assert answers[0] == answers[2] == answers[3] == {"error": EMBEDDING_501}
    assert answers[1]["embedding"] == pytest.approx(expected("embedding", model, rows[1:])[0].tolist(), abs=1e-5)
    assert answers[4]["field"] == "features"


def test_records_carry_the_kinds_answer(handlers, tmp_path):
    handler, ctx, _ = handlers["regression"]

    class Spool:
        directory, budget, lines = tmp_path, 1 << 20, []

        def append(self, data: bytes) -> bool:
            self.lines += data.decode().splitlines()
            return True

    spool = Spool()
    recorder = Recorder(spool, "m", "0.1", [], kind="regression")
    handler.recorder, before = recorder, handler.recorder
    try:
        rows = random_rows(2).tolist()
        _, answers = run(
            handler,
            ctx,
            [json_row({"features": rows[0]}), json_row({"features": [1.0]})],
            [route_headers(False), route_headers(False)],
        )
    finally:
        handler.recorder = before
    good, bad = (json.loads(line) for line in spool.lines)
    assert good["event"] == "prediction" and good["kind"] == "regression" and "class" not in good
    assert good["answer"] == answers[0] and good["status"] == 200
    assert bad["event"] == "rejected" and bad["status"] == 400


# --------------------------------------------------------------------------- drift

WINDOW = 400
#: Two training standard deviations (5) on every feature, in a direction that moves each model's outputs
#: (the embedding network's first tanh saturates on the positive side: rows shifted up barely move its
#: vectors, so their drift rightly stays low, while the inputs' drift is high).
SHIFT = {"multi": 10.0, "regression": 10.0, "two": 10.0, "embedding": -10.0}


@pytest.fixture(scope="module")
def drift_artifacts(tmp_path_factory) -> dict:
    """Each kind exported from 4,000 training rows: a reference whose deciles are not noise themselves."""
    root = tmp_path_factory.mktemp("drift")
    return {kind: exported(root, kind, train_rows=4000) for kind in KINDS}


def drift_handler(directory: Path) -> tuple:
    """A handler with a small drift window whose exports the test makes (its thread waits an hour)."""
    cfg = {
        **MODEL_YAML,
        "handler": {
            **MODEL_YAML["handler"],
            "drift_window": WINDOW,
            "drift_flush_rows": 16,
            "drift_export_seconds": 3600,
        },
    }
    ctx = make_context(directory, cfg, version="0.1")
    handler = RealTimeHandler()
    handler.initialize(ctx)
    return handler, ctx


def send(handler, ctx, rows: torch.Tensor) -> None:
    """``rows`` as /predictions requests in batches of 32; then the export the worker's thread makes."""
    for start in range(0, len(rows), 32):
        statuses, _ = run(handler, ctx, [json_row({"features": r}) for r in rows[start : start + 32].tolist()])
        assert set(statuses) == {200}
    assert handler.telemetry.export_drift()


def gauge(handler, name: str, **labels) -> float | None:
    ids = {"model_name": "realtime-classifier", "model_version": "0.1", **labels}
    return handler.telemetry.metrics.registry.get_sample_value(name, ids)


@pytest.mark.parametrize("kind", list(KINDS))
def test_prediction_drift_stays_low_on_training_like_rows_and_moves_when_the_inputs_shift(drift_artifacts, kind):
    directory, model = drift_artifacts[kind]
    handler, ctx = drift_handler(directory)
    try:
        calm = random_rows(WINDOW, seed=16)  # the training rows' distribution, rows it never saw
        send(handler, ctx, calm)
        low = gauge(handler, "rtserve_prediction_drift_psi")
        shifted = calm + SHIFT[kind]
        send(handler, ctx, shifted)
        high = gauge(handler, "rtserve_prediction_drift_psi")
        assert low < 0.1 and high > 0.2, (low, high)
        # the very score of the window computed here, on the model's own answers
        monitor = DriftMonitor(handler.meta.drift_reference, WINDOW)
        monitor.update(shifted, expected(kind, model, shifted.tolist()))
        assert high == pytest.approx(round(monitor.scores().prediction, 6), abs=1e-5)
        assert gauge(handler, "rtserve_feature_drift_psi", feature="x0") > 0.2  # the inputs' drift too
    finally:
        handler.telemetry.close()


def test_an_archive_without_the_predictions_reference_loads_and_scores_the_features_only(artifacts, tmp_path):
    """An rtserve-model/2 archive exported before the predictions' reference existed."""
    directory, _ = artifacts["regression"]
    (tmp_path / "model.pt2").write_bytes((directory / "model.pt2").read_bytes())
    raw = json.loads((directory / "meta.json").read_text())
    del raw["drift_reference"]["prediction"]
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    handler, ctx = drift_handler(tmp_path)
    try:
        send(handler, ctx, random_rows(WINDOW, seed=17) + 10.0)
        assert gauge(handler, "rtserve_prediction_drift_psi") is None  # not scored: no series
        assert gauge(handler, "rtserve_feature_drift_psi", feature="x0") > 0.2
    finally:
        handler.telemetry.close()


@pytest.mark.parametrize(
    "kind,change,message",
    [
        (
            "multi",
            lambda r: r["prediction"].update(kind="regression"),
            "drift_reference.prediction.kind must be 'multi_label' (the output's kind), got 'regression'",
        ),
        (
            "two",
            lambda r: r["prediction"]["edges"].pop(),
            "drift_reference.prediction.edges must hold 2 lists (one per target) of equally many sorted finite numbers",
        ),
        (
            "multi",
            lambda r: r["prediction"]["edges"][0].append(0.9),
            "drift_reference.prediction.edges must hold 4 lists (one per label) of 1 sorted finite numbers",
        ),
        (
            "regression",
            lambda r: r["prediction"]["expected"][0].__setitem__(0, 2.0),
            "drift_reference.prediction.expected must hold 1 lists (one per target) of 10 shares in [0, 1]",
        ),
        (
            "embedding",
            lambda r: r["prediction"].pop("center"),
            "drift_reference.prediction.center must hold 16 finite numbers (the training mean embedding)",
        ),
        (
            "embedding",
            lambda r: r["prediction"]["edges"][0].reverse(),
            "drift_reference.prediction.edges must hold 1 lists (one per distance to the center) of equally many",
        ),
        ("embedding", lambda r: r.update(prediction=[1]), "drift_reference.prediction must be an object"),
        (
            "regression",
            lambda r: r.update(class_expected=[1.0]),
            "drift_reference.class_expected must hold one share per class (1), for a classifier only",
        ),
        (
            "regression",
            lambda r: r["edges"].pop(),
            "drift_reference.edges must hold 7 lists (one per feature) of equally many sorted finite numbers",
        ),
        ("regression", lambda r: r["expected"][3].append(0.0), "drift_reference.expected must hold 7 lists"),
    ],
)
def test_a_tampered_drift_reference_is_refused_at_load_naming_the_field(artifacts, tmp_path, kind, change, message):
    directory, _ = artifacts[kind]
    raw = json.loads((directory / "meta.json").read_text())
    change(raw["drift_reference"])
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=re.escape(f"meta.json: {message}")):
        ModelMetadata.load(tmp_path / "meta.json")


def test_a_classifier_refuses_a_prediction_block_and_keeps_class_shares(tmp_path):
    export(random_model(), random_rows(), feature_names=NAMES, labels=list("abcde"), version="0.1", out_dir=tmp_path)
    raw = json.loads((tmp_path / "meta.json").read_text())
    assert "prediction" not in raw["drift_reference"] and len(raw["drift_reference"]["class_expected"]) == 5
    raw["drift_reference"]["prediction"] = {"kind": "classification", "edges": [[0.5]], "expected": [[0.5, 0.5]]}
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"drift_reference\.prediction must be an object, for an output that is not"):
        ModelMetadata.load(tmp_path / "meta.json")


PACKAGING = """
import torch
from torch import nn


def packaging():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(100, 3, generator=g)
    return {
        "model": nn.Linear(3, 2),
        "train_features": x,
        "feature_names": ["a", "b", "c"],
        "outputs": {"dose": {"kind": "regression", "targets": ["low", "high"]}},
        "holdout": (x[:10], torch.zeros(10, 2)),
    }
"""


def test_the_command_line_takes_a_packaging_outputs_key(tmp_path, monkeypatch):
    (tmp_path / "kinds_packaging.py").write_text(PACKAGING)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtserve",
            "model",
            "export",
            "kinds_packaging:packaging",
            "--version",
            "1.0",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    meta = ModelMetadata.load(tmp_path / "out" / "meta.json")
    assert (meta.format, meta.outputs) == (
        FORMAT_V2,
        [{"name": "dose", "kind": "regression", "targets": ["low", "high"], "width": 2}],
    )
    assert len(meta.golden["outputs"]) == 10
