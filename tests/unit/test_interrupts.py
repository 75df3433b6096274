"""A test session stopped by SIGTERM (as `make test`'s trap stops a tier run in the background,
SIGINT ignored) still tears its fixtures down: a real pytest process, a real signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

SESSION = """
import time
import pytest

@pytest.fixture(scope="session")
def held(tmp_path_factory):
    yield
    open({done!r}, "w").write("torn down\\n")

def test_waits(held):
    open({started!r}, "w").write("started\\n")
    time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_the_session_with_its_fixtures_torn_down(tmp_path, sig):
    started, done = tmp_path / "started", tmp_path / "done"
    module = tmp_path / "test_session.py"
    module.write_text(SESSION.format(done=str(done), started=str(started)))
    # started as a background job of a non-interactive shell is: SIGINT ignored
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "tests.interrupts",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(module),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert done.read_text() == "torn down\n", out
    assert "KeyboardInterrupt" in out, out  # (SIGTERM's says so: "signal SIGTERM")
    assert sig == signal.SIGINT or "signal SIGTERM" in out, out
