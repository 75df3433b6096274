"""Start, wait for, stop and report the local Kafka broker of ``make kafka`` from its recorded state.

:func:`start` formats the storage only the first time (a restart keeps every topic, offset and transaction) and
stops the broker again if any step fails. :func:`stop` works only from the PID file, never by a process name.
:func:`run` is the same start in the foreground, a pod's main process (deploy/k8s/components/kafka).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from rtserve.errors import StreamError
from rtserve.runtime.process import run as run_command
from rtserve.runtime.process import spawn, tail, wait_until
from rtserve.runtime.recorded import RecordedServer
from rtserve.stream import admin, broker
from rtserve.stream.broker import Layout

READY_TIMEOUT = 120.0
#: A single node's controlled shutdown takes a few seconds; SIGKILL after this.
STOP_TIMEOUT = 60.0
FORMAT_TIMEOUT = 120.0


def _recorded(run_dir: Path) -> RecordedServer:
    return RecordedServer(
        run_dir, "Kafka broker", "kafka", "make kafka", broker.STATE_FILE, broker.PID_FILE, StreamError
    )


def load_state(run_dir: Path) -> dict:
    """What ``start`` recorded (bootstrap, ports, classpath, cluster id, topics).

    Raises:
        StreamError: no broker was started from ``run_dir``.
    """
    return _recorded(run_dir).load_state()


def resolve_ports(run_dir: Path, wanted: dict[str, int]) -> dict[str, int]:
    """Each port: the one given; else the one recorded in ``run_dir``; else a free one.

    A restart keeps its bootstrap address, so clients and the stream consumer find it again.
    """
    return _recorded(run_dir).resolve_ports(broker.PORT_NAMES, wanted)


def pid(run_dir: Path) -> int | None:
    """The broker's PID while it runs (its PID file names a live ``java``), else None."""
    return _recorded(run_dir).pid()


def start(layout: Layout, fresh: bool = False, topics: tuple[str, ...] = broker.TOPICS) -> dict[str, float]:
    """Start the broker of ``layout`` and create ``topics``.

    Returns:
        Each step's seconds: ``format`` (only the first time), ``broker ready``, ``topics``.

    Raises:
        StreamError: the classpath lacks Kafka, a broker already runs from the run directory,
            or a step fails (the broker is then stopped; the message ends with its log).
    """
    return _start(layout, fresh, topics)[1]


def _start(layout: Layout, fresh: bool, topics: tuple[str, ...]) -> tuple[subprocess.Popen, dict[str, float]]:
    """:func:`start`, returning the broker's process too."""
    run_dir = layout.run_dir
    if pid(run_dir) is not None:
        raise StreamError(
            f"a Kafka broker already runs from {run_dir} (pid {pid(run_dir)}): stop it first (make kafka-stop)"
        )
    if not any(layout.libs.glob("kafka_2.13-*.jar")):
        raise StreamError(f"no Kafka jars in {layout.libs}: assemble them with make kafka-deps")
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.data.mkdir(parents=True, exist_ok=True)
    layout.config.write_text(broker.server_properties(layout))
    layout.log4j.write_text(broker.log4j_config())
    layout.ready.unlink(missing_ok=True)
    took: dict[str, float] = {}
    log = layout.log
    cluster_id = _format(layout, log, took)
    state = {
        "bootstrap": layout.bootstrap,
        "ports": layout.ports,
        "libs": str(layout.libs),
        "cluster_id": cluster_id,
        "topics": list(topics),
        "partitions": layout.partitions,
        "data": str(layout.data),
        "log": str(log) if log else "(the standard output)",
    }
    (run_dir / broker.STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    begin = time.monotonic()
    proc = spawn(broker.broker_argv(layout), log, _recorded(run_dir).pids(), cwd=run_dir)
    try:
        took["broker ready"] = _wait_ready(layout, proc, log, begin)
        begin = time.monotonic()
        admin.create_topics(layout.bootstrap, topics, layout.partitions)
        if not wait_until(lambda: set(topics) <= set(admin.topics(layout.bootstrap)), 30, poll=0.2):
            raise StreamError(f"topics {', '.join(topics)} not all led within 30 s at {layout.bootstrap}")
        took["topics"] = time.monotonic() - begin
    except BaseException:
        stop(run_dir)
        raise
    return proc, took


def _end_of(log: Path | None) -> str:
    """The end of the broker's log, for an error message."""
    if log is None:
        return "its output is above"
    return f"the end of {log}:\n{tail(log, 30) or '(no log)'}"


def _format(layout: Layout, log: Path | None, took: dict[str, float]) -> str:
    """Format the data directory unless it holds a node already; returns its cluster id."""
    if layout.formatted():
        for line in (layout.data / "meta.properties").read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.partition("=")[2].strip()
        raise StreamError(
            f"{layout.data / 'meta.properties'} names no cluster.id: start afresh (make kafka KAFKA_FRESH=1)"
        )
    cluster_id = broker.new_cluster_id()
    begin = time.monotonic()
    done = run_command(broker.format_argv(layout, cluster_id), FORMAT_TIMEOUT, cwd=layout.run_dir, check=False)
    if log is None:
        print(done.stdout, end="", flush=True)
    else:
        with open(log, "a") as out:
            out.write(done.stdout)
    if done.returncode != 0:
        raise StreamError(f"formatting {layout.data} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    took["format"] = time.monotonic() - begin
    return cluster_id


def _wait_ready(layout: Layout, proc: subprocess.Popen, log: Path | None, begin: float) -> float:
    def ready() -> bool:
        if proc.poll() is not None:
            raise StreamError(f"the Kafka broker exited with {proc.returncode} at start; {_end_of(log)}")
        return admin.answers(layout.bootstrap)

    if wait_until(ready, READY_TIMEOUT, poll=0.5):
        return time.monotonic() - begin
    raise StreamError(
        f"the Kafka broker gave no metadata at {layout.bootstrap} within {READY_TIMEOUT:.0f} s; {_end_of(log)}"
    )


def run(
    layout: Layout,
    topics: tuple[str, ...] = broker.TOPICS,
    say: Callable[[str], None] = print,
    poll: float = 1.0,
) -> int:
    """Run the broker in the foreground: :func:`start` (format once, broker, topics), then wait for it.

    The pod's main process: once the topics are led it writes ``layout.ready`` (the readiness probe's file).
    SIGTERM or SIGINT stops the broker (a controlled shutdown, SIGKILL after :data:`STOP_TIMEOUT`); one
    arriving during the start stops what was started.

    Returns:
        0 once stopped by a signal, else the broker's own exit status (1 if it was 0: it must not end).

    Raises:
        StreamError: the start failed (the message says which step and ends with the broker's log).
    """
    # SIGTERM raises KeyboardInterrupt as SIGINT does: any step of the start is left, and stopped.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    proc = None
    try:
        proc, took = _start(layout, False, topics)
        layout.ready.write_text(f"{proc.pid}\n")
        steps = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in took.items())
        say(f">> Kafka ready at {layout.bootstrap} ({steps}); topics {', '.join(topics)}")
        while proc.poll() is None:
            time.sleep(poll)
        say(f">> the Kafka broker exited with {proc.returncode}")
        return proc.returncode or 1
    except KeyboardInterrupt:
        say(f">> stopping the Kafka broker: {stop(layout.run_dir) or 'it was not running'}")
        return 0
    finally:
        layout.ready.unlink(missing_ok=True)
        signal.signal(signal.SIGTERM, previous)


def stop(run_dir: Path, timeout: float = STOP_TIMEOUT) -> str | None:
    """Stop the broker the PID file in ``run_dir`` names; the data stays.

    SIGTERM (a controlled shutdown), SIGKILL after ``timeout``.

    Returns:
        What was done, None when none ran.

    Raises:
        StreamError: the process is still alive after SIGKILL.
    """
    return _recorded(run_dir).stop(timeout)


def status(run_dir: Path) -> dict[str, str]:
    """The broker's state (``running (pid N)``, ``dead (pid N)``), bootstrap address, data and log.

    While it runs, also its topics with their partition counts.

    Raises:
        StreamError: no broker was started from ``run_dir``.
    """
    recorded = _recorded(run_dir)
    state = recorded.load_state()
    running = recorded.pid()
    lines = {"kafka": recorded.state(), "bootstrap": state["bootstrap"], "data": state["data"], "log": state["log"]}
    if running:
        found = admin.topics(state["bootstrap"]) if admin.listening(state["bootstrap"]) else {}
        lines["topics"] = ", ".join(f"{n} ({p} partitions)" for n, p in sorted(found.items())) or "(none)"
    return lines
