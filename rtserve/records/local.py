"""Start, wait for, stop and report the local Cassandra node of ``make cassandra`` from its recorded state.

:func:`start` waits for a CQL session and creates the records' schema; the data stays between starts. If a step
fails the node is stopped. :func:`stop` works only from the PID file, never by a process name. A pod's node runs
in the foreground instead (:mod:`rtserve.records.foreground`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import psutil

from rtserve.errors import CassandraNodeError, StoreUnavailable
from rtserve.records import node
from rtserve.records.foreground import prepare
from rtserve.records.node import Layout
from rtserve.records.store import Store
from rtserve.runtime.process import spawn, tail, wait_until
from rtserve.runtime.recorded import RecordedServer

#: A cold first start on 2 busy cores takes 15-30 s; a node that is not up by then has failed.
READY_TIMEOUT = 180.0
#: Seconds for each connection attempt while waiting, and for the schema's statements.
CONNECT_TIMEOUT = 10.0
#: A drain (memtables flushed to disk) takes a few seconds; SIGKILL after this.
STOP_TIMEOUT = 60.0


def _recorded(run_dir: Path) -> RecordedServer:
    return RecordedServer(
        run_dir, "Cassandra node", "cassandra", "make cassandra", node.STATE_FILE, node.PID_FILE, CassandraNodeError
    )


def load_state(run_dir: Path) -> dict:
    """What ``start`` recorded (address, ports, pid, heap, the start's seconds, paths).

    Raises:
        CassandraNodeError: no node was started from ``run_dir``.
    """
    return _recorded(run_dir).load_state()


def resolve_ports(run_dir: Path, wanted: dict[str, int]) -> dict[str, int]:
    """Each port: the one given; else the one recorded in ``run_dir``; else a free one.

    A restart keeps its address, so clients find it again.
    """
    return _recorded(run_dir).resolve_ports(node.PORT_NAMES, wanted)


def pid(run_dir: Path) -> int | None:
    """The node's PID while it runs (its PID file names a live ``java``), else None."""
    return _recorded(run_dir).pid()


def start(layout: Layout, fresh: bool = False) -> dict[str, float]:
    """Start the node of ``layout`` and create the records' schema.

    Args:
        layout: the node.
        fresh: delete the run directory's data (every record) first.

    Returns:
        Each step's seconds: ``node ready`` (until a CQL session connects) and ``schema``.

    Raises:
        CassandraNodeError: the classpath lacks Cassandra, a node already runs from the run
            directory, or the node did not start (the message ends with its log).
        StoreUnavailable: the schema could not be created (the node is stopped).
        StoreSchemaError: the data holds a schema newer than this rtserve knows (the node is
            stopped).
    """
    run_dir = layout.run_dir
    if pid(run_dir) is not None:
        raise CassandraNodeError(
            f"a Cassandra node already runs from {run_dir} (pid {pid(run_dir)}): stop it first (make cassandra-stop)"
        )
    prepare(layout, fresh)
    out = layout.logs / node.OUT_FILE
    begin = time.monotonic()
    proc = spawn(node.argv(layout), out, _recorded(run_dir).pids(), cwd=run_dir)
    took: dict[str, float] = {}
    state = {
        "address": layout.address,
        "ports": layout.ports,
        "pid": proc.pid,
        "heap": layout.heap,
        "libs": str(layout.libs),
        "data": str(layout.data),
        "log": str(layout.logs / node.LOG_FILE),
        "out": str(out),
        "start_seconds": took,
    }
    state_file = run_dir / node.STATE_FILE
    state_file.write_text(json.dumps(state, indent=2) + "\n")
    try:
        with _wait_ready(layout, proc) as store:
            took["node ready"] = time.monotonic() - begin
            begin = time.monotonic()
            store.ensure_schema()
            took["schema"] = time.monotonic() - begin
        state_file.write_text(json.dumps(state, indent=2) + "\n")
    except BaseException:
        stop(run_dir)
        raise
    return took


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def _wait_ready(layout: Layout, proc: subprocess.Popen) -> Store:
    """A store connected to the started node, as soon as a CQL session connects."""

    def ended() -> str:
        return (
            f"the end of {layout.logs / node.LOG_FILE}:\n"
            f"{tail(layout.logs / node.LOG_FILE, 30) or '(no log)'}\n"
            f"the end of {layout.logs / node.OUT_FILE}:\n"
            f"{tail(layout.logs / node.OUT_FILE, 15) or '(no output)'}"
        )

    def connected() -> Store | None:
        if proc.poll() is not None:
            raise CassandraNodeError(f"the Cassandra node exited with {proc.returncode} at start; {ended()}")
        if not _listening(layout.address):
            return None
        try:
            return Store.connect([layout.address], timeout=CONNECT_TIMEOUT)
        except StoreUnavailable:
            return None

    store = wait_until(connected, READY_TIMEOUT, poll=0.5)
    if store is None:
        raise CassandraNodeError(
            f"no CQL session connected to {layout.address} within {READY_TIMEOUT:.0f} s; {ended()}"
        )
    return store


def stop(run_dir: Path, timeout: float = STOP_TIMEOUT) -> str | None:
    """Stop the node the PID file in ``run_dir`` names; the data stays.

    SIGTERM (it drains, flushing its memtables), SIGKILL after ``timeout``.

    Returns:
        What was done, None when none ran.

    Raises:
        CassandraNodeError: the process is still alive after SIGKILL.
    """
    return _recorded(run_dir).stop(timeout)


def rss_bytes(process_id: int) -> int | None:
    """The resident memory of ``process_id`` (None when it is gone)."""
    try:
        return psutil.Process(process_id).memory_info().rss
    except psutil.Error:
        return None


def status(run_dir: Path) -> dict[str, str]:
    """The node's state (``running (pid N)``, ``dead (pid N)``, ``stopped``), address, memory, data and log.

    The resident memory is shown only while it runs.

    Raises:
        CassandraNodeError: no node was started from ``run_dir``.
    """
    recorded = _recorded(run_dir)
    state = recorded.load_state()
    running = recorded.pid()
    lines = {"cassandra": recorded.state(), "address": state["address"]}
    rss = rss_bytes(running) if running else None
    if rss is not None:
        lines["rss"] = f"{rss / 2**20:.0f} MiB"
    lines.update(data=state["data"], log=state["log"])
    return lines
