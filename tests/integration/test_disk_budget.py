"""Every file a server writes stays within its disk budget (rtserve.server.disk), however much it
writes: a real server with the least budget it accepts (8 MiB), its workers' metrics files in its
run directory, takes bounded load that writes more than ten times that across its files, while a
sampler measures the run directory every 150 ms.

The load (wrk, `make bench-deps`) posts predictions whose URL carries a 3,800-byte query parameter
(TorchServe's access log records each URL: about 4 kB a request), with a shadow of the served
version to itself at 100 % (every request a mirror, and a line of the agent's live log), and the
handler's per-batch model_log line on: every kind of file rolls many times.

The handler's per-request audit lines are off here (the archive's model-config ``handler:
audit_log: false``): the records spool (``RUN_DIR/records/``, written by the workers within its
own share of the budget, ``RTSERVE_SPOOL_BYTES``) takes the per-request trail.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.perf import run_wrk
from bench.worker_crash import wait_replaced, workers
from rtserve.observability.metrics_files import kind_and_pid
from rtserve.server.disk import BUDGET_KEY, TS_LOGS, DiskBudget
from rtserve.server.readiness import sample_payload
from rtserve.settings import Settings
from tests.conftest import MODEL_NAME, make_archive, require
from tests.helpers import MODEL_YAML
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

MiB = 2**20
BUDGET = 8 * MiB
#: The query parameter's length: the request line stays within Netty's 4,096 bytes.
PAD = 3800
#: The load runs in rounds of this many seconds until ten budgets are written, at most ROUNDS.
ROUND_S = 10
ROUNDS = 30
SAMPLE_S = 0.15


@pytest.fixture(scope="module")
def small(build_root, tmp_path_factory):
    """A server with an 8 MiB budget, the per-request audit off, a line per batch in model_log,
    the workers' metrics files in its run directory (so they count)."""
    root = tmp_path_factory.mktemp("disk")
    config = {**MODEL_YAML, "handler": {**MODEL_YAML["handler"], "audit_log": False, "log_batches": True}}
    (root / "model-config.yaml").write_text(yaml.safe_dump(config))
    mar = make_archive(build_root, "1.0", root / "store", MODEL_CONFIG=str(root / "model-config.yaml"))
    run = root / "run"
    settings = Settings.from_env().but(metrics_dir=run / "metrics")
    with serve(run, mar, overrides_extra={BUDGET_KEY: "8MiB"}, settings=settings) as ts:
        yield ts


@dataclass
class Usage:
    """The run directory's size, sampled: apparent (bytes in files) and allocated (blocks, what
    the kubelet's du of an emptyDir counts), the largest seen, and what held it then."""

    root: Path
    samples: int = 0
    max_apparent: int = 0
    max_allocated: int = 0
    at_max: dict[str, int] = field(default_factory=dict)
    inodes: dict[str, set[int]] = field(default_factory=dict)

    def sample(self) -> None:
        apparent = allocated = 0
        parts: dict[str, int] = {}
        for folder, dirs, names in os.walk(self.root):
            for name in dirs + names:
                path = Path(folder) / name
                try:
                    st = path.lstat()
                except FileNotFoundError:  # rotated away meanwhile
                    continue
                allocated += st.st_blocks * 512
                if path.is_file():
                    apparent += st.st_size
                    part = path.relative_to(self.root).parts[0] if path.parent != self.root / "logs" else name
                    parts[part] = parts.get(part, 0) + st.st_size
                    self.inodes.setdefault(name, set()).add(st.st_ino)
        self.samples += 1
        self.max_allocated = max(self.max_allocated, allocated)
        if apparent > self.max_apparent:
            self.max_apparent, self.at_max = apparent, parts

    def rolls(self, name: str) -> int:
        """How many files the name was seen on, less one: the rollovers the sampler saw."""
        return len(self.inodes.get(name, ())) - 1


def scrape_requests(server) -> float:
    """The handler's requests counter summed over its labels (the exporter's merged view)."""
    text = requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text)
               for s in family.samples if s.name == "rtserve_handler_requests_total")


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
    before = scrape_requests(small)
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
    after = scrape_requests(small)
    live = {str(w["pid"]) for w in workers(client, MODEL_NAME)}
    found = owners(small.metrics_dir)
    print(f"\nrequests counted: {before:.0f} before the kill, {after:.0f} after 40 more; "
          f"metrics files: {found}")
    assert after >= before + 40  # the dead worker's counts stayed
    assert set(found) == live | {"archive"}, found
    assert "counter_archive.db" in found["archive"]


def test_the_run_directory_never_exceeds_the_budget_under_ten_budgets_of_writes(small, tmp_path):
    require("wrk")
    budget = DiskBudget(BUDGET)
    assert small.budget == budget
    base = small.props["inference_address"]
    routes = {"model": MODEL_NAME, "log": str(small.files.live_log), "token_file": None, "canary": None,
              "shadow": {"version": "1.0", "percent": 100.0, "url": f"{base}/predictions/{MODEL_NAME}/1.0"}}
    small.files.live_routes.with_suffix(".tmp").write_text(json.dumps(routes))
    os.replace(small.files.live_routes.with_suffix(".tmp"), small.files.live_routes)
    body = tmp_path / "body.json"
    body.write_text(json.dumps(sample_payload()))
    url = f"{base}/predictions/{MODEL_NAME}?pad={'x' * PAD}"
    # the access log line of one request: date, client, the request line, status and time
    line = len("2026-12-01T00:00:00,000 - /127.0.0.1:1 \"POST ") + len(url) - len(base) + len(" HTTP/1.1\" 200 0\n")
    usage = Usage(small.run_dir)
    done = threading.Event()

    def sampler() -> None:
        while not done.is_set():
            usage.sample()
            time.sleep(SAMPLE_S)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    sent = errors = rounds = 0
    started = time.monotonic()
    try:
        while sent * line < 10 * BUDGET and rounds < ROUNDS:
            result = run_wrk(url, 8, ROUND_S, small.client().keys.get("inference"), body=body)
            sent += result["requests"]
            errors += sum(result["errors"].values())
            rounds += 1
    finally:
        done.set()
        thread.join()
    seconds = time.monotonic() - started
    usage.sample()
    written = sent * line
    print(f"\n{sent} requests in {seconds:.0f} s ({rounds} rounds of wrk -c8, {errors} errors): at least "
          f"{written / MiB:.1f} MiB written ({written / BUDGET:.1f} budgets: the access log alone); "
          f"run directory at most {usage.max_apparent / MiB:.2f} MiB in files, "
          f"{usage.max_allocated / MiB:.2f} MiB allocated, of a {BUDGET / MiB:.0f} MiB budget "
          f"({(BUDGET - budget.shares().spool) / MiB:.0f} MiB without the spool's share; "
          f"{usage.samples} samples every {SAMPLE_S} s)")
    print("at the largest: " + ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in
                                           sorted(usage.at_max.items(), key=lambda kv: -kv[1])))
    print("rollovers seen: " + ", ".join(f"{name} {usage.rolls(name)}" for name in
                                         (*TS_LOGS, "live-log.jsonl") if usage.rolls(name) > 0))
    assert errors == 0
    assert written >= 10 * BUDGET, f"only {written / BUDGET:.1f} budgets written in {ROUNDS} rounds"
    assert usage.max_apparent <= BUDGET and usage.max_allocated <= BUDGET
    # no records spool here: everything else keeps within the rest of the budget
    assert max(usage.max_apparent, usage.max_allocated) <= BUDGET - budget.shares().spool
    for name in ("access_log.log", "ts_log.log", "model_log.log", "live-log.jsonl"):
        assert usage.rolls(name) >= 2, f"{name} never rolled: the load did not exercise it"
    shares = budget.shares()
    for name in ("access_log.log", "ts_log.log", "model_log.log"):
        path = small.log_dir / name
        assert path.stat().st_size + path.with_name(name + ".1").stat().st_size <= shares.ts_log_file
    assert small.client().predict(MODEL_NAME, sample_payload())["label"]
