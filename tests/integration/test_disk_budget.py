"""Every file a server writes stays within its disk budget (rtserve.server.disk), however much it
writes: a real server with the least budget it accepts (8 MiB), its workers' metrics files in its
run directory, takes bounded load that writes more than ten times that across its files, while a
sampler measures the run directory every 150 ms (tests/disk_budget.py).

Here the server has no records store: its records stay in the local spool, which keeps the newest
within the spool's share (the oldest deleted first). The records tier runs the same load with
the records shipped to Cassandra, and finds every one there (tests/records/test_disk_budget.py).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bench.worker_crash import wait_replaced, workers
from rtserve.observability.metrics_files import kind_and_pid
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import SHIPPER
from tests.conftest import MODEL_NAME
from tests.disk_budget import assert_within_budget, scraped, small_server, ten_budgets

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def small(build_root, tmp_path_factory):
    """A server with an 8 MiB budget and no records store (:func:`tests.disk_budget.small_server`)."""
    with small_server(build_root, tmp_path_factory.mktemp("disk")) as ts:
        yield ts


def owners(directory: Path) -> dict[str, list[str]]:
    """The metrics files by the PID in their name (``archive`` for the archives)."""
    found: dict[str, list[str]] = {}
    for path in directory.iterdir():
        found.setdefault((kind_and_pid(path.name) or ("", path.name))[1], []).append(path.name)
    return found


def predict(server, n: int) -> None:
    client = server.client()
    for _ in range(n):
        client.predict(MODEL_NAME, sample_payload())


def test_a_killed_workers_metrics_files_are_merged_and_its_counts_stay(small):
    """TorchServe restarts a killed worker under a new PID; the exporter merges the dead PID's
    files into the archive: the directory holds the live workers' files only, and the counters
    keep what the dead worker counted."""
    predict(small, 40)
    before = scraped(small, "rtserve_handler_requests_total")
    client = small.client()
    victim = workers(client, MODEL_NAME)[0]
    os.kill(int(victim["pid"]), signal.SIGKILL)
    waited, now = wait_replaced(client, MODEL_NAME, victim, 2, timeout=60)
    assert waited is not None, f"the killed worker was not replaced: {now}"
    deadline = time.monotonic() + 15  # the exporter looks every second
    while str(victim["pid"]) in owners(small.metrics_dir):
        assert time.monotonic() < deadline, owners(small.metrics_dir)
        time.sleep(0.2)
    predict(small, 40)
    after = scraped(small, "rtserve_handler_requests_total")
    live = {str(w["pid"]) for w in workers(client, MODEL_NAME)}
    found = owners(small.metrics_dir)
    print(f"\nrequests counted: {before:.0f} before the kill, {after:.0f} after 40 more; metrics files: {found}")
    assert after >= before + 40  # the dead worker's counts stayed
    shipper = str(small.sidecar_pid(SHIPPER))  # the records shipper's own metrics
    assert set(found) == live | {"archive", shipper}, found
    assert "counter_archive.db" in found["archive"]


def test_the_run_directory_never_exceeds_the_budget_under_ten_budgets_of_writes(small, tmp_path):
    loaded = ten_budgets(small, tmp_path)
    written = scraped(small, "rtserve_records_written_total")
    dropped = scraped(small, "rtserve_records_dropped_total")
    print(
        f"\n{loaded.report()}\nrecords: {written:.0f} written, {dropped:.0f} dropped, the spool "
        f"at most {loaded.usage.max_records / 1024:.0f} KiB"
    )
    assert_within_budget(small, loaded)
    # every request was recorded; the local spool kept the newest, none was dropped
    assert written >= loaded.sent and dropped == 0
    assert small.client().predict(MODEL_NAME, sample_payload())["label"]
