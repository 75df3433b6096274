"""Start, wait for, stop and report the control plane from its recorded state.

``start`` makes the run directory afresh (PKI, configs, data), starts each component in order,
waits until it answers ready and records its PID file; if one fails, every component already
started is stopped before the error is raised. ``stop`` works only from the PID files (a process
is signalled only while its command line is still the recorded binary's), never from a
re-derived plan or a process name.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rtserve.cluster import components, pki
from rtserve.cluster.components import Component, Layout
from rtserve.cluster.errors import ClusterError

STATE_FILE = "state.json"
READY_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class Running:
    """A component as recorded: its PID and the binary it runs."""

    name: str
    pid: int
    binary: str

    def alive(self) -> bool:
        """The PID is alive and still runs the recorded binary (not a reused PID)."""
        try:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return False
        return cmdline[0].decode(errors="replace") == self.binary and stat.rsplit(")", 1)[1].split()[0] != "Z"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((components.HOST, 0))
        return sock.getsockname()[1]


def resolve_ports(wanted: dict[str, int]) -> dict[str, int]:
    """Each component's port: the one given, or a free one for 0 or a missing name."""
    return {name: wanted.get(name) or free_port() for name in components.PORT_NAMES}


def _pid_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.pid"


def recorded(run_dir: Path) -> list[Running]:
    """The components the PID files in ``run_dir`` name, in start order."""
    found = []
    for name in components.NAMES:
        path = _pid_file(run_dir, name)
        if path.is_file():
            pid, binary = path.read_text().split("\n", 1)
            found.append(Running(name, int(pid), binary.strip()))
    return found


def _tls(layout: Layout) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    return ctx


def wait_ready(component: Component, proc: subprocess.Popen, layout: Layout, log: Path,
               timeout: float = READY_TIMEOUT) -> float:
    """Poll ``component``'s ready URL until it answers 200; returns the seconds waited.

    Raises:
        ClusterError: the process exits, or it is not ready within ``timeout`` (with its log's tail).
    """
    ctx, start, last = _tls(layout), time.monotonic(), ""
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            raise ClusterError(f"{component.name} exited with {proc.returncode} at start; "
                               f"the end of {log}:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(component.ready_url, context=ctx, timeout=5) as answer:
                if answer.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError) as err:
            last = str(err)
        time.sleep(0.5)
    raise ClusterError(f"{component.name} not ready at {component.ready_url} within {timeout:.0f} s "
                       f"({last}); the end of {log}:\n{_tail(log)}")


def _tail(log: Path, lines: int = 25) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(layout: Layout) -> dict[str, float]:
    """Start the control plane in ``layout``; returns each component's seconds to ready.

    Raises:
        ClusterError: a binary is missing, a cluster already runs in the run directory, or a
            component fails to start (everything started is then stopped).
    """
    if any(r.alive() for r in recorded(layout.run_dir)):
        raise ClusterError(f"a cluster already runs from {layout.run_dir}: stop it first (make cluster-stop)")
    missing = [n for n in components.NAMES if not os.access(layout.binary(n), os.X_OK)]
    if missing:
        raise ClusterError(f"missing in {layout.bin_dir}: {', '.join(missing)} (build them: make cluster-deps)")
    shutil.rmtree(layout.run_dir, ignore_errors=True)
    (layout.run_dir / "logs").mkdir(parents=True)
    (layout.run_dir / "config").mkdir()
    pki.make(layout.pki, pki.certificates(components.SERVICE_IP))
    state = {"api_url": layout.api_url, "kubeconfig": str(layout.kubeconfig), "ports": layout.ports,
             "bin_dir": str(layout.bin_dir)}
    (layout.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    layout.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    layout.kubeconfig.write_text(components.kubeconfig(layout, "admin", embed=True))
    layout.kubeconfig.chmod(0o600)
    took: dict[str, float] = {}
    try:
        for component in components.control_plane(layout):
            took[component.name] = _start_one(component, layout)
    except BaseException:
        stop(layout.run_dir)
        raise
    return took


def _start_one(component: Component, layout: Layout) -> float:
    for path, text in component.files.items():
        path.write_text(text)
    log = layout.run_dir / "logs" / f"{component.name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(component.argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=layout.run_dir)
    _pid_file(layout.run_dir, component.name).write_text(f"{proc.pid}\n{component.argv[0]}\n")
    return wait_ready(component, proc, layout, log)


def stop(run_dir: Path, timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stop the components the PID files in ``run_dir`` record, in reverse start order
    (SIGTERM, then SIGKILL after ``timeout``); returns the names stopped.

    Raises:
        ClusterError: a process is still alive after SIGKILL.
    """
    stopped = []
    for running in reversed(recorded(run_dir)):
        if running.alive():
            _terminate(running, timeout)
            stopped.append(running.name)
        _pid_file(run_dir, running.name).unlink(missing_ok=True)
    return stopped


def _terminate(running: Running, timeout: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.kill(running.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(running.pid)
            if not running.alive():
                _reap(running.pid)  # it may have died (a zombie) since the first look
                return
            time.sleep(0.2)
    raise ClusterError(f"{running.name} (pid {running.pid}) is still alive after SIGKILL")


def _reap(pid: int) -> None:
    """Collect ``pid``'s exit status when it is our own child (the tests start it in-process)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def status(run_dir: Path) -> dict[str, str]:
    """Each recorded component's state: ``running (pid N)`` or ``dead (pid N)``."""
    return {r.name: f"{'running' if r.alive() else 'dead'} (pid {r.pid})" for r in recorded(run_dir)}


def load_state(run_dir: Path) -> dict:
    """What ``start`` recorded (API URL, kubeconfig, ports, binaries).

    Raises:
        ClusterError: no cluster was started from ``run_dir``.
    """
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster was started from {run_dir} (make cluster)") from None
