"""The node's containerd through its ``ctr`` client: list and import images, remove leftover containers.

:meth:`Ctr.remove_all` runs before containerd stops, so that no shim, mount or network namespace outlives the node.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import IO

from rtserve.errors import ClusterError

CTR = "ctr"
#: The namespace the CRI plugin (the kubelet's containers and images) uses.
NAMESPACE = "k8s.io"


class Ctr:
    """``ctr --address SOCKET -n k8s.io ...``."""

    def __init__(self, socket: Path, binary: str = CTR) -> None:
        self.socket, self.binary = socket, binary

    def argv(self, *args: str) -> list[str]:
        return [self.binary, "--address", str(self.socket), "-n", NAMESPACE, *args]

    def __call__(self, *args: str, stdin: IO[bytes] | bytes | None = None, timeout: float = 120) -> str:
        """Run ``ctr args``; its stdout.

        Raises:
            ClusterError: it exited non-zero (with its stderr) or could not run.
        """
        argv = self.argv(*args)
        try:
            done = subprocess.run(
                argv,
                input=stdin if isinstance(stdin, bytes) else None,
                stdin=None if stdin is None or isinstance(stdin, bytes) else stdin,
                capture_output=True,
                timeout=timeout,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"{shlex.join(argv)}: {exc}") from exc
        if done.returncode:
            raise ClusterError(
                f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()}"
            )
        return done.stdout.decode(errors="replace")

    def answers(self) -> bool:
        """Whether containerd answers on its socket."""
        try:
            self("version", timeout=10)
        except ClusterError:
            return False
        return True

    def images(self) -> dict[str, str]:
        """The images containerd holds: name -> the digest of what the name points at."""
        lines = self("images", "ls").splitlines()[1:]
        return {f[0]: f[2] for f in (line.split() for line in lines) if len(f) > 2}

    def import_archive(self, archive: IO[bytes] | bytes, timeout: float = 1800) -> None:
        """Import an OCI or docker archive (``podman save``) from ``archive``."""
        self("images", "import", "-", stdin=archive, timeout=timeout)

    def container_ids(self) -> list[str]:
        return self("containers", "ls", "-q").split()

    def network_namespace(self, container: str) -> str | None:
        """The network namespace file a container joined (a pod sandbox's), if any."""
        try:
            spec = json.loads(self("containers", "info", container))["Spec"]
        except (ClusterError, ValueError, KeyError):
            return None
        for ns in (spec.get("linux") or {}).get("namespaces") or []:
            if ns.get("type") == "network" and ns.get("path"):
                return ns["path"]
        return None

    def remove_all(self, timeout: float = 30) -> list[str]:
        """Kill and delete every task and container (the kubelet already stopped).

        Returns:
            The network namespace files the pods held (for the host's clean-up).
        """
        ids = self.container_ids()
        netns = sorted({p for p in map(self.network_namespace, ids) if p})
        for cid in ids:
            try:
                self("tasks", "kill", "--signal", "SIGKILL", cid, timeout=10)
            except ClusterError:
                pass  # no task, or it has already exited
        deadline = time.monotonic() + timeout
        for cid in ids:
            while True:
                try:
                    self("tasks", "delete", cid, timeout=10)
                    break
                except ClusterError as exc:
                    if "not found" in str(exc) or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            self("containers", "delete", cid, timeout=30)
        return netns
