"""One way to run and stop a local process: PID files, a detached start with its output in a log,
waiting until a condition holds, stopping a process (or its whole tree), and running a command
whose output is kept in the error when it fails.

TorchServe and its metrics exporter (:mod:`rtserve.server`), local Prometheus and Alertmanager
(:mod:`rtserve.observability.monitor`), the gateway's nginx (:mod:`rtserve.gateway.nginx`) and
the local pod's kubelet loop (``deploy/podman/pod.py``) all start, find and stop their processes
through this module. A process is found again from its PID file (recorded state), never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence, TypeVar

import psutil

from rtserve.errors import ProcessError

T = TypeVar("T")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, or a process not ours to inspect, does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone, or not ours to inspect: not running for us
        return False


@dataclass(frozen=True)
class PidFile:
    """A file holding one process's PID (written by rtserve, or by the process itself)."""

    path: Path

    def read(self) -> int | None:
        """The PID the file holds, alive or not; None when there is no readable PID."""
        try:
            return int(Path(self.path).read_text().strip())
        except (OSError, ValueError):
            return None

    def pid(self) -> int | None:
        """The PID the file holds if that process is alive, else None."""
        pid = self.read()
        return pid if pid is not None and alive(pid) else None

    def write(self, pid: int) -> None:
        """Record ``pid``."""
        Path(self.path).write_text(str(pid))

    def remove(self) -> None:
        """Forget the process (no error when the file is gone already)."""
        Path(self.path).unlink(missing_ok=True)


def wait_until(condition: Callable[[], T], timeout: float, poll: float = 0.1) -> T | None:
    """Call ``condition`` every ``poll`` seconds until it returns a true value (returned), or
    ``timeout`` seconds pass (None). An exception from ``condition`` ends the wait (a process
    that died need not be waited for)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it."""
    try:
        parent = psutil.Process(pid)
        for child in parent.children(recursive=True):
            child.kill()
        parent.kill()
    except psutil.Error:
        pass


def terminate(pid: int, timeout: float, tree: bool = False, poll: float = 0.05) -> bool:
    """SIGTERM ``pid``; SIGKILL it (with ``tree``: it and all its children) if it is still alive
    after ``timeout`` seconds.

    Returns:
        Whether it had to be killed.
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if wait_until(lambda: not alive(pid), timeout, poll):
        return False
    if tree:
        kill_tree(pid)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
    return True


def spawn(cmd: Sequence[str], log: Path, pid_file: PidFile | None = None, cwd: Path | None = None,
          env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` detached (its own session, no stdin), its output appended to ``log``; its
    PID recorded in ``pid_file``. The log stays open only in the child.

    Raises:
        ProcessError: the program cannot be started (not found, not executable).
    """
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(list(cmd), cwd=cwd, env=None if env is None else dict(env),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    except OSError as exc:
        raise ProcessError(f"cannot start {' '.join(map(str, cmd))}: {exc}") from exc
    if pid_file is not None:
        pid_file.write(proc.pid)
    return proc


def run(cmd: Sequence[str], timeout: float, cwd: Path | None = None,
        env: Mapping[str, str] | None = None, check: bool = True,
        output_lines: int = 40) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end with stdout and stderr captured together (``.stdout``, text).

    Raises:
        ProcessError: ``check`` and it exited non-zero, or it ran past ``timeout``, or it cannot
            be started; the message holds the command and the last ``output_lines`` of output.
    """
    shown = " ".join(map(str, cmd))
    try:
        done = subprocess.run(list(cmd), cwd=cwd, env=None if env is None else dict(env),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise ProcessError(f"{shown}: no end after {timeout:.0f}s:\n{last_lines(out, output_lines)}") from exc
    except OSError as exc:
        raise ProcessError(f"cannot run {shown}: {exc}") from exc
    if check and done.returncode != 0:
        raise ProcessError(f"{shown} exited {done.returncode}:\n{last_lines(done.stdout, output_lines)}")
    return done


def last_lines(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.splitlines()[-lines:])


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ("" when it cannot be read)."""
    try:
        return last_lines(Path(path).read_text(errors="replace"), lines)
    except OSError:
        return ""
