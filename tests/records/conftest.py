"""The records tier: a real single-node Apache Cassandra (``make cassandra``) from the jars
``make cassandra-deps`` assembles, in a run directory of the test session's own, on free loopback
ports, stopped by ``make cassandra-stop`` however the session ends."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from rtserve.records import local, node
from rtserve.server.properties import RECORDS_STORE_KEY
from rtserve.testing.server import on_free_ports
from tests.conftest import MODEL_NAME
from tests.helpers import assembled_libs, made_server

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
    return [
        proc.info["pid"] for proc in psutil.process_iter(["pid", "cmdline"]) if mark in (proc.info.get("cmdline") or [])
    ]


@pytest.fixture(scope="session")
def cassandra_libs() -> Path:
    """The classpath, assembled by `make cassandra-deps` (once per machine, into the user's cache)."""
    return assembled_libs("cassandra-deps", "Cassandra 5.0.6: ", DEPS_TIMEOUT)


@pytest.fixture(scope="session")
def cassandra(cassandra_libs, tmp_path_factory) -> Cassandra:
    """`make cassandra` on free ports, stopped by `make cassandra-stop` (and from its PID file if
    that fails) however the session ends; the stop must leave no process behind."""
    run_dir = tmp_path_factory.mktemp("cassandra") / "run"
    with made_server(
        "cassandra",
        "cassandra-stop",
        [f"CASSANDRA_RUN_DIR={run_dir}"],
        lambda: node_processes(run_dir),
        lambda: local.stop(run_dir),
    ) as output:
        state = json.loads((run_dir / node.STATE_FILE).read_text())
        yield Cassandra(run_dir, state["address"], output)


@pytest.fixture(scope="module")
def server(cassandra, mar_v1, tmp_path_factory):
    """One server per test module (as ``make serve`` starts it), shipping its records to the
    tier's Cassandra; a test may kill it and start it again from the same run directory."""
    ts = on_free_ports(
        tmp_path_factory.mktemp("run"),
        mar_v1.parent,
        [f"{MODEL_NAME}={mar_v1.name}"],
        {RECORDS_STORE_KEY: cassandra.address},
    )
    ts.start()
    try:
        ts.wait_ready(180, [MODEL_NAME])
        yield ts
    finally:
        ts.stop()
