"""Rolling replacement of 2 TorchServe replicas behind a real nginx (bench/rolling_rehearsal.py).

The suite runs the forward half (1.0 -> 2.0) to stay short; `make bench-rehearsal` also rolls back.
"""

from __future__ import annotations

import pytest
import requests

from bench import rolling_rehearsal
from tests.conftest import make_archive
from tests.helpers import bench_main

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("nginx_installed")]


@pytest.fixture(scope="module")
def store(build_root, mar_v1):
    make_archive(build_root, "2.0")
    return mar_v1.parent


def test_rolling_replacement_through_nginx_loses_nothing(store, tmp_path):
    rc, report = bench_main(
        rolling_rehearsal.main,
        tmp_path / "report.json",
        "--model-store",
        store,
        "--work-dir",
        tmp_path / "rehearsal",
        "--replicas",
        2,
        "--hold",
        0.5,
        "--rate",
        60,
        "--concurrency",
        3,
        "--quiet",
        0.3,
        "--no-roll-back",
    )
    assert rc == 0
    # No request failed, counted on the first try: none needed rtserve's resend.
    assert report["failed_first"] == 0, [p["errors"] for p in report["phases"] if p["errors"]]
    assert report["resent"] == report["failed_after_resend"] == 0
    assert report["requests"] == report["sent"] == sum(p["sent"] for p in report["phases"])
    assert report["requests"] > 300
    phases = report["phases"]
    assert phases[0]["phase"] == "all on 1.0 [r1:1.0+r2:1.0]" and phases[0]["versions"].keys() == {"1.0"}
    assert phases[-1]["phase"] == "all on 2.0 [r3:2.0+r4:2.0]" and phases[-1]["versions"].keys() == {"2.0"}
    assert report["steady_ok"]
    assert any(p["versions"].keys() == {"1.0", "2.0"} for p in phases)  # side by side mid-roll
    # One at a time: each new replica was in rotation before its old one left; each old one was
    # drained (rtserve.server.drain) before it was stopped.
    actions = [(s["action"], s["replica"]) for s in report["steps"]]
    assert actions == [
        ("start", "r1+r2"),
        ("start", "r3"),
        ("add", "r3"),
        ("remove", "r1"),
        ("drain", "r1"),
        ("stop", "r1"),
        ("start", "r4"),
        ("add", "r4"),
        ("remove", "r2"),
        ("drain", "r2"),
        ("stop", "r2"),
    ]
    # Token auth at every hop: only the gateway key gets through the balancer, a hop checks it
    # too, and the replica itself still wants its own key (TorchServe answers 400 without one).
    assert report["auth"] == {
        "balancer without a key": 401,
        "balancer with a wrong key": 401,
        "balancer with a replica's key": 401,
        "hop without a key": 401,
        "replica without a key": 400,
        "balancer with the gateway key": 200,
    }
    # Everything it started is gone: the balancer's port refuses connections.
    with pytest.raises(requests.ConnectionError):
        requests.get(report["balancer_url"], timeout=2)
