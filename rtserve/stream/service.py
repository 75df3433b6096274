"""The stream consumer as a background process (``make stream``), started and stopped by its PID file.

``python -m rtserve stream run`` runs detached with its PID file and log in a run directory; SIGTERM makes it
finish its step, leave its group and print its counts.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from rtserve.errors import StreamError
from rtserve.runtime.process import PidFile, spawn, tail, terminate, wait_until
from rtserve.settings import PACKAGE_HOME

PID_FILE = "stream.pid"
LOG_FILE = "stream.log"
#: The line ``stream run`` prints once its producer and consumer are made.
STARTED = ">> consuming "
#: The start of the line it prints when it stops (its counts follow).
STOPPED = ">> stopped: "
START_TIMEOUT = 60.0
#: A step in flight (TorchServe's answers, then the transaction) ends before the member leaves.
STOP_TIMEOUT = 60.0


def _pid_file(run_dir: Path) -> PidFile:
    return PidFile(run_dir / PID_FILE, check_program=True)


def pid(run_dir: Path) -> int | None:
    """The consumer's PID while it runs, else None."""
    return _pid_file(run_dir).pid()


def start(run_dir: Path, options: Sequence[str], timeout: float = START_TIMEOUT) -> tuple[int, float]:
    """Start ``python -m rtserve stream run OPTIONS`` detached.

    Returns:
        Its PID and the seconds until it said it consumes.

    Raises:
        StreamError: one runs already from ``run_dir``, or it ended or said nothing within
            ``timeout`` (the message ends with its log).
    """
    if pid(run_dir) is not None:
        raise StreamError(
            f"a stream consumer already runs from {run_dir} (pid {pid(run_dir)}): stop it first (make stream-stop)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / LOG_FILE
    offset = log.stat().st_size if log.exists() else 0
    begin = time.monotonic()
    # rtserve is found from any directory; relative paths in the options stay the caller's.
    path = os.pathsep.join(filter(None, (str(PACKAGE_HOME), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path}
    proc = spawn([sys.executable, "-m", "rtserve", "stream", "run", *options], log, _pid_file(run_dir), env=env)

    def started() -> bool:
        if proc.poll() is not None:
            raise StreamError(
                f"the stream consumer exited with {proc.returncode} at start; the end of {log}:\n{tail(log, 20)}"
            )
        with open(log, "rb") as out:
            out.seek(offset)
            return STARTED.encode() in out.read()

    if not wait_until(started, timeout, poll=0.2):
        stop(run_dir)
        raise StreamError(
            f"the stream consumer did not start within {timeout:.0f} s; the end of {log}:\n{tail(log, 20)}"
        )
    return proc.pid, time.monotonic() - begin


def stop(run_dir: Path, timeout: float = STOP_TIMEOUT) -> str | None:
    """Stop the consumer the PID file names (SIGTERM; SIGKILL after ``timeout``).

    Returns:
        What it wrote (its last log line's counts), None when none ran.

    Raises:
        StreamError: it is still alive after SIGKILL.
    """
    pid_file = _pid_file(run_dir)
    running, program = pid_file.pid(), pid_file.program()
    if running is None:
        pid_file.remove()
        return None
    killed = terminate(running, timeout, poll=0.1, program=program)
    if pid_file.pid() is not None:
        raise StreamError(f"the stream consumer (pid {running}) is still alive after SIGKILL")
    pid_file.remove()
    last = tail(run_dir / LOG_FILE, 1)
    return f"killed after {timeout:.0f} s" if killed else last.removeprefix(STOPPED)
