"""Start, wait for, stop and report the local cluster from its recorded state.

:func:`start` makes the run directory afresh and starts each component in order, waiting until it is ready; if
one fails, all already started are stopped before the error is raised. :func:`stop` works only from the PID
files (a process is signalled only while it still runs the recorded binary), never from a process name.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rtserve.cluster import addons, components, host, netpol, node, pki, sandbox
from rtserve.cluster.components import Component, Layout
from rtserve.cluster.containerd import Ctr
from rtserve.errors import ClusterError
from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import PidFile, alive, pids_with_argument, spawn, tail, terminate, wait_until

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
        """Whether the PID is alive and still runs the recorded binary (not a reused PID)."""
        return alive(self.pid, self.binary)


def resolve_ports(wanted: dict[str, int]) -> dict[str, int]:
    """Each component's port: the one given, or a free one for 0 or a missing name."""
    free = iter(free_ports(len(components.PORT_NAMES)))
    return {name: wanted.get(name) or next(free) for name in components.PORT_NAMES}


def _pid_file(run_dir: Path, name: str) -> PidFile:
    """A component's PID file: its PID and its binary."""
    return PidFile(run_dir / f"{name}.pid", check_program=True)


def recorded(run_dir: Path) -> list[Running]:
    """The components the PID files in ``run_dir`` name, in start order."""
    found = []
    for name in components.NAMES:
        pid_file = _pid_file(run_dir, name)
        pid = pid_file.read()
        if pid is not None:
            found.append(Running(name, pid, pid_file.program() or ""))
    return found


def _tls(layout: Layout) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    return ctx


def wait_ready(
    component: Component, proc: subprocess.Popen, layout: Layout, log: Path, timeout: float = READY_TIMEOUT
) -> float:
    """Poll ``component``'s ready URL until it answers 200; returns the seconds waited.

    Raises:
        ClusterError: the process exits, or it is not ready within ``timeout`` (with its log's tail).
    """
    ctx, start, last = _tls(layout), time.monotonic(), [""]

    def ready() -> bool:
        if proc.poll() is not None:
            raise ClusterError(
                f"{component.name} exited with {proc.returncode} at start; the end of {log}:\n{_tail(log)}"
            )
        url = component.ready_url
        if url.startswith("unix://"):
            return Ctr(Path(url.removeprefix("unix://"))).answers()
        try:
            with urllib.request.urlopen(url, context=ctx if url.startswith("https:") else None, timeout=5) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError) as err:
            last[0] = str(err)
        return False

    if wait_until(ready, timeout, poll=0.5):
        return time.monotonic() - start
    raise ClusterError(
        f"{component.name} not ready at {component.ready_url} within {timeout:.0f} s "
        f"({last[0]}); the end of {log}:\n{_tail(log)}"
    )


def _tail(log: Path, lines: int = 25) -> str:
    return tail(log, lines) or "(no log)"


def start(layout: Layout) -> dict[str, float]:
    """Start the control plane in ``layout``; returns each component's seconds to ready.

    Raises:
        ClusterError: a binary is missing, a cluster already runs in the run directory, or a
            component fails to start (everything started is then stopped).
    """
    if any(r.alive() for r in recorded(layout.run_dir)):
        raise ClusterError(f"a cluster already runs from {layout.run_dir}: stop it first (make cluster-stop)")
    binaries = [layout.binary(n) for n in components.NAMES if n != "containerd"]
    binaries += [Path(node.CONTAINERD), layout.pause or layout.binary("pause")]
    missing = [str(b) for b in binaries if not os.access(b, os.X_OK)]
    if missing:
        raise ClusterError(f"missing: {', '.join(missing)} (build and install them: make cluster-deps)")
    reclaim(layout.run_dir)
    shutil.rmtree(layout.run_dir, ignore_errors=True)
    (layout.run_dir / "logs").mkdir(parents=True)
    (layout.run_dir / "config").mkdir()
    pki.make(layout.pki, pki.certificates(components.SERVICE_IP, node.NODE_NAME, node.NODE_IP))
    state = {
        "api_url": layout.api_url,
        "kubeconfig": str(layout.kubeconfig),
        "ports": layout.ports,
        "bin_dir": str(layout.bin_dir),
        "node": node.NODE_NAME,
        "node_ip": node.NODE_IP,
        "containerd_address": str(layout.node.containerd_socket),
        "containerd_root": str(layout.containerd_root),
    }
    (layout.run_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")
    layout.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    layout.kubeconfig.write_text(components.kubeconfig(layout, "admin", embed=True))
    layout.kubeconfig.chmod(0o600)
    took: dict[str, float] = {}
    try:
        for component in components.control_plane(layout):
            took[component.name] = _start_one(component, layout)
        took.update(start_node(layout))
    except BaseException:
        stop(layout.run_dir)
        raise
    return took


def start_node(layout: Layout) -> dict[str, float]:
    """Start the node on this machine: its bridge, containerd, the kubelet, kube-proxy, the add-ons and kube-router.

    containerd gets the sandbox image imported.

    Returns:
        Each one's seconds to ready, and the node's to ``Ready``.
    """
    took: dict[str, float] = {}
    host.prepare(layout.run_dir)
    for path in (layout.node.cni_ipam_dir, layout.node.kubelet_root, layout.containerd_root):
        path.mkdir(parents=True, exist_ok=True)
    image, archive = sandbox.image_of(layout.pause or layout.binary("pause"))
    took["containerd"] = _start_one(components.containerd(layout, image), layout)
    ctr = Ctr(layout.node.containerd_socket)
    if image not in ctr.images():
        ctr.import_archive(archive)
    for component in (components.kubelet(layout), components.kube_proxy(layout)):
        took[component.name] = _start_one(component, layout)
    begin = time.monotonic()
    kubectl = [str(layout.binary("kubectl")), f"--kubeconfig={layout.kubeconfig}"]
    wait = subprocess.run(
        [*kubectl, "wait", f"node/{node.NODE_NAME}", "--for=condition=Ready", f"--timeout={READY_TIMEOUT:.0f}s"],
        capture_output=True,
        text=True,
    )
    if wait.returncode:
        raise ClusterError(
            f"node {node.NODE_NAME} not Ready: {wait.stderr.strip()}; the end of "
            f"{layout.run_dir / 'logs' / 'kubelet.log'}:\n{_tail(layout.run_dir / 'logs' / 'kubelet.log')}"
        )
    took["node Ready"] = time.monotonic() - begin
    manifests = (
        addons.coredns_manifests()
        + "---\n"
        + addons.metrics_server_manifests(
            node.NODE_IP, layout.ports["metrics-server"], (layout.pki / "ca.crt").read_text()
        )
        + "---\n"
        + addons.custom_metrics_manifests(
            node.NODE_IP, layout.ports["prometheus-adapter"], (layout.pki / "ca.crt").read_text()
        )
        + "---\n"
        + netpol.manifests()
    )
    apply = subprocess.run([*kubectl, "apply", "-f", "-"], input=manifests, capture_output=True, text=True)
    if apply.returncode:
        raise ClusterError(f"the add-ons' objects were refused: {apply.stderr.strip()}")
    for component in (
        components.coredns(layout),
        components.metrics_server(layout),
        components.prometheus(layout),
        components.prometheus_adapter(layout),
        components.kube_router(layout),
    ):
        took[component.name] = _start_one(component, layout)
    return took


def reclaim(run_dir: Path) -> list[str]:
    """Clean up after another run directory's node whose processes are all gone.

    Without it every later start on this machine would refuse, naming a cluster that no longer runs. A node
    with any live process is left alone (``host.prepare`` then refuses).

    Returns:
        What the clean-up removed.
    """
    held = host.owner()
    if held is None or held == run_dir.resolve() or any(r.alive() for r in recorded(held)):
        return []
    removed = stop(held)
    print(
        f">> reclaimed the node of {held}, whose processes were gone: {'; '.join(removed) or 'nothing left'}",
        flush=True,
    )
    return removed


def _start_one(component: Component, layout: Layout) -> float:
    for path, text in component.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    log = layout.run_dir / "logs" / f"{component.name}.log"
    proc = spawn(component.argv, log, _pid_file(layout.run_dir, component.name), cwd=layout.run_dir)
    return wait_ready(component, proc, layout, log)


def stop(run_dir: Path, timeout: float = STOP_TIMEOUT) -> list[str]:
    """Stop the components the PID files in ``run_dir`` record, in reverse start order.

    SIGTERM, then SIGKILL after ``timeout``; the node's containers are removed before containerd stops. Then
    what the node changed on the host is undone (:func:`host.clean`, also when no PID file is left).

    Returns:
        The names stopped and what the clean-up removed.

    Raises:
        ClusterError: a process is still alive after SIGKILL, or the host could not be cleaned.
    """
    stopped, netns = [], []
    state = _state_or_empty(run_dir)
    for running in reversed(recorded(run_dir)):
        if running.name == "containerd" and running.alive():
            netns = Ctr(Path(state.get("containerd_address", ""))).remove_all()
        if running.alive():
            terminate(running.pid, timeout, poll=0.2, program=running.binary)
            if running.alive():
                raise ClusterError(f"{running.name} (pid {running.pid}) is still alive after SIGKILL")
            stopped.append(running.name)
        _pid_file(run_dir, running.name).remove()
    if state.get("containerd_address"):
        stopped += _stop_shims(state["containerd_address"], timeout)
    if host.owner() == run_dir.resolve() or (run_dir / host.SYSCTL_RECORD).exists():
        stopped += host.clean(run_dir.resolve(), netns)
    return stopped


def _state_or_empty(run_dir: Path) -> dict:
    try:
        return load_state(run_dir)
    except ClusterError:
        return {}


def _stop_shims(address: str, timeout: float) -> list[str]:
    """Stop the containerd shims still serving this node's containerd; none is left after :meth:`Ctr.remove_all`.

    They are found by the socket in their command line (``-address SOCKET``).
    """
    stopped = []
    for pid in pids_with_argument("-address", address):
        terminate(pid, timeout, poll=0.2)
        stopped.append(f"containerd shim {pid}")
    return stopped


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
