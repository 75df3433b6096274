"""Drain: readiness false, then SIGTERM, loses no accepted request (bench/drain.py's main, short)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from bench import drain
from bench.loadgen import SteadyLoad
from rtserve.server.readiness import sample_payload
from tests.conftest import MODEL_NAME, REPO
from tests.helpers import bench_main

pytestmark = pytest.mark.integration


def test_drain_then_stop_loses_no_accepted_request(mar_v1, tmp_path, capsys):
    rc, reports = bench_main(
        drain.main,
        tmp_path / "report.json",
        "--model-store",
        mar_v1.parent,
        "--run-root",
        tmp_path,
        "--mode",
        "drain",
        "--hold",
        1.5,
        "--lag",
        0.5,
        "--quiet",
        0.5,
        "--rate",
        1000,
        "--concurrency",
        12,
    )
    assert rc == 0 and [r["mode"] for r in reports] == ["drain"], reports
    (report,) = reports
    assert f"[drain] {report['requests']} requests" in capsys.readouterr().out
    # Traffic really reached the server while it drained (the path under test ran) ...
    assert report["drain"]["drained"] and report["drain"]["arrivals"] > 0, report
    assert report["during_stop"] > 0
    assert report["drain"]["seconds"] >= 0.5  # it waited for the router to stop sending
    # ... every request that got an answer got a 200 on its first try, and none was accepted
    # and then dropped; only a refused connect (the server never saw it) is not a 200:
    assert report["answered_200"] > 100
    assert report["answered_other"] == {}
    assert report["lost"] == 0, report["lost_errors"]
    assert report["answered"] + report["refused"] == report["requests"] == report["sent"]
    assert report["failed_first"] == report["refused"] and report["resent"] == 0
    # Once stopped, a request is refused at connect time: never accepted, then dropped.
    assert report["after_stop"] == ["refused"] * 5


def _server_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rtserve", "server", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )


def test_drain_cli_waits_for_traffic_to_stop_then_stops(server):
    """`python -m rtserve server drain` (what a preStop hook runs) on a server started with
    other ports: the CLI finds them in the run dir's effective config."""
    run_dir = str(server.run_dir)
    url = f"{server.props['inference_address']}/predictions/{MODEL_NAME}"
    client = server.client()
    load = SteadyLoad(
        url, sample_payload(), lambda: client.keys.get("inference"), rate=50, concurrency=2, max_seconds=30
    ).start()
    try:  # traffic that never stops: the drain gives up at its timeout and says so
        busy = _server_cli("drain", "--run-dir", run_dir, "--quiet", "0.5", "--drain-timeout", "1.5")
    finally:
        records = load.stop()
    assert busy.returncode == 1, busy.stdout
    assert "drain: NOT idle after" in busy.stdout
    assert all(r.first_status == 200 for r in records) and records  # draining alone refuses nothing
    assert server.draining
    assert "draining" in _server_cli("status", "--run-dir", run_dir).stdout

    idle = _server_cli("drain", "--run-dir", run_dir, "--quiet", "0.3", "--min-wait", "0.6")
    assert idle.returncode == 0, idle.stdout
    assert "drain: idle after" in idle.stdout
    pid = server.pid()
    stopped = _server_cli("stop", "--drain", "--run-dir", run_dir, "--quiet", "0.3")
    assert stopped.returncode == 0, stopped.stdout
    assert f"TorchServe stopped (pid {pid})." in stopped.stdout
    assert server.pid() is None
    with pytest.raises(requests.ConnectionError):
        requests.post(url, json=sample_payload(), timeout=5)
