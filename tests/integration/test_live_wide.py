"""Shadowing a wide model on a real TorchServe: a candidate whose answers are longer than 4,096
characters (300 classes) has every mirrored request compared, its agreement measured.

The candidate, 5.0, is the demo's 1.0 with 297 more classes that never win (constant logits of
-30 beside the demo's three): it gives the default's class on every request but a near-tie, and
each of its answers carries 300 probabilities (about 6,600 characters). The agent once cut every
body at 4,096 characters, so none of these answers could be read and no pair was compared; it
now writes each whole (agent/src/rtserve/agent/LiveLog.java).
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

from rtserve.model.data import FEATURE_NAMES, LABELS, make_dataset
from rtserve.model.package import export
from rtserve.promotion.history import History
from rtserve.promotion.live.evidence import shadow_report_from_files
from rtserve.promotion.live.routes import Route, set_route
from rtserve.promotion.rollout import Rollout
from tests.conftest import MODEL_NAME, make_archive
from tests.helpers import Reference, agreement, demo_eager, keep_only, routes_applied, routes_lines, settled
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

#: The candidate's classes: the demo's three, then padding.
WIDE_LABELS = LABELS + [f"pad-{i:03d}" for i in range(300 - len(LABELS))]
#: Requests shadowed.
N = 120
VERSION = "5.0"


class Wide(torch.nn.Module):
    """``base``'s logits, then a constant -30 for each padding class (they never win)."""

    def __init__(self, base: torch.nn.Module, width: int) -> None:
        super().__init__()
        self.base = base
        self.pad = width - len(LABELS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.base(x)
        return torch.cat([logits, torch.full((x.shape[0], self.pad), -30.0)], dim=1)


@pytest.fixture(scope="module")
def wide(build_root, mar_v1, tmp_path_factory) -> Path:
    """``<name>_5.0.mar`` of :class:`Wide` over the demo's 1.0, in a model store of its own beside a
    copy of the default's archive (the session's shared store never holds a 5.0: other modules test
    that registering one fails)."""
    store = tmp_path_factory.mktemp("wide-store")
    shutil.copy(mar_v1, store / mar_v1.name)
    out = tmp_path_factory.mktemp("wide") / VERSION
    data = make_dataset()
    export(
        Wide(demo_eager("1.0"), len(WIDE_LABELS)),
        data.x_train,
        feature_names=FEATURE_NAMES,
        labels=WIDE_LABELS,
        version=VERSION,
        out_dir=out,
        holdout=(data.x_test, data.y_test),
    )
    return make_archive(build_root, VERSION, store, ARTIFACTS=str(out))


@pytest.fixture(scope="module")
def server(mar_v1, wide, tmp_path_factory):
    with serve(tmp_path_factory.mktemp("run"), wide.parent / mar_v1.name) as ts:
        rollout = Rollout(ts.client(timeout=120), History(ts.files.history), MODEL_NAME)
        rollout.register(VERSION, workers=1)
        try:
            yield ts
        finally:
            keep_only(rollout)


def send(server, rows) -> list[requests.Response]:
    url = f"{server.props['inference_address']}/predictions/{MODEL_NAME}"
    headers = {"Authorization": f"Bearer {server.client().keys.get('inference')}"}
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda row: requests.post(url, json={"features": row}, headers=headers, timeout=30), rows))


def test_a_300_class_candidate_has_every_mirrored_request_compared(server, wide, mar_v1):
    files = server.files
    rows = make_dataset().x_test[:N].tolist()
    before = len(routes_lines(server.run_dir))
    set_route(
        files.live_routes,
        MODEL_NAME,
        files.live_log.resolve(),
        "shadow",
        Route(VERSION, 100.0, f"{server.props['inference_address']}/predictions/{MODEL_NAME}/{VERSION}"),
    )
    routes_applied(server.run_dir, before, timeout=30.0, expect=f"shadow {VERSION} at 100.0%")
    answers = send(server, rows)
    assert [a.status_code for a in answers] == [200] * N
    assert {a.json()["model_version"] for a in answers} == {"1.0"}
    ids = {a.headers["x-request-id"] for a in answers}

    def mirrored() -> list[dict]:
        text = files.live_log.read_text() if files.live_log.exists() else ""
        return [line for line in map(json.loads, text.splitlines()) if line["of"] in ids]

    lines = settled(mirrored, at_least=N, timeout=60.0)
    assert len(lines) == N and {line["status"] for line in lines} == {200}
    report = shadow_report_from_files(MODEL_NAME, files.live_log, files.records, VERSION, candidate_labels=WIDE_LABELS)
    print(report.text())
    assert (
        report.mirrored,
        report.compared,
        report.truncated,
        report.dropped,
        report.unmatched,
        report.skipped_lines,
    ) == (N, N, 0, 0, 0, 0), report.json()
    assert report.errors["candidate"]["errors"] == 0
    # The agreement, as the in-process models (the archives' own weights) give it on these rows.
    default = Reference.from_mar(mar_v1, demo_eager("1.0"))
    candidate = Reference.from_mar(wide, Wide(demo_eager("1.0"), len(WIDE_LABELS)).eval())
    same, ties = agreement(default, candidate, rows)
    assert same >= N - ties and abs(report.agreement * N - same) <= ties + 1e-6 * N, (report.agreement, same)
    # Every answer is longer than the 4,096 characters the agent once kept, and logged whole.
    assert min(len(line["body"]) for line in lines) > 4096
    assert all(len(json.loads(line["body"])["probabilities"]) == len(WIDE_LABELS) for line in lines)
    launcher = (server.run_dir / "launcher.log").read_text()
    assert (
        "[rtserve-agent] live log: answers of up to 6553500 characters are logged whole "
        "(the frontend's max_response_size)"
    ) in launcher
