"""The cluster tier: a real control plane (``make cluster``) from binaries ``make cluster-deps``
builds, in a run directory and kubeconfig of the test session's own, on free loopback ports."""

from __future__ import annotations

import json
import re
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from bench.loadgen import Counts, SteadyLoad, summarize
from rtserve.cluster import runtime
from rtserve.k8s.deploy import Kubectl
from rtserve.k8s.pod import Deployed
from rtserve.runtime.process import tail
from tests.conftest import MODEL_NAME, REPO
from tests.helpers import make  # noqa: F401 - the cluster tier's tests import it from here


@dataclass(frozen=True)
class Cluster:
    """A running cluster: its run directory, kubeconfig, binaries, node and what ``start`` printed."""

    run_dir: Path
    kubeconfig: Path
    bin_dir: Path
    api_url: str
    start_output: str
    node: str = "rtserve-node"

    @property
    def make_vars(self) -> list[str]:
        """The variables that point `make` targets at this cluster."""
        return [f"CLUSTER_RUN_DIR={self.run_dir}", f"CLUSTER_KUBECONFIG={self.kubeconfig}"]

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """The built kubectl against this cluster (stdout and stderr apart)."""
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def namespace(self, name: str, **labels: str) -> None:
        """Create namespace ``name`` with ``labels`` and wait for its ``default`` service account
        (the controller manager makes it; until then the API server refuses every pod there)."""
        self.ok("create", "namespace", name)
        if labels:
            self.ok("label", "namespace", name, *(f"{k}={v}" for k, v in labels.items()))
        deadline = time.monotonic() + 30
        while self.kubectl("get", "serviceaccount", "default", "-n", name).returncode:
            assert time.monotonic() < deadline, f"no default service account in {name} after 30 s"
            time.sleep(0.2)

    def ok(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        done = self.kubectl(*args, stdin=stdin, timeout=timeout)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout


@pytest.fixture(scope="session")
def cluster_bin(cluster_build) -> Path:
    """The binaries, built by `make cluster-deps` (once per machine, into the user's cache; started
    in the background when the session began: tests/conftest.py)."""
    start = time.monotonic()
    done = cluster_build.result()
    assert done.returncode == 0, f"make cluster-deps failed:\n{done.stdout[-4000:]}"
    found = re.search(r"^>> cluster binaries \(.*\) in (\S+)$", done.stdout, re.M)
    assert found, done.stdout
    print(f"make cluster-deps: waited {time.monotonic() - start:.0f} s")
    return Path(found[1])


@pytest.fixture(scope="session")
def cluster(cluster_bin, tmp_path_factory) -> Cluster:
    """`make cluster` on free ports, stopped by `make cluster-stop` (and from its PID files if that
    fails) however the session ends."""
    root = tmp_path_factory.mktemp("cluster")
    run_dir, kubeconfig = root / "run", root / "admin.kubeconfig"
    where = [f"CLUSTER_RUN_DIR={run_dir}", f"CLUSTER_KUBECONFIG={kubeconfig}"]
    try:
        done = make("cluster", *where)
        assert done.returncode == 0, f"make cluster failed:\n{done.stdout[-6000:]}"
        _RUNNING.append(run_dir)
        state = json.loads((run_dir / runtime.STATE_FILE).read_text())
        print(next((line for line in done.stdout.splitlines() if line.startswith(">> cluster ready")), ""))
        yield Cluster(run_dir, kubeconfig, cluster_bin, state["api_url"], done.stdout)
    finally:
        _RUNNING.clear()
        stopped = make("cluster-stop", *where)
        left = [r for r in runtime.recorded(run_dir) if r.alive()]
        left += leftovers(run_dir)
        runtime.stop(run_dir)
        assert stopped.returncode == 0 and not left, f"make cluster-stop left {left}:\n{stopped.stdout}"


#: The run directory of the cluster running now (none, or one).
_RUNNING: list[Path] = []
#: The components' logs a failed test's report ends with (their last lines): what CI keeps of a cluster.
FAILURE_LOGS = (("kube-router", 40), ("kubelet", 40), ("coredns", 15))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A cluster test that fails carries the tails of the network policy controller's, the kubelet's
    and the DNS's logs: a clean clone's run directory is gone once CI ends."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _RUNNING:
        for name, lines in FAILURE_LOGS:
            log = _RUNNING[0] / "logs" / f"{name}.log"
            report.sections.append((f"{name}.log, its last {lines} lines", tail(log, lines) or "(no log)"))


def leftovers(run_dir: Path) -> list[str]:
    """What a node left on this machine: mounts under its run directory, its bridge, KUBE-*
    iptables chains, the network policy controller's ipsets, processes serving its containerd
    (shims) and its network namespaces."""
    from rtserve.cluster import host, node
    from rtserve.runtime.process import pids_with_argument

    left = [f"mount {m}" for m in host.mounts_under(run_dir)] + host.left_iptables() + host.left_ipsets()
    left += [f"bridge {node.BRIDGE}"] if host.bridge_exists() else []
    socket = str(node.NodePaths(run_dir, Path("/")).containerd_socket)
    left += [f"process {pid}" for pid in pids_with_argument("-address", socket)]
    return left


@pytest.fixture(scope="session")
def rendered(cluster) -> dict[str, Path]:
    """`make k8s-render` with the built kubectl: each overlay's file by overlay name."""
    done = make("k8s-render", f"KUBECTL={cluster.bin_dir / 'kubectl'}")
    assert done.returncode == 0, done.stdout
    files = {p.stem: p for p in (REPO / "build" / "k8s" / "render").glob("*.yaml")}
    assert {"production", "staging", "local", "verify", "local-verify"} <= set(files), files
    return files


#: The local overlay's namespace.
NAMESPACE = "rtserve-local"
#: Requests per second of the steady traffic during a rollout (4 clients).
RATE = 40.0


#: A deploy that builds its image with no build cache (a machine's first run: the Java runtime
#: installed, the 4 GB virtualenv made) and loads all of it into the node took 15 min beside the
#: other tiers; with the caches warm it takes 2 to 5.
DEPLOY_TIMEOUT = 2400


def pytest_collection_modifyitems(items):
    """A cluster test may take as long as a cold first deploy may (DEPLOY_TIMEOUT), plus its own
    checks: longer than the suite's 1,200 s per test. (The cold build of the binaries is waited
    for before any limit starts: tests/conftest.py.)"""
    for item in items:
        if item.get_closest_marker("cluster") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(DEPLOY_TIMEOUT + 600))


def deploy(cluster, image_vars, version: str, *extra: str, timeout: float = DEPLOY_TIMEOUT, overlay: str = "local"):
    """`make k8s-deploy OVERLAY=overlay MODEL_VERSION=version` against this cluster."""
    return make(
        "k8s-deploy",
        f"OVERLAY={overlay}",
        f"MODEL_VERSION={version}",
        *cluster.make_vars,
        *image_vars,
        *extra,
        timeout=timeout,
    )


class Served:
    """A local overlay's Deployment and Service (in ``namespace``) as a client sees them."""

    def __init__(self, cluster, image_vars: list[str], deploy_output: str, namespace: str = NAMESPACE) -> None:
        self.cluster, self.image_vars, self.namespace = cluster, image_vars, namespace
        kubectl = Kubectl(f"{cluster.bin_dir / 'kubectl'} --kubeconfig {cluster.kubeconfig}", out=lambda _: None)
        self.deployed = Deployed(kubectl, namespace)
        self._read(deploy_output)

    def _read(self, deploy_output: str) -> None:
        self.deploy_output = deploy_output
        self.token = self.deployed.token()
        self.base = self.deployed.service_url()
        self.url = f"{self.base}/predictions/{MODEL_NAME}"

    def ensure(self, timeout: float = 300) -> Served:
        """What a test on the Deployment needs, whichever tests ran before it: the namespace there
        (`make pod-stop` removes it) and 1.0 alone serving (a test may leave 2.0); otherwise
        `make k8s-deploy` 1.0 again, once the namespace has gone, and the token and address read
        anew (the Secret's token is random per namespace)."""
        phase = self.cluster.kubectl("get", "namespace", self.namespace, "-o", "jsonpath={.status.phase}")
        if phase.returncode == 0 and phase.stdout.strip() == "Active" and self.versions() == {"1.0"}:
            return self
        deadline = time.monotonic() + timeout
        while phase.returncode == 0 and phase.stdout.strip() == "Terminating":
            assert time.monotonic() < deadline, f"namespace {self.namespace} still terminating after {timeout:.0f} s"
            time.sleep(2)
            phase = self.cluster.kubectl("get", "namespace", self.namespace, "-o", "jsonpath={.status.phase}")
        begin = time.monotonic()
        done = deploy(self.cluster, self.image_vars, "1.0")
        assert done.returncode == 0, done.stdout[-6000:]
        print(
            f"k8s-deploy 1.0 again ({'namespace was gone' if phase.returncode else 'not 1.0 alone'}): "
            f"{time.monotonic() - begin:.0f} s"
        )
        self._read(done.stdout)
        return self

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def load(
        self,
        max_seconds: float = DEPLOY_TIMEOUT + 300,
        rows: list[list[float]] | None = None,
        rate: float = RATE,
        concurrency: int = 4,
        keep_alive: bool = True,
        phase: str = "baseline",
    ) -> SteadyLoad:
        """Steady traffic through the Service (``rate`` requests/s from ``concurrency`` senders) for
        as long as a cold deploy may take and its undo (:func:`bench.pod_rollout.settled` tells
        whether it still ran at a phase's end): one constant row, or ``rows`` in turn (each record's
        ``payload`` is its row's index). ``keep_alive=False``: each request on a new connection."""
        payload = {"features": [0.25] * 32}
        return SteadyLoad(
            self.url,
            payload,
            lambda: self.token,
            rate=rate,
            concurrency=concurrency,
            keep_alive=keep_alive,
            max_seconds=max_seconds,
            resend_worker_lost=False,
            payloads=[{"features": row} for row in rows or []],
        ).start(phase)

    def versions(self) -> set[str]:
        """The versions the pods run (their image tags)."""
        return {p.version for p in self.deployed.pods()}

    def pods(self) -> list[str]:
        """The names of the pods."""
        return [p.name for p in self.deployed.pods()]


@contextmanager
def autoscaler_held(served, replicas: int = 2, timeout: float = 240):
    """The autoscaler held at ``replicas`` pods (its maximum lowered), entered once exactly that
    many run, all ready and none terminating; its maximum restored on exit. The tests' steady
    traffic keeps the pods above the HPA's CPU target, and a pod it adds mid-test changes what a
    test compares (the pods before and after, the replicas a drain meets)."""
    cluster, namespace = served.cluster, served.namespace
    most = cluster.ok("-n", namespace, "get", "hpa", "rtserve", "-o", "jsonpath={.spec.maxReplicas}")
    cluster.ok("-n", namespace, "patch", "hpa", "rtserve", "-p", json.dumps({"spec": {"maxReplicas": replicas}}))
    try:
        deadline = time.monotonic() + timeout
        while True:
            pods = served.deployed.pods()
            if len(pods) == replicas and all(p.ready for p in pods) and not served.deployed.terminating():
                break
            assert time.monotonic() < deadline, f"not {replicas} ready pods alone within {timeout:.0f} s: {pods}"
            time.sleep(1)
        yield served
    finally:
        cluster.ok("-n", namespace, "patch", "hpa", "rtserve", "-p", json.dumps({"spec": {"maxReplicas": int(most)}}))


def hpa_status(cluster, namespace: str = NAMESPACE) -> dict:
    """The status of the HorizontalPodAutoscaler ``rtserve``."""
    return json.loads(cluster.ok("-n", namespace, "get", "hpa", "rtserve", "-o", "json"))["status"]


def wait_for(what: str, condition, timeout: float, poll: float = 3.0):
    """``condition()``'s first true value, asked every ``poll`` s; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(poll)


def no_failures(records, what: str) -> Counts:
    counts = Counts.of(records)
    assert counts.sent > 0, f"{what}: no request was sent"
    assert counts.failed_first == 0, f"{what}: {counts.text()}; {summarize(records)}"
    return counts


@pytest.fixture(scope="session")
def served(cluster, image_vars) -> Served:
    """1.0 deployed with `make k8s-deploy OVERLAY=local` alone: the image built and loaded into
    the node, the namespace and the gateway token's Secret (a random token) made by the target."""
    begin = time.monotonic()
    done = deploy(cluster, image_vars, "1.0")
    assert done.returncode == 0, done.stdout[-6000:]
    print(f"k8s-deploy OVERLAY=local 1.0 (image build and load included): {time.monotonic() - begin:.0f} s")
    print(
        "\n".join(line for line in done.stdout.splitlines() if line.startswith((">> built", ">> loaded", ">> 2 image")))
    )
    assert "secret/rtserve-gateway-tokens created" in done.stdout, done.stdout[-6000:]
    return Served(cluster, image_vars, done.stdout)


@pytest.fixture(autouse=True)
def deployment_as_needed(request):
    """A test that uses the Deployment finds it as :meth:`Served.ensure` leaves it, so that the
    tier passes in any order (module fixtures built on ``served`` call it themselves: they are
    set up before this)."""
    if "served" in request.fixturenames:
        request.getfixturevalue("served").ensure()


# Probes of who reaches what (tests/cluster/test_network_policy.py, test_stream_in_cluster.py): a
# short connect from a pod of the rtserve image, and the policies deciding it deleted for a control.
#: The seconds a probe waits for the connection and then for the answer's first line.
CONNECT_TIMEOUT = 3.0
#: The seconds a policy change may take to reach the node's rules (a deletion or a restore).
APPLY_TIMEOUT = 60.0
#: The ports the test's own target pod answers on: one no policy names, and Kafka's.
TARGET_PORT, KAFKA_PORT = 8000, 9092

#: Run in a probe pod: connect to argv[1]:argv[2], send an HTTP GET, read the status line.
PROBE = """
import json, socket, sys, time
host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
begin = time.monotonic()
try:
    conn = socket.create_connection((host, port), timeout=timeout)
except OSError as exc:
    print(json.dumps({"connected": False, "detail": type(exc).__name__, "s": time.monotonic() - begin}))
    sys.exit(0)
try:
    conn.sendall(b"GET / HTTP/1.0\\r\\nHost: probe\\r\\n\\r\\n")
    line = conn.makefile("rb").readline().decode(errors="replace").strip()
except OSError as exc:
    line = "no answer (" + type(exc).__name__ + ")"
print(json.dumps({"connected": True, "detail": line[:40], "s": time.monotonic() - begin}))
"""

#: The target: answers 204 on TARGET_PORT and KAFKA_PORT.
TARGET = f"""
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Answer(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(204); self.end_headers()
    def log_message(self, *args):
        pass
servers = [ThreadingHTTPServer(("0.0.0.0", p), Answer) for p in ({TARGET_PORT}, {KAFKA_PORT})]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
servers[0].serve_forever()
"""


@dataclass(frozen=True)
class Source:
    """Where a probe runs: a pod (and container), its namespace and labels."""

    name: str
    namespace: str
    pod: str
    labels: dict
    container: str = "probe"


@dataclass(frozen=True)
class Target:
    """What a probe connects to: an address and port, and the namespace and labels of the pods behind it."""

    name: str
    host: str
    port: int
    namespace: str
    labels: dict


@dataclass(frozen=True)
class Reach:
    connected: bool
    detail: str
    seconds: float

    def text(self) -> str:
        if self.connected:  # (a peer that speaks no HTTP, Kafka, closes without a line)
            return f"**yes** ({self.detail.removeprefix('HTTP/1.1 ').removeprefix('HTTP/1.0 ') or 'no HTTP answer'})"
        return f"no ({self.detail})"


def probe_pod(name: str, namespace: str, image: str, labels: dict, command: str, port: int | None = None) -> dict:
    """A pod of the rtserve image running ``command`` (Python) with the restricted profile."""
    container = {
        "name": "probe",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["python", "-c", command],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if port:
        container["readinessProbe"] = {"tcpSocket": {"port": port}, "periodSeconds": 1}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "runAsGroup": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [container],
        },
    }


def selects(policy: dict, namespace: str, labels: dict) -> bool:
    """Whether ``policy`` selects a pod with ``labels`` in ``namespace`` (matchLabels only, as ours)."""
    selector = policy["spec"]["podSelector"]
    assert not selector.get("matchExpressions"), f"{policy['metadata']['name']}: matchExpressions not handled here"
    wanted = selector.get("matchLabels") or {}
    return policy["metadata"]["namespace"] == namespace and all(labels.get(k) == v for k, v in wanted.items())


class Probes:
    """The probe pods, the targets and the policies of the cluster, and how to probe and delete them."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.sources: dict[str, Source] = {}
        self.targets: dict[str, Target] = {}

    def reach(self, source: Source, target: Target) -> Reach:
        done = self.cluster.kubectl(
            "-n",
            source.namespace,
            "exec",
            source.pod,
            "-c",
            source.container,
            "--",
            "python",
            "-c",
            PROBE,
            target.host,
            str(target.port),
            str(CONNECT_TIMEOUT),
            timeout=60,
        )
        assert done.returncode == 0, f"probe from {source.name}: {done.stderr}"
        answer = json.loads(done.stdout)
        return Reach(answer["connected"], answer["detail"], answer["s"])

    def policies(self) -> list[dict]:
        return json.loads(self.cluster.ok("get", "networkpolicies", "-A", "-o", "json"))["items"]

    def deniers(self, source: Source, target: Target) -> list[dict]:
        """The policies that decide whether ``source`` reaches ``target``: the Egress policies selecting
        the source and the Ingress policies selecting the pods behind the target."""
        return [
            p
            for p in self.policies()
            if ("Egress" in p["spec"]["policyTypes"] and selects(p, source.namespace, source.labels))
            or ("Ingress" in p["spec"]["policyTypes"] and selects(p, target.namespace, target.labels))
        ]

    @contextmanager
    def deleted(self, policies: list[dict]):
        """``policies`` deleted inside the block, created again as they were after it."""
        kept = []
        for p in policies:
            meta = p["metadata"]
            kept.append(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "NetworkPolicy",
                    "metadata": {
                        k: meta[k] for k in ("name", "namespace", "labels", "annotations") if meta.get(k) is not None
                    },
                    "spec": p["spec"],
                }
            )
            self.cluster.ok("-n", meta["namespace"], "delete", "networkpolicy", meta["name"], "--wait=true")
        try:
            yield
        finally:
            self.cluster.ok("create", "-f", "-", stdin=yaml.safe_dump_all(kept))

    def until(self, source: Source, target: Target, connected: bool) -> tuple[Reach, float]:
        """Probe until the outcome is ``connected`` (within APPLY_TIMEOUT); the last probe, the seconds."""
        begin = time.monotonic()
        while True:
            reach = self.reach(source, target)
            if reach.connected == connected or time.monotonic() - begin > APPLY_TIMEOUT:
                return reach, time.monotonic() - begin
            time.sleep(0.5)
