"""A local server found again from its run directory alone.

The state its start recorded, its PID file, the ports a restart takes again, and its stop (the local Kafka broker of
:mod:`rtserve.stream.local`, the local Cassandra node of :mod:`rtserve.records.local`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from rtserve.errors import RtserveError
from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import PidFile, terminate


@dataclass(frozen=True)
class RecordedServer:
    """One server's run directory and how its messages name it.

    Attributes:
        run_dir: where the server's start recorded its state and PID file.
        what: the server in a sentence (``Kafka broker``).
        short: the server in a stop's report (``kafka``).
        target: the make target that starts it (``make kafka``).
        state_file: the state's file name in ``run_dir`` (JSON, with ``ports``).
        pid_file: the PID file's name in ``run_dir`` (PID and program).
        error: the error this server's failures raise.
    """

    run_dir: Path
    what: str
    short: str
    target: str
    state_file: str
    pid_file: str
    error: type[RtserveError]

    def pids(self) -> PidFile:
        """The PID file (a process counts while it still runs the recorded program)."""
        return PidFile(self.run_dir / self.pid_file, check_program=True)

    def load_state(self) -> dict:
        """What the start recorded.

        Raises:
            error: no server was started from the run directory.
        """
        try:
            return json.loads((self.run_dir / self.state_file).read_text())
        except FileNotFoundError:
            raise self.error(f"no {self.what} was started from {self.run_dir} ({self.target})") from None

    def resolve_ports(self, names: tuple[str, ...], wanted: dict[str, int]) -> dict[str, int]:
        """Each port: the one given.

        Else the one recorded (a restart keeps its address, so clients find it again); else a free one.
        """
        try:
            recorded = self.load_state().get("ports", {})
        except self.error:
            recorded = {}
        free = iter(free_ports(len(names)))
        return {name: wanted.get(name) or recorded.get(name) or next(free) for name in names}

    def pid(self) -> int | None:
        """The server's PID while it runs, else None."""
        return self.pids().pid()

    def state(self) -> str:
        """``running (pid N)``, ``dead (pid N)`` (its PID file outlived it) or ``stopped``."""
        pid_file = self.pids()
        running = pid_file.pid()
        return (
            f"running (pid {running})" if running else f"dead (pid {pid_file.read()})" if pid_file.read() else "stopped"
        )

    def stop(self, timeout: float) -> str | None:
        """Stop the process the PID file names (SIGTERM; SIGKILL after ``timeout``).

        Returns what was done, None when none ran.

        Raises:
            error: the process is still alive after SIGKILL.
        """
        pid_file = self.pids()
        running, program = pid_file.pid(), pid_file.program()
        if running is None:
            pid_file.remove()
            return None
        begin = time.monotonic()
        killed = terminate(running, timeout, poll=0.2, program=program)
        if pid_file.pid() is not None:
            raise self.error(f"the {self.what} (pid {running}) is still alive after SIGKILL")
        pid_file.remove()
        how = f"killed after {timeout:.0f} s" if killed else f"stopped in {time.monotonic() - begin:.1f} s"
        return f"{self.short} (pid {running}) {how}"
