"""What the examples' end-to-end tests share: the served example and its candidates, requests, gauges, the gate.

Each example (examples/<name>.py) is built by `make example EXAMPLE_NAME=<name>` as users build it, its
candidates (a retrain, a model trained on shuffled truth) exported here, and served alone by one worker,
so one drift window fills in order.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
import yaml

from rtserve.errors import GateRefused
from rtserve.model.package import export
from rtserve.promotion.gate import GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.rollout import Rollout, Verification
from tests.conftest import REPO, make_archive
from tests.helpers import make
from tests.integration.conftest import serve


@contextmanager
def served_example(
    name: str,
    packaging: Callable[..., dict],
    candidates: dict[str, dict],
    build_root: Path,
    mar_v1: Path,
    tmp_path_factory,
    drift_window: int,
) -> Iterator[tuple]:
    """(server, {version: archive}): 1.0 by `make example`, each candidate ``packaging(**kwargs)`` exported here."""
    work = tmp_path_factory.mktemp(name)
    config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    config.update(minWorkers=1, maxWorkers=1)  # one drift window, filled in order
    config["handler"].update(drift_window=drift_window, drift_export_seconds=0.2)
    (work / "model-config.yaml").write_text(yaml.safe_dump(config))
    where = [f"MODEL_STORE={build_root / 'model_store'}", f"MODEL_CONFIG={work / 'model-config.yaml'}"]
    done = make("example", f"EXAMPLE_NAME={name}", f"DEMO_ARTIFACTS={build_root / 'artifacts'}", *where, timeout=900)
    assert done.returncode == 0, f"make example failed:\n{done.stdout[-3000:]}"
    mars = {"1.0": build_root / "model_store" / f"{name}_1.0.mar"}
    assert mars["1.0"].is_file(), done.stdout
    for version, kwargs in candidates.items():
        export(version=version, out_dir=work / version, model_config=work / "model-config.yaml", **packaging(**kwargs))
        mars[version] = make_archive(
            build_root,
            version,
            MODEL_NAME=name,
            ARTIFACTS=str(work / version),
            MODEL_CONFIG=str(work / "model-config.yaml"),
        )
    with serve(tmp_path_factory.mktemp("run"), mar_v1, models=[f"{name}={mars['1.0'].name}"], ready=[name]) as ts:
        yield ts, mars


def post(server, path: str, body=None, data: bytes | None = None, headers: dict | None = None) -> requests.Response:
    """POST a JSON ``body`` (NaN and infinities as JSON's extensions) or raw ``data`` to the inference API."""
    sent = {"Authorization": f"Bearer {server.client().keys.get('inference')}", "Content-Type": "application/json"}
    payload = data if data is not None else json.dumps(body).encode()
    return requests.post(
        f"{server.props['inference_address']}/{path}", data=payload, headers={**sent, **(headers or {})}, timeout=30
    )


def scraped(server, metric: str, name: str) -> dict[str, float]:
    """``feature`` label (or '') -> value of ``metric``'s series for the model ``name``."""
    text = requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith(metric + "{") and f'model_name="{name}"' in line:
            feature = line.split('feature="', 1)[1].split('"', 1)[0] if 'feature="' in line else ""
            out[feature] = float(line.rsplit(" ", 1)[1])
    return out


def settled(server, metric: str, name: str) -> dict[str, float]:
    """``metric``'s series once two scrapes 0.5 s apart agree (the exporter runs every 0.2 s)."""
    before = scraped(server, metric, name)
    for _ in range(20):
        time.sleep(0.5)
        now = scraped(server, metric, name)
        if now and now == before:
            return now
        before = now
    return before


def gate_verdicts(server, mars: dict, name: str) -> tuple:
    """Register 2.0 and 3.0, promote 3.0 (it must be refused), then 2.0: (the refusal's report, 2.0's gate event).

    The default is set back to 1.0 and the candidates unregistered afterwards, whatever happened.
    """
    config = dataclasses.replace(
        GateConfig.load(), burst_requests=20, warmup_requests=2, concurrency=4, max_latency_ratio=10.0
    )  # the p99 ratio is gated alike for every kind (tests/integration/test_promotion.py)
    rollout = Rollout(
        server.client(timeout=120),
        History(server.run_dir / HISTORY_FILE),
        name,
        Verification(mars["2.0"].parent, config, server.run_dir / "logs" / "audit.log"),
    )
    try:
        rollout.register("2.0", workers=1)
        rollout.register("3.0", workers=1)
        try:
            rollout.promote("3.0")
        except GateRefused as refused:
            report = refused.report
        else:
            raise AssertionError(f"{name} 3.0 (trained on shuffled truth) was promoted")
        print(report.text())
        assert rollout.default_version() == "1.0", "a refused candidate changed the default"
        rollout.promote("2.0")
        promoted = [e for e in History(server.run_dir / HISTORY_FILE).events() if e.get("action") == "gate"][-1]
        print(promoted)
        assert rollout.default_version() == "2.0" and promoted["candidate"] == "2.0"
        return report, promoted
    finally:
        if rollout.default_version() != "1.0":
            rollout.client.set_default(name, "1.0")
        for version in rollout.versions():
            if version != "1.0":
                rollout.client.unregister(name, version)
