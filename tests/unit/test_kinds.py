"""Output kinds (``rtserve-model/2``): export validation, meta round-trips and the handler's answers per kind.

A multi-label, a regression (one target and two named ones) and an embedding model are exported with
``outputs=``; the handler answers each with the model run in this process (sigmoid or raw) to 1e-5, also
beside a bad request in the same batch, over rtserve's body, KServe v1 and OIP v2. A classifier exported
with ``labels=`` keeps ``rtserve-model/1`` byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from handler.drift import DriftMonitor
from handler.errors import ConfigError
from handler.model import FORMAT, FORMAT_V2, ModelMetadata
from handler.records import Recorder
from handler.rtserve_handler import RealTimeHandler
from handler.signature import output_values
from rtserve.model.package import PackagingError, check, export
from tests.conftest import REPO
from tests.helpers import MODEL_YAML, json_row, make_context, route_headers, start_batch
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


def exported(root: Path, kind: str, **overrides) -> tuple[Path, nn.Module]:
    outputs, width = KINDS[kind]
    model = model_of(width)
    kwargs = dict(feature_names=NAMES, outputs=outputs, version="0.1", out_dir=root / kind)
    kwargs.update(overrides)
    export(model, random_rows(), **kwargs)
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
            {"a": {"kind": "regression"}, "b": {"kind": "embedding"}},
            1,
            "outputs names 2 outputs ('a', 'b'): several outputs are not supported yet",
        ),
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


@pytest.mark.parametrize("kind", list(KINDS))
def test_explain_answers_501_naming_the_kind_and_predictions_still_answer(handlers, kind):
    handler, ctx, _ = handlers[kind]
    rows = random_rows(2).tolist()
    statuses, answers = run(
        handler,
        ctx,
        [json_row({"features": rows[0]}), json_row({"features": rows[1]})],
        [route_headers(True), route_headers(False)],
    )
    assert statuses == [501, 200]
    assert answers[0] == {
        "error": f"explanations are not available for a {handler.output['kind']} model yet: "
        "this server explains classifiers only (Integrated Gradients over one "
        "class's probability); ask /predictions instead"
    }


@pytest.mark.parametrize("kind", ["regression", "multi"])
def test_explain_with_a_target_or_a_protocol_body_answers_501_too(handlers, kind):
    handler, ctx, _ = handlers[kind]
    row = random_rows(1).tolist()[0]
    statuses, answers = run(
        handler,
        ctx,
        [json_row({"features": row, "target": 2}), json_row({"instances": [row]}), json_row({"features": [1.0]})],
        [route_headers(True), {"explain": "True"}, route_headers(True)],
    )
    assert statuses == [501, 501, 400]
    assert answers[0] == answers[1] and answers[0]["error"].startswith("explanations are not available")


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


def test_drift_without_class_shares_scores_the_features_only(artifacts):
    directory, _ = artifacts["regression"]
    monitor = DriftMonitor(ModelMetadata.load(directory / "meta.json").drift_reference, window=50)
    monitor.update(random_rows(60), torch.zeros(60, dtype=torch.long))
    scores = monitor.scores()
    assert scores.prediction == 0.0 and len(scores.features) == 7 and scores.rows == 50


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
