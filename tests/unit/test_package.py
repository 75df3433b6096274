"""rtserve.model.package.export: bad input refused with its message; the safe loader refuses payloads.

The safety tests build artifacts whose program file carries a pickle payload that writes a file
when unpickled, and show that the handler's loader refuses each one and the file is never
written. One of them is first shown to be live: torch.export.load alone runs it.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from handler.errors import ConfigError
from handler.model import check_program_file, load_program
from handler.rtserve_handler import RealTimeHandler
from rtserve.model.package import PackagingError, Standardize, check, export
from tests.conftest import REPO
from tests.helpers import MODEL_YAML, make_context

pytestmark = pytest.mark.unit


class Payload:
    """Unpickling this object writes ``path``: the attack a model file could carry."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (exec, (f"open({self.path!r}, 'w').write('payload ran')",))


def random_model(n_features: int = 7, n_classes: int = 5, seed: int = 3) -> nn.Module:
    """A network the project never defined: random layers of another shape."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(n_features, 24), nn.Tanh(), nn.Linear(24, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, n_classes)
    ).eval()


def random_rows(rows: int = 300, n_features: int = 7, seed: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, n_features, generator=g) * 5 + 2


def exported(tmp_path: Path, **overrides) -> Path:
    kwargs = dict(
        feature_names=[f"x{i}" for i in range(7)], labels=list("abcde"), version="0.1", out_dir=tmp_path / "artifact"
    )
    kwargs.update(overrides)
    export(random_model(), random_rows(), **kwargs)
    return Path(kwargs["out_dir"])


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return exported(tmp_path_factory.mktemp("pkg"))


def test_round_trip_of_a_model_the_project_never_defined(artifact):
    meta = check(artifact, "0.1")  # the handler's loader, then the golden set replayed
    assert meta.name == "sequential" and meta.labels == list("abcde") and meta.accuracy is None
    x = random_rows(50, seed=9)
    forward = load_program(artifact / "model.pt2")
    with torch.inference_mode():
        for rows in (x[:1], x):
            assert torch.allclose(forward(rows), random_model()(rows), atol=1e-5)
    assert meta.provenance["checked_batch_sizes"] == [1, 32, 2048]
    assert len(meta.golden["features"]) == 256 and meta.golden["labels"] is None


def test_the_program_is_checked_on_the_batch_sizes_of_the_model_config_it_will_ship_with(tmp_path):
    """`make archive MODEL_CONFIG=...` exports with that config: its batchSize and
    handler.max_instances, not the demo's, decide the batch sizes checked."""
    config = {**MODEL_YAML, "batchSize": 4, "handler": {**MODEL_YAML["handler"], "max_instances": 3}}
    path = tmp_path / "model-config.yaml"
    path.write_text(yaml.safe_dump(config))
    meta = check(exported(tmp_path, model_config=path), "0.1")
    assert meta.provenance["checked_batch_sizes"] == [1, 4, 12]


def test_holdout_gives_golden_labels_and_accuracy(tmp_path):
    x = random_rows(40, seed=5)
    with torch.no_grad():
        y = random_model()(x).argmax(dim=1)
    y[:10] = (y[:10] + 1) % 5  # 10 of 40 wrong
    out = exported(tmp_path, holdout=(x, y))
    meta = json.loads((out / "meta.json").read_text())
    assert meta["golden"]["labels"] == y.tolist() and meta["accuracy"] == 0.75


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # Python control flow on a tensor's value
            return x[:, :5]
        return -x[:, :5]


def _nan_rows() -> torch.Tensor:
    x = random_rows()
    x[17, 3] = float("nan")
    return x


@pytest.mark.parametrize(
    "model,rows,overrides,message",
    [
        (
            None,
            None,
            {"feature_names": ["x0", "x1", "x1", "x3", "x4", "x5", "x5"]},
            "feature_names must be unique: 'x1', 'x5' appear more than once",
        ),
        (None, None, {"feature_names": ["x0", "x1"]}, "feature_names has 2 names but train_features has 7 columns"),
        (None, None, {"labels": ["a", "b", "c"]}, "labels has 3 entries but the model returns 5 logits per row"),
        (None, None, {"labels": ["a", "b", "a", "d", "e"]}, "labels must be unique: 'a'"),
        (None, _nan_rows, {}, "training statistics are not finite for feature(s) 'x3'"),
        (DataDependent, None, {}, "the model cannot be exported with torch.export"),
        (None, None, {"version": "1.0 beta"}, "version must be 1-64 letters, digits"),
        (None, None, {"holdout": (random_rows(4), [0, 1, 2, 9])}, "holdout labels must be class indices in [0, 4]"),
    ],
)
def test_bad_input_is_refused_with_what_to_fix(tmp_path, model, rows, overrides, message):
    kwargs = dict(
        feature_names=[f"x{i}" for i in range(7)], labels=list("abcde"), version="0.1", out_dir=tmp_path / "out"
    )
    kwargs.update(overrides)
    with pytest.raises(PackagingError) as info:
        export(model() if model else random_model(), rows() if rows else random_rows(), **kwargs)
    assert message in str(info.value)
    assert not (tmp_path / "out" / "meta.json").exists()


def test_standardize_puts_preprocessing_inside_the_program(tmp_path):
    x = random_rows() * 100 + 50
    model = nn.Sequential(Standardize.fit(x), random_model()).eval()
    out = tmp_path / "std"
    export(model, x, feature_names=[f"x{i}" for i in range(7)], labels=list("abcde"), version="0.1", out_dir=out)
    with torch.inference_mode():
        assert torch.allclose(load_program(out / "model.pt2")(x[:8]), model(x[:8]), atol=1e-5)


# --------------------------------------------------------------------------- safety


def rewrite(src: Path, dst: Path, change) -> None:
    """Copy the zip ``src`` to ``dst``, passing each member through ``change(name, data)``
    (which returns the new bytes, or a dict of name -> bytes to write instead)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            out = change(info.filename, zin.read(info.filename))
            for name, data in out.items() if isinstance(out, dict) else [(info.filename, out)]:
                zout.writestr(name, data)


def _pickled_weight(marker: Path):
    def change(name: str, data: bytes):
        if name.endswith("_weights_config.json"):
            config = json.loads(data)
            config["config"]["0.weight"]["use_pickle"] = True
            return json.dumps(config).encode()
        if name.endswith("/weight_0"):
            buffer = io.BytesIO()
            torch.save(Payload(marker), buffer)
            return buffer.getvalue()
        return data

    return change


def _pickled_sample_inputs(marker: Path):
    def change(name: str, data: bytes):
        if name.endswith("sample_inputs/model.pt"):
            buffer = io.BytesIO()
            torch.save(((Payload(marker),), {}), buffer)
            return buffer.getvalue()
        return data

    return change


def _compiled_code(marker: Path):
    def change(name: str, data: bytes):
        if name.endswith("archive_format"):
            root = name.split("/")[0]
            return {name: data, f"{root}/data/aotinductor/model/model.so": b"\x7fELF"}
        return data

    return change


def malicious_artifact(clean: Path, dst: Path, kind: str, marker: Path) -> Path:
    """A copy of the artifact directory ``clean`` whose program carries a payload of ``kind``."""
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "meta.json").write_bytes((clean / "meta.json").read_bytes())
    if kind == "whole file pickled":
        torch.save({"model": Payload(marker)}, dst / "model.pt2")
    else:
        change = {
            "pickled weight": _pickled_weight,
            "pickled sample inputs": _pickled_sample_inputs,
            "compiled code": _compiled_code,
        }[kind](marker)
        rewrite(clean / "model.pt2", dst / "model.pt2", change)
    return dst


KINDS = ["pickled weight", "pickled sample inputs", "whole file pickled", "compiled code"]


def test_the_sample_inputs_payload_is_live_for_a_plain_torch_export_load(artifact, tmp_path):
    """Without rtserve's check, torch.export.load runs the payload (so the refusals below are
    refusals of a real attack)."""
    marker = tmp_path / "ran"
    bad = malicious_artifact(artifact, tmp_path / "bad", "pickled sample inputs", marker)
    subprocess.run(
        [sys.executable, "-c", f"import torch; torch.export.load({str(bad / 'model.pt2')!r})"],
        cwd=REPO,
        capture_output=True,
        timeout=120,
    )
    assert marker.read_text() == "payload ran"


@pytest.mark.parametrize("kind", KINDS)
def test_loading_never_runs_code_from_the_artifact(artifact, tmp_path, kind):
    marker = tmp_path / "ran"
    bad = malicious_artifact(artifact, tmp_path / "bad", kind, marker)
    with pytest.raises(ConfigError, match="refused|not a torch.export archive|never has"):
        check_program_file(bad / "model.pt2")
    with pytest.raises(PackagingError):
        check(bad)
    ctx = make_context(bad, MODEL_YAML)
    with pytest.raises(ConfigError):
        RealTimeHandler().initialize(ctx)
    assert not marker.exists(), "the payload ran"


def test_pickle_module_is_never_asked_to_load_a_refused_program(artifact, tmp_path, monkeypatch):
    """The check reads JSON and zip directories only; the one unpickling it does is
    ``torch.load(weights_only=True)`` on sample inputs."""
    calls = []
    monkeypatch.setattr(pickle, "loads", lambda *a, **k: calls.append(a))
    bad = malicious_artifact(artifact, tmp_path / "bad", "pickled weight", tmp_path / "ran")
    with pytest.raises(ConfigError):
        load_program(bad / "model.pt2")
    assert calls == []
