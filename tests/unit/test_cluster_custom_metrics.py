"""The local cluster's custom metrics as pure builders: Prometheus's scrape configuration and argv,
prometheus-adapter's argv, rules file and manifests (rtserve/cluster/addons.py,
deploy/monitoring/prometheus-adapter.yaml), and the HorizontalPodAutoscaler metrics they serve."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import yaml

from rtserve.cluster import addons, components, pki
from rtserve.errors import ClusterError
from tests.conftest import REPO
from tests.unit.test_cluster_addons import CA_PEM, NODE_IP, by_kind_and_name

pytestmark = pytest.mark.unit

RULES = REPO / "deploy" / "monitoring" / "prometheus-adapter.yaml"


def test_prometheus_scrapes_running_annotated_pods_at_their_ip_with_namespace_and_pod_labels():
    config = yaml.safe_load(addons.prometheus_config(Path("/run/prometheus.kubeconfig")))
    assert config["global"]["scrape_interval"] == addons.SCRAPE_INTERVAL
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": "/run/prometheus.kubeconfig"}]
    relabel = job["relabel_configs"]
    keeps = {r["source_labels"][0]: r["regex"] for r in relabel if r.get("action") == "keep"}
    assert keeps == {
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
        "__meta_kubernetes_pod_phase": "Running",
    }
    by_target = {r["target_label"]: r for r in relabel if "target_label" in r}
    address = by_target["__address__"]
    # What Prometheus does with the pod's IP and its port annotation (a full match, as Prometheus anchors it).
    found = re.fullmatch(address["regex"], "10.244.0.7;8082")
    assert found and found.expand(address["replacement"].replace("$", "\\")) == "10.244.0.7:8082"
    assert re.fullmatch(address["regex"], "10.244.0.7;") is None  # no port annotation: the target keeps its own
    assert by_target["__metrics_path__"]["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_path"]
    assert by_target["namespace"]["source_labels"] == ["__meta_kubernetes_namespace"]
    assert by_target["pod"]["source_labels"] == ["__meta_kubernetes_pod_name"]


def test_prometheus_listens_on_loopback_and_keeps_an_hour():
    argv = addons.prometheus_argv(Path("/bin/prometheus"), Path("/c/p.yml"), Path("/d"), 9090)
    assert argv[0] == "/bin/prometheus"
    assert {"--config.file=/c/p.yml", "--storage.tsdb.path=/d", "--web.listen-address=127.0.0.1:9090"} <= set(argv)
    assert "--storage.tsdb.retention.time=1h" in argv
    assert addons.prometheus_url(9090, "/-/ready") == "http://127.0.0.1:9090/-/ready"
    with pytest.raises(ClusterError, match="port must be a port number 1-65535, got 70000"):
        addons.prometheus_argv(Path("/bin/prometheus"), Path("/c"), Path("/d"), 70000)


def test_adapter_argv_serves_on_the_node_address_from_prometheus_by_the_rules():
    argv = addons.prometheus_adapter_argv(
        Path("/bin/prometheus-adapter"),
        Path("/c/a.kubeconfig"),
        Path("/c/rules.yaml"),
        "http://127.0.0.1:9090",
        NODE_IP,
        6443,
        Path("/p/a.crt"),
        Path("/p/a.key"),
    )
    flags = dict(a.split("=", 1) for a in argv[1:])
    assert flags == {
        "--prometheus-url": "http://127.0.0.1:9090",
        "--config": "/c/rules.yaml",
        "--metrics-relist-interval": addons.ADAPTER_RELIST,
        "--lister-kubeconfig": "/c/a.kubeconfig",
        "--authentication-kubeconfig": "/c/a.kubeconfig",
        "--authorization-kubeconfig": "/c/a.kubeconfig",
        "--bind-address": NODE_IP,
        "--secure-port": "6443",
        "--tls-cert-file": "/p/a.crt",
        "--tls-private-key-file": "/p/a.key",
    }
    with pytest.raises(ClusterError, match="listen_ip must be an IP address, got 'node'"):
        addons.prometheus_adapter_argv(
            Path("/b"), Path("/k"), Path("/r"), "http://x", "node", 1, Path("/c"), Path("/k")
        )


def test_custom_metrics_manifests_register_both_api_versions_and_let_prometheus_list_pods():
    objects = by_kind_and_name(addons.custom_metrics_manifests(NODE_IP, 6443, CA_PEM))
    apis = {name: doc["spec"] for (kind, name), doc in objects.items() if kind == "APIService"}
    assert set(apis) == {"v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io"}
    for api in apis.values():
        assert api["service"] == {"name": "prometheus-adapter", "namespace": "kube-system", "port": 443}
        assert base64.b64decode(api["caBundle"]).decode() == CA_PEM
    slice_ = objects[("EndpointSlice", "prometheus-adapter-host")]
    assert slice_["endpoints"] == [{"addresses": [NODE_IP], "conditions": {"ready": True}}]
    assert slice_["ports"] == [{"name": "https", "protocol": "TCP", "port": 6443}]
    read = ["get", "list", "watch"]
    assert objects[("ClusterRole", addons.PROMETHEUS_USER)]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": read}
    ]
    assert objects[("ClusterRole", addons.ADAPTER_USER)]["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces", "pods", "services"], "verbs": read}
    ]
    bound = {
        (doc["roleRef"]["name"], doc["subjects"][0]["name"])
        for (kind, _), doc in objects.items()
        if kind.endswith("Binding")
    }
    assert bound == {
        (addons.PROMETHEUS_USER, addons.PROMETHEUS_USER),
        (addons.ADAPTER_USER, addons.ADAPTER_USER),
        ("system:auth-delegator", addons.ADAPTER_USER),
        ("extension-apiserver-authentication-reader", addons.ADAPTER_USER),
    }
    with pytest.raises(ClusterError, match="ca_pem must be the cluster CA's certificate"):
        addons.custom_metrics_manifests(NODE_IP, 6443, "")


def test_adapter_certificate_serves_its_service_name_and_prometheus_is_a_client():
    certs = {cert.name: cert for cert in pki.certificates("10.0.0.1", "node-1", NODE_IP)}
    adapter, prometheus = certs["prometheus-adapter"], certs["prometheus"]
    assert adapter.subject == f"/CN={addons.ADAPTER_USER}" and adapter.usage == "serverAuth,clientAuth"
    assert {f"IP:{NODE_IP}", f"DNS:{addons.ADAPTER_DNS}"} <= set(adapter.sans)
    assert (prometheus.subject, prometheus.usage) == (f"/CN={addons.PROMETHEUS_USER}", "clientAuth")


def rules() -> dict[str, dict]:
    """The adapter's rules by the metric name each serves."""
    return {rule["name"]["as"]: rule for rule in yaml.safe_load(RULES.read_text())["rules"]}


def test_adapter_rules_map_namespace_and_pod_and_query_per_pod():
    found = rules()
    assert set(found) == {"rtserve_queue_seconds", "rtserve_request_p99_seconds", "rtserve_gpu_utilization"}
    for rule in found.values():
        assert rule["resources"] == {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}}
        assert 'namespace!=""' in rule["seriesQuery"] and 'pod!=""' in rule["seriesQuery"]
        series = rule["seriesQuery"].split("{")[0]
        assert re.fullmatch(rule["name"]["matches"], series)
        query = rule["metricsQuery"]
        # Every selector is limited to the asked pods and every sum keeps them apart.
        assert query.count("{<<.LabelMatchers>>}") == query.count("[30s]")
        assert query.count(" by (") == query.count("<<.GroupBy>>")


def test_the_adapter_component_runs_the_repositorys_rules_file():
    layout = components.Layout(
        Path("/r"),
        Path("/b"),
        Path("/k"),
        {name: 1000 + i for i, name in enumerate(components.PORT_NAMES)},
        metrics_bin=Path("/m"),
    )
    adapter, prometheus = components.prometheus_adapter(layout), components.prometheus(layout)
    assert adapter.argv[0] == "/m/prometheus-adapter" and prometheus.argv[0] == "/m/prometheus"
    assert adapter.files[layout.config("prometheus-adapter.yaml")] == RULES.read_text()
    assert f"--prometheus-url=http://127.0.0.1:{layout.ports['prometheus']}" in adapter.argv
    assert prometheus.ready_url == f"http://127.0.0.1:{layout.ports['prometheus']}/-/ready"


def hpas() -> dict[str, dict]:
    """The HorizontalPodAutoscaler of the base and of each overlay patching it."""
    k8s = REPO / "deploy" / "k8s"
    return {
        path.parent.name: yaml.safe_load(path.read_text())
        for path in [k8s / "base" / "hpa.yaml", *sorted((k8s / "overlays").glob("*/hpa.yaml"))]
    }


def test_every_hpa_listing_metrics_scales_on_cpu_and_both_serving_signals():
    """The base and every overlay listing its own metrics: CPU first (the cluster tier reads it
    there), the queue wait and p99, each served by a rule (components/gpu adds the GPU's:
    tests/deploy/test_gpu_manifests.py)."""
    served = set(rules())
    listed = {where: hpa["spec"]["metrics"] for where, hpa in hpas().items() if "metrics" in hpa["spec"]}
    assert {"base", "local"} <= set(listed)
    for where, metrics in listed.items():
        assert metrics[0]["type"] == "Resource" and metrics[0]["resource"]["name"] == "cpu", where
        pods = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in metrics if m["type"] == "Pods"}
        assert set(pods) == {"rtserve_queue_seconds", "rtserve_request_p99_seconds"} and set(pods) <= served, where
        for name, target in pods.items():
            assert target["type"] == "AverageValue" and re.fullmatch(r"\d+m", target["averageValue"]), (where, name)
