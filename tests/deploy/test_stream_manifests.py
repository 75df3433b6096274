"""The stream consumer's component (deploy/k8s/components/stream) enabled in every overlay, rendered
by the real ``kubectl kustomize``: valid against the Kubernetes 1.32 schemas, the server's objects
untouched, and the consumer's Deployment right where schemas cannot tell (its replicas against
the input's partitions, its command line as the real parser reads it, probes and scrape on the
metrics port, the server's security conventions)."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml

from rtserve.cli import build_parser
from rtserve.cli import stream as stream_cli
from rtserve.stream import metrics
from tests.deploy.conftest import (INFERENCE_PORT, K8S_VERSION, OVERLAYS, STREAM, dns_rules, lists_component, load,
                                   one, pull_policy, render, with_stream)

pytestmark = pytest.mark.deploy

APP = "rtserve-stream"
#: The Deployment's annotation recording the input topic's partition count.
PARTITIONS = "rtserve.io/input-partitions"


def stream_objects(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["metadata"]["name"].startswith(APP)]


def stream_deployment(objects) -> dict:
    return one(objects, "Deployment", APP)


def consumer(objects) -> dict:
    (c,) = stream_deployment(objects)["spec"]["template"]["spec"]["containers"]
    return c


def server(objects) -> dict:
    return one(objects, "Deployment", "rtserve")


def settings(objects) -> dict[str, str]:
    """The ConfigMap the consumer's environment refers to (its generated, hashed name)."""
    names = {e["valueFrom"]["configMapKeyRef"]["name"] for e in consumer(objects)["env"] if "valueFrom" in e}
    (name,) = names
    assert name.startswith(APP + "-") and name != APP, "the generator's hash rolls the pods"
    return one(objects, "ConfigMap", name)["data"]


def expanded_args(objects) -> list[str]:
    """The container's args with $(VAR) replaced as the kubelet does, from its env and ConfigMap."""
    data = settings(objects)
    env = {e["name"]: e.get("value") or data[e["valueFrom"]["configMapKeyRef"]["key"]]
           for e in consumer(objects)["env"]}
    args = consumer(objects)["args"]
    for ref in re.findall(r"\$\((\w+)\)", " ".join(args)):
        assert ref in env, f"$({ref}) is not in the container's env: the kubelet would pass it as it is"
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_and_the_servers_are_untouched(rendered, rendered_stream, overlay):
    objects = rendered_stream[overlay]
    for obj in objects:
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == "1.32"
    if lists_component(overlay, STREAM):  # local-stream: its server's are local's (test_kafka_manifests.py)
        assert objects == rendered[overlay]
        return
    added = stream_objects(objects)
    assert sorted(o["kind"] for o in added) == ["ConfigMap", "Deployment", "NetworkPolicy", "PodDisruptionBudget"]
    assert [o for o in objects if o not in added] == rendered[overlay], "the component changed the server's objects"
    for obj in added:
        assert obj["metadata"]["namespace"] == f"rtserve-{overlay}"
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == f"rtserve-{overlay}"


def check_members(objects: list[dict]) -> None:
    """The group never holds more members than the input has partitions: ``replicas`` at most
    the recorded count, and an update adds no member.

    Raises:
        AssertionError: naming what is wrong.
    """
    dep = stream_deployment(objects)
    partitions = int(dep["metadata"]["annotations"][PARTITIONS])
    replicas = dep["spec"]["replicas"]
    assert 1 <= replicas <= partitions, f"replicas {replicas}: more members than the {partitions} partitions"
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    assert one(objects, "PodDisruptionBudget", APP)["spec"] == {
        "maxUnavailable": 1, "selector": dep["spec"]["selector"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_replicas_are_at_most_the_input_partitions_and_updates_add_no_member(rendered_stream, overlay):
    check_members(rendered_stream[overlay])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_consumer_runs_the_servers_image_with_a_command_the_cli_accepts(rendered_stream, overlay):
    objects = rendered_stream[overlay]
    c = consumer(objects)
    (served,) = server(objects)["spec"]["template"]["spec"]["containers"]
    assert c["image"] == served["image"] and c["imagePullPolicy"] == pull_policy(overlay)
    argv = expanded_args(objects)
    assert argv[:3] == ["python", "-m", "rtserve"]
    args = build_parser().parse_args(argv[3:])
    data = settings(objects)
    assert args.func is stream_cli.cmd_run
    assert (args.bootstrap, args.group) == (data["bootstrap"], data["group"])
    assert (args.input, args.output, args.dead_letters, args.model) == (
        data["input"], data["output"], data["dead-letters"], data["model"])
    # the server's Service, through its gateway, with the Secret's token
    service = one(objects, "Service", "rtserve")
    assert args.inference == f"http://rtserve:{service['spec']['ports'][0]['port']}"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args.token_file == mounts["gateway-tokens"] + "/tokens"
    volumes = {v["name"]: v for v in stream_deployment(objects)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["gateway-tokens"]["secret"]["secretName"] == "rtserve-gateway-tokens"
    assert args.metrics_host == "0.0.0.0"
    assert args.metrics_port == metrics.METRICS_PORT


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_scrape_use_the_metrics_port(rendered_stream, overlay):
    objects = rendered_stream[overlay]
    dep = stream_deployment(objects)
    c = consumer(objects)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": metrics.METRICS_PORT}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "metrics"}
    # liveness gives up only after the consumer itself says it stalled (its --stall-seconds)
    assert c["livenessProbe"]["timeoutSeconds"] < c["livenessProbe"]["periodSeconds"]
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics.METRICS_PORT),
                           "prometheus.io/path": "/metrics"}
    # the shipped Prometheus configuration keeps these pods
    scrape = yaml.safe_load((STREAM.parents[2] / "monitoring" / "prometheus.yml").read_text())
    keep = next(r for r in scrape["scrape_configs"][0]["relabel_configs"]
                if r["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"])
    assert re.fullmatch(keep["regex"], dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"])
    # the grace period covers a step's transaction (30 s calls) and leaving the group
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context_follows_the_servers(rendered_stream, overlay):
    objects = rendered_stream[overlay]
    pod = stream_deployment(objects)["spec"]["template"]["spec"]
    served = server(objects)["spec"]["template"]["spec"]
    assert pod["securityContext"] == served["securityContext"]
    (served_container,) = served["containers"]
    assert consumer(objects)["securityContext"] == served_container["securityContext"]
    assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == "rtserve"
    for mount in consumer(objects)["volumeMounts"]:  # read-only root: writes go to an emptyDir only
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert mount.get("readOnly") or "emptyDir" in volume, mount
    resources = consumer(objects)["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_keep_the_consumer_and_the_server_apart(rendered_stream, overlay):
    objects = rendered_stream[overlay]
    labels = stream_deployment(objects)["spec"]["template"]["metadata"]["labels"]
    served = server(objects)["spec"]["template"]["metadata"]["labels"]
    assert selects(stream_deployment(objects)["spec"]["selector"]["matchLabels"], labels)
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        ours = one(objects, kind, APP)["spec"]
        theirs = one(objects, kind, "rtserve")["spec"]
        key = "selector" if kind == "PodDisruptionBudget" else "podSelector"
        assert selects(ours[key]["matchLabels"], labels) and not selects(ours[key]["matchLabels"], served)
        assert not selects(theirs[key]["matchLabels"], labels), f"the server's {kind} selects the consumer"
    for svc in (o for o in objects if o["kind"] == "Service"):
        assert not selects(svc["spec"]["selector"], labels), f"Service {svc['metadata']['name']} would route to it"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_admits_scrapes_and_reaches_the_gateway_dns_and_kafka(rendered_stream, overlay):
    objects = rendered_stream[overlay]
    policy = one(objects, "NetworkPolicy", APP)["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    (ingress,) = policy["ingress"]
    assert ingress["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    assert ingress["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    gateway, dns, kafka, *node_dns = policy["egress"]
    served = server(objects)["spec"]["template"]
    assert selects(gateway["to"][0]["podSelector"]["matchLabels"], served["metadata"]["labels"])
    gateway_ports = {p["name"]: p["containerPort"] for c in served["spec"]["initContainers"] for p in c["ports"]}
    assert [p["port"] for p in gateway["ports"]] == [INFERENCE_PORT] == [gateway_ports["inference"]]
    assert [dns, *node_dns] == dns_rules(overlay)
    bootstrap_ports = {int(a.rsplit(":", 1)[1]) for a in settings(objects)["bootstrap"].split(",")}
    assert {p["port"] for p in kafka["ports"]} == bootstrap_ports
    # the server's policy lets the consumer in: its inference port is open to any pod
    assert any(r.get("ports") == [{"port": INFERENCE_PORT, "protocol": "TCP"}] and "from" not in r
               for r in one(objects, "NetworkPolicy", "rtserve")["spec"]["ingress"])


def test_an_overlay_sets_the_bootstrap_with_a_patch_of_the_configmap(tmp_path):
    """What the component's kustomization.yaml and docs/streaming.md tell a user to write: a patch
    changes the setting and the hashed name the Deployment refers to (so the pods roll). (A
    configMapGenerator merge in the overlay fails: its generators run before the components.)"""
    before = load(render(with_stream("staging", tmp_path / "a")))
    overlay = with_stream("staging", tmp_path / "b")
    path = overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["patches"].append({"patch": yaml.safe_dump({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": APP},
        "data": {"bootstrap": "kafka-0.kafka:9092,kafka-1.kafka:9092"}})})
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    after = load(render(overlay))
    assert settings(after)["bootstrap"] == "kafka-0.kafka:9092,kafka-1.kafka:9092"
    assert settings(after)["group"] == settings(before)["group"]
    names = [{e["valueFrom"]["configMapKeyRef"]["name"] for e in consumer(o)["env"] if "valueFrom" in e}
             for o in (before, after)]
    assert names[0] != names[1]
    argv = expanded_args(after)
    assert argv[argv.index("--bootstrap") + 1] == "kafka-0.kafka:9092,kafka-1.kafka:9092"


def test_too_many_replicas_for_the_partitions_is_caught(tmp_path):
    """The check above is not vacuous: an overlay that scales past the partitions fails it."""
    overlay = with_stream("production", tmp_path)
    path = overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["replicas"] = [{"name": APP, "count": 6}]
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    objects = load(render(overlay))
    assert stream_deployment(objects)["spec"]["replicas"] == 6
    with pytest.raises(AssertionError, match="replicas 6: more members than the 4 partitions"):
        check_members(objects)
