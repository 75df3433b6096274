"""The NetworkPolicies as the local cluster enforces them (kube-router's firewall, which `make
cluster` runs): who reaches the model, its management API, its metrics, its probes' port, the
candidate, and what the pods themselves may reach, probed with a short connect timeout from pods of the test's own.

The probes run in pods of the rtserve image (its Python) with the restricted security context:
in another namespace with and without the management-client label, in the local overlay's
namespace with and without it, and in the ``monitoring`` namespace. The stream consumer's policy
(components/stream, rendered for the local overlay) is applied to a stand-in pod with the
consumer's labels: the stand-in proves the policy as the local overlay renders it, with the
wide Kafka rule (the real consumer, beside a broker, is test_stream_in_cluster.py's). A target pod of the test's own listens on 8000 (a
port no policy names) and 9092 (Kafka's). The candidate is the real one (`make k8s-shadow`).

Every denial has a control: the policies that deny it (the egress policies selecting the source,
the ingress policies selecting the destination) are deleted, the same probe must then connect,
and the policies are put back (the probe denied again) before the next. So a probe that cannot
connect for another reason cannot pass as a denial.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.cluster.conftest import (
    APPLY_TIMEOUT,
    CONNECT_TIMEOUT,
    DEPLOY_TIMEOUT,
    KAFKA_PORT,
    NAMESPACE,
    TARGET,
    TARGET_PORT,
    Probes,
    Source,
    Target,
    make,
    probe_pod,
)

pytestmark = pytest.mark.cluster

#: The probes' namespace (none of the policies selects it) and the metrics scrapers'.
OTHER = "rtserve-netpol-probe"
MONITORING = "monitoring"
MANAGEMENT_CLIENT = {"rtserve.io/management-client": "true"}
#: Who reaches what, as the policies say: (source, target) -> connects. The default pod reaches
#: the candidate and nothing else; calls from it to its own pods' ports are not probed (a pod
#: reaching its own address never crosses the node's filter).
EXPECTED = {
    ("another namespace", "inference (Service)"): True,
    ("another namespace", "management (pod)"): False,
    ("another namespace", "metrics (pod)"): False,
    ("another namespace", "probes (pod)"): False,
    ("another namespace", "candidate (Service)"): False,
    ("another namespace", "test's target :8000"): True,
    ("another namespace", "test's target :9092 (Kafka's port)"): True,
    ("another namespace, management-client label", "inference (Service)"): True,
    ("another namespace, management-client label", "management (pod)"): False,
    ("another namespace, management-client label", "metrics (pod)"): False,
    ("another namespace, management-client label", "probes (pod)"): False,
    ("another namespace, management-client label", "candidate (Service)"): False,
    ("another namespace, management-client label", "test's target :8000"): True,
    ("another namespace, management-client label", "test's target :9092 (Kafka's port)"): True,
    (f"{NAMESPACE}, no label", "inference (Service)"): True,
    (f"{NAMESPACE}, no label", "management (pod)"): False,
    (f"{NAMESPACE}, no label", "metrics (pod)"): False,
    (f"{NAMESPACE}, no label", "probes (pod)"): False,
    (f"{NAMESPACE}, no label", "candidate (Service)"): False,
    (f"{NAMESPACE}, no label", "test's target :8000"): True,
    (f"{NAMESPACE}, no label", "test's target :9092 (Kafka's port)"): True,
    (f"{NAMESPACE}, management-client label", "inference (Service)"): True,
    (f"{NAMESPACE}, management-client label", "management (pod)"): True,
    (f"{NAMESPACE}, management-client label", "metrics (pod)"): False,
    (f"{NAMESPACE}, management-client label", "probes (pod)"): False,
    (f"{NAMESPACE}, management-client label", "candidate (Service)"): False,
    (f"{NAMESPACE}, management-client label", "test's target :8000"): True,
    (f"{NAMESPACE}, management-client label", "test's target :9092 (Kafka's port)"): True,
    ("monitoring namespace", "inference (Service)"): True,
    ("monitoring namespace", "management (pod)"): False,
    ("monitoring namespace", "metrics (pod)"): True,
    ("monitoring namespace", "probes (pod)"): False,
    ("monitoring namespace", "candidate (Service)"): False,
    ("monitoring namespace", "test's target :8000"): True,
    ("monitoring namespace", "test's target :9092 (Kafka's port)"): True,
    ("stream consumer's policy", "inference (Service)"): True,
    ("stream consumer's policy", "management (pod)"): False,
    ("stream consumer's policy", "metrics (pod)"): False,
    ("stream consumer's policy", "probes (pod)"): False,
    ("stream consumer's policy", "candidate (Service)"): False,
    ("stream consumer's policy", "test's target :8000"): False,
    ("stream consumer's policy", "test's target :9092 (Kafka's port)"): True,
    ("default rtserve pod", "candidate (Service)"): True,
    ("default rtserve pod", "test's target :8000"): False,
    ("default rtserve pod", "test's target :9092 (Kafka's port)"): False,
}


def stream_policy(cluster, tmp_path_factory) -> dict:
    """The stream consumer's NetworkPolicy as the local overlay with components/stream renders it."""
    from tests.deploy.conftest import with_stream

    text = cluster.ok("kustomize", str(with_stream("local", tmp_path_factory.mktemp("stream"))))
    (policy,) = [
        o for o in yaml.safe_load_all(text) if o and o["kind"] == "NetworkPolicy" and "stream" in o["metadata"]["name"]
    ]
    assert policy["metadata"]["namespace"] == NAMESPACE
    return policy


@pytest.fixture(scope="module")
def probes(served, image_vars, tmp_path_factory):
    """The probe pods and the target running, the stream consumer's policy applied, a candidate
    deployed (`make k8s-shadow MODEL_VERSION=2.0 PERCENT=1`); all removed afterwards."""
    cluster = served.cluster
    served.ensure()
    image = cluster.ok(
        "-n",
        NAMESPACE,
        "get",
        "deployment",
        "rtserve",
        "-o",
        "jsonpath={.spec.template.spec.containers[?(@.name=='rtserve')].image}",
    )
    made_monitoring = cluster.kubectl("get", "namespace", MONITORING).returncode != 0
    cluster.namespace(OTHER)
    if made_monitoring:
        cluster.namespace(MONITORING)
    live = ["OVERLAY=local", f"K8S_LIVE_DIR={tmp_path_factory.mktemp('live')}", *cluster.make_vars, *image_vars]
    stream = stream_policy(cluster, tmp_path_factory)
    probe_label = {"app.kubernetes.io/name": "rtserve-netpol-probe"}
    stream_labels = stream["spec"]["podSelector"]["matchLabels"]
    sleeper = "import time; time.sleep(86400)"
    pods = [
        ("another namespace", OTHER, "other", probe_label),
        ("another namespace, management-client label", OTHER, "other-client", {**probe_label, **MANAGEMENT_CLIENT}),
        (f"{NAMESPACE}, no label", NAMESPACE, "netpol-plain", probe_label),
        (f"{NAMESPACE}, management-client label", NAMESPACE, "netpol-client", {**probe_label, **MANAGEMENT_CLIENT}),
        ("monitoring namespace", MONITORING, "netpol-scraper", probe_label),
        ("stream consumer's policy", NAMESPACE, "netpol-stream-stand-in", stream_labels),
    ]
    state = Probes(cluster)
    try:
        cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(stream))
        specs = [probe_pod(pod, ns, image, labels, sleeper) for _, ns, pod, labels in pods]
        target_labels = {"app.kubernetes.io/name": "rtserve-netpol-target"}
        specs.append(probe_pod("target", OTHER, image, target_labels, TARGET, port=TARGET_PORT))
        cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump_all(specs))
        for _, ns, pod, _ in [*pods, (None, OTHER, "target", None)]:
            cluster.ok("-n", ns, "wait", "--for=condition=Ready", f"pod/{pod}", "--timeout=180s", timeout=200)
        begin = time.monotonic()
        shadow = make("k8s-shadow", "MODEL_VERSION=2.0", "PERCENT=1", *live, timeout=DEPLOY_TIMEOUT)
        assert shadow.returncode == 0, shadow.stdout[-4000:]
        print(f"make k8s-shadow MODEL_VERSION=2.0 PERCENT=1 (the candidate): {time.monotonic() - begin:.0f} s")
        default = served.deployed.pods()
        server_labels = json.loads(
            cluster.ok(
                "-n", NAMESPACE, "get", "deployment", "rtserve", "-o", "jsonpath={.spec.template.metadata.labels}"
            )
        )
        candidate_labels = json.loads(
            cluster.ok(
                "-n",
                NAMESPACE,
                "get",
                "deployment",
                "rtserve-candidate",
                "-o",
                "jsonpath={.spec.template.metadata.labels}",
            )
        )
        for name, ns, pod, labels in pods:
            state.sources[name] = Source(name, ns, pod, labels)
        state.sources["default rtserve pod"] = Source(
            "default rtserve pod", NAMESPACE, default[0].name, server_labels, "rtserve"
        )
        service = {
            s: cluster.ok("-n", NAMESPACE, "get", "service", s, "-o", "jsonpath={.spec.clusterIP}")
            for s in ("rtserve", "rtserve-candidate")
        }
        target_ip = cluster.ok("-n", OTHER, "get", "pod", "target", "-o", "jsonpath={.status.podIP}")
        last = default[-1]
        for target in (
            Target("inference (Service)", service["rtserve"], 8080, NAMESPACE, server_labels),
            Target("management (pod)", last.ip, 8081, NAMESPACE, server_labels),
            Target("metrics (pod)", last.ip, 8082, NAMESPACE, server_labels),
            # the kubelet's HTTP probes (the pod's main process answers them): the node only
            Target("probes (pod)", last.ip, 8087, NAMESPACE, server_labels),
            Target("candidate (Service)", service["rtserve-candidate"], 8080, NAMESPACE, candidate_labels),
            Target("test's target :8000", target_ip, TARGET_PORT, OTHER, target_labels),
            Target("test's target :9092 (Kafka's port)", target_ip, KAFKA_PORT, OTHER, target_labels),
        ):
            state.targets[target.name] = target
        yield state
    finally:
        stopped = make("k8s-live-stop", *live, timeout=300)
        for _, ns, pod, _ in pods:
            cluster.kubectl("-n", ns, "delete", "pod", pod, "--ignore-not-found", "--wait=false")
        cluster.kubectl("-n", NAMESPACE, "delete", "networkpolicy", stream["metadata"]["name"], "--ignore-not-found")
        cluster.kubectl("delete", "namespace", OTHER, "--ignore-not-found", "--wait=false")
        if made_monitoring:
            cluster.kubectl("delete", "namespace", MONITORING, "--ignore-not-found", "--wait=false")
        assert stopped.returncode == 0, stopped.stdout[-3000:]


def test_who_reaches_the_model_its_management_its_metrics_the_candidate_and_what_the_pods_reach(probes):
    """Each (source, target) of EXPECTED probed once, the matrix printed (docs/kubernetes.md,
    "Security", shows it), and each outcome the policies' (the inference port answers through
    the Service with an HTTP status line)."""
    measured = {cell: probes.reach(probes.sources[cell[0]], probes.targets[cell[1]]) for cell in EXPECTED}
    targets = list(probes.targets)
    slowest = max(measured.values(), key=lambda r: r.seconds)
    print(
        f"\n>> who reaches what: {len(measured)} probes, connect timeout {CONNECT_TIMEOUT:g} s, the slowest "
        f"{slowest.seconds:.2f} s ({slowest.text()}); a denial is kube-router's reject:"
    )
    print("| from \\ to | " + " | ".join(targets) + " |")
    print("|---" * (len(targets) + 1) + "|")
    for source in probes.sources:
        cells = [measured.get((source, t)) for t in targets]
        print(f"| {source} | " + " | ".join(c.text() if c else "not probed" for c in cells) + " |")
    wrong = {cell: reach.text() for cell, reach in measured.items() if reach.connected != EXPECTED[cell]}
    assert not wrong, f"outcomes the policies do not allow: {wrong}"
    for cell, reach in measured.items():
        if cell[1] == "inference (Service)":
            assert reach.detail.startswith("HTTP/1."), (cell, reach)


def test_every_denial_connects_once_the_policies_that_deny_it_are_deleted(probes):
    """The control of each denial of EXPECTED: denied now, connects within APPLY_TIMEOUT once the
    policies deciding it are deleted, and is denied again once they are back."""
    denied = [cell for cell, connects in EXPECTED.items() if not connects]
    groups: dict[tuple[str, ...], list[tuple[str, str]]] = {}
    for cell in denied:
        source, target = probes.sources[cell[0]], probes.targets[cell[1]]
        names = tuple(
            sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in probes.deniers(source, target))
        )
        assert names, f"{cell}: denied, yet no policy selects either end"
        groups.setdefault(names, []).append(cell)
    print(f"\n>> controls: {len(denied)} denials, {len(groups)} sets of policies deleted in turn")
    for names, cells in groups.items():
        policies = [p for p in probes.policies() if f"{p['metadata']['namespace']}/{p['metadata']['name']}" in names]
        for cell in cells:
            before = probes.reach(probes.sources[cell[0]], probes.targets[cell[1]])
            assert not before.connected, f"{cell} connects before its control: {before.text()}"
        with probes.deleted(policies):
            for cell in cells:
                reach, took = probes.until(probes.sources[cell[0]], probes.targets[cell[1]], connected=True)
                print(f"  without {', '.join(names)}: {cell[0]} -> {cell[1]}: {reach.text()} after {took:.1f} s")
                assert reach.connected, (
                    f"{cell} still refused {APPLY_TIMEOUT:g} s after deleting {names}: {reach.text()}"
                )
        for cell in cells:
            reach, took = probes.until(probes.sources[cell[0]], probes.targets[cell[1]], connected=False)
            assert not reach.connected, f"{cell} still connects {APPLY_TIMEOUT:g} s after restoring {names}"
        print(f"  {', '.join(names)} back: denied again ({took:.1f} s for the last)")
