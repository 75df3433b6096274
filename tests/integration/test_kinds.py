"""Output kinds on a real TorchServe: a multi-label, a regression (scikit-learn's diabetes data) and an
embedding model, exported with ``outputs=``, archived by `make archive ARTIFACTS=<dir>` and served side by side.

Each answers /predictions with the model run in this process (sigmoid or raw) to 1e-5, KServe v1 and OIP v2
carry its output and the register-time golden check passes. /explanations explains a label's probability
or a regression target's value as Captum does on the model in this process (attributions summing to the
output's move from the baseline), also in a concurrent burst mixed with predictions and bad requests; an
embedding answers 501. The prediction drift the server exports stays low on training-like rows and rises
on shifted ones, as scored here.

The regression's versions: 1.0, 2.0 retrained with another seed, 3.0 trained on shuffled targets. The gate
(mean absolute error and agreement within a tolerance, in target standard deviations) refuses 3.0 and
promotes 2.0, and a shadow of each through the frontend agent reports their live agreement.
"""

from __future__ import annotations

import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
import yaml
from sklearn.datasets import load_diabetes
from torch import nn

from handler.drift import DriftMonitor
from handler.model import ModelMetadata
from rtserve.errors import GateRefused
from rtserve.model.archive import read_archive
from rtserve.model.package import Standardize, export
from rtserve.promotion.gate import ArchiveMeta, GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.live.evidence import save_shadow_report
from rtserve.promotion.live.routes import Route, set_route
from rtserve.promotion.measure import check_golden
from rtserve.promotion.rollout import Rollout, Verification
from tests.conftest import REPO, make_archive
from tests.helpers import record_batches, routes_applied, routes_lines, settled
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

MULTI, DIABETES, EMBED = "kinds-multi", "kinds-diabetes", "kinds-embed"
#: Rows in each worker's drift window; its gauges are exported every 0.2 s.
DRIFT_WINDOW = 400
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
    # a drift window a test fills exactly, exported often
    config["handler"].update(drift_window=DRIFT_WINDOW, drift_export_seconds=0.2)
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
def test_the_golden_check_passes(kinds, name):
    server, _, mars = kinds
    meta = ArchiveMeta.from_mar(mars[name, "1.0"])
    assert check_golden(server.client(timeout=60), name, None, meta, CONFIG) == len(meta.golden["features"])


def packed_meta(mars, name: str) -> ModelMetadata:
    """The ``meta.json`` packed inside the served archive."""
    raw = read_archive(mars[name, "1.0"]).meta
    return ModelMetadata(**{k: raw[k] for k in ModelMetadata.__dataclass_fields__ if k in raw})


def captum(models, name: str, mean: list[float], row: list[float], target: int) -> tuple[list[float], float, float]:
    """Captum on the model in this process: (attributions, convergence delta, output - baseline output)."""
    from captum.attr import IntegratedGradients

    model, activation = models[name]

    def forward(x: torch.Tensor) -> torch.Tensor:
        return activation(model(x))

    x, base = torch.tensor([row]), torch.tensor([mean])
    attributions, delta = IntegratedGradients(forward).attribute(
        x, baselines=base, target=target, n_steps=50, return_convergence_delta=True
    )
    with torch.no_grad():
        values = forward(torch.cat([x, base]))[:, target]
    return attributions[0].tolist(), float(delta[0]), float(values[0] - values[1])


def check_explanation(models, mars, name: str, body: dict, row: list[float], target: int, label: str) -> None:
    """``body`` explains ``target`` as Captum does here; its attributions sum to the output's move (IG's completeness)."""
    meta = packed_meta(mars, name)
    attributions, delta, move = captum(models, name, meta.mean, row, target)
    key = "value" if name == DIABETES else "probability"
    scale = max(1.0, abs(move))  # diabetes progressions are in the hundreds
    assert (body["target"], body["label"], body["model_version"]) == (target, label, "1.0")
    assert list(body["attributions"]) == meta.feature_names
    assert list(body["attributions"].values()) == pytest.approx(attributions, abs=1e-5 * scale)
    served_move = body[f"target_{key}"] - body[f"baseline_{key}"]
    assert served_move == pytest.approx(move, abs=1e-5 * scale)
    assert sum(body["attributions"].values()) == pytest.approx(
        served_move + body["convergence_delta"], abs=1e-5 * scale
    )
    assert body["convergence_delta"] == pytest.approx(delta, abs=1e-5 * scale)
    # sum(attributions) is about output - baseline output: 50 steps over the regression's ReLU kinks
    # leave up to 1.6% of a diabetes progression's move unattributed here
    assert abs(body["convergence_delta"]) < 0.05 * scale


def test_multi_label_and_regression_explanations_equal_captum_on_every_route(kinds):
    server, models, mars = kinds
    labels = ["urgent", "billing", "spam"]
    for row in golden_rows(mars, MULTI, 3):
        want = in_process(models, MULTI, [row])[0]
        top = max(range(3), key=want.__getitem__)
        default = post(server, f"explanations/{MULTI}", {"features": row})
        assert default.status_code == 200, default.text
        body = default.json()
        check_explanation(models, mars, MULTI, body, row, top, labels[top])  # the highest probability
        assert body["labels"] == [label for label, p in zip(labels, want) if p >= 0.5]
        assert list(body["probabilities"].values()) == pytest.approx(want, abs=1e-5)
        by_name = post(server, f"v1/models/{MULTI}:explain", {"features": row, "target": "spam"})
        assert by_name.status_code == 200, by_name.text
        check_explanation(models, mars, MULTI, by_name.json(), row, 2, "spam")
    for row in golden_rows(mars, DIABETES, 3):
        for path, target in ((f"explanations/{DIABETES}", None), (f"v2/models/{DIABETES}/explain", "progression")):
            response = post(server, path, {"features": row} | ({} if target is None else {"target": target}))
            assert response.status_code == 200, response.text
            body = response.json()
            check_explanation(models, mars, DIABETES, body, row, 0, "progression")
            assert body["prediction"] == pytest.approx(in_process(models, DIABETES, [row])[0][0], rel=1e-5)


def test_a_bad_target_gets_400_and_an_embedding_explanation_501(kinds):
    server, _, mars = kinds
    row = golden_rows(mars, MULTI, 1)[0]
    bad = post(server, f"explanations/{MULTI}", {"features": row, "target": "ham"})
    assert bad.status_code == 400
    assert bad.json() == {
        "error": "'target' must be a label index, an integer in [0, 2], or a label name "
        "('urgent', 'billing', 'spam'), got 'ham'",
        "field": "target",
    }
    bad = post(server, f"explanations/{DIABETES}", {"features": golden_rows(mars, DIABETES, 1)[0], "target": 1})
    assert bad.status_code == 400
    assert bad.json() == {
        "error": "'target' must be a target index, an integer in [0, 0], or a target name ('progression'), got 1",
        "field": "target",
    }
    for path in (f"explanations/{EMBED}", f"v1/models/{EMBED}:explain"):
        response = post(server, path, {"features": row})
        assert response.status_code == 501
        assert response.json() == {
            "error": "explanations are not available for an embedding model: it has no single scalar output to "
            "attribute (an embedding's numbers mean something only together); ask /predictions instead"
        }
    assert post(server, f"predictions/{EMBED}", {"features": row}).status_code == 200


def test_a_concurrent_burst_mixing_explanations_predictions_and_bad_requests(kinds):
    """36 requests at once to the regression: each gets the answer to what it asked.

    An explanation beyond the per-batch ceiling may get 503 + Retry-After; it is then sent again on
    its own and must succeed.
    """
    server, models, mars = kinds
    rows = ArchiveMeta.from_mar(mars[DIABETES, "1.0"]).golden["features"][:36]
    jobs = []
    for i, row in enumerate(rows):
        route = ("explanations", "predictions", "predictions")[i % 3]
        body = {"features": row} if i % 4 else {"features": row[:5]}  # every fourth too short
        jobs.append((route, body))
    before = len(record_batches(server.files.records))
    with ThreadPoolExecutor(max_workers=18) as pool:
        answers = list(pool.map(lambda job: post(server, f"{job[0]}/{DIABETES}", job[1]), jobs))
    for (route, body), answer, row in zip(jobs, answers, rows):
        if len(body["features"]) == 5:
            assert answer.status_code == 400
            assert answer.json() == {"error": "'features' must have exactly 10 numbers, got 5", "field": "features"}
        elif route == "predictions":
            assert answer.status_code == 200, answer.text
            assert set(answer.json()) == {"prediction", "model_version"}
            assert answer.json()["prediction"] == pytest.approx(in_process(models, DIABETES, [row])[0][0], rel=1e-5)
        else:
            if answer.status_code == 503:
                assert answer.headers["Retry-After"] == "1"
                answer = post(server, f"explanations/{DIABETES}", body)
            assert answer.status_code == 200, answer.text
            check_explanation(models, mars, DIABETES, answer.json(), row, 0, "progression")
    batches = record_batches(server.files.records)[before:]
    assert sum(size for size, _, _ in batches) >= len(jobs)
    mixed = [b for b in batches if 0 < b[2] < b[0]]
    assert mixed, f"no batch held both predictions and explanations: {batches}"


def scrape(server) -> str:
    return requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text


def prediction_drift(server, model: str) -> float | None:
    """The ``rtserve_prediction_drift_psi`` the server exports for ``model`` (None: no series)."""
    for line in scrape(server).splitlines():
        if line.startswith("rtserve_prediction_drift_psi{") and f'model_name="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def fill_window(server, model: str, rows: torch.Tensor) -> None:
    """``rows`` in order through KServe v1 (50 instances a request), sent one request at a time."""
    for start in range(0, len(rows), 50):
        response = post(server, f"v1/models/{model}:predict", {"instances": rows[start : start + 50].tolist()})
        assert response.status_code == 200, response.text


def drift_scraped(server, models, mars, name: str, rows: torch.Tensor) -> tuple[float, float]:
    """Fill the drift window with ``rows``; (the prediction drift scraped, the one scored here on them)."""
    fill_window(server, name, rows)
    monitor = DriftMonitor(packed_meta(mars, name).drift_reference, DRIFT_WINDOW)
    model, activation = models[name]
    with torch.inference_mode():
        monitor.update(rows, activation(model(rows)))
    want = monitor.scores().prediction
    deadline = time.monotonic() + 10
    while True:  # the worker's exporter thread sets the gauge within drift_export_seconds
        got = prediction_drift(server, name)
        if (got is not None and abs(got - want) < 0.01) or time.monotonic() > deadline:
            return got, want
        time.sleep(0.2)


@pytest.mark.parametrize("name", [MULTI, DIABETES, EMBED])
def test_prediction_drift_stays_low_on_training_like_rows_and_rises_on_shifted_ones(kinds, name):
    server, models, mars = kinds
    if name == DIABETES:
        x = torch.tensor(load_diabetes().data, dtype=torch.float32)
        calm, step = x[:DRIFT_WINDOW], 2 * x.std(dim=0)  # the training rows, then the holdout's first
    else:
        g = torch.Generator().manual_seed(21)
        calm, step = torch.randn(DRIFT_WINDOW, 6, generator=g) * 3 + 1, 6.0  # fresh rows like the training's
    got, want = drift_scraped(server, models, mars, name, calm)
    assert got == pytest.approx(want, abs=0.01) and got < 0.1
    got, want = drift_scraped(server, models, mars, name, calm + step)  # two standard deviations up
    assert got == pytest.approx(want, abs=0.01) and got > 0.2


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
