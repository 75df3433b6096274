"""Run the production pod locally with podman, as the rendered Deployment specifies.

Everything comes from ``kubectl kustomize`` of an overlay (:func:`render`), not from a second copy:
the pod template's containers (the native gateway sidecar first, then rtserve), their command or
args, env, volume mounts (emptyDirs, the ConfigMaps' files, the gateway Secret's ``tokens`` file),
securityContext (user and group, read-only root, capabilities dropped, no new privileges),
resources, shared process namespace, grace period, preStop hook and probes.

podman 4.3's ``kube play`` cannot run native sidecars and mounts Secret data base64-encoded, so a
pod is made with ``podman pod create`` and ``podman run --pod``; host ports are published on
127.0.0.1 only. A detached "kubelet" process (``python -m deploy.podman.pod kubelet``) runs the
probes as a kubelet does: exec probes with ``podman exec``, httpGet probes from the host into the
pod's network namespace, at their periods, timeouts and thresholds; a sidecar's startup probe must
pass before the next container starts; a failed liveness probe runs the preStop hook and restarts
the container. It writes the pod's state to ``status.json`` in the pod directory.

Where the manifest differs from what this machine can do, it says so (:data:`DIFFERENCES`).

    python -m deploy.podman.pod up   --overlay production --pod-dir .run/pod
    python -m deploy.podman.pod down --pod-dir .run/pod
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import yaml

from rtserve.runtime.process import PidFile, spawn, wait_until

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent.parent
CONTAINERS_CONF = REPO / "deploy" / "podman" / "containers.conf"
#: The stand-in for the manifest's gateway image where that cannot be pulled (gateway.Dockerfile).
GATEWAY_STANDIN = "localhost/rtserve-gateway-standin:nginx-bookworm"
#: The Secret's key the Deployment reads (README: ``--from-literal=tokens=...``).
SECRET_KEY = "tokens"
#: Host ports by container port name (``make pod``'s defaults).
DEFAULT_PORTS = {"inference": 8080, "management": 8081, "metrics": 8082}
DIFFERENCES = (
    "images are used as built locally (imagePullPolicy Always is not honoured: --pull never)",
    "emptyDirs are host directories under the pod directory (sizeLimit is not enforced)",
    "fsGroup is a supplementary group of both containers; volumes are owned by it",
)


class PodError(RuntimeError):
    """podman refused something, or the pod did not become ready (the message says why)."""


def podman(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run podman with the project's containers.conf; stdout and stderr as text."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONTAINERS_CONF))
    # Not from the repository: conmon (podman's container monitor) inherits this directory and,
    # on cgroup v1, drops an empty file named `oom` there when a container runs out of memory.
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                            env=env, cwd=tempfile.gettempdir())
    if check and result.returncode != 0:
        raise PodError(f"podman {' '.join(args[:3])} ... failed: {result.stderr.strip()[-800:]}")
    return result


def image_exists(image: str) -> bool:
    """Whether podman's storage has ``image`` (nothing is pulled)."""
    return podman("image", "exists", image, check=False).returncode == 0


# -- the manifest -----------------------------------------------------------------------------
def render(overlay: str, k8s_dir: Path = REPO / "deploy" / "k8s") -> list[dict]:
    """The objects ``kubectl kustomize`` renders for ``overlay``."""
    result = subprocess.run(["kubectl", "kustomize", str(Path(k8s_dir) / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise PodError(f"kubectl kustomize {overlay}: {result.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@dataclass(frozen=True)
class Probe:
    """One probe as the manifest states it (Kubernetes' defaults where it says nothing)."""

    exec_command: list[str] | None = None
    http_path: str | None = None
    http_port: int | None = None
    period: float = 10
    timeout: float = 1
    failure_threshold: int = 3
    success_threshold: int = 1
    initial_delay: float = 0

    @classmethod
    def from_spec(cls, spec: dict | None, ports: dict[str, int]) -> Probe | None:
        if not spec:
            return None
        http = spec.get("httpGet")
        port = http and http["port"]
        return cls(
            exec_command=(spec.get("exec") or {}).get("command"),
            http_path=http and http.get("path", "/"),
            http_port=ports.get(port, port) if http else None,
            period=spec.get("periodSeconds", 10), timeout=spec.get("timeoutSeconds", 1),
            failure_threshold=spec.get("failureThreshold", 3),
            success_threshold=spec.get("successThreshold", 1),
            initial_delay=spec.get("initialDelaySeconds", 0))


@dataclass(frozen=True)
class Container:
    """One container of the pod template, in the terms ``podman run`` needs."""

    name: str
    image: str
    command: list[str] | None
    args: list[str] | None
    env: dict[str, str]
    mounts: list[tuple[str, str, bool]]  # (volume, path, read-only)
    user: int
    group: int
    read_only: bool
    drop_all: bool
    no_new_privileges: bool
    cpus: str | None
    memory: str | None
    working_dir: str | None
    ports: dict[str, int]  # port name -> container port
    startup: Probe | None
    readiness: Probe | None
    liveness: Probe | None
    pre_stop: list[str] | None
    sidecar: bool


@dataclass(frozen=True)
class Volume:
    """A pod volume: ``emptyDir``, ``configMap`` (its files) or ``secret`` (its files)."""

    name: str
    kind: str
    files: dict[str, str] = field(default_factory=dict)
    mode: int = 0o644


@dataclass(frozen=True)
class PodSpec:
    """What the Deployment's pod template asks for."""

    containers: list[Container]  # in start order: native sidecars first
    volumes: dict[str, Volume]
    share_pid: bool
    grace: float
    fs_group: int | None


def _cpus(value: str | None) -> str | None:
    if value is None:
        return None
    value = str(value)
    return str(int(value[:-1]) / 1000) if value.endswith("m") else value


def _memory(value: str | None) -> str | None:
    if value is None:
        return None
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, unit in units.items():
        if str(value).endswith(suffix):
            return str(value)[:-2] + unit
    return str(value)


def _container(spec: dict, pod_security: dict, sidecar: bool) -> Container:
    sc = {**pod_security, **spec.get("securityContext", {})}
    ports = {p["name"]: p["containerPort"] for p in spec.get("ports", [])}
    limits = spec.get("resources", {}).get("limits", {})
    pre_stop = (spec.get("lifecycle", {}).get("preStop") or {}).get("exec", {}).get("command")
    return Container(
        name=spec["name"], image=spec["image"], command=spec.get("command"),
        args=spec.get("args"), env={e["name"]: e["value"] for e in spec.get("env", [])},
        mounts=[(m["name"], m["mountPath"], bool(m.get("readOnly"))) for m in spec.get("volumeMounts", [])],
        user=sc["runAsUser"], group=sc["runAsGroup"],
        read_only=bool(sc.get("readOnlyRootFilesystem")),
        drop_all="ALL" in sc.get("capabilities", {}).get("drop", []),
        no_new_privileges=sc.get("allowPrivilegeEscalation") is False,
        cpus=_cpus(limits.get("cpu")), memory=_memory(limits.get("memory")),
        working_dir=spec.get("workingDir"), ports=ports,
        startup=Probe.from_spec(spec.get("startupProbe"), ports),
        readiness=Probe.from_spec(spec.get("readinessProbe"), ports),
        liveness=Probe.from_spec(spec.get("livenessProbe"), ports),
        pre_stop=pre_stop, sidecar=sidecar)


def pod_spec(objects: list[dict], token: str) -> PodSpec:
    """The :class:`PodSpec` of the rendered Deployment; the Secret's file holds ``token``.

    Raises:
        PodError: no Deployment, or a volume of a kind this runner does not know.
    """
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    if len(deployments) != 1:
        raise PodError(f"expected one Deployment in the rendered overlay, found {len(deployments)}")
    config_maps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    pod = deployments[0]["spec"]["template"]["spec"]
    security = pod.get("securityContext", {})
    containers = [_container(c, security, sidecar=True) for c in pod.get("initContainers", [])
                  if c.get("restartPolicy") == "Always"]
    if len(containers) != len(pod.get("initContainers", [])):
        raise PodError("only native sidecars (initContainers with restartPolicy Always) are run")
    containers += [_container(c, security, sidecar=False) for c in pod["containers"]]
    volumes = {}
    for v in pod.get("volumes", []):
        if "emptyDir" in v:
            volumes[v["name"]] = Volume(v["name"], "emptyDir")
        elif "configMap" in v:
            volumes[v["name"]] = Volume(v["name"], "configMap", config_maps[v["configMap"]["name"]],
                                        v["configMap"].get("defaultMode", 0o644))
        elif "secret" in v:
            volumes[v["name"]] = Volume(v["name"], "secret", {SECRET_KEY: token + "\n"},
                                        v["secret"].get("defaultMode", 0o644))
        else:
            raise PodError(f"volume {v['name']}: only emptyDir, configMap and secret are run here")
    return PodSpec(containers, volumes, bool(pod.get("shareProcessNamespace")),
                   float(pod.get("terminationGracePeriodSeconds", 30)), security.get("fsGroup"))


# -- the pod ----------------------------------------------------------------------------------
@dataclass
class PodConfig:
    """Where a pod lives and how it is reached.

    Attributes:
        name: the podman pod's name (containers are ``<name>-<container>``).
        pod_dir: its state: volumes, status.json, the kubelet's log and PID file.
        token_file: the shared gateway token (written with mode 0600 when absent).
        ports: host port (on 127.0.0.1) by container port name.
        image_tag: the rtserve image's tag (the model version); None keeps the overlay's pin.
        overlay: the kustomize overlay rendered.
        manifest: a file of already rendered objects to run instead of the overlay (tests run
            a copy of the rendered manifest with shorter probe periods: tests/pod).
    """

    name: str = "rtserve"
    pod_dir: Path = REPO / ".run" / "pod"
    token_file: Path | None = None
    ports: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_PORTS))
    image_tag: str | None = None
    overlay: str = "production"
    manifest: Path | None = None

    def __post_init__(self) -> None:
        self.pod_dir = Path(self.pod_dir).resolve()
        self.token_file = Path(self.token_file or self.pod_dir / "gateway-token").resolve()
        self.manifest = Path(self.manifest).resolve() if self.manifest else None

    def objects(self) -> list[dict]:
        """The objects this pod runs: the manifest file's, else the overlay's rendering."""
        if self.manifest:
            return [doc for doc in yaml.safe_load_all(self.manifest.read_text()) if doc]
        return render(self.overlay)

    def to_json(self) -> str:
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()})

    @classmethod
    def from_json(cls, text: str) -> PodConfig:
        return cls(**json.loads(text))


def ensure_token(path: Path) -> str:
    """The shared gateway token in ``path``; a new random one (mode 0600) when it is absent."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def with_images(spec: PodSpec, image_tag: str | None) -> tuple[PodSpec, list[str]]:
    """The spec with the rtserve image's tag set and unpullable sidecar images replaced by the
    local stand-in; and the notes saying so."""
    notes, containers = [], []
    for c in spec.containers:
        image = c.image
        if not c.sidecar and image_tag:
            image = f"{image.rsplit(':', 1)[0]}:{image_tag}"
        if c.sidecar and not image_exists(image) and podman("pull", "-q", image, check=False).returncode:
            notes.append(f"{c.name}: {image} cannot be pulled here; using the stand-in "
                         f"{GATEWAY_STANDIN} (Debian's nginx, see deploy/podman/gateway.Dockerfile)")
            image = GATEWAY_STANDIN
        if not image_exists(image):
            raise PodError(f"{c.name}: image {image} is not built (make image / make pod builds it)")
        containers.append(replace(c, image=image))
    return PodSpec(containers, spec.volumes, spec.share_pid, spec.grace, spec.fs_group), notes


class Pod:
    """One local pod made from a :class:`PodSpec`."""

    def __init__(self, config: PodConfig, spec: PodSpec) -> None:
        self.config = config
        self.spec = spec

    @property
    def dir(self) -> Path:
        return self.config.pod_dir

    def cname(self, container: Container) -> str:
        return f"{self.config.name}-{container.name}"

    def container(self, name: str) -> Container:
        (found,) = [c for c in self.spec.containers if c.name == name]
        return found

    def volume_dir(self, name: str) -> Path:
        return self.dir / "volumes" / name

    def make_volumes(self) -> None:
        """Fresh host directories for every volume (a new pod's emptyDirs are empty)."""
        root = self.dir / "volumes"
        shutil.rmtree(root, ignore_errors=True)
        group = self.spec.fs_group if self.spec.fs_group is not None else 0
        for v in self.spec.volumes.values():
            d = self.volume_dir(v.name)
            d.mkdir(parents=True)
            for file, text in v.files.items():
                (d / file).write_text(text)
                os.chown(d / file, 0, group)
                (d / file).chmod(v.mode)
            if v.kind == "emptyDir":
                owner = next((c.user for c in self.spec.containers), 0)
                os.chown(d, owner, group)
                d.chmod(0o2770)
            else:
                os.chown(d, 0, group)
                d.chmod(0o755)

    def run_args(self, c: Container) -> list[str]:
        """``podman run`` arguments for container ``c`` (what the manifest says of it)."""
        args = ["run", "-d", "--pod", self.config.name, "--name", self.cname(c), "--pull", "never",
                "--user", f"{c.user}:{c.group}", "--restart", "always"]
        if self.spec.fs_group is not None:
            args += ["--group-add", str(self.spec.fs_group)]
        if c.read_only:
            args += ["--read-only", "--read-only-tmpfs=false"]
        if c.drop_all:
            args += ["--cap-drop", "ALL"]
        if c.no_new_privileges:
            args += ["--security-opt", "no-new-privileges"]
        if c.cpus:
            args += ["--cpus", c.cpus]
        if c.memory:
            args += ["--memory", c.memory]
        if c.working_dir:
            args += ["--workdir", c.working_dir]
        for k, v in c.env.items():
            args += ["--env", f"{k}={v}"]
        for volume, path, read_only in c.mounts:
            args += ["--volume", f"{self.volume_dir(volume)}:{path}:{'ro' if read_only else 'rw'}"]
        if c.command:
            args += ["--entrypoint", json.dumps(c.command)]
        args.append(c.image)
        return args + (c.args or [])

    def create(self) -> None:
        """Create the pod (shared network, IPC, UTS and, as the manifest asks, PID namespace)
        with the named container ports published on 127.0.0.1, and its volumes."""
        share = "ipc,net,uts" + (",pid" if self.spec.share_pid else "")
        published = []
        for c in self.spec.containers:
            for port_name, port in c.ports.items():
                if port_name in self.config.ports:
                    published += ["--publish", f"127.0.0.1:{self.config.ports[port_name]}:{port}"]
        self.make_volumes()
        podman("pod", "create", "--name", self.config.name, "--share", share, *published)

    def start_container(self, c: Container) -> None:
        podman(*self.run_args(c))

    def infra_pid(self) -> int:
        infra = podman("pod", "inspect", "--format", "{{.InfraContainerID}}", self.config.name).stdout.strip()
        return int(podman("inspect", "--format", "{{.State.Pid}}", infra).stdout.strip())

    def probe(self, c: Container, probe: Probe) -> tuple[bool, str]:
        """Run one probe as a kubelet does: (passed, its output)."""
        try:
            if probe.exec_command:
                # The probe's process ends at its timeout, inside the container too, as a CRI
                # runtime ends it: killing only `podman exec` would leave it running, and under
                # load such leftovers pile up until the container runs out of memory.
                r = podman("exec", self.cname(c), "timeout", "-s", "KILL", str(probe.timeout),
                           *probe.exec_command, check=False, timeout=probe.timeout + 5)
                if r.returncode in (124, 137):
                    return False, f"timed out after {probe.timeout}s"
                return r.returncode == 0, (r.stdout + r.stderr).strip()[-300:]
            # httpGet: from the host into the pod's network namespace, as the kubelet connects
            # to the pod's IP; 200-399 passes.
            code = ("import sys, urllib.request\ntry:\n"
                    f" r = urllib.request.urlopen('http://127.0.0.1:{probe.http_port}{probe.http_path}', timeout={probe.timeout})\n"
                    " print(r.status)\nexcept Exception as e:\n print(getattr(e, 'code', e))")
            r = subprocess.run(["nsenter", "-t", str(self.infra_pid()), "-n", sys.executable, "-c", code],
                               capture_output=True, text=True, timeout=probe.timeout + 5)
            out = r.stdout.strip()
            return out.isdigit() and 200 <= int(out) < 400, f"HTTP {out}"
        except subprocess.TimeoutExpired:
            return False, f"timed out after {probe.timeout}s"
        except PodError as exc:
            return False, str(exc)

    def pre_stop(self, c: Container, budget: float) -> str:
        """Run ``c``'s preStop hook (if any) within ``budget`` seconds; its output."""
        if not c.pre_stop:
            return ""
        try:
            r = podman("exec", self.cname(c), *c.pre_stop, check=False, timeout=max(budget, 1))
            return (r.stdout + r.stderr).strip()
        except subprocess.TimeoutExpired:
            return f"preStop still running after {budget:.0f}s: SIGTERM follows"

    def stop_container(self, c: Container, deadline: float) -> str:
        """preStop, then SIGTERM, then SIGKILL at ``deadline`` (the grace period's end)."""
        hook = self.pre_stop(c, deadline - time.monotonic())
        remaining = max(1, int(deadline - time.monotonic()))
        podman("stop", "--time", str(remaining), self.cname(c), check=False, timeout=remaining + 30)
        return hook

    def remove(self) -> None:
        podman("pod", "rm", "--force", "--ignore", self.config.name, check=False, timeout=120)


# -- the kubelet ------------------------------------------------------------------------------
@dataclass
class ContainerState:
    started: bool = False
    ready: bool = False
    restarts: int = 0
    last: str = ""


class Kubelet:
    """The probe loop of one pod (runs detached; ``status.json`` is its report)."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod
        self.state = {c.name: ContainerState() for c in pod.spec.containers}
        self.due: dict[tuple[str, str], float] = {}
        self.fails: dict[tuple[str, str], int] = {}
        self.stopping = False

    def write_status(self) -> None:
        status = {"pod": self.pod.config.name, "time": time.time(),
                  "ready": all(s.ready for s in self.state.values()),
                  "containers": {n: asdict(s) for n, s in self.state.items()}}
        tmp = self.pod.dir / ".status.json.new"
        tmp.write_text(json.dumps(status, indent=1))
        os.replace(tmp, self.pod.dir / "status.json")

    def step(self, c: Container, now: float) -> None:
        """Run the probes of ``c`` that are due."""
        st = self.state[c.name]
        kinds = [("startup", c.startup)] if not st.started and c.startup else \
            [("readiness", c.readiness), ("liveness", c.liveness)]
        if not st.started and not c.startup:
            st.started = True
        for kind, probe in kinds:
            if probe is None:
                if kind == "readiness":
                    st.ready = True
                continue
            key = (c.name, kind)
            if now < self.due.setdefault(key, now + probe.initial_delay):
                continue
            self.due[key] = now + probe.period
            ok, out = self.pod.probe(c, probe)
            st.last = f"{kind}: {out}"
            self.fails[key] = 0 if ok else self.fails.get(key, 0) + 1
            if kind == "startup" and ok:
                st.started = True
                logger.info("%s: started (%s)", c.name, out)
            elif kind == "readiness":
                if ok != st.ready:
                    logger.info("%s: %s (%s)", c.name, "ready" if ok else "not ready", out)
                if ok:
                    st.ready = True
                elif self.fails[key] >= probe.failure_threshold:
                    st.ready = False
            elif not ok and self.fails[key] >= probe.failure_threshold:
                logger.info("%s: %s probe failed %d times (%s): restarting it", c.name, kind,
                            self.fails[key], out)
                self.restart(c)

    def restart(self, c: Container) -> None:
        """What a kubelet does after a failed liveness (or startup) probe."""
        st = self.state[c.name]
        st.ready = st.started = False
        self.write_status()
        hook = self.pod.stop_container(c, time.monotonic() + self.pod.spec.grace)
        logger.info("%s: preStop: %s", c.name, hook or "(none)")
        podman("start", self.pod.cname(c), check=False)
        st.restarts += 1
        for kind in ("startup", "readiness", "liveness"):
            self.fails.pop((c.name, kind), None)
            self.due.pop((c.name, kind), None)

    def run(self) -> None:
        """Start the containers in order (a sidecar's startup probe gates the next one), then
        probe until SIGTERM."""
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        for c in self.pod.spec.containers:
            self.pod.start_container(c)
            logger.info("%s: container started (%s)", c.name, c.image)
            while c.sidecar and not self.state[c.name].started and not self.stopping:
                self.step(c, time.monotonic())
                self.write_status()
                time.sleep(0.2)
        while not self.stopping:
            now = time.monotonic()
            for c in self.pod.spec.containers:
                self.step(c, now)
            self.write_status()
            time.sleep(0.2)
        logger.info("kubelet stopping")


# -- commands ---------------------------------------------------------------------------------
def load_pod(config: PodConfig) -> tuple[Pod, list[str]]:
    """Render the overlay and make the pod object (nothing started)."""
    token = ensure_token(config.token_file)
    spec, notes = with_images(pod_spec(config.objects(), token), config.image_tag)
    return Pod(config, spec), notes


def read_status(pod_dir: Path) -> dict:
    try:
        return json.loads((Path(pod_dir) / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def kubelet_pid(pod_dir: Path) -> int | None:
    """The kubelet loop's PID (from its PID file) while it runs."""
    return PidFile(Path(pod_dir) / "kubelet.pid").pid()


def up(config: PodConfig, timeout: float = 240) -> float:
    """Create the pod, start the kubelet loop (detached), wait until every container is ready.

    Returns:
        Seconds from the first container's start until the pod was ready.

    Raises:
        PodError: a pod of this name runs already, or it was not ready within ``timeout``.
    """
    if kubelet_pid(config.pod_dir) or podman("pod", "exists", config.name, check=False).returncode == 0:
        raise PodError(f"pod {config.name} exists: make pod-stop first")
    pod, notes = load_pod(config)
    for note in notes:
        logger.info(">> %s", note)
    pod.create()
    (pod.dir / "status.json").unlink(missing_ok=True)
    (pod.dir / "config.json").write_text(config.to_json())
    started = time.monotonic()
    proc = spawn([sys.executable, "-m", "deploy.podman.pod", "kubelet", "--pod-dir", str(pod.dir)],
                 pod.dir / "kubelet.log", PidFile(pod.dir / "kubelet.pid"), cwd=REPO)

    def settled() -> str | None:
        if read_status(pod.dir).get("ready"):
            return "ready"
        return "exited" if proc.poll() is not None else None

    if wait_until(settled, timeout, poll=0.25) == "ready":
        return time.monotonic() - started
    tail = (pod.dir / "kubelet.log").read_text(errors="replace")[-2000:]
    raise PodError(f"pod {config.name} not ready after {time.monotonic() - started:.0f}s; "
                   f"status {read_status(pod.dir)}; kubelet log:\n{tail}")


def down(pod_dir: Path) -> list[str]:
    """Stop the kubelet loop, run the preStop hooks, stop within the grace period (main
    containers first, then sidecars in reverse order), remove the pod. Returns hook outputs."""
    config_file = Path(pod_dir) / "config.json"
    if not config_file.exists():
        return []
    config = PodConfig.from_json(config_file.read_text())
    pid = kubelet_pid(config.pod_dir)
    if pid:
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: kubelet_pid(config.pod_dir) is None, 10.0)
    outputs = []
    if podman("pod", "exists", config.name, check=False).returncode == 0:
        pod, _ = load_pod(config)
        deadline = time.monotonic() + pod.spec.grace
        order = [c for c in pod.spec.containers if not c.sidecar] + \
            [c for c in reversed(pod.spec.containers) if c.sidecar]
        for c in order:
            out = pod.stop_container(c, deadline)
            if out:
                outputs.append(f"{c.name} preStop: {out}")
        pod.remove()
    (config.pod_dir / "kubelet.pid").unlink(missing_ok=True)
    config_file.unlink()
    return outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.podman.pod", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "status", "kubelet"])
    parser.add_argument("--pod-dir", type=Path, default=REPO / ".run" / "pod")
    parser.add_argument("--name", default="rtserve")
    parser.add_argument("--overlay", default="production")
    parser.add_argument("--image-tag", default=None, help="the rtserve image's tag (model version)")
    parser.add_argument("--token-file", type=Path, default=None)
    parser.add_argument("--manifest", type=Path, default=None,
                        help="run these rendered objects (a YAML file) instead of the overlay's")
    parser.add_argument("--ports", default=None,
                        help="inference,management,metrics host ports (default 8080,8081,8082)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s" if args.action == "kubelet"
                        else "%(message)s", stream=sys.stdout)
    if args.action == "kubelet":
        config = PodConfig.from_json((args.pod_dir / "config.json").read_text())
        pod, _ = load_pod(config)
        Kubelet(pod).run()
        return 0
    if args.action == "down":
        for line in down(args.pod_dir):
            logger.info("%s", line)
        logger.info(">> pod stopped and removed")
        return 0
    if args.action == "status":
        print(json.dumps(read_status(args.pod_dir), indent=1))
        return 0 if read_status(args.pod_dir).get("ready") else 1
    ports = dict(DEFAULT_PORTS)
    if args.ports:
        ports = dict(zip(("inference", "management", "metrics"), (int(p) for p in args.ports.split(","))))
    config = PodConfig(args.name, args.pod_dir, args.token_file, ports, args.image_tag, args.overlay,
                       args.manifest)
    try:
        waited = up(config)
    except PodError as exc:
        logger.error("%s", exc)
        down(args.pod_dir)
        return 1
    for d in DIFFERENCES:
        logger.info("   (differs from a cluster: %s)", d)
    logger.info(">> pod %s ready in %.1f s (podman pod ps shows it). Try it:", config.name, waited)
    p = ports
    logger.info("   TOKEN=$(cat %s)", config.token_file)
    logger.info("   curl -s http://127.0.0.1:%d/predictions/realtime-classifier -H \"Authorization: Bearer $TOKEN\" "
                "-H 'Content-Type: application/json' -d @examples/request.json", p["inference"])
    logger.info("   curl -s http://127.0.0.1:%d/v2/models/realtime-classifier/ready -H \"Authorization: Bearer $TOKEN\"",
                p["inference"])
    logger.info("   curl -s http://127.0.0.1:%d/metrics | head", p["metrics"])
    logger.info("   make pod-stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
