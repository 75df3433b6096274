"""Output kinds on a real TorchServe: a multi-label, a regression (scikit-learn's diabetes data) and an
embedding model, exported with ``outputs=``, archived by `make archive ARTIFACTS=<dir>` and served side by side.

Each answers /predictions with the model run in this process (sigmoid or raw) to 1e-5, KServe v1 and OIP v2
carry its output, the register-time golden check passes, the gate refuses clearly (it compares classifiers
only today) and /explanations answers 501 naming the kind.
"""

from __future__ import annotations

import dataclasses

import pytest
import requests
import torch
import yaml
from sklearn.datasets import load_diabetes
from torch import nn

from rtserve.errors import GateError
from rtserve.model.package import Standardize, export
from rtserve.promotion.gate import ArchiveMeta, GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.measure import check_golden
from rtserve.promotion.rollout import Rollout, Verification
from tests.conftest import REPO, make_archive
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

MULTI, DIABETES, EMBED = "kinds-multi", "kinds-diabetes", "kinds-embed"
CONFIG = dataclasses.replace(GateConfig.load(), burst_requests=20, warmup_requests=2, concurrency=4)


def multi_label_data() -> tuple[torch.Tensor, list[str]]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(400, 6, generator=g) * 3 + 1, ["urgent", "billing", "spam"]


def diabetes_model(version: str) -> tuple[nn.Module, torch.Tensor, list[str]]:
    data = load_diabetes()
    x, y = torch.tensor(data.data, dtype=torch.float32), torch.tensor(data.target, dtype=torch.float32)
    torch.manual_seed(0 if version == "1.0" else 1)
    model = nn.Sequential(Standardize.fit(x), nn.Linear(x.shape[1], 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[:350]).squeeze(1), y[:350])
        loss.backward()
        opt.step()
    return model.eval(), x, list(data.feature_names)


@pytest.fixture(scope="module")
def kinds(build_root, mar_v1, tmp_path_factory):
    """(server, {model: (eager model, its kind's activation)}, {(model, version): mar})."""
    root = tmp_path_factory.mktemp("kinds")
    config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    config.update(minWorkers=1, maxWorkers=1)
    (root / "model-config.yaml").write_text(yaml.safe_dump(config))
    models, mars = {}, {}

    x, labels = multi_label_data()
    torch.manual_seed(2)
    multi = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3)).eval()
    export(
        multi,
        x,
        feature_names=[f"f{i}" for i in range(6)],
        version="1.0",
        out_dir=root / MULTI,
        outputs={"topics": {"kind": "multi_label", "labels": labels, "threshold": 0.5}},
    )
    models[MULTI] = (multi, torch.sigmoid)

    for version in ("1.0", "2.0"):
        model, dx, names = diabetes_model(version)
        export(
            model,
            dx[:350],
            feature_names=names,
            outputs={"progression": {"kind": "regression"}},
            holdout=(dx[350:], load_diabetes().target[350:]),
            version=version,
            out_dir=root / f"{DIABETES}-{version}",
        )
        models.setdefault(DIABETES, (model, lambda t: t))

    torch.manual_seed(3)
    embed = nn.Sequential(nn.Linear(6, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    export(
        embed,
        x,
        feature_names=[f"f{i}" for i in range(6)],
        outputs={"vector": {"kind": "embedding"}},
        version="1.0",
        out_dir=root / EMBED,
    )
    models[EMBED] = (embed, lambda t: t)

    for name, version, directory in (
        (MULTI, "1.0", MULTI),
        (DIABETES, "1.0", f"{DIABETES}-1.0"),
        (DIABETES, "2.0", f"{DIABETES}-2.0"),
        (EMBED, "1.0", EMBED),
    ):
        mars[name, version] = make_archive(
            build_root,
            version,
            MODEL_NAME=name,
            ARTIFACTS=str(root / directory),
            MODEL_CONFIG=str(root / "model-config.yaml"),
        )
    served = [f"{name}={mars[name, '1.0'].name}" for name in (MULTI, DIABETES, EMBED)]
    with serve(
        tmp_path_factory.mktemp("run"), mar_v1, models=served, ready=[MULTI, DIABETES, EMBED], timeout=180
    ) as ts:
        yield ts, models, mars


def post(server, path: str, body) -> requests.Response:
    key = server.client().keys.get("inference")
    return requests.post(
        f"{server.props['inference_address']}/{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def in_process(models, name: str, rows) -> list[list[float]]:
    model, activation = models[name]
    with torch.inference_mode():
        return activation(model(torch.tensor(rows, dtype=torch.float32))).tolist()


def golden_rows(mars, name: str, n: int) -> list[list[float]]:
    return ArchiveMeta.from_mar(mars[name, "1.0"]).golden["features"][:n]


def test_multi_label_answers_sigmoid_labels_over_the_threshold(kinds):
    server, models, mars = kinds
    rows = golden_rows(mars, MULTI, 12)
    for row, want in zip(rows, in_process(models, MULTI, rows)):
        response = post(server, f"predictions/{MULTI}", {"features": row})
        assert response.status_code == 200, response.text
        body = response.json()
        assert set(body) == {"labels", "probabilities", "model_version"}
        assert list(body["probabilities"].values()) == pytest.approx(want, abs=1e-5)
        assert body["labels"] == [label for label, p in zip(["urgent", "billing", "spam"], want) if p >= 0.5]


@pytest.mark.parametrize("name,key", [(DIABETES, "prediction"), (EMBED, "embedding")])
def test_regression_and_embedding_answer_their_values(kinds, name, key):
    server, models, mars = kinds
    rows = golden_rows(mars, name, 12)
    for row, want in zip(rows, in_process(models, name, rows)):
        response = post(server, f"predictions/{name}", {"features": row})
        assert response.status_code == 200, response.text
        body = response.json()
        assert set(body) == {key, "model_version"} and body["model_version"] == "1.0"
        got = body[key] if isinstance(body[key], list) else [body[key]]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-5)  # float32: about 3e-5 apart at 265


@pytest.mark.parametrize(
    "name,output,width", [(MULTI, "topics", 3), (DIABETES, "progression", 1), (EMBED, "vector", 8)]
)
def test_kserve_v1_and_oip_v2_carry_the_output(kinds, name, output, width):
    server, models, mars = kinds
    rows = golden_rows(mars, name, 2)
    want = in_process(models, name, rows)
    v1 = post(server, f"v1/models/{name}:predict", {"instances": rows})
    assert v1.status_code == 200, v1.text
    assert len(v1.json()["predictions"]) == 2
    v2 = post(
        server,
        f"v2/models/{name}/infer",
        {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, len(rows[0])], "data": rows}]},
    )
    assert v2.status_code == 200, v2.text
    (tensor,) = v2.json()["outputs"]
    assert (tensor["name"], tensor["datatype"], tensor["shape"]) == (output, "FP32", [2, width])
    assert tensor["data"] == pytest.approx([v for w in want for v in w], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("name", [MULTI, DIABETES, EMBED])
def test_the_golden_check_passes_and_explain_answers_501(kinds, name):
    server, _, mars = kinds
    meta = ArchiveMeta.from_mar(mars[name, "1.0"])
    assert check_golden(server.client(timeout=60), name, None, meta, CONFIG) == len(meta.golden["features"])
    response = post(server, f"explanations/{name}", {"features": meta.golden["features"][0]})
    assert response.status_code == 501
    assert response.json()["error"].startswith(f"explanations are not available for a {meta.kind} model yet")


def test_register_checks_the_golden_set_and_the_gate_refuses_clearly(kinds):
    server, _, mars = kinds
    store = mars[DIABETES, "2.0"].parent
    rollout = Rollout(
        server.client(timeout=120),
        History(server.run_dir / HISTORY_FILE),
        DIABETES,
        Verification(store, CONFIG, server.run_dir / "logs" / "audit.log"),
    )
    rollout.register("2.0", workers=1)  # its golden regression values are checked: it passes
    try:
        with pytest.raises(GateError) as info:
            rollout.promote("2.0")
        assert "is a regression model: the gate compares classifiers only today" in str(info.value)
        assert rollout.default_version() == "1.0"
    finally:
        rollout.client.unregister(DIABETES, "2.0")
