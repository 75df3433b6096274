"""The production pod on a cluster, for a person at a terminal.

How to call it, its pods, and its removal (`make pod`, `make pod-status`, `make pod-stop`; the rollout itself is
:mod:`rtserve.k8s.deploy`). On `make cluster`'s node the pods' cgroups are this machine's, so :func:`cgroup_dir` finds
them for bench/pod_report.py.
"""

from __future__ import annotations

import base64
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rtserve.errors import DeployError
from rtserve.k8s.deploy import POLL_SECONDS, Kubectl
from rtserve.settings import RunDir

#: The gateway image of the local overlay (deploy/k8s/components/local-images): Debian's nginx,
#: built here by `make image-gateway` (the Makefile's GATEWAY_STANDIN) where the manifest's cannot be pulled.
GATEWAY_STANDIN = "localhost/rtserve-gateway-standin:nginx-bookworm"
#: The gateway token's Secret (README: ``--from-literal=tokens=...``) and its key.
TOKEN_SECRET = "rtserve-gateway-tokens"
#: The rtserve container's run directory (its ``run`` emptyDir: the manifests' RTSERVE_RUN_DIR).
POD_RUN_DIR = RunDir(Path("/home/model-server/run"))
#: Where that container keeps TorchServe's key file.
POD_KEY_FILE_PATH = str(POD_RUN_DIR.key_file)
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class PodState:
    """One of the Deployment's pods as the API server reports it."""

    name: str
    uid: str
    ip: str
    phase: str
    qos: str
    ready: bool
    image: str
    restarts: dict[str, int]
    #: Container name -> its runtime id (without the ``containerd://`` prefix).
    container_ids: dict[str, str]
    created: str
    #: Whether the rtserve container runs (it may not be ready yet: TorchServe still starting).
    running: bool = False

    @classmethod
    def of(cls, item: dict) -> PodState:
        status = item.get("status", {})
        # The gateway is a native sidecar: an init container that keeps running.
        statuses = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
        (image,) = [c["image"] for c in item["spec"]["containers"] if c["name"] == "rtserve"] or [""]
        return cls(
            item["metadata"]["name"],
            item["metadata"]["uid"],
            status.get("podIP", ""),
            status.get("phase", "Unknown"),
            status.get("qosClass", ""),
            ready,
            image,
            {c["name"]: c.get("restartCount", 0) for c in statuses},
            {c["name"]: c["containerID"].split("://", 1)[1] for c in statuses if c.get("containerID")},
            item["metadata"]["creationTimestamp"],
            any(c["name"] == "rtserve" and "running" in (c.get("state") or {}) for c in statuses),
        )

    @property
    def version(self) -> str:
        return self.image.rsplit(":", 1)[-1]


class Deployed:
    """The overlay's Deployment in ``namespace``, through ``kubectl``."""

    def __init__(self, kubectl: Kubectl, namespace: str, app: str = "rtserve") -> None:
        self.kubectl, self.namespace, self.app = kubectl, namespace, app

    def get(self, *args: str) -> str:
        return self.kubectl("-n", self.namespace, "get", *args, capture=True, quiet=True)

    def _items(self) -> list[dict]:
        return json.loads(self.get("pods", "-l", f"app.kubernetes.io/name={self.app}", "-o", "json"))["items"]

    def pods(self) -> list[PodState]:
        """The Deployment's pods that are not terminating, by name."""
        return sorted(
            (PodState.of(i) for i in self._items() if not i["metadata"].get("deletionTimestamp")), key=lambda p: p.name
        )

    def terminating(self) -> list[str]:
        """The names of the Deployment's pods that are terminating (draining in their preStop)."""
        return sorted(i["metadata"]["name"] for i in self._items() if i["metadata"].get("deletionTimestamp"))

    def grace_seconds(self) -> float:
        """The longest grace period the terminating pods were given (0 when none terminates).

        Kubernetes kills each pod once its own has passed.
        """
        return max(
            (
                float(i["metadata"].get("deletionGracePeriodSeconds") or 0)
                for i in self._items()
                if i["metadata"].get("deletionTimestamp")
            ),
            default=0.0,
        )

    def service_url(self, service: str | None = None, port: int = 8080) -> str:
        ip = self.get("service", service or self.app, "-o", "jsonpath={.spec.clusterIP}")
        return f"http://{ip}:{port}"

    def token(self) -> str:
        """The gateway's shared token (the Secret's first line)."""
        data = self.get("secret", TOKEN_SECRET, "-o", "jsonpath={.data.tokens}")
        return base64.b64decode(data).decode().splitlines()[0]

    def exec(self, pod: str, container: str, *cmd: str) -> str:
        """``cmd``'s stdout in ``container`` of ``pod``."""
        return self.kubectl("-n", self.namespace, "exec", pod, "-c", container, "--", *cmd, capture=True, quiet=True)

    def keys(self, pod: str) -> dict[str, str]:
        """TorchServe's keys in ``pod`` (random per start)."""
        data = json.loads(self.exec(pod, "rtserve", "cat", POD_KEY_FILE_PATH))
        return {kind: data[kind]["key"] for kind in ("inference", "management")}

    def wait_ready(self, replicas: int, timeout: float) -> list[PodState]:
        """Wait until ``replicas`` pods are ready; they."""
        deadline = time.monotonic() + timeout
        while True:
            pods = [p for p in self.pods() if p.ready]
            if len(pods) >= replicas:
                return pods
            if time.monotonic() > deadline:
                raise DeployError(
                    f"{len(pods)} of {replicas} pods of {self.app} ready in {self.namespace} after {timeout:.0f} s"
                )
            time.sleep(POLL_SECONDS)


def save_token(token: str, path: Path) -> None:
    """``token`` into ``path``, readable by its owner only (examples/oip_client.py --token-file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)


def info(deployed: Deployed, model: str, token_file: Path) -> list[str]:
    """What `make pod` prints once the rollout is verified: where to call the pod, and how."""
    pods = deployed.pods()
    ready = [p for p in pods if p.ready]
    if not ready:
        raise DeployError(f"no pod of {deployed.app} is ready in {deployed.namespace} (make pod-status)")
    save_token(deployed.token(), token_file)
    url = deployed.service_url()
    versions = ", ".join(sorted({p.version for p in ready}))
    return [
        f">> {len(ready)} of {len(pods)} pods ready in namespace {deployed.namespace}, serving {model} {versions}: "
        + ", ".join(f"{p.name} ({p.ip})" for p in ready),
        f"   predictions (the Service, through kube-proxy): {url}/predictions/{model}",
        f"   the gateway token is in {token_file} (mode 0600):",
        f"   curl -s -H \"Authorization: Bearer $(cat {token_file})\" -H 'Content-Type: application/json' "
        f"{url}/predictions/{model} -d @examples/request.json",
        f"   management: {deployed.service_url('rtserve-management', 8081)} (TorchServe's key: inside the pod);"
        f" metrics: http://{ready[0].ip}:8082/metrics",
        "   make pod-status; make pod-stop (the cluster keeps running: make cluster-stop)",
    ]


def status(deployed: Deployed) -> list[str]:
    """One line per pod: phase, readiness, version, restarts per container, address."""
    pods = deployed.pods()
    if not pods:
        return [f">> no pod of {deployed.app} in namespace {deployed.namespace} (make pod)"]
    return [
        f"{p.name}  {p.phase:<9} {'ready' if p.ready else 'not ready':<9} {p.version:<6} "
        + " ".join(f"{c}: {n} restarts" for c, n in sorted(p.restarts.items()))
        + f"  {p.ip}  {p.qos}"
        for p in pods
    ]


def stop(deployed: Deployed, timeout: float = 180) -> list[str]:
    """Delete the Deployment, wait for its pods to go, then delete the namespace.

    Each pod's preStop hook drains it within its grace period; a hook that failed is reported.
    """
    began = time.monotonic()
    names = [p.name for p in deployed.pods()]
    deployed.kubectl(
        "-n",
        deployed.namespace,
        "delete",
        "deployment",
        deployed.app,
        "--ignore-not-found",
        f"--timeout={int(timeout)}s",
    )
    while deployed.get("pods", "-l", f"app.kubernetes.io/name={deployed.app}", "-o", "name").strip():
        if time.monotonic() - began > timeout:
            raise DeployError(f"pods of {deployed.app} still terminating after {timeout:.0f} s")
        time.sleep(POLL_SECONDS)
    seconds = time.monotonic() - began
    events = json.loads(deployed.get("events", "--field-selector", "reason=FailedPreStopHook", "-o", "json"))
    failed = [e.get("message", "") for e in events["items"] if e["involvedObject"].get("name") in names]
    deployed.kubectl("delete", "namespace", deployed.namespace, "--ignore-not-found", f"--timeout={int(timeout)}s")
    lines = [
        f">> {len(names)} pods stopped in {seconds:.1f} s, each after its preStop hook"
        + (f"; the hook failed: {'; '.join(failed)}" if failed else " (none failed)"),
        f">> namespace {deployed.namespace} deleted (the cluster keeps running: make cluster-stop)",
    ]
    if failed:
        raise DeployError("\n".join(lines))
    return lines


def cgroup_dir(pod: PodState, controller: str, container: str | None = None) -> Path:
    """``pod``'s (or one of its containers') cgroup directory for ``controller`` on this machine.

    Cgroup v1, the cgroupfs driver: ``kubepods[/burstable|/besteffort]/pod<uid>[/<id>]``.
    """
    qos = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}[pod.qos]
    path = CGROUP_ROOT / controller / "kubepods" / qos / f"pod{pod.uid}"
    return path / pod.container_ids[container] if container else path


def memory_mib(pod: PodState, container: str) -> float:
    """A container's working set (usage less inactive file pages, as the kubelet counts it), MiB."""
    path = cgroup_dir(pod, "memory", container)
    usage = int((path / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (path / "memory.stat").read_text().splitlines())
    return max(0, usage - int(stat.get("total_inactive_file", 0))) / 2**20


def cpu_seconds(pod: PodState) -> float:
    """CPU seconds the pod's containers used so far (its cgroup's cpuacct.usage)."""
    return int((cgroup_dir(pod, "cpuacct") / "cpuacct.usage").read_text()) / 1e9
