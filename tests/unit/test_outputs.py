"""Models with several outputs (``rtserve-model/2``): export, ``meta.json``, ``model check`` and the answers.

A network with four heads, one of each kind, returns a tuple in the signature's order or a dict by name;
``export`` wraps it in ``FlatOutputs`` so the program returns every output's columns side by side, and
``meta.json`` lists each output with its width in that column order. The golden set records what every
output's answer carries (softmax per classification, sigmoid per multi-label), the holdout's truth,
accuracy and drift reference are the first output's. The handler answers each output by name over
rtserve's body, KServe v1 and OIP v2 (JSON and binary), equal to the eager model to 1e-5. The warm-up,
``model check`` and the gate's golden replay check every output; the gate's comparison, the live
evidence, metrics, records and drift follow the first output.
"""

from __future__ import annotations

import json
import logging
import re
import zipfile
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from handler.drift import DriftMonitor
from handler.errors import ConfigError
from handler.model import FORMAT_V2, ModelMetadata, answer_columns
from handler.records import Recorder
from handler.rtserve_handler import RealTimeHandler
from rtserve.cli.model import cmd_check
from rtserve.client.rest import Client
from rtserve.errors import GoldenMismatch, WarmupError, WrongAnswers
from rtserve.model.package import FlatOutputs, PackagingError, check, export
from rtserve.promotion.gate import ArchiveMeta, GateConfig, comparison
from rtserve.promotion.kinds import answer_value, regression_scale
from rtserve.promotion.live.evidence import archive_compare
from rtserve.promotion.measure import check_golden
from rtserve.server.oip import read_archive as oip_read_archive
from rtserve.server.warmup import Rows, _Sender
from tests.helpers import MODEL_YAML, json_row, make_context, route_headers, start_batch
from tests.unit.test_kinds import WINDOW, drift_handler
from tests.unit.test_package import random_rows

pytestmark = pytest.mark.unit

NAMES = [f"x{i}" for i in range(7)]
#: One output of each kind, in column order; widths 3, 2, 2 and 4.
OUTPUTS = {
    "digit": {"kind": "classification", "labels": ["zero", "one", "two"]},
    "tags": {"kind": "multi_label", "labels": ["red", "blue"], "threshold": 0.4},
    "score": {"kind": "regression", "targets": ["low", "high"]},
    "vector": {"kind": "embedding"},
}
WIDTHS = {"digit": 3, "tags": 2, "score": 2, "vector": 4}


class Heads(nn.Module):
    """One body, a head per output: a tuple in ``OUTPUTS``' order, or a dict (in reverse order, by name)."""

    def __init__(self, as_dict: bool = False, widths: dict | None = None, seed: int = 5) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.as_dict = as_dict
        self.body = nn.Sequential(nn.Linear(7, 24), nn.Tanh(), nn.Linear(24, 24), nn.GELU())
        self.heads = nn.ModuleDict({name: nn.Linear(24, w) for name, w in (widths or WIDTHS).items()})

    def forward(self, x: torch.Tensor):
        h = self.body(x)
        out = {name: head(h) for name, head in self.heads.items()}
        return dict(reversed(list(out.items()))) if self.as_dict else tuple(out.values())


def eager(model: nn.Module, rows, outputs: dict = OUTPUTS) -> dict[str, torch.Tensor]:
    """What each output's answer carries for ``rows``, computed here from the eager model."""
    with torch.inference_mode():
        out = model(torch.as_tensor(rows, dtype=torch.float32))
    parts = out if isinstance(out, dict) else dict(zip(outputs, out))
    activation = {"classification": lambda t: torch.softmax(t, dim=1), "multi_label": torch.sigmoid}
    return {name: activation.get(spec["kind"], lambda t: t)(parts[name]) for name, spec in outputs.items()}


def export_heads(out_dir: Path, model: nn.Module | None = None, outputs: dict = OUTPUTS, **overrides) -> dict:
    """Export ``model`` (default: the tuple heads) with ``outputs``; its meta.json as written."""
    kwargs = dict(feature_names=NAMES, outputs=outputs, version="0.1", out_dir=out_dir, **overrides)
    export(model or Heads(), random_rows(), **kwargs)
    return json.loads((Path(out_dir) / "meta.json").read_text())


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> tuple[Path, nn.Module]:
    """The tuple heads exported with a holdout: truth for the first output (class indices)."""
    directory = tmp_path_factory.mktemp("outputs") / "heads"
    model = Heads()
    export_heads(directory, model, holdout=(random_rows(40, seed=9), torch.arange(40) % 3))
    return directory, model


def copy(directory: Path, to: Path) -> dict:
    """Copy an artifact directory; its meta.json."""
    for name in ("model.pt2", "meta.json"):
        (to / name).write_bytes((directory / name).read_bytes())
    return json.loads((to / "meta.json").read_text())


# --------------------------------------------------------------------------- export and meta.json


def test_several_outputs_are_listed_with_their_widths_in_column_order(heads):
    directory, model = heads
    raw = json.loads((directory / "meta.json").read_text())
    assert raw["format"] == FORMAT_V2
    assert raw["outputs"] == [{"name": name, **spec, "width": WIDTHS[name]} for name, spec in OUTPUTS.items()]
    assert raw["labels"] == ["zero", "one", "two"]  # the first output's
    meta = check(directory)  # the handler's loader, then every output's golden values replayed
    assert [out["name"] for out in meta.signature] == list(OUTPUTS) and meta.output["name"] == "digit"


def test_the_golden_set_records_every_outputs_answer_side_by_side(heads):
    directory, model = heads
    raw = json.loads((directory / "meta.json").read_text())
    golden = raw["golden"]
    assert "probabilities" not in golden and len(golden["outputs"][0]) == sum(WIDTHS.values())
    want = eager(model, golden["features"])
    got = torch.tensor(golden["outputs"])
    start = 0
    for name, width in WIDTHS.items():
        assert torch.allclose(got[:, start : start + width], want[name], atol=1e-6), name
        start += width
    digit = got[:, :3]
    assert torch.allclose(digit.sum(dim=1), torch.ones(len(digit)), atol=1e-6)  # softmax over its own columns


def test_the_first_output_gives_the_truth_accuracy_and_drift_reference(heads):
    directory, model = heads
    raw = json.loads((directory / "meta.json").read_text())
    truth = (torch.arange(40) % 3).tolist()
    assert raw["golden"]["labels"] == truth
    predicted = eager(model, raw["golden"]["features"])["digit"].argmax(dim=1)
    assert raw["accuracy"] == pytest.approx(float((predicted == torch.tensor(truth)).float().mean()), abs=1e-6)
    reference = raw["drift_reference"]
    assert len(reference["class_expected"]) == 3 and "prediction" not in reference


def test_a_first_output_of_another_kind_keeps_its_own_prediction_reference(tmp_path):
    outputs = {"score": OUTPUTS["score"], "digit": OUTPUTS["digit"]}
    model = Heads(as_dict=True, widths={"score": 2, "digit": 3})
    targets = torch.randn(40, 2, dtype=torch.float64)
    raw = export_heads(tmp_path, model, outputs, holdout=(random_rows(40, seed=9), targets))
    assert raw["labels"] == [] and raw["accuracy"] is None
    assert raw["golden"]["labels"] == targets.tolist()
    reference = raw["drift_reference"]
    assert "class_expected" not in reference and reference["prediction"]["kind"] == "regression"
    assert len(reference["prediction"]["edges"]) == 2  # one per target of the first output
    assert check(tmp_path).kind == "regression"


def test_a_dict_by_name_and_a_tuple_in_order_export_the_same_program(heads, tmp_path):
    directory, _ = heads
    raw = export_heads(tmp_path, Heads(as_dict=True), holdout=(random_rows(40, seed=9), torch.arange(40) % 3))
    assert raw["outputs"] == json.loads((directory / "meta.json").read_text())["outputs"]
    want = json.loads((directory / "meta.json").read_text())["golden"]["outputs"]
    assert torch.allclose(torch.tensor(raw["golden"]["outputs"]), torch.tensor(want), atol=1e-6)


def test_flat_outputs_concatenates_in_signature_order():
    rows = random_rows(5)
    flat = FlatOutputs(Heads(as_dict=True), list(OUTPUTS))(rows)
    parts = Heads()(rows)
    assert torch.equal(flat, torch.cat(parts, dim=1))


def test_answer_columns_transforms_each_outputs_own_columns():
    raw = torch.randn(6, 11)
    signature = [{"name": n, "kind": s["kind"], "width": WIDTHS[n]} for n, s in OUTPUTS.items()]
    got = answer_columns(signature, raw)
    assert torch.allclose(got[:, :3], torch.softmax(raw[:, :3], dim=1))
    assert torch.allclose(got[:, 3:5], torch.sigmoid(raw[:, 3:5]))
    assert torch.equal(got[:, 5:], raw[:, 5:])


class Shaped(nn.Module):
    """Returns what ``make(x)`` builds: refusals of outputs that do not fit the signature."""

    def __init__(self, make) -> None:
        super().__init__()
        self.make = make
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor):
        return self.make(x * self.scale)


def cols(x: torch.Tensor, width: int) -> torch.Tensor:
    return x[:, :1].repeat(1, width)


TWO = {"digit": OUTPUTS["digit"], "vector": OUTPUTS["vector"]}


@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda x: (cols(x, 3), cols(x, 4), cols(x, 1)),
            "the model returns 3 tensors but outputs names 2 ('digit', 'vector'): return one tensor per output, "
            "in that order",
        ),
        (lambda x: (cols(x, 3),), "the model returns 1 tensors but outputs names 2 ('digit', 'vector')"),
        (
            lambda x: {"digit": cols(x, 3), "embedding": cols(x, 4)},
            "the model returns a dict of 'digit', 'embedding' but outputs names 2 ('digit', 'vector'): "
            "return one tensor per output, keyed by its name",
        ),
        (
            lambda x: cols(x, 7),
            "the model returns one tensor [256, 7] but outputs names 2 ('digit', 'vector'): return a tuple",
        ),
        (
            lambda x: (cols(x, 5), cols(x, 4)),
            "outputs['digit'].labels has 3 entries but the model returns 5 values per row",
        ),
        (
            lambda x: (cols(x, 3), x[:, 0]),
            "the model's output 'vector' must be one tensor [N, width], got [256]",
        ),
        (
            lambda x: (cols(x, 3), cols(x, 4) / 0),
            "the model returns non-finite outputs on training rows (output 'vector')",
        ),
    ],
    ids=["tuple too long", "tuple too short", "dict names", "one tensor", "width", "not 2-D", "not finite"],
)
def test_outputs_that_do_not_fit_the_signature_are_refused_naming_the_output(tmp_path, make, message):
    with pytest.raises(PackagingError) as info:
        export_heads(tmp_path / "out", Shaped(make), TWO)
    assert message in str(info.value)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_a_bad_entry_among_several_outputs_is_refused_naming_it(tmp_path):
    outputs = {**TWO, "tags": {"kind": "multi_label", "labels": ["a"], "threshold": 2}}
    with pytest.raises(PackagingError, match=re.escape("outputs['tags'].threshold must be a number in (0, 1)")):
        export_heads(tmp_path / "out", Heads(), outputs)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda o: o[2].update(name="digit"), "outputs[2].name 'digit' repeats outputs[0].name"),
        (lambda o: o[1].update(width=3), "outputs[1].width must be the number of labels"),
        (lambda o: o[1]["labels"].append("red"), "outputs[1].labels must be at least 1 unique non-empty strings"),
        (lambda o: o[3].update(kind="ranking"), "outputs[3].kind must be one of"),
        (lambda o: o[2].update(targets=["low"]), "outputs[2].targets must name each of the width's columns"),
        (lambda o: o[0]["labels"].reverse(), "outputs[0].labels must equal labels"),
        (lambda o: o.append(7), "outputs must be a non-empty list of output objects"),
    ],
    ids=["duplicate name", "width", "labels", "kind", "targets", "first labels", "not an object"],
)
def test_a_tampered_signature_of_several_outputs_is_refused_at_load(heads, tmp_path, change, message):
    directory, _ = heads
    raw = copy(directory, tmp_path)
    change(raw["outputs"])
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=re.escape(f"meta.json: {message}")):
        ModelMetadata.load(tmp_path / "meta.json")
    with pytest.raises(PackagingError, match=re.escape(message)):
        check(tmp_path)


def test_model_check_replays_every_outputs_golden_columns(heads, tmp_path):
    directory, _ = heads
    raw = copy(directory, tmp_path)
    raw["golden"]["outputs"][3][-1] += 0.01  # the last output's last column
    (tmp_path / "meta.json").write_text(json.dumps(raw))
    with pytest.raises(PackagingError, match=r"differ from the golden set .*rows \[3\]"):
        check(tmp_path)


def test_model_check_names_every_output(heads, caplog):
    directory, _ = heads
    with caplog.at_level(logging.INFO, logger="rtserve.cli.model"):
        assert cmd_check(Namespace(artifacts=directory, version="0.1")) == 0
    assert (
        "4 outputs (digit: classification of width 3, tags: multi_label of width 2, "
        "score: regression of width 2, vector: embedding of width 4), golden set of 40 rows replayed"
    ) in caplog.text


# --------------------------------------------------------------------------- the handler's answers

#: A KServe REST route's headers (TorchServe sets ``explain``; no ``url_path``).
REST = {"explain": "False"}
PREDICT, EXPLAIN = route_headers(False), route_headers(True)


@pytest.fixture(scope="module")
def served(heads) -> tuple:
    """A handler on the exported heads (its warm-up ran at initialize), its context and the eager model."""
    directory, model = heads
    ctx = make_context(directory, MODEL_YAML, version="0.1")
    handler = RealTimeHandler()
    handler.initialize(ctx)
    return handler, ctx, model


def run(handler, ctx, rows: list, headers=None) -> tuple[list[int], list]:
    start_batch(ctx, len(rows), headers)
    out = handler.handle(rows, ctx)
    assert isinstance(out, list) and len(out) == len(rows)
    return [ctx.get_response_status(i)[0] for i in range(len(rows))], out


def assert_document(got: dict, want: dict[str, torch.Tensor], row: int) -> None:
    """One row's several-output document equals the eager model's answers to 1e-5, each in its kind's form."""
    assert list(got) == ["outputs", "model_version"] and got["model_version"] == "0.1"
    documents = got["outputs"]
    assert list(documents) == list(OUTPUTS)  # column order
    digit, tags = want["digit"][row].tolist(), want["tags"][row].tolist()
    assert set(documents["digit"]) == {"prediction", "label", "probabilities"}
    assert documents["digit"]["probabilities"] == pytest.approx(digit, abs=1e-5)
    assert documents["digit"]["prediction"] == max(range(3), key=digit.__getitem__)
    assert documents["digit"]["label"] == OUTPUTS["digit"]["labels"][documents["digit"]["prediction"]]
    assert set(documents["tags"]) == {"labels", "probabilities"}
    assert list(documents["tags"]["probabilities"]) == ["red", "blue"]
    assert list(documents["tags"]["probabilities"].values()) == pytest.approx(tags, abs=1e-5)
    assert documents["tags"]["labels"] == [label for label, p in zip(["red", "blue"], tags) if p >= 0.4]
    assert documents["score"] == {"prediction": pytest.approx(want["score"][row].tolist(), abs=1e-5)}
    assert documents["vector"] == {"embedding": pytest.approx(want["vector"][row].tolist(), abs=1e-5)}


def test_answers_carry_every_output_by_name_equal_to_the_eager_model_beside_a_bad_request(served):
    handler, ctx, model = served
    rows = random_rows(3, seed=21).tolist()
    statuses, out = run(
        handler,
        ctx,
        [json_row({"features": rows[0]}), json_row({"features": [1.0]}), json_row({"features": rows[2]})],
        [PREDICT] * 3,
    )
    assert statuses == [200, 400, 200]
    answers = [json.loads(o) for o in out]
    assert answers[1] == {"error": "'features' must have exactly 7 numbers, got 1", "field": "features"}
    want = eager(model, rows)
    assert_document(answers[0], want, 0)
    assert_document(answers[2], want, 2)


def test_kserve_v1_answers_a_list_of_several_output_documents(served):
    handler, ctx, model = served
    rows = random_rows(4, seed=22).tolist()
    statuses, (out,) = run(handler, ctx, [json_row({"instances": rows})], [REST])
    assert statuses == [200]
    predictions = json.loads(out)["predictions"]
    assert len(predictions) == 4
    want = eager(model, rows)
    for row, document in enumerate(predictions):
        assert_document(document, want, row)


def v2(rows: list, **extra) -> dict:
    """An OIP v2 request for ``rows`` (``extra``: its ``outputs``, ``parameters``)."""
    tensor = {"name": "features", "datatype": "FP32", "shape": [len(rows), 7], "data": rows}
    return {"id": "r1", "inputs": [tensor], **extra}


def test_oip_v2_carries_every_output_tensor_by_its_real_name(served):
    handler, ctx, model = served
    rows = random_rows(3, seed=23).tolist()
    want = eager(model, rows)
    subset = v2(rows, outputs=[{"name": "vector"}, {"name": "digit"}])
    refused = v2(rows, outputs=[{"name": "probabilities"}])
    statuses, out = run(handler, ctx, [json_row(v2(rows)), json_row(subset), json_row(refused)], [REST] * 3)
    assert statuses == [200, 200, 400]
    every, some, error = (json.loads(o) for o in out)
    assert (every["id"], every["model_name"], every["model_version"]) == ("r1", "realtime-classifier", "0.1")
    assert [t["name"] for t in every["outputs"]] == list(OUTPUTS)
    for tensor in every["outputs"]:
        name = tensor["name"]
        assert (tensor["datatype"], tensor["shape"]) == ("FP32", [3, WIDTHS[name]])
        assert tensor["data"] == pytest.approx(want[name].flatten().tolist(), abs=1e-5), name
    assert [t["name"] for t in some["outputs"]] == ["vector", "digit"]  # as the request named them
    assert some["outputs"][1] == every["outputs"][0]
    assert error["error"] == ("outputs[0].name must be one of 'digit', 'tags', 'score', 'vector', got 'probabilities'")


def test_oip_v2_binary_outputs_carry_every_tensors_bytes(served):
    handler, ctx, model = served
    rows = random_rows(2, seed=24).tolist()
    body = v2(rows, parameters={"binary_data_output": True})
    statuses, (out,) = run(handler, ctx, [json_row(body)], [REST])
    assert statuses == [200]
    length = int(ctx.get_response_headers(0)["Inference-Header-Content-Length"])
    header, tail = json.loads(out[:length]), out[length:]
    want = eager(model, rows)
    at = 0
    for tensor in header["outputs"]:
        size = tensor["parameters"]["binary_data_size"]
        assert "data" not in tensor and size == 2 * WIDTHS[tensor["name"]] * 4
        values = np.frombuffer(tail[at : at + size], dtype="<f4").tolist()
        assert values == pytest.approx(want[tensor["name"]].flatten().tolist(), abs=1e-5)
        at += size
    assert at == len(tail) and [t["name"] for t in header["outputs"]] == list(OUTPUTS)


SEVERAL_501 = (
    "explanations are not available for a model with several outputs ('digit', 'tags', 'score', 'vector') yet: "
    "an explanation attributes one number of one output, and a target cannot name the output; "
    "ask /predictions instead"
)


def test_an_explanation_answers_501_saying_why_and_predictions_still_answer(served):
    handler, ctx, model = served
    assert handler.explainer is None
    rows = random_rows(2, seed=25).tolist()
    statuses, out = run(
        handler,
        ctx,
        [
            json_row({"features": rows[0]}),
            json_row({"features": rows[1]}),
            json_row({"features": rows[0], "target": "digit:one"}),
            json_row({"instances": [rows[1]]}),
            json_row({"features": [1.0]}),
        ],
        [EXPLAIN, PREDICT, EXPLAIN, {"explain": "True"}, EXPLAIN],
    )
    assert statuses == [501, 200, 501, 501, 400]
    answers = [json.loads(o) for o in out]
    assert answers[0] == answers[2] == answers[3] == {"error": SEVERAL_501}
    assert_document(answers[1], eager(model, rows), 1)
    assert answers[4]["field"] == "features"


def test_records_and_metrics_follow_the_first_output(served, tmp_path):
    handler, ctx, model = served

    class Spool:
        directory, budget, lines = tmp_path, 1 << 20, []

        def append(self, data: bytes) -> bool:
            self.lines += data.decode().splitlines()
            return True

    spool = Spool()
    before = handler.recorder
    handler.recorder = Recorder(spool, "m", "0.1", handler.meta.labels, kind=handler.meta.kind)
    try:
        rows = random_rows(3, seed=26).tolist()
        _, out = run(handler, ctx, [json_row({"features": r}) for r in rows], [PREDICT] * 3)
    finally:
        handler.recorder = before
    classes = eager(model, rows)["digit"].argmax(dim=1).tolist()
    lines = [json.loads(line) for line in spool.lines]
    assert [(line["class"], line["label"]) for line in lines] == [(c, OUTPUTS["digit"]["labels"][c]) for c in classes]
    assert [line["answer"] for line in lines] == [json.loads(o) for o in out]


# --------------------------------------------------------------------------- golden set, warm-up, gate, drift


def mar_of(directory: Path, to: Path) -> Path:
    """An archive holding what the readers of ``.mar`` files read: the manifest and ``meta.json``."""
    mar = to / "heads.mar"
    with zipfile.ZipFile(mar, "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "heads", "modelVersion": "0.1"}}))
        zf.writestr("meta.json", (directory / "meta.json").read_text())
    return mar


def golden_answers(served, features: list) -> list[dict]:
    """The handler's answers to the golden rows, as ``/predictions`` sends them."""
    handler, ctx, _ = served
    statuses, out = run(handler, ctx, [json_row({"features": row}) for row in features], [PREDICT] * len(features))
    assert set(statuses) == {200}
    return [json.loads(o) for o in out]


def test_the_warm_up_checks_every_outputs_golden_values(heads, served, tmp_path):
    directory, _ = heads
    rows = Rows.from_mar(mar_of(directory, tmp_path))
    meta = json.loads((directory / "meta.json").read_text())
    assert rows.signature == meta["outputs"] and rows.probabilities == meta["golden"]["outputs"]
    answers = golden_answers(served, rows.features[:3])
    sender = _Sender(Client("http://127.0.0.1:9", "http://127.0.0.1:9"), "heads", "k", rows, deadline=0)
    for i, answer in enumerate(answers):
        sender._check(i, 200, json.dumps(answer).encode())
    wrong = json.loads(json.dumps(answers[1]))
    wrong["outputs"]["vector"]["embedding"][-1] += 0.01  # the last output
    with pytest.raises(WrongAnswers, match="heads answered golden row 1 of its archive with"):
        sender._check(1, 200, json.dumps(wrong).encode())
    with pytest.raises(WarmupError, match="not a 4-output answer"):
        sender._check(0, 200, json.dumps(answers[0]["outputs"]["digit"]).encode())


def test_the_gate_replays_every_output_and_compares_the_first(heads, served, tmp_path, monkeypatch):
    directory, _ = heads
    meta = ArchiveMeta.from_mar(mar_of(directory, tmp_path))
    assert meta.output["name"] == "digit" and [o["name"] for o in meta.outputs] == list(OUTPUTS)
    assert meta.golden_labels()[:3] == ["zero", "one", "two"]  # the holdout's truth: the first output's
    compare = comparison(meta, GateConfig.load())
    assert compare.kind == "classification"
    answers = golden_answers(served, meta.golden["features"])
    assert [answer_value(compare.kind, a) for a in answers[:2]] == [a["outputs"]["digit"]["label"] for a in answers[:2]]
    monkeypatch.setattr("rtserve.promotion.measure.answer_rows", lambda *args: answers)
    config = GateConfig.load()
    assert check_golden(None, "heads", "0.1", meta, config) == len(answers)
    answers[7]["outputs"]["score"]["prediction"][1] += 0.01
    with pytest.raises(GoldenMismatch, match=r"answers 1 of 40 golden rows differently .*rows \[7\]"):
        check_golden(None, "heads", "0.1", meta, config)


def test_a_first_regression_is_compared_on_its_own_columns(tmp_path):
    outputs = {"score": OUTPUTS["score"], "digit": OUTPUTS["digit"]}
    export_heads(tmp_path / "art", Heads(as_dict=True, widths={"score": 2, "digit": 3}), outputs)
    mar = mar_of(tmp_path / "art", tmp_path)
    meta = ArchiveMeta.from_mar(mar)
    compare = comparison(meta, GateConfig.load())
    live, _ = archive_compare(mar)
    assert compare.kind == live.kind == "regression" and len(compare.scale) == len(live.scale) == 2
    assert compare.scale == regression_scale({"labels": None, "outputs": [r[:2] for r in meta.golden["outputs"]]})
    answer = {"outputs": {"score": {"prediction": [1.0, 2.0]}, "digit": {"label": "one"}}, "model_version": "0.1"}
    assert answer_value("regression", answer) == (1.0, 2.0)


def test_the_oip_metadata_lists_every_output(heads, tmp_path):
    directory, _ = heads
    metadata = oip_read_archive(mar_of(directory, tmp_path)).metadata()
    assert metadata["outputs"] == [
        {"name": name, "datatype": "FP32", "shape": [-1, width]} for name, width in WIDTHS.items()
    ]


#: Rows in the drift window; the inputs shift by two training standard deviations.
SHIFT = 10.0


@pytest.mark.parametrize("first", ["digit", "score"])
def test_prediction_drift_follows_the_first_output(tmp_path, first):
    outputs = {first: OUTPUTS[first], **{k: v for k, v in OUTPUTS.items() if k != first}}
    model = Heads(as_dict=True)
    directory = tmp_path / first
    export(model, random_rows(4000), feature_names=NAMES, outputs=outputs, version="0.1", out_dir=directory)
    handler, ctx = drift_handler(directory)
    try:
        scores = []
        for rows in (random_rows(WINDOW, seed=16), random_rows(WINDOW, seed=16) + SHIFT):
            for start in range(0, len(rows), 32):
                statuses, _ = run(handler, ctx, [json_row({"features": r}) for r in rows[start : start + 32].tolist()])
                assert set(statuses) == {200}
            assert handler.telemetry.export_drift()
            scores.append(
                handler.telemetry.metrics.registry.get_sample_value(
                    "rtserve_prediction_drift_psi", {"model_name": "realtime-classifier", "model_version": "0.1"}
                )
            )
        low, high = scores
        assert low < 0.1 and high > 0.2, (low, high)
        # the very score of the window, from the first output's answers computed here
        answers = eager(model, rows, outputs)[first]
        monitor = DriftMonitor(handler.meta.drift_reference, WINDOW)
        monitor.update(rows, answers.argmax(dim=1) if first == "digit" else answers)
        assert high == pytest.approx(round(monitor.scores().prediction, 6), abs=1e-5)
    finally:
        handler.telemetry.close()
