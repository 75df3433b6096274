"""The stream tier: a real single-node Apache Kafka broker (``make kafka``) from the jars
``make kafka-deps`` assembles, in a run directory of the test session's own, on free loopback
ports, stopped by ``make kafka-stop`` however the session ends; and a real TorchServe per test
module serving the ``make archive`` build. Before each test the broker runs and answers (a test
that stopped, froze or killed it and failed before it was back does not fail the later ones)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from rtserve.stream import broker, local
from rtserve.testing.server import serving
from tests.conftest import MODEL_NAME
from tests.helpers import assembled_libs, made_server
from tests.stream.helpers import restore_broker

#: A cold `make kafka-deps` downloads about 45 MB of jars from Maven Central (under a minute).
DEPS_TIMEOUT = 900


@dataclass(frozen=True)
class Kafka:
    """A running broker: its run directory, bootstrap address and what ``make kafka`` printed."""

    run_dir: Path
    bootstrap: str
    start_output: str

    @property
    def make_vars(self) -> list[str]:
        """The variables that point `make` targets at this broker."""
        return [f"KAFKA_RUN_DIR={self.run_dir}"]


def broker_processes(run_dir: Path) -> list[int]:
    """Every process whose command line names ``run_dir``'s server.properties or log
    configuration (the broker, and a format step that never ended), found without its PID file."""
    marks = {str(run_dir / broker.CONFIG_FILE), f"-Dlog4j2.configurationFile={run_dir / broker.LOG4J_FILE}"}
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if marks & set(proc.info.get("cmdline") or []):
            found.append(proc.info["pid"])
    return found


@pytest.fixture(scope="session")
def kafka_libs() -> Path:
    """The classpath, assembled by `make kafka-deps` (once per machine, into the user's cache)."""
    return assembled_libs("kafka-deps", "Kafka ", DEPS_TIMEOUT)


@pytest.fixture(scope="session")
def kafka(kafka_libs, tmp_path_factory) -> Kafka:
    """`make kafka` on free ports, stopped by `make kafka-stop` (and from its PID file if that
    fails) however the session ends; the stop must leave no process behind."""
    run_dir = tmp_path_factory.mktemp("kafka") / "run"
    with made_server(
        "kafka",
        "kafka-stop",
        [f"KAFKA_RUN_DIR={run_dir}"],
        lambda: broker_processes(run_dir),
        lambda: local.stop(run_dir),
    ) as output:
        state = json.loads((run_dir / broker.STATE_FILE).read_text())
        yield Kafka(run_dir, state["bootstrap"], output)


@pytest.fixture(autouse=True)
def broker_running(request) -> None:
    """The tier's one broker running and answering before each test that uses it."""
    if "kafka" in request.fixturenames:
        done = restore_broker(request.getfixturevalue("kafka"))
        if done:
            print(f"the broker was {done} before this test")


@pytest.fixture(scope="module")
def torchserve(mar_v1, tmp_path_factory):
    """A TorchServe of the module's own on free ports, serving version 1.0 (a module's tests may
    restart it or register versions: the next module starts afresh)."""
    with serving(tmp_path_factory.mktemp("ts"), mar_v1.parent, [f"{MODEL_NAME}={mar_v1.name}"]) as ts:
        yield ts
