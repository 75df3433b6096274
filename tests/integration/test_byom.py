"""Bring your own model: three models packaged with rtserve.model.package.export, archived by
`make archive ... ARTIFACTS=<dir>`, served side by side by one real TorchServe.

- the demo (1.0, the shared session archive),
- the example on real data (examples/breast_cancer.py: 30 features, 2 classes, batch norm and
  dropout), trained in this process,
- a network the project never defined (random layers of another shape, 7 features, 5 classes).

Each answers like its eager model run in this process, refuses wrong lengths with its own count,
explains with its own feature names, scores drift against its own reference and labels its
metrics with its own name. An archive whose program carries a pickle payload is refused at
`make archive` and, packed by hand, at register; the payload never runs.
"""

from __future__ import annotations

import json
import subprocess
import time
import zipfile

import pytest
import requests
import torch
import yaml

from examples.breast_cancer import packaging
from handler.drift import DriftMonitor
from rtserve.client.rest import TorchServeError
from rtserve.model.package import export
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.rollout import Rollout
from tests.conftest import MODEL_NAME, REPO, make_archive
from tests.helpers import Reference, demo_eager
from tests.integration.conftest import serve
from tests.unit.test_package import malicious_artifact, random_model, random_rows, rewrite

pytestmark = pytest.mark.integration

EXAMPLE, RANDOM = "breast-cancer", "random-net"
DRIFT_WINDOW = 100


@pytest.fixture(scope="module")
def byom(build_root, mar_v1, tmp_path_factory):
    """(server, {model name: Reference to its eager model}, artifact dirs)."""
    root = tmp_path_factory.mktemp("byom")
    spec = packaging()
    example_model = spec["model"]
    export(version="1.0", out_dir=root / EXAMPLE, **spec)
    rnd = random_model()
    export(
        rnd,
        random_rows(),
        feature_names=[f"x{i}" for i in range(7)],
        labels=list("abcde"),
        version="0.1",
        out_dir=root / RANDOM,
    )
    # one worker each, and a small drift window exported often, so a test can fill it exactly
    config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    config.update(minWorkers=1, maxWorkers=1)
    config["handler"].update(drift_window=DRIFT_WINDOW, drift_export_seconds=0.2)
    (root / "model-config.yaml").write_text(yaml.safe_dump(config))
    mars = {
        name: make_archive(
            build_root,
            version,
            MODEL_NAME=name,
            ARTIFACTS=str(root / name),
            MODEL_CONFIG=str(root / "model-config.yaml"),
        )
        for name, version in ((EXAMPLE, "1.0"), (RANDOM, "0.1"))
    }
    models = [f"{MODEL_NAME}={mar_v1.name}"] + [f"{n}={m.name}" for n, m in mars.items()]
    refs = {
        MODEL_NAME: Reference.from_mar(mar_v1, demo_eager("1.0")),
        EXAMPLE: Reference.from_mar(mars[EXAMPLE], example_model),
        RANDOM: Reference.from_mar(mars[RANDOM], rnd),
    }
    with serve(
        tmp_path_factory.mktemp("run"), mar_v1, models=models, ready=[MODEL_NAME, EXAMPLE, RANDOM], timeout=180
    ) as ts:
        yield ts, refs, root


def post(server, route: str, model: str, body) -> requests.Response:
    key = server.client().keys.get("inference")
    return requests.post(
        f"{server.props['inference_address']}/{route}/{model}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def rows_for(ref: Reference, n: int) -> list[list[float]]:
    return ref.meta.golden["features"][:n]


@pytest.mark.parametrize("model", [MODEL_NAME, EXAMPLE, RANDOM])
def test_predictions_equal_the_eager_model_in_process(byom, model):
    server, refs, _ = byom
    ref = refs[model]
    rows = rows_for(ref, 24)
    expected = ref.probabilities(rows)
    for row, probs in zip(rows, expected):
        response = post(server, "predictions", model, {"features": row})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["probabilities"] == pytest.approx(probs.tolist(), abs=1e-5)
        assert body["label"] == ref.meta.labels[int(probs.argmax())]
    assert len(ref.meta.labels) == len(expected[0])


@pytest.mark.parametrize("model,expected", [(MODEL_NAME, 32), (EXAMPLE, 30), (RANDOM, 7)])
def test_wrong_lengths_name_each_models_own_count(byom, model, expected):
    server, _, _ = byom
    for n in (expected - 1, expected + 2):
        response = post(server, "predictions", model, {"features": [0.5] * n})
        assert response.status_code == 400
        assert response.json() == {
            "error": f"'features' must have exactly {expected} numbers, got {n}",
            "field": "features",
        }


def test_example_explanations_are_keyed_by_its_feature_names_and_equal_captum(byom):
    server, refs, _ = byom
    ref = refs[EXAMPLE]
    assert ref.meta.feature_names[:2] == ["mean radius", "mean texture"]
    for row in rows_for(ref, 3):
        for target in (0, 1):
            response = post(server, "explanations", EXAMPLE, {"features": row, "target": target})
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["label"] == ref.meta.labels[target] == ("malignant", "benign")[target]
            expected, delta = ref.integrated_gradients(row, target)
            assert list(body["attributions"]) == ref.meta.feature_names
            assert list(body["attributions"].values()) == pytest.approx(expected, abs=1e-5)
            assert body["convergence_delta"] == pytest.approx(delta, abs=1e-5)


def scrape(server) -> str:
    return requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text


def series(text: str, name: str, model: str) -> dict[str, float]:
    """``feature`` label (or '') -> value of ``name``'s series for ``model``."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model_name="{model}"' in line:
            feature = line.split('feature="', 1)[1].split('"', 1)[0] if 'feature="' in line else ""
            out[feature] = out.get(feature, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_drift_against_its_own_reference_and_metrics_labelled_with_its_own_name(byom):
    """Sequential requests to the one worker: its drift window then holds known rows, whose
    PSI against the example's own training reference is computed here and must be scraped."""
    server, refs, _ = byom
    ref = refs[EXAMPLE]
    x = torch.tensor(ref.meta.golden["features"])
    x = torch.cat([x[:20], x * 1.5])[: DRIFT_WINDOW + 20]  # the window ends up all shifted
    for row in x.tolist():
        assert post(server, "predictions", EXAMPLE, {"features": row}).status_code == 200
    time.sleep(0.3)
    last = x[-1:].tolist()
    assert post(server, "predictions", EXAMPLE, {"features": last[0]}).status_code == 200
    window = torch.cat([x, x[-1:]])[-DRIFT_WINDOW:]
    monitor = DriftMonitor(ref.meta.drift_reference, DRIFT_WINDOW)
    monitor.update(window, ref.probabilities(window.tolist()).argmax(dim=1))
    expected = dict(zip(ref.meta.feature_names, monitor.scores().features))
    deadline = time.monotonic() + 10
    while True:  # the worker's exporter thread sets the gauges within drift_export_seconds
        text = scrape(server)
        scraped = series(text, "rtserve_feature_drift_psi", EXAMPLE)
        if scraped == pytest.approx(expected, abs=1e-4) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert set(scraped) == set(ref.meta.feature_names)
    assert scraped == pytest.approx(expected, abs=1e-4)
    assert max(expected.values()) > 0.2  # the shifted rows show
    assert series(text, "rtserve_handler_requests_total", EXAMPLE)[""] >= DRIFT_WINDOW + 21
    assert set(series(text, "rtserve_feature_drift_psi", RANDOM)) <= {f"x{i}" for i in range(7)}
    predicted = {
        line.split('class="', 1)[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("rtserve_predictions_total{")
        and f'model_name="{EXAMPLE}"' in line
        and not line.endswith(" 0.0")
    }
    assert predicted and predicted <= {"malignant", "benign"}


def test_drift_after_a_burst_and_then_silence_covers_every_row(byom):
    """A burst, then no request at all: the worker's exporter thread scores the rows still
    buffered (all of them here: fewer than drift_flush_rows) and sets the gauges, with no later
    batch to trigger it. The burst ends with shifted rows, which the gauges must show."""
    server, refs, _ = byom
    ref = refs[RANDOM]
    x = torch.tensor(ref.meta.golden["features"])
    burst = torch.cat([x[:DRIFT_WINDOW], x[:30] * 3.0])  # the window's last 30 rows shifted
    for row in burst.tolist():
        assert post(server, "predictions", RANDOM, {"features": row}).status_code == 200
    window = burst[-DRIFT_WINDOW:]
    monitor = DriftMonitor(ref.meta.drift_reference, DRIFT_WINDOW)
    monitor.update(window, ref.probabilities(window.tolist()).argmax(dim=1))
    expected = dict(zip(ref.meta.feature_names, monitor.scores().features))
    silent_since = time.monotonic()
    while True:  # a scrape within 10 s of the last request
        scraped = series(scrape(server), "rtserve_feature_drift_psi", RANDOM)
        if scraped == pytest.approx(expected, abs=1e-4) or time.monotonic() - silent_since > 10:
            break
        time.sleep(0.2)
    assert scraped == pytest.approx(expected, abs=1e-4)
    assert max(expected.values()) > 0.2


def test_a_program_carrying_a_pickle_payload_never_runs(byom, build_root, tmp_path):
    server, _, root = byom
    marker = tmp_path / "payload-ran"
    bad = malicious_artifact(root / EXAMPLE, tmp_path / "bad", "pickled sample inputs", marker)
    # 1. make archive refuses it (its check is the handler's loader)
    done = subprocess.run(
        [
            "make",
            "-s",
            "archive",
            f"MODEL_NAME={EXAMPLE}",
            "MODEL_VERSION=1.0",
            f"ARTIFACTS={bad}",
            f"MODEL_STORE={tmp_path / 'store'}",
            f"VENV={REPO / '.venv'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "its sample inputs are not plain tensors and are refused" in done.stderr + done.stdout
    # 2. packed by hand into an archive anyway, TorchServe's worker refuses to load it
    store = server.model_store
    good = store / f"{EXAMPLE}_1.0.mar"

    def change(name: str, data: bytes):
        if name == "model.pt2":
            return (bad / "model.pt2").read_bytes()
        if name == "MAR-INF/MANIFEST.json":
            manifest = json.loads(data)
            manifest["model"]["modelVersion"] = "6.6"
            return json.dumps(manifest).encode()
        return data

    rewrite(good, store / f"{EXAMPLE}_6.6.mar", change)
    with zipfile.ZipFile(store / f"{EXAMPLE}_6.6.mar") as zf:
        assert zf.read("model.pt2") == (bad / "model.pt2").read_bytes()
    rollout = Rollout(server.client(timeout=120), History(server.run_dir / HISTORY_FILE), EXAMPLE)
    with pytest.raises(TorchServeError, match="the archive's handler failed to load"):
        rollout.register("6.6")
    assert rollout.versions() == ["1.0"]
    assert not marker.exists(), "the payload ran"
    assert post(server, "predictions", EXAMPLE, {"features": [1.0] * 30}).status_code == 200
