"""One way to run and stop a local process: PID files, detached starts, waiting, stopping, checked commands.

Every process rtserve starts (servers, sidecars, monitoring, nginx, the local cluster, the canary watcher, bench/)
goes through here and is found again from its PID file, never by name. :class:`PidFile` keeps a reused PID from
being taken for the process: it records the program (``check_program``), or the caller names strings of its command
line (``marks``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

from rtserve.errors import CommandError, ProcessError

T = TypeVar("T")


def alive(pid: int, program: str | None = None) -> bool:
    """Whether ``pid`` runs and, with ``program``, still runs that program.

    A zombie, a process not ours to inspect, or a reused PID does not count.
    """
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
    """The processes whose command line holds ``flag value`` side by side.

    For helpers a process starts detached, such as containerd's shims, found by the socket they serve and never by a
    program name.
    """
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if any(a == flag and b == value for a, b in zip(cmd, cmd[1:])):
            found.append(proc.info["pid"])
    return found


def holds(pid: int, marks: Sequence[bytes]) -> bool:
    """Whether ``pid``'s command line holds each of ``marks``.

    No marks: true; a process gone, or whose command line cannot be read, holds none.
    """
    if not marks:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return all(mark in cmdline for mark in marks)


@dataclass(frozen=True)
class PidFile:
    """A file holding one process's PID (written by rtserve, or by the process itself).

    Attributes:
        path: the file: the PID on its first line.
        check_program: the program is recorded on the second line, and the process counts as
            running only while its PID still runs that program.
        marks: the process counts as running only while its command line (``/proc/PID/cmdline``,
            its arguments NUL-separated) holds each of these.
    """

    path: Path
    check_program: bool = False
    marks: tuple[bytes, ...] = ()

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
        """The PID the file holds if that process is alive.

        It must also run the recorded program, and its command line hold the marks.
        """
        pid = self.read()
        program = self.program() if self.check_program else None
        if pid is None or not alive(pid, program):
            return None
        return pid if holds(pid, self.marks) else None

    def write(self, pid: int, program: str | None = None) -> None:
        """Record ``pid`` (and ``program``, when the file checks it)."""
        Path(self.path).write_text(f"{pid}\n{program}\n" if self.check_program and program else str(pid))

    def remove(self) -> None:
        """Forget the process (no error when the file is gone already)."""
        Path(self.path).unlink(missing_ok=True)


def wait_until(condition: Callable[[], T], timeout: float, poll: float = 0.1) -> T | None:
    """Call ``condition`` every ``poll`` seconds until it returns a true value, or ``timeout`` seconds pass.

    Returns that value, or None after the timeout. An exception from ``condition`` ends the wait (a process
    that died need not be waited for).
    """
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


def terminate(
    pid: int,
    timeout: float,
    tree: bool = False,
    poll: float = 0.05,
    program: str | None = None,
    kill_wait: float = 10.0,
) -> bool:
    """SIGTERM ``pid``; SIGKILL it if it is still alive after ``timeout`` seconds.

    With ``tree``, the SIGKILL goes to it and all its children. Then wait up to ``kill_wait`` seconds for it to go. With
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


def stop_process(
    pid: int,
    timeout: float,
    signum: int = signal.SIGTERM,
    tree: bool = False,
    poll: float = 0.05,
    kill_wait: float = 10.0,
) -> bool:
    """Send ``signum`` to ``pid``, SIGKILL it if it is still alive after ``timeout`` seconds.

    ``signum`` is SIGTERM, or the program's own graceful stop (nginx's SIGQUIT, ``perf record``'s SIGINT). Then
    wait up to ``kill_wait`` seconds for it to go. With ``tree``, every process that was below it
    when it was signalled is SIGKILLed too once it has gone, if still alive (a child that
    outlives its parent included). :func:`terminate` is this with SIGTERM, its ``tree`` killing
    the children only when the parent had to be killed.

    Returns:
        Whether it had to be killed.
    """
    below: list[psutil.Process] = []
    if tree:
        try:
            below = psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            pass
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        killed = False
    else:
        killed = not wait_until(lambda: _ended(pid, None), timeout, poll)
        if killed:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wait_until(lambda: _ended(pid, None), kill_wait, poll)
    for child in below:
        try:
            child.kill()  # psutil: never a process that took a gone child's PID
        except psutil.Error:
            pass
    return killed


def spawn(
    cmd: Sequence[str],
    log: Path | None,
    pid_file: PidFile | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``cmd`` detached (its own session, no stdin), its output appended to ``log``.

    Its PID (and program) is recorded in ``pid_file``. The log stays open only in the child; ``log`` None:
    the output goes where this process's goes (a container's main process: ``kubectl logs``).

    Raises:
        ProcessError: the program cannot be started (not found, not executable).
    """
    try:
        with open(log, "ab") if log is not None else contextlib.nullcontext(None) as out:
            proc = subprocess.Popen(
                list(cmd),
                cwd=cwd,
                env=None if env is None else dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    except OSError as exc:
        raise ProcessError(f"cannot start {' '.join(map(str, cmd))}: {exc}") from exc
    if pid_file is not None:
        pid_file.write(proc.pid, str(cmd[0]))
    return proc


def run(
    cmd: Sequence[str],
    timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
    stdin: str | None = None,
    apart: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``cmd`` to its end, its output captured as text.

    Stdout and stderr together in ``.stdout``, or with ``apart`` each in its own attribute; ``stdin`` is its input.

    Raises:
        CommandError: ``check`` and it exited non-zero (with its command and output).
        ProcessError: it ran past ``timeout``, or it cannot be started.
    """
    argv = [str(a) for a in cmd]
    shown = " ".join(argv)
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            env=None if env is None else dict(env),
            text=True,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if apart else subprocess.STDOUT,
            timeout=timeout,
        )
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
    """The PID ``pid_file`` records, when that process runs and its command line holds every one of ``marks``.

    A reused PID running something else is not the recorded process: the :class:`PidFile` with those marks.
    """
    return PidFile(Path(pid_file), marks=tuple(marks)).pid()


def stop_recorded(pid_file: str | Path, marks: Sequence[bytes], timeout: float) -> int | None:
    """Stop the process ``pid_file`` records and remove the file; returns the PID it stopped, if one ran.

    The process is found by :func:`recorded_pid`, never by name; SIGTERM, then SIGKILL after ``timeout``.
    """
    recorded = PidFile(Path(pid_file), marks=tuple(marks))
    pid = recorded.pid()
    if pid is not None:
        terminate(pid, timeout)
    recorded.remove()
    return pid


def remove_own_pid_file(pid_file: str | Path, marks: Sequence[bytes] = ()) -> None:
    """Remove ``pid_file`` when it records this process (:func:`recorded_pid`).

    A process that ends forgets itself, and never a successor that recorded itself in the same file since.
    """
    if recorded_pid(pid_file, marks) == os.getpid():
        Path(pid_file).unlink(missing_ok=True)


def exit_on_sigterm() -> None:
    """Make SIGTERM end this process as ``sys.exit(0)`` does, so that its ``finally`` blocks run.

    A process stopped by :func:`terminate` or :func:`stop_recorded` then cleans up as on a normal end.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
