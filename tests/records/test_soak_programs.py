"""What `make soak` runs inside a server pod, run here against the same parts: a real TorchServe
(as ``make serve`` starts it) shipping its records to the tier's real Cassandra.

bench/soak.py sends two programs through ``kubectl exec``: :data:`bench.soak.POD_SAMPLE` (the
run directory's bytes, then the exporter's scrape) and :data:`bench.soak.STORE_CHECK` (sampled
request ids looked up in the store named by ``RTSERVE_RECORDS_STORE``). Here they run in this
machine's ``sh`` and Python, with what a pod's environment gives them, after a steady load whose
requests the soak's own sink aggregated; the cluster itself is the cluster tier's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench import soak
from bench.loadgen import SteadyLoad
from tests.conftest import MODEL_NAME
from tests.helpers import features

pytestmark = pytest.mark.records

SHIP_TIMEOUT = 120.0


def pod_sample(server) -> dict:
    """:data:`bench.soak.POD_SAMPLE` as ``kubectl exec ... sh -c`` runs it, read as the sampler does."""
    done = subprocess.run(
        ["sh", "-c", soak.POD_SAMPLE, "sh", str(server.run_dir), f"{server.props['metrics_address']}/metrics"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    size, metrics = soak.parse_pod_sample(done.stdout)
    return {"t": time.monotonic(), "run_bytes": {"pod": size}, "records": {"pod": metrics}, "errors": []}


def store_check(server, env: dict, ids: list[str]) -> list[str]:
    """:data:`bench.soak.STORE_CHECK` as ``kubectl exec -i ... python -c`` runs it: ids on stdin."""
    done = subprocess.run(
        [sys.executable, "-c", soak.STORE_CHECK],
        input="".join(i + "\n" for i in ids),
        env={**os.environ, "RTSERVE_RUN_DIR": str(server.run_dir), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_pod_programs_count_every_answered_record_and_find_the_sampled_ones(server, cassandra):
    before = pod_sample(server)
    assert before["run_bytes"]["pod"] > 0 and before["records"]["pod"]["pending_bytes"] is not None
    minutes = soak.Minutes(id_every=10)
    load = SteadyLoad(
        f"{server.props['inference_address']}/predictions/{MODEL_NAME}",
        {"features": features()},
        lambda: server.client().keys.get("inference"),
        rate=80,
        concurrency=4,
        max_seconds=60,
        timeout=10.0,
        bad_every=20,
        sink=minutes,
    ).start("soak")
    time.sleep(8)
    load.stop()
    deadline = time.monotonic() + SHIP_TIMEOUT
    after = pod_sample(server)
    while after["records"]["pod"]["pending_bytes"] and time.monotonic() < deadline:
        time.sleep(1)
        after = pod_sample(server)
    assert after["records"]["pod"]["pending_bytes"] == 0, f"still pending after {SHIP_TIMEOUT:.0f} s"

    totals = minutes.totals(8)
    assert totals["answered"] == totals["sent"] > 80 and totals["bad"] > 0  # 4 threads, each a 20th bad
    intervals, run = soak.records_over_time([before, after])
    assert (run["written"], run["shipped"], run["dropped"]) == (totals["answered"],) * 2 + (0,)
    assert 0 < run["lag_p50_s"] <= run["lag_p99_s"] < 30 and intervals[0]["pending_bytes"] == 0

    lines = store_check(
        server,
        {"RTSERVE_RECORDS_STORE": cassandra.address},
        [i for i, _, _ in minutes.ids] + ["00000000-0000-0000-0000-000000000000"],
    )
    checked = soak.check_sample(minutes.ids + [("00000000-0000-0000-0000-000000000000", 200, "1.0")], lines)
    assert len(minutes.ids) == totals["answered"] // 10
    assert {k: checked[k] for k in ("found", "missing", "status_mismatches", "version_mismatches")} == {
        "found": len(minutes.ids),
        "missing": 1,
        "status_mismatches": 0,
        "version_mismatches": 0,
    }
    print(f"soak programs: {totals['sent']} sent, {run} over the run; sampled {checked}")


def test_the_store_check_says_when_the_pod_has_no_store(server):
    assert store_check(server, {"RTSERVE_RECORDS_STORE": ""}, ["x"]) == [
        '{"error": "RTSERVE_RECORDS_STORE is not set in the pod: its records stay in its spool"}'
    ]
