"""rtserve.runtime.process: one PID identity scheme (a PID file, checked by program or by marks
on the command line) and a stop with the program's own signal that leaves no child behind."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from rtserve.runtime.process import PidFile, alive, recorded_pid, spawn, stop_process, stop_recorded, wait_until

pytestmark = pytest.mark.unit

#: A Python child that says it is ready, then ends on SIGINT (``trap``) or ignores SIGTERM
#: (``deaf``), or leaves its own child behind when SIGTERM ends it (``orphan``).
CHILD = """
import signal, subprocess, sys, time
role, ready = sys.argv[1], sys.argv[2]
if role == "trap":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
elif role == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif role == "orphan":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(ready + ".child", "w").write(str(child.pid))
open(ready, "w").write("ok")
time.sleep(60)
"""


def start(tmp_path: Path, role: str, pid_file: PidFile | None = None):
    ready = tmp_path / f"{role}.ready"
    proc = spawn(
        [sys.executable, "-c", CHILD, role, str(ready), "rtserve-test-mark"], tmp_path / f"{role}.log", pid_file
    )
    assert wait_until(ready.exists, 30), (tmp_path / f"{role}.log").read_text()
    return proc, ready


def test_a_pid_file_finds_its_process_by_program_or_by_marks(tmp_path):
    pid_file = PidFile(tmp_path / "child.pid", check_program=True)
    proc, _ = start(tmp_path, "trap", pid_file)
    try:
        assert pid_file.pid() == proc.pid and pid_file.program() == sys.executable
        by_marks = PidFile(tmp_path / "child.pid", marks=(b"rtserve-test-mark", b"trap"))
        assert by_marks.pid() == proc.pid == recorded_pid(by_marks.path, by_marks.marks)
        assert PidFile(by_marks.path, marks=(b"rtserve-test-mark", b"no-such-mark")).pid() is None
        assert recorded_pid(by_marks.path, (b"no-such-mark",)) is None
        (tmp_path / "other.pid").write_text(f"{proc.pid}\n")  # the canary watcher's form: the PID alone
        assert stop_recorded(tmp_path / "other.pid", (b"no-such-mark",), timeout=5) is None
        assert alive(proc.pid) and not (tmp_path / "other.pid").exists(), "another process is not stopped"
        assert stop_recorded(by_marks.path, by_marks.marks, timeout=5) == proc.pid
        assert not alive(proc.pid) and not by_marks.path.exists()
        assert by_marks.pid() is None and recorded_pid(by_marks.path, by_marks.marks) is None
    finally:
        stop_process(proc.pid, 1)


def test_stop_process_sends_the_programs_own_signal_then_kills(tmp_path):
    trap, _ = start(tmp_path, "trap")
    assert stop_process(trap.pid, 10, signal.SIGINT) is False
    assert not alive(trap.pid)
    deaf, _ = start(tmp_path, "deaf")
    assert stop_process(deaf.pid, 0.5) is True, "SIGTERM is ignored: it had to be killed"
    assert not alive(deaf.pid)
    assert stop_process(deaf.pid, 1) is False, "a process gone already"


def test_stop_process_with_tree_leaves_no_child_behind(tmp_path):
    orphan, ready = start(tmp_path, "orphan")
    child = int(Path(f"{ready}.child").read_text())
    assert alive(child)
    assert stop_process(orphan.pid, 10, tree=True) is False, "SIGTERM ends the parent"
    assert wait_until(lambda: not alive(child), 5), "the child outlived its parent"
