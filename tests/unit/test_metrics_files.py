"""The workers' metrics directory kept bounded (rtserve.observability.metrics_files), with real
prometheus_client multiprocess files written by real processes that then exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from rtserve.observability import metrics_files as mf
from rtserve.observability.metrics_files import compact

pytestmark = pytest.mark.unit

#: A worker: counters, a histogram and gauges of four modes, each moved by argv[1]; with argv[2],
#: it stays alive until its stdin closes.
WORKER = """
import sys
from prometheus_client import Counter, Gauge, Histogram
n = int(sys.argv[1])
Counter("rtserve_requests", "r", ["model"]).labels("m").inc(n)
h = Histogram("rtserve_seconds", "s", buckets=(0.1, 1.0))
for i in range(n):
    h.observe(0.05 * (i % 30))
Gauge("rtserve_drift", "d", multiprocess_mode="mostrecent").set(n)
Gauge("rtserve_peak", "p", multiprocess_mode="max").set(n)
Gauge("rtserve_sum", "s", multiprocess_mode="sum").set(n)
Gauge("rtserve_inflight", "i", multiprocess_mode="livesum").set(n)
if len(sys.argv) > 2:
    print("ready", flush=True)
    sys.stdin.read()
"""


def worker(directory: Path, n: int, stay: bool = False):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    args = [sys.executable, "-c", WORKER, str(n)] + (["stay"] if stay else [])
    if not stay:
        subprocess.run(args, env=env, check=True, timeout=60)
        return None
    proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def scrape(directory: Path) -> dict[tuple, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect() for s in family.samples}


def no_live(scraped: dict[tuple, float]) -> dict[tuple, float]:
    """A scrape but for the live gauge (a dead worker's is dropped)."""
    return {k: v for k, v in scraped.items() if k[0] != "rtserve_inflight"}


def kept(scraped: dict[tuple, float]):
    """:func:`no_live`, compared to 1e-12 (a sum's rounding follows the order of the files)."""
    return pytest.approx(no_live(scraped), rel=1e-12)


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def pid_files(directory: Path, pid: int) -> list[str]:
    return [name for name in files(directory) if name.endswith(f"_{pid}.db")]


def test_dead_workers_files_are_merged_and_the_totals_stay(tmp_path):
    live = worker(tmp_path, 7, stay=True)
    try:
        for n in (3, 5, 11):
            worker(tmp_path, n)
        before = scrape(tmp_path)
        assert len(files(tmp_path)) == 4 * 6  # 4 processes x 6 files (counter, histogram, 4 gauges)
        done = compact(tmp_path)
        assert (done.merged, done.dropped) == (3 * 5, 3)
        after = scrape(tmp_path)
        # the live worker's files and one archive per kind (live gauges have none)
        assert files(tmp_path) == sorted(
            pid_files(tmp_path, live.pid)
            + [
                "counter_archive.db",
                "histogram_archive.db",
                "gauge_mostrecent_archive.db",
                "gauge_max_archive.db",
                "gauge_sum_archive.db",
            ]
        )
        assert after[("rtserve_requests_total", (("model", "m"),))] == 3 + 5 + 11 + 7
        assert after[("rtserve_seconds_count", ())] == 26
        assert after[("rtserve_sum", ())] == 26 and after[("rtserve_peak", ())] == 11
        assert after[("rtserve_drift", ())] == 11  # the worker that set it last
        assert before[("rtserve_inflight", ())] == 26 and after[("rtserve_inflight", ())] == 7
        # everything else reads exactly as before (histogram buckets included)
        assert no_live(after) == kept(before)
        # more workers die: their counts add to the archive's
        worker(tmp_path, 2)
        assert compact(tmp_path).merged == 5
        assert scrape(tmp_path)[("rtserve_requests_total", (("model", "m"),))] == 28
        assert len(files(tmp_path)) == 6 + 5
        assert compact(tmp_path).merged == 0  # nothing dead left
    finally:
        live.stdin.close()
        live.wait(timeout=30)
    assert compact(tmp_path).merged == 5  # the last one died too
    assert files(tmp_path) == [
        "counter_archive.db",
        "gauge_max_archive.db",
        "gauge_mostrecent_archive.db",
        "gauge_sum_archive.db",
        "histogram_archive.db",
    ]
    assert scrape(tmp_path)[("rtserve_drift", ())] == 2  # the last one set


@pytest.mark.parametrize("crash_after", ["staging", "commit"])
def test_a_compaction_cut_short_is_finished_or_forgotten_never_counted_twice(tmp_path, monkeypatch, crash_after):
    for n in (3, 5):
        worker(tmp_path, n)
    compact(tmp_path)  # an archive exists already
    worker(tmp_path, 11)
    expected = scrape(tmp_path)
    real_finish, real_replace = mf._finish, os.replace
    calls = []

    def finish(directory):
        calls.append(directory)
        if len(calls) == 2 and crash_after == "commit":
            raise KeyboardInterrupt("killed after the commit")
        real_finish(directory)

    def replace(src, dst):
        if crash_after == "staging" and str(dst).endswith(mf.MANIFEST):
            raise KeyboardInterrupt("killed before the commit")
        real_replace(src, dst)

    monkeypatch.setattr(mf, "_finish", finish)
    monkeypatch.setattr(mf.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        compact(tmp_path)
    monkeypatch.undo()
    assert any(name.endswith(mf.STAGED) for name in files(tmp_path))
    assert scrape(tmp_path) == pytest.approx(expected, rel=1e-12)  # staged archives are not read
    compact(tmp_path)  # the next round (a restarted exporter)
    assert no_live(scrape(tmp_path)) == kept(expected)
    assert scrape(tmp_path)[("rtserve_requests_total", (("model", "m"),))] == 19
    assert not any(name.endswith((mf.STAGED, ".json", ".tmp")) for name in files(tmp_path))
    assert len(files(tmp_path)) == 5


def test_files_that_are_not_a_workers_are_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "counter_archive.db").write_bytes(b"")
    assert mf.kind_and_pid("gauge_livesum_12.db") == ("gauge_livesum", "12")
    assert mf.kind_and_pid("counter_archive.db") == ("counter", "archive")
    assert mf.kind_and_pid("x.db") is None and mf.kind_and_pid("counter_1.txt") is None
    assert compact(tmp_path) == mf.Compaction()
    assert files(tmp_path) == ["counter_archive.db", "notes.txt"]
