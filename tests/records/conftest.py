"""The records tier: a real single-node Apache Cassandra (``make cassandra``) from the jars
``make cassandra-deps`` assembles, in a run directory of the test session's own, on free loopback
ports, stopped by ``make cassandra-stop`` however the session ends."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from rtserve.records import local, node
from rtserve.runtime.process import terminate
from tests.helpers import make

#: A cold `make cassandra-deps` downloads about 66 MB of jars from Maven Central (under a minute).
DEPS_TIMEOUT = 900


@dataclass(frozen=True)
class Cassandra:
    """A running node: its run directory, CQL address and what ``make cassandra`` printed."""

    run_dir: Path
    address: str
    start_output: str

    @property
    def make_vars(self) -> list[str]:
        """The variables that point `make` targets at this node."""
        return [f"CASSANDRA_RUN_DIR={self.run_dir}"]


def node_processes(run_dir: Path) -> list[int]:
    """Every process whose command line names ``run_dir``'s cassandra.yaml, found without its
    PID file."""
    mark = f"-Dcassandra.config=file://{run_dir / node.CONFIG_FILE}"
    return [proc.info["pid"] for proc in psutil.process_iter(["pid", "cmdline"])
            if mark in (proc.info.get("cmdline") or [])]


@pytest.fixture(scope="session")
def cassandra_libs() -> Path:
    """The classpath, assembled by `make cassandra-deps` (once per machine, into the user's cache)."""
    start = time.monotonic()
    done = make("cassandra-deps", timeout=DEPS_TIMEOUT)
    assert done.returncode == 0, f"make cassandra-deps failed:\n{done.stdout[-4000:]}"
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(">> Cassandra 5.0.6: ") and " jars in " in line, done.stdout
    print(f"make cassandra-deps: {time.monotonic() - start:.0f} s")
    return Path(line.rsplit(" jars in ", 1)[1])


@pytest.fixture(scope="session")
def cassandra(cassandra_libs, tmp_path_factory) -> Cassandra:
    """`make cassandra` on free ports, stopped by `make cassandra-stop` (and from its PID file if
    that fails) however the session ends; the stop must leave no process behind."""
    run_dir = tmp_path_factory.mktemp("cassandra") / "run"
    where = [f"CASSANDRA_RUN_DIR={run_dir}"]
    try:
        done = make("cassandra", *where)
        assert done.returncode == 0, f"make cassandra failed:\n{done.stdout[-6000:]}"
        state = json.loads((run_dir / node.STATE_FILE).read_text())
        yield Cassandra(run_dir, state["address"], done.stdout)
    finally:
        stopped = make("cassandra-stop", *where)
        left = node_processes(run_dir)
        local.stop(run_dir)
        for pid in node_processes(run_dir):  # ours: they name this session's own run directory
            terminate(pid, 10)
        assert stopped.returncode == 0 and not left, f"make cassandra-stop left {left}:\n{stopped.stdout}"
