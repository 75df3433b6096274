"""One way to run and stop a local process: PID files, a detached start with its output in a log,
waiting until a condition holds, stopping a process (or its whole tree), and running a command
whose output is kept in the error when it fails.

TorchServe and its sidecars (:mod:`rtserve.server`), local Prometheus and Alertmanager
(:mod:`rtserve.observability.monitor`), the gateway's nginx (:mod:`rtserve.gateway.nginx`), the
local cluster's control plane (:mod:`rtserve.cluster`) and the local pod's kubelet loop
(``deploy/podman/pod.py``) all start, find and stop their processes through this module. A
process is found again from its PID file (recorded state), never by name; a PID file may record
the program too, so that a reused PID is never taken for the process.
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

from rtserve.errors import CommandError, ProcessError

T = TypeVar("T")


def alive(pid: int, program: str | None = None) -> bool:
    """Whether ``pid`` runs (a zombie, or a process not ours to inspect, does not count) and, with
    ``program``, still runs that program (a reused PID does not count)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if program is None:
            return True
        command = proc.cmdline()
        # An exiting process has no command line any more, before it becomes a zombie.
        return command[:1] == [program] or not command
    except Exception:  # noqa: BLE001 - gone, or not ours to inspect: not running for us
        return False


def pids_with_argument(flag: str, value: str) -> list[int]:
    """The processes whose command line holds ``flag value`` side by side (for helpers a
    process starts detached, such as containerd's shims, found by the socket they serve and
    never by a program name)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if any(a == flag and b == value for a, b in zip(cmd, cmd[1:])):
            found.append(proc.info["pid"])
    return found


@dataclass(frozen=True)
class PidFile:
    """A file holding one process's PID (written by rtserve, or by the process itself).

    Attributes:
        path: the file: the PID on its first line.
        check_program: the program is recorded on the second line, and the process counts as
            running only while its PID still runs that program.
    """

    path: Path
    check_program: bool = False

    def _lines(self) -> list[str]:
        try:
            return Path(self.path).read_text().splitlines()
        except OSError:
            return []

    def read(self) -> int | None:
        """The PID the file holds, alive or not; None when there is no readable PID."""
        lines = self._lines()
        try:
            return int(lines[0].strip()) if lines else None
        except ValueError:
            return None

    def program(self) -> str | None:
        """The program recorded beside the PID, if any."""
        lines = self._lines()
        return lines[1].strip() if len(lines) > 1 and lines[1].strip() else None

    def pid(self) -> int | None:
        """The PID the file holds if that process is alive (and runs the recorded program)."""
        pid = self.read()
        program = self.program() if self.check_program else None
        return pid if pid is not None and alive(pid, program) else None

    def write(self, pid: int, program: str | None = None) -> None:
        """Record ``pid`` (and ``program``, when the file checks it)."""
        Path(self.path).write_text(f"{pid}\n{program}\n" if self.check_program and program
                                   else str(pid))

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


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status when it is our own child (or it stays a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _ended(pid: int, program: str | None) -> bool:
    _reap(pid)
    if alive(pid, program):
        return False
    _reap(pid)  # it may have died (a zombie) since the first look
    return True


def terminate(pid: int, timeout: float, tree: bool = False, poll: float = 0.05,
              program: str | None = None, kill_wait: float = 10.0) -> bool:
    """SIGTERM ``pid``; SIGKILL it (with ``tree``: it and all its children) if it is still alive
    after ``timeout`` seconds, then wait up to ``kill_wait`` seconds for it to go. With
    ``program``, a PID that runs another program counts as gone already.

    Returns:
        Whether it had to be killed (:func:`alive` says whether even that failed).
    """
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if wait_until(lambda: _ended(pid, program), timeout, poll):
        return False
    if tree:
        kill_tree(pid)
    else:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
    wait_until(lambda: _ended(pid, program), kill_wait, poll)
    return True


def spawn(cmd: Sequence[str], log: Path, pid_file: PidFile | None = None, cwd: Path | None = None,
          env: Mapping[str, str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` detached (its own session, no stdin), its output appended to ``log``; its
    PID (and program) recorded in ``pid_file``. The log stays open only in the child.

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
        pid_file.write(proc.pid, str(cmd[0]))
    return proc


def run(cmd: Sequence[str], timeout: float, cwd: Path | None = None,
        env: Mapping[str, str] | None = None, check: bool = True, stdin: str | None = None,
        apart: bool = False) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end, its output captured as text: stdout and stderr together in
    ``.stdout``, or with ``apart`` each in its own attribute; ``stdin`` is its input.

    Raises:
        CommandError: ``check`` and it exited non-zero (with its command and output).
        ProcessError: it ran past ``timeout``, or it cannot be started.
    """
    argv = [str(a) for a in cmd]
    shown = " ".join(argv)
    try:
        done = subprocess.run(argv, cwd=cwd, env=None if env is None else dict(env), text=True,
                              input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE if apart else subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        raise ProcessError(f"{shown}: no end after {timeout:.0f}s:\n{last_lines(out, 40)}") from exc
    except OSError as exc:
        raise ProcessError(f"cannot run {shown}: {exc}") from exc
    if check and done.returncode != 0:
        raise CommandError(argv, done.returncode, done.stdout + (done.stderr or ""))
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


def recorded_pid(pid_file: str | Path, marks: Sequence[bytes]) -> int | None:
    """The PID ``pid_file`` records, when that process runs and its command line holds every
    one of ``marks`` (a reused PID running something else is not the recorded process)."""
    try:
        pid = int(Path(pid_file).read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return None
    return pid if all(mark in cmdline for mark in marks) else None


def stop_recorded(pid_file: str | Path, marks: Sequence[bytes], timeout: float) -> int | None:
    """Stop the process ``pid_file`` records (:func:`recorded_pid`; SIGTERM, SIGKILL after
    ``timeout``; never a process found by name) and remove the file. Returns the PID it
    stopped, if one ran."""
    pid = recorded_pid(pid_file, marks)
    if pid is not None:
        terminate(pid, timeout)
    Path(pid_file).unlink(missing_ok=True)
    return pid
