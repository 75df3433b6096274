"""Rendered overlays: valid against the Kubernetes 1.32 schemas, and right in what schemas miss."""

from __future__ import annotations

import re
import shutil
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
import yaml

from rtserve.cli import build_parser
from rtserve.gateway import nginx as gateway
from rtserve.server import probe
from rtserve.server.torchserve import SIDECARS, TorchServe
from rtserve.k8s.pod import GATEWAY_STANDIN
from tests.conftest import REPO
from tests.deploy.conftest import (INFERENCE_PORT, K8S_DIR, K8S_VERSION, KUBE_SYSTEM_DNS, OVERLAYS, OWN_VERIFY,
                                   VERIFY_DIR, dns_rules, load, makefile_text, one, pinned_tag, pull_policy, render,
                                   server_objects)

pytestmark = pytest.mark.deploy

PROPERTY = re.compile(r"^([a-z_]+)=(.*)$", re.M)


def deployment(objects):
    """The server's Deployment (local-stream's consumers are another: test_stream_manifests.py)."""
    return one(objects, "Deployment", "rtserve")


def pod_spec(objects) -> dict:
    return deployment(objects)["spec"]["template"]["spec"]


def container(objects) -> dict:
    (c,) = pod_spec(objects)["containers"]
    return c


def sidecar(objects) -> dict:
    """The gateway: the pod's one init container (a native sidecar)."""
    (c,) = pod_spec(objects)["initContainers"]
    assert c["name"] == "gateway"
    return c


def env(objects) -> dict[str, str]:
    """The container's plain variables (those taken from a ConfigMap or the pod left out)."""
    return {e["name"]: e["value"] for e in container(objects)["env"] if "value" in e}


def config_map(objects, volume_name: str) -> dict:
    """The generated ConfigMap the pod mounts as ``volume_name``."""
    volume = next(v for v in pod_spec(objects)["volumes"] if v["name"] == volume_name)
    return one(objects, "ConfigMap", volume["configMap"]["name"])


def server_config(objects) -> dict[str, str]:
    """The config.properties the pods mount (from the generated ConfigMap they refer to)."""
    return dict(PROPERTY.findall(config_map(objects, "config")["data"]["config.properties"]))


def container_ports(objects) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container(objects)["ports"]}


def pod_ports(objects) -> dict[str, int]:
    """Named ports of every container of the pod (Services and policies may name any)."""
    return {p["name"]: p["containerPort"]
            for c in [container(objects), sidecar(objects)] for p in c["ports"]}


def mounts(c: dict) -> dict[str, str]:
    """volume name -> mount path in container ``c``."""
    return {m["name"]: m["mountPath"] for m in c["volumeMounts"]}


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly_offline(rendered, overlay):
    for obj in rendered[overlay]:
        # strict: unknown fields fail; a missing schema raises SchemaNotFoundError and fails too.
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == "1.32"
    # (the records' objects: tests/deploy/test_records_manifests.py; the stream's: test_stream_manifests.py)
    kinds = {obj["kind"] for obj in server_objects(rendered[overlay])}
    assert kinds == {"Namespace", "ServiceAccount", "ConfigMap", "Service", "Deployment",
                     "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"}


def test_a_missing_schema_is_a_failure():
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate({"apiVersion": "example.com/v1", "kind": "Nope",
                                      "metadata": {"name": "x"}}, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_match_the_pod_template_and_carry_no_version(rendered, overlay):
    objects = server_objects(rendered[overlay])
    dep = deployment(objects)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selects(dep["spec"]["selector"]["matchLabels"], labels)
    for svc in (o for o in objects if o["kind"] == "Service"):
        assert selects(svc["spec"]["selector"], labels), svc["metadata"]["name"]
    assert selects(one(objects, "PodDisruptionBudget", "rtserve")["spec"]["selector"]["matchLabels"], labels)
    assert selects(one(objects, "NetworkPolicy", "rtserve")["spec"]["podSelector"]["matchLabels"], labels)
    tag = container(objects)["image"].rsplit(":", 1)[1]
    for key, value in dep["spec"]["selector"]["matchLabels"].items():
        assert "version" not in key and value != tag


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespace_is_the_one_make_deploy_waits_on(rendered, overlay):
    cluster_scoped = ("Namespace", "PersistentVolume")
    namespaces = {o["metadata"].get("namespace") for o in rendered[overlay] if o["kind"] not in cluster_scoped}
    assert namespaces == {f"rtserve-{overlay}"}  # the Makefile's NAMESPACE ?= rtserve-$(OVERLAY)
    assert one(rendered[overlay], "Namespace")["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rolling_update_never_drops_below_the_serving_count(rendered, overlay):
    spec = deployment(rendered[overlay])["spec"]
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["strategy"]["rollingUpdate"]["maxSurge"] >= 1
    assert spec["revisionHistoryLimit"] >= 2, "kubectl rollout undo needs old ReplicaSets"
    assert "replicas" not in spec, "the HPA owns the replica count; an applied one resets it"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_image_is_the_overlays_pinned_model_version(rendered, overlay):
    image = container(rendered[overlay])["image"]
    name, _, tag = image.rpartition(":")
    assert name and "/" in name and tag and tag != "latest" and "@" not in image
    assert tag == pinned_tag(overlay)
    makefile = makefile_text()
    assert f"TRAIN_ARGS_{tag} =" in makefile, f"{overlay} pins {tag}, a version make cannot build"
    assert container(rendered[overlay])["imagePullPolicy"] == pull_policy(overlay)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_ask_the_entry_point_on_the_port_it_answers_them(rendered, overlay):
    objects = rendered[overlay]
    c = container(objects)
    checks = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(c[kind]) >= {"httpGet"} and "exec" not in c[kind], c[kind]
        assert c[kind]["httpGet"]["port"] == "probes", c[kind]
        checks[kind] = c[kind]["httpGet"]["path"]
        assert c[kind]["timeoutSeconds"] >= 3 and c[kind]["periodSeconds"] >= 5
    assert checks == {"startupProbe": "/ready", "readinessProbe": "/ready", "livenessProbe": "/live"}
    # the startup probe gives the model load at least two minutes
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 120

    # The entry point answers them (rtserve.server.probe.serve) on the port they name, and finds the
    # server through RTSERVE_RUN_DIR, where it runs it.
    assert c["args"][:5] == ["python", "-m", "rtserve", "server", "run"]
    args = build_parser().parse_args(c["args"][3:])  # exits (fails) on a bad argument
    assert args.probes == f"0.0.0.0:{container_ports(objects)['probes']}", args.probes
    assert env(objects)["RTSERVE_RUN_DIR"] == c["workingDir"]
    assert env(objects)["RTSERVE_MODEL"] == "realtime-classifier"

    config = server_config(objects)
    ports = container_ports(objects)
    for name in ("management", "metrics"):
        address = config[f"{name}_address"]
        assert address == f"http://0.0.0.0:{ports[name]}", (name, address)
    # TorchServe's inference listener is on loopback, no container port: the gateway's is.
    assert config["inference_address"].startswith("http://127.0.0.1:")
    assert "inference" not in ports and "inference" in pod_ports(objects)
    assert probe.loopback(config["inference_address"]) == config["inference_address"]
    annotations = deployment(objects)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    assert config["metrics_mode"] == "prometheus"
    services = [o for o in server_objects(objects) if o["kind"] == "Service"]
    for svc in services:
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in pod_ports(objects), port
    assert {svc["spec"]["ports"][0]["targetPort"] for svc in services} == {"inference", "management"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_gateway_fronts_torchserve_with_the_shared_token(rendered, overlay):
    objects = rendered[overlay]
    pod, gw, c = pod_spec(objects), sidecar(objects), container(objects)
    config = server_config(objects)
    # The nginx.conf the ConfigMap ships is rtserve.gateway's pod config, in front of this server.
    conf = config_map(objects, "gateway-conf")["data"]["nginx.conf"]
    assert conf == gateway.render_nginx_conf(gateway.POD)
    assert config["inference_address"] == f"http://{gateway.POD.upstream}"
    assert int(config["max_request_size"]) == gateway.POD.max_body
    assert gw["command"] == ["nginx", "-c", f"{mounts(gw)['gateway-conf']}/nginx.conf", "-e",
                             "stderr", "-g", "daemon off;"]
    gw_ports = {p["name"]: p["containerPort"] for p in gw["ports"]}
    assert gw_ports == {"inference": int(gateway.POD.listen),
                        "gateway-health": int(gateway.POD.health_listen)}
    # A native sidecar: up before TorchServe starts, stopped only after it drained and exited.
    assert gw["restartPolicy"] == "Always" and "lifecycle" not in gw
    name, _, tag = gw["image"].rpartition(":")
    if pull_policy(overlay) == "Always":
        assert name == "nginxinc/nginx-unprivileged" and re.fullmatch(r"\d+\.\d+\.\d+-alpine", tag)
    else:  # built here (make image-gateway): Debian's nginx, what the local cluster runs
        assert gw["image"] == GATEWAY_STANDIN
    assert gw["imagePullPolicy"] == pull_policy(overlay)
    for kind, path in (("startupProbe", "/livez"), ("readinessProbe", "/readyz"),
                       ("livenessProbe", "/livez")):
        assert gw[kind]["httpGet"] == {"path": path, "port": "gateway-health"}, kind
        assert f"location = {path} {{" in conf
    # The shared directory: rtserve writes the maps where nginx includes them and keeps its PID.
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["gateway"] and "emptyDir" in volumes["gateway-tmp"]
    assert mounts(gw)["gateway"] == mounts(c)["gateway"] == gateway.POD.gateway_dir
    assert mounts(gw)["gateway-tmp"] == gateway.POD.tmp_dir
    assert env(objects)["RTSERVE_GATEWAY_DIR"] == gateway.POD.gateway_dir
    assert f"include {gateway.POD.gateway_dir}/client-tokens*.map;" in conf
    # The tokens: a Secret (created outside kustomize), as a file, in the rtserve container only.
    secret = volumes["gateway-tokens"]["secret"]
    assert secret["secretName"] == "rtserve-gateway-tokens" and secret.get("optional") is not True
    assert PurePosixPath(env(objects)["RTSERVE_GATEWAY_TOKENS"]) == \
        PurePosixPath(mounts(c)["gateway-tokens"]) / "tokens"
    assert "gateway-tokens" not in mounts(gw)
    assert not [o for o in objects if o["kind"] == "Secret"], "no secret value is committed"
    # rtserve signals nginx to reload: one process namespace, one user.
    assert pod["shareProcessNamespace"] is True
    assert gw["securityContext"]["runAsUser"] == c["securityContext"]["runAsUser"]
    # A renewed key would be refused until nginx reloads: it lives longer than a pod.
    assert float(config["token_expiration_min"]) >= 365 * 24 * 60


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_token_auth_stays_on_and_grpc_stays_on_loopback(rendered, overlay):
    config = server_config(rendered[overlay])
    assert config["disable_token_authorization"] == "false"
    assert config["grpc_inference_address"] == config["grpc_management_address"] == "127.0.0.1"
    assert config["ts_open_inference_protocol"] == "true"  # the /v2 server routes
    assert config["allowed_urls"] == "^$"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_drain_fits_in_the_grace_period(rendered, overlay):
    c = container(rendered[overlay])
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:5] == ["python", "-m", "rtserve", "probe", "drain"]
    args = build_parser().parse_args(command[3:])
    assert args.propagation >= 5, "endpoints and proxies need seconds to stop sending traffic"
    model_config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    assert args.timeout > model_config["responseTimeout"], \
        "in-flight requests may take up to the model's responseTimeout"
    stop_timeout = float(c["args"][c["args"].index("--stop-timeout") + 1])
    grace = pod_spec(rendered[overlay])["terminationGracePeriodSeconds"]
    slack = 5  # python start-up of the hook, the last HTTP check, signal delivery
    # after TorchServe, the entry point stops its sidecars one by one: the records shipper last,
    # which ships what is left of the spool (its stop timeout: the shipping, then SIGKILL)
    sidecars = sum(sidecar.stop_timeout for sidecar in SIDECARS)
    assert grace >= args.propagation + args.timeout + stop_timeout + sidecars + slack, (grace, args, sidecars)
    readiness = c["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= args.propagation, \
        "readiness must turn false before the propagation wait ends"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_and_pdb_are_consistent(rendered, overlay):
    objects = rendered[overlay]
    hpa = one(objects, "HorizontalPodAutoscaler")
    pdb = one(objects, "PodDisruptionBudget", "rtserve")
    dep = deployment(objects)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": dep["metadata"]["name"]}
    low, high = hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]
    assert 2 <= low <= high
    assert "minAvailable" not in pdb["spec"]
    # A node drain may evict pods, but never all of them, and never blocks forever.
    assert 1 <= pdb["spec"]["maxUnavailable"] < low
    metric = hpa["spec"]["metrics"][0]["resource"]
    assert metric["name"] == "cpu" and "cpu" in container(objects)["resources"]["requests"]


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if (K8S_DIR / "overlays" / o / "hpa.yaml").is_file()])
def test_each_overlay_pins_its_own_replica_range(rendered, overlay):
    patch = yaml.safe_load((K8S_DIR / "overlays" / overlay / "hpa.yaml").read_text())
    hpa = one(rendered[overlay], "HorizontalPodAutoscaler")["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (patch["spec"]["minReplicas"],
                                                        patch["spec"]["maxReplicas"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context_is_strict(rendered, overlay):
    objects = rendered[overlay]
    pod = pod_spec(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for c in (container(objects), sidecar(objects)):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 10000
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        requests, limits = c["resources"]["requests"], c["resources"]["limits"]
        assert set(requests) == set(limits) == {"cpu", "memory"}
        if pull_policy(overlay) == "IfNotPresent":  # local: Burstable on CPU only, to fit a laptop
            assert requests["memory"] == limits["memory"] and cpus(requests["cpu"]) < cpus(limits["cpu"])
        else:
            assert requests == limits, "Guaranteed QoS"
    sc = container(objects)["securityContext"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(rf"^USER {sc['runAsUser']}:{sc['runAsGroup']}$", dockerfile, re.M)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_service_account_token(rendered, overlay):
    objects = rendered[overlay]
    pod = pod_spec(objects)
    assert pod["automountServiceAccountToken"] is False
    sa = one(objects, "ServiceAccount", pod["serviceAccountName"])
    assert sa["automountServiceAccountToken"] is False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_torchserve_writes_only_to_emptydirs(rendered, overlay):
    objects = rendered[overlay]
    pod = pod_spec(objects)
    c = container(objects)
    empty = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    writable = [PurePosixPath(m["mountPath"]) for m in c["volumeMounts"] if m["name"] in empty]
    variables = env(objects)

    def on_emptydir(path: str) -> bool:
        return any(PurePosixPath(path).is_relative_to(mount) for mount in writable)

    assert on_emptydir(c["workingDir"])
    # What rtserve.server hands TorchServe for this run directory: the manifest says the same.
    server = TorchServe(Path(variables["RTSERVE_RUN_DIR"]), Path("/opt/rtserve/model_store"))
    expected = server._env("warm-up key")
    for name in ("TEMP", "TMPDIR", "LOG_LOCATION", "METRICS_LOCATION"):
        assert variables[name] == expected[name], name
        assert on_emptydir(variables[name]), name
    assert on_emptydir(variables["HOME"]) and on_emptydir("/tmp")
    assert on_emptydir(str(server.key_file))
    config_mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert config_mount["readOnly"] is True
    assert str(PurePosixPath(variables["RTSERVE_CONFIG"]).parent) == config_mount["mountPath"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_keeps_management_and_metrics_internal(rendered, overlay):
    objects = rendered[overlay]
    policy = one(objects, "NetworkPolicy", "rtserve")["spec"]
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"}
    assert policy["egress"] == []
    ports = pod_ports(objects)
    opened: dict[str, list] = {}
    numbers = {number: name for name, number in ports.items()}
    for rule in policy["ingress"]:
        for port in rule["ports"]:
            name = numbers.get(port["port"], port["port"])  # the gateway's by number: its policy says why
            assert name in ports, f"policy names a port the container lacks: {name}"
            opened.setdefault(name, []).append(rule.get("from"))
    assert {"port": INFERENCE_PORT, "protocol": "TCP"} in [p for r in policy["ingress"] for p in r["ports"]]
    assert ports["inference"] == INFERENCE_PORT
    # the gateway's probe port is opened to no pod (the kubelet's probes come from the node)
    assert set(opened) == {"inference", "management", "metrics"}
    assert all(sources for sources in opened["management"]), "management open to every pod"
    assert all(sources for sources in opened["metrics"]), "metrics open to every pod"
    (management_from,) = opened["management"]
    assert management_from == [{"podSelector": {"matchLabels": {"rtserve.io/management-client": "true"}}}]
    management = one(objects, "Service", "rtserve-management")
    assert management["spec"]["type"] == "ClusterIP"


def cpus(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    return float(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else float(quantity) / 2**20


def test_local_overlay_fits_a_two_core_laptop(rendered):
    """2 replicas, the surge pod of a rolling update, the verification Job and the records store
    are scheduled at once on 2 CPUs, leaving half a CPU for the cluster's own pods (DNS,
    metrics); memory is as measured (docs/image-and-pod.md: at most 1124 MiB) with room, and
    never overcommitted."""
    objects = rendered["local"]
    dep, hpa = deployment(objects)["spec"], one(objects, "HorizontalPodAutoscaler")["spec"]
    (job,) = [o for o in load(render(OWN_VERIFY["local"])) if o["kind"] == "Job"]
    (verify,) = job["spec"]["template"]["spec"]["containers"]
    (store,) = one(rendered["local-records"], "StatefulSet", "rtserve-cassandra")["spec"]["template"]["spec"]["containers"]
    pods = hpa["minReplicas"] + dep["strategy"]["rollingUpdate"]["maxSurge"]
    pod_cpu = sum(cpus(c["resources"]["requests"]["cpu"]) for c in (container(objects), sidecar(objects)))
    others = cpus(verify["resources"]["requests"]["cpu"]) + cpus(store["resources"]["requests"]["cpu"])
    assert pods == 3 and pods * pod_cpu + others <= 1.5
    assert hpa["minReplicas"] == 2 and hpa["maxReplicas"] > hpa["minReplicas"], "the PDB needs 2; load adds one"
    memory = container(objects)["resources"]
    assert mebibytes(memory["limits"]["memory"]) >= 1536 and memory["requests"]["memory"] == memory["limits"]["memory"]
    # The HPA's target, as a share of the pod's small request (rtserve and gateway): 100 % is 300m
    # per pod, above the idle pods' use (about 30 %) and below a burst's on 2 shared cores (about
    # 150 %), so the cluster tier sees it scale out and back.
    target = hpa["metrics"][0]["resource"]["target"]["averageUtilization"]
    assert pod_cpu * target / 100 == 0.3


def test_local_images_are_taken_from_the_node_and_the_others_pulled(rendered):
    """Every container of the local overlay and of its Job: IfNotPresent; the gateway is the
    stand-in make image-gateway builds (GATEWAY_STANDIN in the Makefile and rtserve/k8s/pod.py)."""
    local = {"local", "local-records", "local-stream"}
    assert {o for o in OVERLAYS if pull_policy(o) == "IfNotPresent"} == local
    assert {pull_policy(o) for o in OVERLAYS if o not in local} == {"Always"}
    pod = pod_spec(rendered["local"])
    (job,) = [o for o in load(render(OWN_VERIFY["local"])) if o["kind"] == "Job"]
    store = one(rendered["local-records"], "StatefulSet", "rtserve-cassandra")["spec"]["template"]["spec"]
    broker = one(rendered["local-stream"], "StatefulSet", "rtserve-kafka")["spec"]["template"]["spec"]
    stream = one(rendered["local-stream"], "Deployment", "rtserve-stream")["spec"]["template"]["spec"]
    for c in pod["containers"] + pod["initContainers"] + job["spec"]["template"]["spec"]["containers"] \
            + store["containers"] + broker["containers"] + stream["containers"]:
        assert c["imagePullPolicy"] == "IfNotPresent", c["name"]
    assert sidecar(rendered["local"])["image"] == GATEWAY_STANDIN
    makefile = makefile_text()
    assert re.search(rf"^GATEWAY_STANDIN \?= {re.escape(GATEWAY_STANDIN)}$", makefile, re.M)


@pytest.mark.parametrize("overlay", sorted(OWN_VERIFY))
def test_an_overlays_own_verification_job_is_the_shared_one_in_its_namespace(overlay):
    """The same Job and policy as deploy/k8s/verify (make k8s-deploy renders it with the
    rollout's image), in the overlay's namespace, with the overlay's pull policy and sizing."""
    own, shared = load(render(OWN_VERIFY[overlay])), load(render(VERIFY_DIR))
    for obj in own:
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == "1.32"
        assert obj["metadata"]["namespace"] == f"rtserve-{overlay}"
    assert [(o["kind"], o["metadata"]["name"]) for o in own] == [(o["kind"], o["metadata"]["name"]) for o in shared]
    job, base = one(own, "Job"), one(shared, "Job")
    (c,), (b,) = job["spec"]["template"]["spec"]["containers"], base["spec"]["template"]["spec"]["containers"]
    assert c["imagePullPolicy"] == pull_policy(overlay)
    assert c["image"].rpartition(":")[0] == b["image"].rpartition(":")[0]  # the tag: the rollout's
    for obj in (c, b):
        obj.pop("imagePullPolicy"), obj.pop("resources"), obj.pop("image")
    for obj in (job, base):
        obj["metadata"].pop("namespace"), obj["metadata"].pop("annotations")
    assert job == base
    # the shared policy, with the local cluster's DNS address where the overlay lists local-dns
    own_policy, shared_policy = one(own, "NetworkPolicy")["spec"], one(shared, "NetworkPolicy")["spec"]
    assert own_policy["egress"][:2] == shared_policy["egress"]
    assert shared_policy["egress"][1] == KUBE_SYSTEM_DNS
    assert own_policy["egress"][1:] == dns_rules(overlay)
    own_policy.pop("egress"), shared_policy.pop("egress")
    assert own_policy == shared_policy


def test_config_change_renames_the_configmap_and_so_rolls_the_pods(tmp_path):
    """configMapGenerator's hash: a different config.properties gives a different name."""
    copy = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, copy)
    before = pod_spec(load(render(copy / "overlays" / OVERLAYS[0])))
    (copy / "base" / "config.properties").write_text(
        (copy / "base" / "config.properties").read_text() + "default_workers_per_model=1\n")
    after = pod_spec(load(render(copy / "overlays" / OVERLAYS[0])))
    names = [next(v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v)
             for spec in (before, after)]
    assert names[0] != names[1] and all(n.startswith("rtserve-config-") for n in names)



def test_verification_job_validates_and_runs_once_unprivileged():
    """The Job `make k8s-verify` applies: strict schemas, no retry, a deadline, non-root and
    read-only, no service account token, only the Service's inference port and DNS reachable."""
    objects = load(render(VERIFY_DIR))
    for obj in objects:
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == "1.32"
    job = one(objects, "Job", "rtserve-verify")["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] > 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["imagePullPolicy"] == "Always"
    policy = one(objects, "NetworkPolicy", "rtserve-verify")["spec"]
    assert policy["ingress"] == [] and set(policy["policyTypes"]) == {"Ingress", "Egress"}
    assert policy["egress"][0]["to"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "rtserve"}
