"""Bounded disk and records in the cluster: the local-records overlay (the local overlay with an
in-cluster Cassandra node) with its run volume's sizeLimit patched to 16Mi (a copy of deploy/k8s
with one patch: the disk budget follows by the overlay's replacement) takes steady traffic through
the Service that writes four times that into the pods' access logs, with no pod evicted or
restarted and no request failed on its first try; then a rollout replaces those pods under the
same traffic, and every request they answered (or rejected) is in the in-cluster Cassandra node
exactly once, with its version, also after that node's pod is deleted and comes back on its volume.

It runs last in the tier (after test_pod.py's `make pod-stop` removed the local overlay's
namespace: the node's 2 cores are this overlay's alone), in its own namespace, which it deletes
at the end. A last test releases a local volume as `make pod-stop` does and hands it to
rtserve.k8s.volumes, against the real API server.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from bench.loadgen import SteadyLoad, summarize
from rtserve.cluster.node import NODE_NAME
from rtserve.k8s.deploy import Kubectl
from rtserve.k8s.volumes import local_volumes, prepare
from rtserve.records.store import Store
from rtserve.server.disk import BUDGET_KEY
from tests.cluster.conftest import Served, deploy, no_failures
from tests.conftest import MODEL_NAME, REPO

pytestmark = pytest.mark.cluster

#: The overlay under test and its namespace.
OVERLAY, NAMESPACE = "local-records", "rtserve-local-records"
#: The run volume's size limit under test, and how many times it the traffic writes.
SIZE_LIMIT, SIZE_LIMIT_BYTES, WRITES = "16Mi", 16 * 2**20, 4
#: A query parameter this long on every request: the access log keeps each request's URI (the
#: integration tier's disk test does the same; TorchServe takes request lines up to 4 KiB).
PAD = 3800
#: The traffic: requests per second over connections, a tenth of them bad (answered 400), and
#: the longest the writing may take.
RATE, CONCURRENCY, BAD_EVERY, WRITE_SECONDS = 150.0, 6, 10, 900
#: The records store's node (components/cassandra) and how long its records may take to arrive.
NODE, SHIP_SECONDS = "rtserve-cassandra", 120
RUN_DIR = "/home/model-server/run"


def small_volume(tmp_path: Path) -> Path:
    """A copy of deploy/k8s whose local-records overlay patches the run volume's sizeLimit alone."""
    tree = tmp_path / "k8s"
    shutil.copytree(REPO / "deploy" / "k8s", tree)
    overlay = tree / "overlays" / OVERLAY
    (overlay / "run-volume.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "rtserve"},
                "spec": {"template": {"spec": {"volumes": [{"name": "run", "emptyDir": {"sizeLimit": SIZE_LIMIT}}]}}},
            }
        )
    )
    kustomization = overlay / "kustomization.yaml"
    text = yaml.safe_load(kustomization.read_text())
    assert text["patches"], "the local-records overlay lists no patches"
    text["patches"].append({"path": "run-volume.yaml"})
    kustomization.write_text(yaml.safe_dump(text, sort_keys=False))
    return tree


class PodWatch:
    """Samples the server's pods every ``period`` seconds in a thread: each pod's restarts, its
    phase and reason (``Evicted``), and every ``du_every``-th time its run directory's size
    (``du``, as the kubelet measures an emptyDir; an exec costs the node more than a look)."""

    def __init__(self, cluster, period: float = 5.0, du_every: int = 3) -> None:
        self.cluster, self.period, self.du_every, self.samples = cluster, period, du_every, 0
        self.pods: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-watch")

    def start(self) -> PodWatch:
        self._thread.start()
        return self

    def stop(self) -> dict[str, dict]:
        self._stop.set()
        self._thread.join(60)
        self.sample()
        return self.pods

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def sample(self) -> None:
        self.samples += 1
        done = self.cluster.kubectl(
            "-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/name=rtserve", "-o", "json"
        )
        if done.returncode:
            return  # the API server was busy: the next sample counts
        for item in json.loads(done.stdout)["items"]:
            name, status = item["metadata"]["name"], item.get("status", {})
            seen = self.pods.setdefault(name, {"restarts": 0, "reasons": set(), "run_kib": 0, "limit": None})
            statuses = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
            seen["restarts"] = max(seen["restarts"], sum(c.get("restartCount", 0) for c in statuses))
            if status.get("reason"):
                seen["reasons"].add(status["reason"])
            (run,) = [v for v in item["spec"]["volumes"] if v["name"] == "run"]
            seen["limit"] = run["emptyDir"].get("sizeLimit")
            running = any(c["name"] == "rtserve" and "running" in (c.get("state") or {}) for c in statuses)
            if running and not item["metadata"].get("deletionTimestamp") and self.samples % self.du_every == 1:
                du = self.cluster.kubectl("-n", NAMESPACE, "exec", name, "-c", "rtserve", "--", "du", "-sk", RUN_DIR)
                if du.returncode == 0:
                    seen["run_kib"] = max(seen["run_kib"], int(du.stdout.split()[0]))


def answers(load: SteadyLoad) -> int:
    """How many requests so far got their expected answer (each one line of the access log)."""
    return sum(1 for r in list(load.records) if r.answered)


def evictions(cluster, since: datetime) -> list[str]:
    """The namespace's events since ``since`` that evicted or killed a pod for its storage."""
    events = json.loads(cluster.ok("-n", NAMESPACE, "get", "events", "-o", "json"))["items"]
    found = []
    for event in events:
        when = event.get("lastTimestamp") or event.get("eventTime") or ""
        if when and datetime.fromisoformat(when.replace("Z", "+00:00")) < since:
            continue
        text = f"{event.get('reason')}: {event.get('message', '')}"
        if event.get("reason") == "Evicted" or "ephemeral" in text.lower() or "exceeds the limit" in text:
            found.append(f"{event['involvedObject'].get('name')} {text}")
    return found


def node_address(cluster) -> str:
    ip = cluster.ok("-n", NAMESPACE, "get", "pod", f"{NODE}-0", "-o", "jsonpath={.status.podIP}").strip()
    return f"{ip}:9042"


def node_ready(cluster, old_uid: str, timeout: float = 240) -> float:
    """Seconds until the node's pod, made anew (another uid than ``old_uid``), is ready."""
    begin = time.monotonic()
    ready = '{.metadata.uid} {.status.conditions[?(@.type=="Ready")].status}'
    while True:
        done = cluster.kubectl("-n", NAMESPACE, "get", "pod", f"{NODE}-0", "-o", f"jsonpath={ready}")
        uid, _, status = done.stdout.partition(" ")
        if done.returncode == 0 and uid != old_uid and status == "True":
            return time.monotonic() - begin
        assert time.monotonic() - begin < timeout, f"{NODE}-0 not ready again within {timeout:.0f} s"
        time.sleep(2)


def stored(store: Store, since: datetime) -> Counter:
    """How many records of the model each request id has from ``since`` on (records_by_minute)."""
    return Counter(r.request_id for r in store.records(MODEL_NAME, since))


def wait_stored(cluster, wanted: set[str], since: datetime, timeout: float = SHIP_SECONDS) -> tuple[Counter, float]:
    """The store's counts once every id of ``wanted`` is in it (or at ``timeout``), and the wait."""
    begin = time.monotonic()
    while True:
        with Store.connect([node_address(cluster)], timeout=30.0) as store:
            counts = stored(store, since)
        if wanted <= set(counts) or time.monotonic() - begin > timeout:
            return counts, time.monotonic() - begin
        time.sleep(5)


@pytest.fixture(scope="module")
def namespace(cluster):
    """The overlay's namespace, deleted when the module ends (its pods drain in the background)."""
    yield NAMESPACE
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def test_a_16mi_run_volume_takes_four_times_its_size_and_every_answer_reaches_cassandra(
    cluster, namespace, image_vars, tmp_path
):
    begin = time.monotonic()
    since = datetime.now(UTC) - timedelta(seconds=5)
    small = deploy(cluster, image_vars, "1.0", f"K8S_DIR={small_volume(tmp_path)}", overlay=OVERLAY)
    assert small.returncode == 0, small.stdout[-4000:]
    deployed = time.monotonic() - begin
    served = Served(cluster, image_vars, small.stdout, namespace)
    # the pods' server resolved half the limit as its budget (its effective config records it)
    pods = served.deployed.wait_ready(2, timeout=300)
    for pod in pods:
        config = served.deployed.exec(pod.name, "rtserve", "cat", f"{RUN_DIR}/config.properties")
        assert f"{BUDGET_KEY}={SIZE_LIMIT_BYTES // 2}" in config.splitlines(), (pod.name, config[-800:])

    # the autoscaler held at its 2 replicas while the pods write (a third pod's start costs the
    # shared node as much as the traffic; the rollout's apply gives it its maximum back)
    cluster.ok("-n", NAMESPACE, "patch", "hpa", "rtserve", "-p", '{"spec": {"maxReplicas": 2}}')
    url = f"{served.url}?pad={'x' * PAD}"
    uri_bytes = len(url.split("8080", 1)[1])  # what the access log keeps of each request, at least
    watch = PodWatch(cluster).start()
    load = SteadyLoad(
        url,
        {"features": [0.25] * 32},
        lambda: served.token,
        rate=RATE,
        concurrency=CONCURRENCY,
        max_seconds=WRITE_SECONDS + 900,
        bad_every=BAD_EVERY,
        resend_worker_lost=False,
    ).start("write")
    try:
        deadline = time.monotonic() + WRITE_SECONDS
        while answers(load) * uri_bytes < WRITES * SIZE_LIMIT_BYTES and time.monotonic() < deadline:
            time.sleep(2)
        written = answers(load) * uri_bytes
        wrote = time.monotonic() - begin - deployed
        load.mark("rollout")
        rolled = deploy(cluster, image_vars, "2.0", overlay=OVERLAY)  # as it is: every small-volume pod replaced
    finally:
        records = load.stop()
        pods = watch.stop()
    assert rolled.returncode == 0, rolled.stdout[-4000:]
    small_pods = {name: p for name, p in pods.items() if p["limit"] == SIZE_LIMIT}
    report = {p.phase: f"{p.sent} requests, {p.failed_first} failed, versions {p.versions}" for p in summarize(records)}
    print(
        f"k8s-deploy of the {SIZE_LIMIT} overlay {deployed:.0f} s; writing {wrote:.0f} s: {len(records)} requests, "
        f"at least {written / 2**20:.0f} MiB into the access logs ({written / SIZE_LIMIT_BYTES:.1f} x "
        f"{SIZE_LIMIT}); {report}"
    )
    print(
        "pods: "
        + ", ".join(
            f"{n} ({p['limit']}) restarts {p['restarts']}, run dir at most {p['run_kib'] / 1024:.1f} MiB"
            for n, p in sorted(pods.items())
        )
    )
    assert written >= WRITES * SIZE_LIMIT_BYTES, f"{written / 2**20:.0f} MiB in {WRITE_SECONDS} s"

    # Every answer (200 or 400) in the store exactly once, with its version and status.
    answered = {r.request_id: r for r in records if r.answered}
    assert answered and "" not in answered, "an answer without its x-request-id"
    found, waited = wait_stored(cluster, set(answered), since)
    missing = set(answered) - set(found)
    twice = [i for i in answered if found[i] > 1]
    print(
        f"in Cassandra after {waited:.0f} s: {len(answered) - len(missing)} of {len(answered)} answered "
        f"({sum(r.bad for r in answered.values())} rejected), {len(twice)} twice, "
        f"{len(set(found) - set(answered))} other records (warm-ups, the verification Jobs)"
    )
    assert not missing, f"{len(missing)} answered requests have no record, e.g. {sorted(missing)[:3]}"
    assert not twice, twice[:3]
    with Store.connect([node_address(cluster)], timeout=30.0) as store:
        by_id = {r.request_id: r for r in store.records(MODEL_NAME, since) if r.request_id in answered}
        for request_id, sent in answered.items():
            record = by_id[request_id]
            assert record.status == sent.status, (request_id, record.status, sent.status)
            if not sent.bad:
                assert record.model_version == sent.version, (request_id, record.model_version, sent.version)
        sample = sorted(answered)[:: max(1, len(answered) // 200)]
        assert all(store.find(i).line == by_id[i].line for i in sample)  # the table by id agrees
    versions = Counter(r.model_version for r in by_id.values())
    assert set(versions) == {"1.0", "2.0"}, versions

    # The pods took it: none failed a request, restarted or was evicted, each within its budget.
    no_failures(records, "writing four times the run volume, then the rollout")
    assert len(small_pods) >= 2, pods
    for name, pod in pods.items():
        assert pod["restarts"] == 0 and "Evicted" not in pod["reasons"], (name, pod)
    for name, pod in small_pods.items():  # within the budget: half the limit
        assert 0 < pod["run_kib"] * 1024 <= SIZE_LIMIT_BYTES // 2, (name, pod)
    assert evictions(cluster, since) == []

    # The node's volume outlives its pod: deleted, it comes back with every record.
    before = node_address(cluster)
    old = cluster.ok("-n", NAMESPACE, "get", "pod", f"{NODE}-0", "-o", "jsonpath={.metadata.uid}")
    cluster.ok("-n", NAMESPACE, "delete", "pod", f"{NODE}-0", "--wait=true", timeout=120)
    back = node_ready(cluster, old)
    after, _ = wait_stored(cluster, set(answered), since)
    assert set(answered) <= set(after) and not [i for i in answered if after[i] > 1]
    print(
        f"the node's pod deleted and ready again in {back:.0f} s ({before} -> {node_address(cluster)}): "
        f"{len(answered)} records still there; whole test {time.monotonic() - begin:.0f} s"
    )


def test_a_volume_released_by_a_deleted_claim_is_made_anew_for_the_next_one(cluster, tmp_path):
    """What `make k8s-deploy OVERLAY=local-records` meets after `make pod-stop` deleted the
    namespace and with it the node's claim: rtserve.k8s.volumes makes the directory, deletes the Released
    volume, and the volume applied anew binds the new claim, its files still there."""
    namespace, name = f"volume-check-{uuid.uuid4().hex[:6]}", f"volume-check-{uuid.uuid4().hex[:6]}"
    path = tmp_path / "volume"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "local": {"path": str(path)},
            "claimRef": {"namespace": namespace, "name": "data"},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                            ]
                        }
                    ]
                }
            },
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    }
    kubectl = Kubectl(f"{cluster.bin_dir / 'kubectl'} --kubeconfig {cluster.kubeconfig}", out=lambda _: None)
    volumes, said = local_volumes(yaml.safe_dump(pv)), []

    def phase(want: str) -> None:
        deadline = time.monotonic() + 60
        while cluster.kubectl("get", "pv", name, "-o", "jsonpath={.status.phase}").stdout != want:
            assert time.monotonic() < deadline, f"PersistentVolume {name} not {want} within 60 s"
            time.sleep(1)

    cluster.namespace(namespace)
    try:
        prepare(kubectl, volumes, said.append)
        assert path.is_dir() and said == []
        (path / "kept").write_text("a record")
        cluster.ok("apply", "-f", "-", stdin=json.dumps(pv))
        cluster.ok("apply", "-f", "-", stdin=json.dumps(pvc))
        phase("Bound")
        cluster.ok("-n", namespace, "delete", "pvc", "data", "--wait=true")
        phase("Released")
        prepare(kubectl, volumes, said.append)
        assert cluster.kubectl("get", "pv", name).returncode == 1, "the released volume is still there"
        assert len(said) == 1 and "was released by a deleted claim" in said[0], said
        cluster.ok("apply", "-f", "-", stdin=json.dumps(pv))
        cluster.ok("apply", "-f", "-", stdin=json.dumps(pvc))
        phase("Bound")
        assert (path / "kept").read_text() == "a record"
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")
        cluster.kubectl("delete", "pv", name, "--wait=false")
