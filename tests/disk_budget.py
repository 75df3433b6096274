"""A bounded load that writes ten disk budgets through a real server, and a sampler of its run
directory: what the disk-budget tests of the main tier (records kept in the local spool) and the
records tier (records shipped to Cassandra) share.

The load (wrk, `make bench-deps`) posts predictions whose URL carries a 3,800-byte query parameter
(TorchServe's access log records each URL: about 4 kB a request), with a shadow of the served
version to itself at 100 % (every request a mirror, a line of the agent's live log and a second
record), and the handler's per-batch model_log line on: every kind of file rolls many times.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.perf import run_wrk
from rtserve.server.disk import BUDGET_KEY, TS_LOGS, DiskBudget
from rtserve.server.readiness import sample_payload
from rtserve.settings import Settings
from tests.conftest import MODEL_NAME, make_archive, require
from tests.helpers import MODEL_YAML
from tests.integration.conftest import serve

MiB = 2**20
BUDGET = 8 * MiB
#: The query parameter's length: the request line stays within Netty's 4,096 bytes.
PAD = 3800
#: The load runs in rounds of this many seconds until ten budgets are written, at most ROUNDS.
ROUND_S = 10
ROUNDS = 30
SAMPLE_S = 0.15
#: The files that must have rolled over (twice) under the load: each kind the budget bounds.
ROLLED = ("access_log.log", "ts_log.log", "model_log.log", "live-log.jsonl")


def scraped(server, name: str) -> float:
    """A counter of the server's summed over its labels (the exporter's merged view)."""
    text = requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples if s.name == name)


def small_server(build_root: Path, root: Path, overrides: dict[str, str] | None = None):
    """A server with an 8 MiB budget, a line per batch in model_log, the workers' metrics files
    in its run directory (so they count); ``overrides`` of its config.properties besides."""
    config = {**MODEL_YAML, "handler": {**MODEL_YAML["handler"], "log_batches": True}}
    (root / "model-config.yaml").write_text(yaml.safe_dump(config))
    mar = make_archive(build_root, "1.0", root / "store", MODEL_CONFIG=str(root / "model-config.yaml"))
    run = root / "run"
    settings = Settings.from_env().but(metrics_dir=run / "metrics")
    return serve(run, mar, overrides_extra={BUDGET_KEY: "8MiB", **(overrides or {})}, settings=settings)


@dataclass
class Usage:
    """The run directory's size, sampled: apparent (bytes in files) and allocated (blocks, what
    the kubelet's du of an emptyDir counts), the largest seen, and what held it then."""

    root: Path
    samples: int = 0
    max_apparent: int = 0
    max_allocated: int = 0
    at_max: dict[str, int] = field(default_factory=dict)
    #: The largest the records spool (``RUN_DIR/records``) was seen.
    max_records: int = 0
    #: Each file name's (inode, size) at the last sample, and the rollovers seen on it.
    last: dict[str, tuple[int, int]] = field(default_factory=dict)
    rolled: dict[str, int] = field(default_factory=dict)

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
                    before = self.last.get(name)
                    if before is not None and (st.st_ino != before[0] or st.st_size < before[1]):
                        self.rolled[name] = self.rolled.get(name, 0) + 1
                    self.last[name] = (st.st_ino, st.st_size)
        self.samples += 1
        self.max_records = max(self.max_records, parts.get("records", 0))
        self.max_allocated = max(self.max_allocated, allocated)
        if apparent > self.max_apparent:
            self.max_apparent, self.at_max = apparent, parts

    def rolls(self, name: str) -> int:
        """The rollovers the sampler saw: the name on another inode, or smaller, than at the
        sample before. (A set of the inodes seen undercounts: the file made at a rollover often
        gets the inode number the deleted backup just freed, so two inodes take turns.)"""
        return self.rolled.get(name, 0)


@dataclass
class Loaded:
    """What :func:`ten_budgets` measured."""

    usage: Usage
    sent: int
    errors: int
    rounds: int
    seconds: float
    written: int
    #: The budgets it had to write, and the files that had to roll twice.
    budgets: int = 10
    rolled: tuple[str, ...] = ROLLED

    def report(self) -> str:
        budget = DiskBudget(BUDGET)
        return (
            f"{self.sent} requests in {self.seconds:.0f} s ({self.rounds} rounds of wrk -c8, "
            f"{self.errors} errors): at least {self.written / MiB:.1f} MiB written "
            f"({self.written / BUDGET:.1f} budgets: the access log alone); run directory at most "
            f"{self.usage.max_apparent / MiB:.2f} MiB in files, {self.usage.max_allocated / MiB:.2f} "
            f"MiB allocated, of a {BUDGET / MiB:.0f} MiB budget (the spool's share "
            f"{budget.shares().spool / MiB:.0f} MiB; {self.usage.samples} samples every {SAMPLE_S} s)\n"
            "at the largest: "
            + ", ".join(f"{k} {v / 1024:.0f} KiB" for k, v in sorted(self.usage.at_max.items(), key=lambda kv: -kv[1]))
            + "\n"
            "rollovers seen: "
            + ", ".join(
                f"{name} {self.usage.rolls(name)}"
                for name in (*TS_LOGS, "live-log.jsonl")
                if self.usage.rolls(name) > 0
            )
        )


def ten_budgets(
    server,
    tmp_path: Path,
    budgets: int = 10,
    rolled: tuple[str, ...] = ROLLED,
    round_s: int = ROUND_S,
    between: Callable[[], None] | None = None,
    rounds_at_most: int = ROUNDS,
) -> Loaded:
    """Shadow the served version to itself, then load ``server`` with wrk in rounds of
    ``round_s`` until ``budgets`` budgets of access-log lines are written and each file of
    ``rolled`` rolled twice (at most ``rounds_at_most`` rounds; ``between()`` after each),
    sampling the run directory every :data:`SAMPLE_S`."""
    require("wrk")
    base = server.props["inference_address"]
    routes = {
        "model": MODEL_NAME,
        "log": str(server.files.live_log),
        "token_file": None,
        "canary": None,
        "shadow": {"version": "1.0", "percent": 100.0, "url": f"{base}/predictions/{MODEL_NAME}/1.0"},
    }
    server.files.live_routes.with_suffix(".tmp").write_text(json.dumps(routes))
    os.replace(server.files.live_routes.with_suffix(".tmp"), server.files.live_routes)
    body = tmp_path / "body.json"
    body.write_text(json.dumps(sample_payload()))
    url = f"{base}/predictions/{MODEL_NAME}?pad={'x' * PAD}"
    # the access log line of one request: date, client, the request line, status and time
    line = len('2026-12-01T00:00:00,000 - /127.0.0.1:1 "POST ') + len(url) - len(base) + len(' HTTP/1.1" 200 0\n')
    usage = Usage(server.run_dir)
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
        # ten budgets, and every kind of file rolled twice (a busy machine answers fewer
        # requests a round, and the model log takes fewer bytes a request than the access log)
        while (
            sent * line < budgets * BUDGET or not all(usage.rolls(name) >= 2 for name in rolled)
        ) and rounds < rounds_at_most:
            result = run_wrk(url, 8, round_s, server.client().keys.get("inference"), body=body)
            sent += result["requests"]
            errors += sum(result["errors"].values())
            rounds += 1
            if between is not None:
                between()
    finally:
        done.set()
        thread.join()
    usage.sample()
    return Loaded(usage, sent, errors, rounds, time.monotonic() - started, sent * line, budgets, rolled)


def assert_within_budget(server, loaded: Loaded) -> None:
    """The budgets written, no error, the run directory never above the budget, the records spool
    within its share, and every file that had to roll rolled twice."""
    shares = DiskBudget(BUDGET).shares()
    assert server.budget == DiskBudget(BUDGET)
    assert loaded.errors == 0
    assert loaded.written >= loaded.budgets * BUDGET, (
        f"only {loaded.written / BUDGET:.1f} budgets written in {loaded.rounds} rounds"
    )
    assert loaded.usage.max_apparent <= BUDGET and loaded.usage.max_allocated <= BUDGET
    assert loaded.usage.max_records <= shares.spool, loaded.usage.max_records
    for name in loaded.rolled:
        assert loaded.usage.rolls(name) >= 2, f"{name} never rolled: the load did not exercise it"
    for name in ("access_log.log", "ts_log.log", "model_log.log"):
        path = server.log_dir / name
        assert path.stat().st_size + path.with_name(name + ".1").stat().st_size <= shares.ts_log_file
