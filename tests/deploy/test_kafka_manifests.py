"""The local-stream overlay, rendered by the real ``kubectl kustomize``: the local overlay's server
in its own namespace, the stream consumer (components/stream) and an in-cluster Kafka broker
(components/kafka) whose command the real parser accepts, whose topics' partitions and port are
the ones the consumers are given, and whose policies let only the consumers in and the consumers
reach only the broker among Kafka's ports. The cluster tier runs it
(tests/cluster/test_stream_in_cluster.py)."""

from __future__ import annotations

import re

import pytest

from rtserve.cli import build_parser
from rtserve.stream import broker
from tests.deploy.conftest import KAFKA, OVERLAYS, STREAM, lists_component, makefile_text, one, server_objects

pytestmark = pytest.mark.deploy

OVERLAY, NAMESPACE = "local-stream", "rtserve-local-stream"
BROKER, CONSUMER = "rtserve-kafka", "rtserve-stream"


def broker_pod(objects) -> dict:
    return one(objects, "StatefulSet", BROKER)["spec"]["template"]


def broker_container(objects) -> dict:
    (c,) = broker_pod(objects)["spec"]["containers"]
    return c


def broker_args(objects) -> list[str]:
    """The broker's args with $(POD_IP) as the kubelet expands it (a pod's address)."""
    c = broker_container(objects)
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
    return [a.replace("$(POD_IP)", "10.244.0.9") for a in c["args"]]


def consumer_settings(objects) -> dict[str, str]:
    (c,) = one(objects, "Deployment", CONSUMER)["spec"]["template"]["spec"]["containers"]
    (name,) = {e["valueFrom"]["configMapKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
    return one(objects, "ConfigMap", name)["data"]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_only_local_stream_runs_a_broker_and_it_lists_the_consumer_too():
    assert [o for o in OVERLAYS if lists_component(o, KAFKA)] == [OVERLAY]
    assert lists_component(OVERLAY, STREAM)


def test_its_server_is_the_local_overlays_in_its_own_namespace(rendered):
    """Everything but the stream's objects is what the local overlay renders, renamed."""

    def server(objects: list[dict]) -> list[dict]:  # (the consumers' generated ConfigMap has no component label)
        return [o for o in server_objects(objects) if not o["metadata"]["name"].startswith((CONSUMER, BROKER))]

    renamed = eval(repr(server(rendered[OVERLAY])).replace(NAMESPACE, "rtserve-local"))  # noqa: S307 - our repr
    assert renamed == server(rendered["local"]) and len(renamed) >= 10
    assert {o["metadata"].get("namespace") for o in rendered[OVERLAY] if o["kind"] != "Namespace"} == {NAMESPACE}


def test_the_brokers_command_is_one_the_cli_accepts_with_the_consumers_port_and_partitions(rendered):
    objects = rendered[OVERLAY]
    args = broker_args(objects)
    assert args[:5] == ["python", "-m", "rtserve", "kafka", "run"]
    parsed = build_parser("kafka").parse_args(args[3:])
    assert parsed.host == "10.244.0.9" and parsed.port != parsed.controller_port
    # the consumers' bootstrap is the headless Service, on the broker's clients' port
    service = one(objects, "Service", BROKER)["spec"]
    assert service["clusterIP"] == "None" and selects(service["selector"], broker_pod(objects)["metadata"]["labels"])
    (port,) = service["ports"]
    assert consumer_settings(objects)["bootstrap"] == f"{BROKER}:{port['port']}"
    assert {p["name"]: p["containerPort"] for p in broker_container(objects)["ports"]} == {"kafka": parsed.port}
    assert port["port"] == parsed.port and port["targetPort"] == "kafka"
    # the topics it creates are the consumers' and have the partitions their replicas count on
    consumer = one(objects, "Deployment", CONSUMER)
    settings = consumer_settings(objects)
    assert {settings["input"], settings["output"], settings["dead-letters"]} == set(broker.TOPICS)
    assert parsed.partitions == int(consumer["metadata"]["annotations"]["rtserve.io/input-partitions"])
    assert consumer["spec"]["replicas"] <= parsed.partitions


def test_ready_means_the_topics_are_there_and_the_image_is_the_kafka_release(rendered):
    c = broker_container(rendered[OVERLAY])
    parsed = build_parser("kafka").parse_args(broker_args(rendered[OVERLAY])[3:])
    ready = str(parsed.run_dir / broker.READY_FILE)
    assert c["startupProbe"]["exec"]["command"] == ["cat", ready] == c["readinessProbe"]["exec"]["command"]
    assert c["livenessProbe"]["tcpSocket"]["port"] == "kafka"
    version = re.search(r"^KAFKA_VERSION\s+\?= (\S+)$", makefile_text(), re.M)[1]
    assert c["image"] == f"registry.example.com/ml/rtserve-kafka:{version}" and c["imagePullPolicy"] == "IfNotPresent"


def test_the_broker_runs_restricted_and_writes_only_to_its_emptydirs(rendered):
    pod = broker_pod(rendered[OVERLAY])["spec"]
    c = broker_container(rendered[OVERLAY])
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"], sc["capabilities"]) == (
        True, False, {"drop": ["ALL"]})
    assert (sc["runAsUser"], sc["runAsGroup"], sc["seccompProfile"]) == (10001, 10001, {"type": "RuntimeDefault"})
    parsed = build_parser("kafka").parse_args(broker_args(rendered[OVERLAY])[3:])
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert set(mounts) == {str(parsed.run_dir), "/tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert all(volumes[name]["emptyDir"]["sizeLimit"] for name in mounts.values())
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"]
    heap = int(parsed.heap[:-1]) * (1024 if parsed.heap[-1] in "gG" else 1)
    assert int(c["resources"]["limits"]["memory"].removesuffix("Mi")) >= 2 * heap


def test_only_the_consumers_reach_the_broker_and_the_consumers_reach_no_other_kafka(rendered):
    objects = rendered[OVERLAY]
    consumer_labels = one(objects, "Deployment", CONSUMER)["spec"]["template"]["metadata"]["labels"]
    broker_labels = broker_pod(objects)["metadata"]["labels"]
    policy = one(objects, "NetworkPolicy", BROKER)["spec"]
    assert selects(policy["podSelector"]["matchLabels"], broker_labels)
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    (ingress,) = policy["ingress"]
    (source,) = ingress["from"]
    assert set(source) == {"podSelector"} and selects(source["podSelector"]["matchLabels"], consumer_labels)
    assert ingress["ports"] == [{"port": "kafka", "protocol": "TCP"}]
    (egress,) = policy["egress"]  # itself only (a transaction's markers), no DNS
    assert egress["to"] == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": BROKER}}}]
    # the consumers' rule for Kafka's port names the broker's pods, nothing wider
    stream = one(objects, "NetworkPolicy", CONSUMER)["spec"]["egress"]
    kafka = [r for r in stream if {p["port"] for p in r["ports"]} == {9092}]
    assert kafka == [{"to": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": BROKER}}}],
                      "ports": [{"port": 9092, "protocol": "TCP"}]}]
    assert all("to" in r for r in stream), "a rule of the consumers' egress with no destination"
