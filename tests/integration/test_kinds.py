"""Output kinds on a real TorchServe: a multi-label, a regression (scikit-learn's diabetes data) and an
embedding model, exported with ``outputs=``, archived by `make archive ARTIFACTS=<dir>` and served side by side.

Each answers /predictions with the model run in this process (sigmoid or raw) to 1e-5, KServe v1 and OIP v2
carry its output, the register-time golden check passes and /explanations answers 501 naming the kind.

The regression's versions: 1.0, 2.0 retrained with another seed, 3.0 trained on shuffled targets. The gate
(mean absolute error and agreement within a tolerance, in target standard deviations) refuses 3.0 and
promotes 2.0, and a shadow of each through the frontend agent reports their live agreement.
"""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
import yaml
from sklearn.datasets import load_diabetes
from torch import nn

from rtserve.errors import GateRefused
from rtserve.model.package import Standardize, export
from rtserve.promotion.gate import ArchiveMeta, GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.live.evidence import save_shadow_report
from rtserve.promotion.live.routes import Route, set_route
from rtserve.promotion.measure import check_golden
from rtserve.promotion.rollout import Rollout, Verification
from tests.conftest import REPO, make_archive
from tests.helpers import routes_applied, routes_lines, settled
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

MULTI, DIABETES, EMBED = "kinds-multi", "kinds-diabetes", "kinds-embed"
CONFIG = dataclasses.replace(GateConfig.load(), burst_requests=20, warmup_requests=2, concurrency=4)


def multi_label_data() -> tuple[torch.Tensor, list[str]]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(400, 6, generator=g) * 3 + 1, ["urgent", "billing", "spam"]


#: The regression's versions: the seed it is trained with, and whether its training targets are shuffled.
DIABETES_VERSIONS = {"1.0": (0, False), "2.0": (1, False), "3.0": (1, True)}


def diabetes_model(version: str) -> tuple[nn.Module, torch.Tensor, list[str]]:
    """A small network trained on the first 350 rows of the diabetes data (the rest held out).

    3.0's training targets are shuffled: it learns nothing of the features' meaning.
    """
    data = load_diabetes()
    x, y = torch.tensor(data.data, dtype=torch.float32), torch.tensor(data.target, dtype=torch.float32)
    seed, shuffled = DIABETES_VERSIONS[version]
    if shuffled:
        y = torch.cat([y[:350][torch.randperm(350, generator=torch.Generator().manual_seed(5))], y[350:]])
    torch.manual_seed(seed)
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

    for version in DIABETES_VERSIONS:
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
        (DIABETES, "3.0", f"{DIABETES}-3.0"),
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


def diabetes_rollout(server, mars) -> Rollout:
    """The regression's versions on the server, gated with the shipped thresholds (a shorter burst,
    and room for a loaded machine's latency: the p99 ratio is gated alike for every kind and
    tested in tests/integration/test_promotion.py)."""
    config = dataclasses.replace(CONFIG, max_latency_ratio=10.0)
    return Rollout(
        server.client(timeout=120),
        History(server.run_dir / HISTORY_FILE),
        DIABETES,
        Verification(mars[DIABETES, "2.0"].parent, config, server.run_dir / "logs" / "audit.log"),
    )


def leave_only_1_0(rollout: Rollout) -> None:
    if rollout.default_version() != "1.0":
        rollout.client.set_default(DIABETES, "1.0")
    for version in rollout.versions():
        if version != "1.0":
            rollout.client.unregister(DIABETES, version)


def test_the_archive_keeps_the_regressions_holdout_targets(kinds):
    _, _, mars = kinds
    meta = ArchiveMeta.from_mar(mars[DIABETES, "1.0"])
    want = load_diabetes().target[350:].tolist()
    assert meta.golden_labels() == [[y] for y in want] and meta.golden["labels"] == want


def test_the_gate_refuses_a_regression_trained_on_shuffled_targets_and_promotes_a_retrained_one(kinds):
    """3.0 (shuffled targets) is refused on its mean absolute error and its agreement; 2.0 (the same
    network and data, another seed) is promoted. Both are registered after their golden check."""
    server, _, mars = kinds
    rollout = diabetes_rollout(server, mars)
    try:
        rollout.register("2.0", workers=1)  # their golden regression values are checked: they pass
        rollout.register("3.0", workers=1)
        with pytest.raises(GateRefused) as info:
            rollout.promote("3.0")
        refused = info.value.report
        print(refused.text())
        assert rollout.default_version() == "1.0"
        assert refused.kind == "regression" and refused.outcome == "refused"
        assert [f.split(":")[0] for f in refused.failures] == ["mean absolute error", "agreement"], refused.failures
        assert refused.quality["increase"] > 0.2 and refused.agreement["value"] < 0.5
        assert refused.quality["rows"] == 2 * len(load_diabetes().target[350:])

        rollout.promote("2.0")
        assert rollout.default_version() == "2.0"
        gates = [e for e in History(server.run_dir / HISTORY_FILE).events() if e.get("action") == "gate"]
        promoted = gates[-1]
        print(json.dumps(promoted, sort_keys=True))
        assert (promoted["candidate"], promoted["outcome"], promoted["kind"]) == ("2.0", "promoted", "regression")
        assert promoted["quality"]["increase"] <= CONFIG.kinds.max_mae_increase
        assert promoted["agreement"]["value"] >= CONFIG.min_agreement
        assert promoted["agreement"]["tolerance"] == [
            pytest.approx(CONFIG.kinds.agreement_tolerance * promoted["quality"]["scale"][0])
        ]
        audit = (server.run_dir / "logs" / "audit.log").read_text().splitlines()
        assert [json.loads(line) for line in audit if '"event":"gate"' in line][-2:] == gates[-2:]
    finally:
        leave_only_1_0(rollout)


def test_a_shadow_of_each_regression_candidate_reports_its_live_agreement(kinds, tmp_path):
    """The frontend agent mirrors 1.0's requests to 2.0, then 3.0: the records' regression answers and
    the live log's are compared within the tolerance (2.0 agrees on most, 3.0 on few)."""
    server, _, mars = kinds
    rollout = diabetes_rollout(server, mars)
    files = server.files
    rows = ArchiveMeta.from_mar(mars[DIABETES, "1.0"]).golden["features"][:60]
    url = f"{server.props['inference_address']}/predictions/{DIABETES}"
    token = server.client().keys.get("inference")
    found = {}
    try:
        for version in ("2.0", "3.0"):
            rollout.register(version, workers=1)
            before = len(routes_lines(server.run_dir))
            set_route(
                files.live_routes,
                DIABETES,
                files.live_log.resolve(),
                "shadow",
                Route(version, 100.0, f"{url}/{version}"),
            )
            routes_applied(server.run_dir, before, timeout=30.0, expect=f"shadow {version} at 100.0%")
            with ThreadPoolExecutor(4) as pool:
                sent = list(
                    pool.map(
                        lambda row: requests.post(
                            url, json={"features": row}, headers={"Authorization": f"Bearer {token}"}, timeout=30
                        ),
                        rows,
                    )
                )
            assert {r.status_code for r in sent} == {200} and {r.json()["model_version"] for r in sent} == {"1.0"}
            ids = {r.headers["x-request-id"] for r in sent}

            def mirrored(ids=ids) -> list[dict]:
                text = files.live_log.read_text() if files.live_log.exists() else ""
                return [line for line in map(json.loads, text.splitlines()) if line["of"] in ids]

            assert len(settled(mirrored, at_least=len(rows), timeout=60.0)) == len(rows)
            report = save_shadow_report(
                DIABETES,
                version,
                files.live_log,
                files.records,
                mars[DIABETES, version],
                tmp_path / f"shadow-{version}.json",
                CONFIG.kinds,
            )
            print(report.text())
            assert (report.kind, report.compared, report.unmatched, report.truncated) == ("regression", 60, 0, 0)
            found[version] = report
            set_route(files.live_routes, DIABETES, files.live_log.resolve(), "shadow", None)
            rollout.client.unregister(DIABETES, version)
    finally:
        set_route(files.live_routes, DIABETES, files.live_log.resolve(), "shadow", None)
        leave_only_1_0(rollout)
    assert found["2.0"].agreement >= 0.9 > 0.5 > found["3.0"].agreement, {v: r.agreement for v, r in found.items()}
    worst = found["3.0"].disagreements
    assert worst and [d["gap"] for d in worst] == sorted((d["gap"] for d in worst), reverse=True)
    assert found["3.0"].ranked_by == "by the largest absolute difference, in target standard deviations"
