"""The stream consumer for real in the local cluster: the local-stream overlay (the local overlay in
its own namespace, the consumers of components/stream and an in-cluster Kafka broker of
components/kafka) deployed with `make k8s-deploy OVERLAY=local-stream`, its NetworkPolicies
enforced (kube-router's firewall).

Under a steady, bounded event load that this test produces to the broker at its pod's address
(this machine is the node, which reaches pod IPs), the consumers' Deployment is rolled out to a
second tag of the same image and rolled back (`kubectl rollout undo`); then a read_committed
reader finds every input offset exactly once in the predictions or the dead letters
(tests/stream/oracle.py), each prediction the in-process model's own answer for its event and
each dead letter naming its field. From a consumer pod's own network namespace, the broker and
the inference Service answer and a target pod of the test's own does not, on a port no policy
names nor on Kafka's; a pod without the consumers' labels cannot reach the broker; each denial
has its control (the same probe connects once the policies deciding it are deleted).

One deploy serves the module; its namespace is deleted at the end.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field

import pytest
import torch
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

from handler.model import PROGRAM_FILE, ModelMetadata, load_program
from rtserve.stream import admin
from rtserve.stream.broker import TOPICS
from tests.cluster.conftest import (
    APPLY_TIMEOUT,
    CONNECT_TIMEOUT,
    KAFKA_PORT,
    TARGET,
    TARGET_PORT,
    Probes,
    Source,
    Target,
    deploy,
    make,
    probe_pod,
)
from tests.stream.helpers import POISON, letters_name_their_fields, read_all
from tests.stream.oracle import OUTPUTS, Output, exactly_once_of

pytestmark = pytest.mark.cluster

OVERLAY, NAMESPACE = "local-stream", "rtserve-local-stream"
BROKER, CONSUMER = "rtserve-kafka", "rtserve-stream"
#: The topics' partitions (the broker's --partitions, the consumers' input-partitions annotation).
PARTITIONS = 4
#: The steady load: events per second, and the most it may send (bounded whatever happens).
RATE, MOST = 25.0, 12_000
#: Seconds for the consumers' rollouts, and for them to commit every event once the load ends.
ROLLOUT_TIMEOUT, DRAIN_TIMEOUT = 300, 180
#: The probes' namespace, where the test's target listens (no policy selects it).
OTHER = "rtserve-stream-probe"


@dataclass
class Stream:
    """The deployed overlay: the cluster, the broker's address, the image and the deploy's seconds."""

    cluster: object
    bootstrap: str
    image: str
    deployed: float
    notes: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        return self.cluster.ok("-n", NAMESPACE, *args, timeout=timeout)

    def consumer_pods(self) -> dict[str, str]:
        """The consumers' pods that are not terminating: name -> image."""
        items = json.loads(self.kubectl("get", "pods", "-l", f"app.kubernetes.io/name={CONSUMER}", "-o", "json"))
        return {
            p["metadata"]["name"]: p["spec"]["containers"][0]["image"]
            for p in items["items"]
            if not p["metadata"].get("deletionTimestamp")
        }

    def rolled(self, what: str) -> float:
        """Seconds until the consumers' rollout is complete (``kubectl rollout status``)."""
        begin = time.monotonic()
        status = ("rollout", "status", f"deployment/{CONSUMER}", f"--timeout={ROLLOUT_TIMEOUT}s")
        done = self.cluster.kubectl("-n", NAMESPACE, *status, timeout=ROLLOUT_TIMEOUT + 30)
        assert done.returncode == 0, f"{what}: {done.stdout}{done.stderr}\n{diagnosis(self.cluster)}"
        took = time.monotonic() - begin
        self.notes.append(f"{what}: rolled out in {took:.0f} s")
        return took


@pytest.fixture(scope="module")
def stream(request, image_vars):
    """`make k8s-deploy OVERLAY=local-stream` (the server's, the gateway stand-in's and the broker's
    images built and loaded), then the broker and the consumers ready; the namespace is deleted
    at the end (its pods drain in the background). The server's image is built before the
    cluster is asked for: where this module starts the cluster, the build's transient gigabytes
    cannot put its node under disk pressure, whose image collection would take the node's
    sandbox image (unpinned on Debian's containerd 1.6) while no pod runs."""
    built = make("image", "MODEL_VERSION=1.0", "IMAGE_TAG=1.0", *image_vars, timeout=2400)
    assert built.returncode == 0, built.stdout[-4000:]
    cluster = request.getfixturevalue("cluster")
    begin = time.monotonic()
    try:
        done = deploy(cluster, image_vars, "1.0", overlay=OVERLAY)
        assert done.returncode == 0, done.stdout[-6000:]
        deployed = time.monotonic() - begin
        print(
            f"k8s-deploy OVERLAY={OVERLAY} 1.0: {deployed:.0f} s; "
            + "; ".join(line for line in done.stdout.splitlines() if "rtserve-kafka" in line and line.startswith(">> "))
        )
        wait = f"--timeout={ROLLOUT_TIMEOUT}s"
        for what in (f"statefulset/{BROKER}", f"deployment/{CONSUMER}"):
            done = cluster.kubectl("-n", NAMESPACE, "rollout", "status", what, wait, timeout=ROLLOUT_TIMEOUT + 30)
            assert done.returncode == 0, f"{what} not ready: {done.stdout}{done.stderr}\n{diagnosis(cluster)}"
        ip = cluster.ok("-n", NAMESPACE, "get", "pod", f"{BROKER}-0", "-o", "jsonpath={.status.podIP}").strip()
        image = cluster.ok(
            "-n", NAMESPACE, "get", f"deployment/{CONSUMER}", "-o", "jsonpath={.spec.template.spec.containers[0].image}"
        )
        restarts = cluster.ok(
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}",
        )
        print(
            f"broker and consumers ready {time.monotonic() - begin:.0f} s after the deploy began; restarts: {restarts}"
        )
        yield Stream(cluster, f"{ip}:{KAFKA_PORT}", image, deployed)
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def diagnosis(cluster) -> str:
    """The namespace's pods and the ends of the broker's and the consumers' logs (a failure's report)."""
    lines = [cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide").stdout]
    for what in (f"statefulset/{BROKER}", f"deployment/{CONSUMER}"):
        for previous in ("--previous=false", "--previous=true"):
            done = cluster.kubectl("-n", NAMESPACE, "logs", what, previous, "--tail=25")
            lines.append(f"--- logs {what} {previous}:\n{done.stdout or done.stderr}")
    return "\n".join(lines)


def rows(meta: ModelMetadata, n: int, seed: int = 39) -> list[list[float]]:
    """``n`` feature rows drawn around the training data's mean (the classes spread)."""
    generator = torch.Generator().manual_seed(seed)
    mean, std = torch.tensor(meta.stats["mean"]), torch.tensor(meta.stats["std"])
    return (mean + std * torch.randn(n, meta.n_features, generator=generator)).tolist()


class Load:
    """Events produced at ``RATE`` in a thread until stopped (at most ``MOST``): valid ones keyed
    ``k0``..``k7`` with an ``id``, and every 250th one of :data:`POISON` (the 5 MB one left out:
    the topic takes records up to Kafka's default 1 MB). Records where each landed."""

    def __init__(self, bootstrap: str, features: list[list[float]]) -> None:
        self.features = features
        self.sent: dict[tuple[int, int], tuple[bytes, bytes]] = {}
        self.failed: list[str] = []
        self.marks: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 4}
        )
        self._thread = threading.Thread(target=self._run, daemon=True, name="stream-load")

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.sent[(msg.partition(), msg.offset())] = (msg.key(), msg.value())

    def _event(self, i: int) -> tuple[bytes, bytes]:
        poison = [value for value, _, reason in POISON if reason != "too_large"]
        if i % 250 == 125:
            return b"poison-%d" % i, poison[(i // 250) % len(poison)]
        row = self.features[i % len(self.features)]
        return b"k%d" % (i % 8), json.dumps({"features": row, "id": f"e{i}"}).encode()

    def _run(self) -> None:
        begin = time.monotonic()
        for i in range(MOST):
            wait = begin + i / RATE - time.monotonic()
            if self._stop.wait(max(0.0, wait)):
                break
            key, value = self._event(i)
            self._producer.produce("events", key=key, value=value, on_delivery=self._delivered)
            self._producer.poll(0)
        self._producer.flush(60)

    def start(self) -> Load:
        self._thread.start()
        return self

    def mark(self, phase: str) -> None:
        self.marks.append((phase, len(self.sent)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(90)
        assert not self._thread.is_alive(), "the producer did not flush within 90 s"


def reader(bootstrap: str, level: str = "read_committed") -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": level,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 4,
        }
    )


def ends(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end as a read_committed reader finds it."""
    check = reader(bootstrap)
    try:
        return {
            p: check.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(PARTITIONS)
        }
    finally:
        check.close()


def written(bootstrap: str) -> dict[str, list[Output]]:
    """Every committed record of the output topics, read with read_committed to their ends, by role;
    each record's ``_written_ms`` is its Kafka timestamp (the event-to-output latency's end)."""
    return {
        name: [
            Output(m.partition(), m.offset(), m.key(), {**json.loads(m.value()), "_written_ms": m.timestamp()[1]})
            for m in read_all(bootstrap, name, timeout=120, partitions=PARTITIONS)
        ]
        for name in OUTPUTS
    }


def drained(bootstrap: str, sent: dict[tuple[int, int], tuple[bytes, bytes]]) -> float:
    """Seconds until the consumers' group committed every event sent (its offsets at the input's ends)."""
    want = {p: 1 + max((o for q, o in sent if q == p), default=-1) for p in range(PARTITIONS)}
    want = {p: o for p, o in want.items() if o > 0}
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": "rtserve-stream", "log_level": 4})
    begin = time.monotonic()
    try:
        while True:
            try:
                committed = {
                    tp.partition: tp.offset
                    for tp in watcher.committed([TopicPartition("events", p) for p in want], timeout=10)
                }
            except Exception:  # noqa: BLE001 - a transaction in flight: asked again
                committed = {}
            if committed and all(committed.get(p, -1) >= o for p, o in want.items()):
                return time.monotonic() - begin
            assert time.monotonic() - begin < DRAIN_TIMEOUT, f"committed {committed}, the input's ends {want}"
            time.sleep(1)
    finally:
        watcher.close()


def outputs_now(bootstrap: str) -> int:
    return sum(sum(ends(bootstrap, name).values()) for name in OUTPUTS)


def test_exactly_once_through_a_rollout_of_the_consumers_and_its_undo(stream, mar_v1, tmp_path):
    cluster, bootstrap = stream.cluster, stream.bootstrap
    # the broker made the stream's topics at its start, with the consumers' partitions
    assert admin.create_topics(bootstrap, TOPICS, PARTITIONS) == []
    assert {t: n for t, n in admin.topics(bootstrap).items() if t in TOPICS} == dict.fromkeys(TOPICS, PARTITIONS)
    with zipfile.ZipFile(mar_v1) as zf:
        zf.extractall(tmp_path, [PROGRAM_FILE, "meta.json"])
    meta = ModelMetadata.load(tmp_path / "meta.json")
    features = rows(meta, 2000)
    # a second tag of the consumers' image, loaded into the node (tagged there when the node holds
    # the image; its layers are there in any case, so even an import sends next to nothing)
    other = f"{stream.image.rsplit(':', 1)[0]}:1.0-stream-rollout"
    subprocess.run(["podman", "tag", stream.image, other], check=True, timeout=60)
    tagged = make("cluster-load", f"IMAGES={other}", *cluster.make_vars, timeout=600)
    assert tagged.returncode == 0 and ">> 1 image(s) on the node" in tagged.stdout, tagged.stdout[-2000:]
    before = stream.consumer_pods()
    assert len(before) == 2 and set(before.values()) == {stream.image}, before

    begin = time.monotonic()
    load = Load(bootstrap, features).start()
    flowing: list[tuple[str, int, int]] = []
    try:
        time.sleep(5)
        load.mark("set image")
        out = outputs_now(bootstrap)
        stream.kubectl("set", "image", f"deployment/{CONSUMER}", f"stream={other}")
        stream.rolled(f"set image {other}")
        flowing.append(("set image", len(load.sent) - load.marks[-1][1], outputs_now(bootstrap) - out))
        rolled = stream.consumer_pods()
        load.mark("undo")
        out = outputs_now(bootstrap)
        stream.kubectl("rollout", "undo", f"deployment/{CONSUMER}")
        stream.rolled("rollout undo")
        flowing.append(("undo", len(load.sent) - load.marks[-1][1], outputs_now(bootstrap) - out))
        undone = stream.consumer_pods()
        time.sleep(5)
    finally:
        load.stop()
        subprocess.run(["podman", "untag", other, other], capture_output=True, timeout=60)
    produced = time.monotonic() - begin
    assert load.failed == [], load.failed[:3]
    assert set(rolled.values()) == {other} and not set(rolled) & set(before), (before, rolled)
    assert set(undone.values()) == {stream.image} and not set(undone) & set(rolled), (rolled, undone)
    drain = drained(bootstrap, load.sent)
    found = written(bootstrap)

    check = exactly_once_of(found, load.sent, "events")
    letters = letters_name_their_fields(check, load.sent)
    assert letters > 0 and len(check.predictions) == len(load.sent) - letters
    by_id = {f"e{i}": i for i in range(MOST)}
    order = [by_id[r["id"]] % len(features) for r in check.predictions]
    forward = load_program(tmp_path / PROGRAM_FILE)
    with torch.inference_mode():
        expected = torch.softmax(forward(torch.tensor([features[i] for i in order], dtype=torch.float32)), dim=1)
    served = torch.tensor([r["probabilities"] for r in check.predictions])
    worst = float((served - expected).abs().max())
    assert worst <= 1e-5, f"largest difference from the model's own answer: {worst:.2e}"
    assert {r["model_version"] for r in check.predictions} == {str(meta.version)}
    # the stream flowed while each rollout ran: events in and outputs committed during both
    for phase, sent, out in flowing:
        assert sent > 0 and out > 0, (phase, sent, out)
    lag = sorted(r["_written_ms"] - r["event_timestamp"] for name in OUTPUTS for r in (o.record for o in found[name]))
    print(
        f"\n>> {len(load.sent)} events at {RATE:g}/s over {produced:.0f} s through the consumers' rollout to "
        f"{other} and its undo ({'; '.join(stream.notes)}): {check.summary(load.sent)}; committed in full "
        f"{drain:.0f} s after the last; {len(check.predictions)} predictions equal the in-process model's "
        f"(largest difference {worst:.1e}); {letters} dead letters name their fields; during each rollout "
        + ", ".join(f"{phase}: {sent} events in, {out} outputs committed" for phase, sent, out in flowing)
        + f"; event to output p50 {lag[len(lag) // 2]} ms, p99 {lag[int(len(lag) * 0.99)]} ms, "
        f"max {lag[-1]} ms"
    )


def test_a_consumer_reaches_kafka_and_the_inference_service_and_nothing_else(stream):
    """From a consumer pod's own network namespace (kubectl exec into it): the broker and the
    inference Service connect, the test's target in another namespace does not (a port no policy
    names, and Kafka's: the consumers' Kafka rule names the broker's pods); a pod of the namespace
    without the consumers' labels cannot reach the broker. Each denial connects once the policies
    deciding it are deleted, and is denied again once they are back."""
    cluster = stream.cluster
    probes = Probes(cluster)
    labels = json.loads(
        stream.kubectl("get", f"deployment/{CONSUMER}", "-o", "jsonpath={.spec.template.metadata.labels}")
    )
    broker_labels = json.loads(
        stream.kubectl("get", f"statefulset/{BROKER}", "-o", "jsonpath={.spec.template.metadata.labels}")
    )
    server_labels = json.loads(
        stream.kubectl("get", "deployment/rtserve", "-o", "jsonpath={.spec.template.metadata.labels}")
    )
    target_labels = {"app.kubernetes.io/name": "rtserve-stream-probe-target"}
    plain_labels = {"app.kubernetes.io/name": "rtserve-stream-probe"}
    cluster.namespace(OTHER)
    try:
        cluster.ok(
            "apply",
            "-f",
            "-",
            stdin=yaml.safe_dump_all(
                [
                    probe_pod("target", OTHER, stream.image, target_labels, TARGET, port=TARGET_PORT),
                    probe_pod("plain", NAMESPACE, stream.image, plain_labels, "import time; time.sleep(86400)"),
                ]
            ),
        )
        for ns, pod in ((OTHER, "target"), (NAMESPACE, "plain")):
            cluster.ok("-n", ns, "wait", "--for=condition=Ready", f"pod/{pod}", "--timeout=180s", timeout=200)
        consumer = sorted(stream.consumer_pods())[0]
        sources = {
            "stream consumer": Source("stream consumer", NAMESPACE, consumer, labels, "stream"),
            "pod without the consumers' labels": Source(
                "pod without the consumers' labels", NAMESPACE, "plain", plain_labels
            ),
        }
        host = stream.bootstrap.rsplit(":", 1)[0]
        service = stream.kubectl("get", "service", "rtserve", "-o", "jsonpath={.spec.clusterIP}")
        target_ip = cluster.ok("-n", OTHER, "get", "pod", "target", "-o", "jsonpath={.status.podIP}")
        targets = {
            t.name: t
            for t in (
                Target("Kafka broker :9092", host, KAFKA_PORT, NAMESPACE, broker_labels),
                Target("inference (Service)", service, 8080, NAMESPACE, server_labels),
                Target("test's target :8000", target_ip, TARGET_PORT, OTHER, target_labels),
                Target("test's target :9092 (Kafka's port)", target_ip, KAFKA_PORT, OTHER, target_labels),
            )
        }
        expected = {
            ("stream consumer", "Kafka broker :9092"): True,
            ("stream consumer", "inference (Service)"): True,
            ("stream consumer", "test's target :8000"): False,
            ("stream consumer", "test's target :9092 (Kafka's port)"): False,
            ("pod without the consumers' labels", "Kafka broker :9092"): False,
            ("pod without the consumers' labels", "test's target :9092 (Kafka's port)"): True,
        }
        measured = {cell: probes.reach(sources[cell[0]], targets[cell[1]]) for cell in expected}
        print(
            f"\n>> from the consumer's network namespace and a pod beside it (connect timeout {CONNECT_TIMEOUT:g} s):"
        )
        for (source, target), reach in measured.items():
            print(f"  {source} -> {target}: {reach.text()}")
        wrong = {cell: reach.text() for cell, reach in measured.items() if reach.connected != expected[cell]}
        assert not wrong, f"outcomes the policies do not allow: {wrong}"
        assert measured[("stream consumer", "inference (Service)")].detail.startswith("HTTP/1.")

        for cell in [c for c, connects in expected.items() if not connects]:
            source, target = sources[cell[0]], targets[cell[1]]
            deniers = probes.deniers(source, target)
            names = sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in deniers)
            assert names, f"{cell}: denied, yet no policy selects either end"
            with probes.deleted(deniers):
                reach, took = probes.until(source, target, connected=True)
                print(f"  without {', '.join(names)}: {cell[0]} -> {cell[1]}: {reach.text()} after {took:.1f} s")
                assert reach.connected, (
                    f"{cell} still refused {APPLY_TIMEOUT:g} s after deleting {names}: {reach.text()}"
                )
            reach, took = probes.until(source, target, connected=False)
            assert not reach.connected, f"{cell} still connects {APPLY_TIMEOUT:g} s after restoring {names}"
            print(f"  {', '.join(names)} back: denied again after {took:.1f} s")
    finally:
        cluster.kubectl("-n", NAMESPACE, "delete", "pod", "plain", "--ignore-not-found", "--wait=false")
        cluster.kubectl("delete", "namespace", OTHER, "--ignore-not-found", "--wait=false")
