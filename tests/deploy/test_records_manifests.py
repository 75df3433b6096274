"""The records in every overlay but local (whose records stay in each pod's spool), rendered by the
real ``kubectl kustomize``: the pods find the store
through the ConfigMap rtserve-records (its hashed name, so a change rolls them), and their
NetworkPolicies let them reach the store's port and the DNS, nothing more; the run volume's
sizeLimit and the disk budget's RTSERVE_RUN_VOLUME_LIMIT are one value; and local-records'
in-cluster Cassandra node (components/cassandra) is right where schemas cannot tell: its command as
the real parser reads it, its address and port as the contact points name them, its volume bound
to its claim on make cluster's node, the server's security conventions. (Every object is
validated against the Kubernetes schemas in test_manifests.py, and checkov runs over them in
test_checkov.py.)"""

from __future__ import annotations

import re
import shutil
from pathlib import Path, PurePosixPath

import pytest
import yaml

from rtserve.cli import build_parser
from rtserve.cli import cassandra as cassandra_cli
from rtserve.cluster.node import NODE_NAME
from rtserve.k8s.volumes import LocalVolume, local_volumes
from rtserve.records import local as local_node
from rtserve.records.lookup import contact_points
from rtserve.records.node import Layout, cassandra_yaml
from rtserve.server.disk import VOLUME_ENV, DiskBudget
from rtserve.server.properties import RECORDS_STORE_KEY
from rtserve.server.torchserve import TorchServe, records_options
from rtserve.settings import Settings, byte_size
from tests.conftest import REPO
from tests.deploy.conftest import (CANDIDATE_DIR, CASSANDRA, K8S_DIR, OVERLAYS, OWN_CANDIDATE, RECORDS,
                                   dns_rules, lists_component, load, makefile_text, one, pull_policy, records_objects, render,
                                   server_objects)

pytestmark = pytest.mark.deploy

STORE_ENV = "RTSERVE_RECORDS_STORE"
CONFIGMAP = "rtserve-records"
NODE = "rtserve-cassandra"
#: Overlays with the in-cluster node (components/cassandra), and those that ship their records.
WITH_NODE = [o for o in OVERLAYS if lists_component(o, CASSANDRA)]
RECORDED = [o for o in OVERLAYS if lists_component(o, RECORDS)]
#: A pod IP, as the kubelet puts it in $(POD_IP).
POD_IP = "10.244.0.7"


def server_container(objects: list[dict], name: str = "rtserve") -> dict:
    spec = one(objects, "Deployment", name)["spec"]["template"]["spec"]
    (c,) = [c for c in spec["containers"] if c["name"] == "rtserve"]
    return c


def records_settings(objects: list[dict]) -> tuple[str, dict]:
    """(the ConfigMap's name, its data) that the server's RTSERVE_RECORDS_STORE comes from."""
    (entry,) = [e for e in server_container(objects)["env"] if e["name"] == STORE_ENV]
    ref = entry["valueFrom"]["configMapKeyRef"]
    assert set(ref) == {"name", "key"}, "the variable is required: the pod fails without the ConfigMap"
    return ref["name"], {**one(objects, "ConfigMap", ref["name"])["data"], "key": ref["key"]}


def store(objects: list[dict]) -> str:
    """The contact points the server's pods get."""
    _, data = records_settings(objects)
    return data[data["key"]]


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_labels(objects: list[dict], kind: str, name: str) -> dict:
    return one(objects, kind, name)["spec"]["template"]["metadata"]["labels"]


def ports(rule: dict) -> set[tuple[int | str, str]]:
    return {(p["port"], p["protocol"]) for p in rule.get("ports", [])}


def one_value(objects: list[dict], deployment: str = "rtserve") -> str:
    """The run volume's sizeLimit, checked equal to the disk budget's RTSERVE_RUN_VOLUME_LIMIT.

    Raises:
        AssertionError: they differ.
    """
    spec = one(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    (run,) = [v for v in spec["volumes"] if v["name"] == "run"]
    limit = run["emptyDir"]["sizeLimit"]
    (value,) = [e["value"] for e in server_container(objects, deployment)["env"] if e["name"] == VOLUME_ENV]
    assert value == limit, f"{VOLUME_ENV} {value} is not the run volume's sizeLimit {limit}"
    return limit


def overlay_copy(tmp_path: Path, overlay: str) -> Path:
    """A copy of the kustomize tree; the overlay's directory in it."""
    tree = tmp_path / "k8s"
    if not tree.exists():
        shutil.copytree(K8S_DIR, tree)
    return tree / "overlays" / overlay


def edit(overlay_dir: Path, change) -> None:
    path = overlay_dir / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    change(kustomization)
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))


def with_size_limit(overlay_dir: Path, limit: str) -> Path:
    """The overlay with a patch of the run volume's sizeLimit alone (what docs/kubernetes.md tells)."""
    patch = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "rtserve"},
             "spec": {"template": {"spec": {"volumes": [{"name": "run", "emptyDir": {"sizeLimit": limit}}]}}}}
    edit(overlay_dir, lambda k: k.setdefault("patches", []).append({"patch": yaml.safe_dump(patch)}))
    return overlay_dir


def test_local_alone_keeps_its_records_in_the_pods_and_local_records_runs_the_store(rendered):
    """The laptop's lean overlays have no store to ship to (their records stay in each pod's
    spool, within the disk budget: make serve's default; local-stream is local with the stream);
    local-records is the same with the store."""
    assert sorted(set(OVERLAYS) - set(RECORDED)) == ["local", "local-stream"] and WITH_NODE == ["local-records"]
    assert records_objects(rendered["local"]) == []
    assert STORE_ENV not in {e["name"] for e in server_container(rendered["local"])["env"]}


@pytest.mark.parametrize("overlay", RECORDED)
def test_every_overlay_ships_its_records_and_only_the_local_one_runs_the_store(rendered, overlay, tmp_path):
    """The records component in every overlay but local; the in-cluster node only where it is
    listed. Without the two components the server's objects are the same but for the one variable."""
    objects = rendered[overlay]
    assert lists_component(overlay, RECORDS)
    added = sorted((o["kind"], o["metadata"]["name"]) for o in records_objects(objects))
    name, _ = records_settings(objects)
    expected = [("ConfigMap", name), ("NetworkPolicy", CONFIGMAP)]
    if overlay in WITH_NODE:
        expected += [("NetworkPolicy", NODE), ("PersistentVolume", f"rtserve-{overlay}-cassandra-data"),
                     ("Service", NODE), ("StatefulSet", NODE)]
    assert added == sorted(expected)
    for obj in records_objects(objects):
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == f"rtserve-{overlay}"
        assert obj["metadata"].get("namespace", f"rtserve-{overlay}") == f"rtserve-{overlay}"

    bare = overlay_copy(tmp_path, overlay)  # the same overlay without the records' parts

    def without_records(k: dict) -> None:
        k["components"] = [c for c in k["components"] if not c.endswith(("/records", "/cassandra"))]
        k["resources"] = [r for r in k["resources"] if "cassandra" not in r]
        k["patches"] = [p for p in k["patches"] if "records" not in p.get("path", "")]

    edit(bare, without_records)
    before = load(render(bare))
    after = server_objects(objects)
    for obj in after:
        if obj["kind"] == "Deployment":
            obj = yaml.safe_load(yaml.safe_dump(obj))
            c = server_container([obj])
            c["env"] = [e for e in c["env"] if e["name"] != STORE_ENV]
        assert obj in before, f"{obj['kind']} {obj['metadata']['name']} changed beyond {STORE_ENV}"
    assert len(after) == len(before)


@pytest.mark.parametrize("overlay", RECORDED)
def test_the_configmap_feeds_the_servers_store_setting(rendered, overlay, tmp_path):
    """RTSERVE_RECORDS_STORE from the generated ConfigMap's contact points, which the server hands
    its shipper; local: the in-cluster node's Service, elsewhere the overlay's records.yaml."""
    objects = rendered[overlay]
    name, data = records_settings(objects)
    assert name.startswith(CONFIGMAP + "-") and name != CONFIGMAP, "the generator's hash rolls the pods"
    assert data["key"] == "contact-points"
    points = contact_points(store(objects))  # each host:port, as the shipper checks them
    # what the pod's server starts its shipper with (its config.properties from the ConfigMap)
    config_name = next(v["configMap"]["name"] for v in one(objects, "Deployment", "rtserve")["spec"]["template"]
                       ["spec"]["volumes"] if v["name"] == "config")
    config = tmp_path / "config.properties"
    config.write_text(one(objects, "ConfigMap", config_name)["data"]["config.properties"])
    server = TorchServe(tmp_path / "run", tmp_path, config=config,
                        settings=Settings.from_env({STORE_ENV: store(objects)}))
    assert server.props[RECORDS_STORE_KEY] == store(objects)
    options = records_options(server.props)
    assert options[options.index("--store") + 1] == store(objects)
    if overlay in WITH_NODE:
        service = one(objects, "Service", NODE)
        assert points == [f"{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"]
    else:
        patch = yaml.safe_load((K8S_DIR / "overlays" / overlay / "records.yaml").read_text())
        assert patch["metadata"]["name"] == CONFIGMAP
        assert store(objects) == patch["data"]["contact-points"]


def test_new_contact_points_rename_the_configmap_and_so_roll_the_pods(tmp_path):
    before = load(render(K8S_DIR / "overlays" / "staging"))
    overlay = overlay_copy(tmp_path, "staging")
    (overlay / "records.yaml").write_text((overlay / "records.yaml").read_text().replace(
        "contact-points: ", "contact-points: cassandra-9.elsewhere.svc:9042,"))
    after = load(render(overlay))
    assert store(after).startswith("cassandra-9.elsewhere.svc:9042,")
    assert records_settings(before)[0] != records_settings(after)[0]


@pytest.mark.parametrize("overlay", RECORDED)
def test_the_policies_let_the_pods_reach_the_store_and_dns_and_nothing_more(rendered, overlay):
    objects = rendered[overlay]
    server = pod_labels(objects, "Deployment", "rtserve")
    policy = one(objects, "NetworkPolicy", CONFIGMAP)["spec"]
    assert selects(policy["podSelector"]["matchLabels"], server)
    assert policy["policyTypes"] == ["Egress"] and "ingress" not in policy, "nothing comes in through it"
    dns, to_store, *node_dns = policy["egress"]
    assert [dns, *node_dns] == dns_rules(overlay)  # kube-system's DNS pods; the local node's (local-dns)
    store_ports = {int(point.rsplit(":", 1)[1]) for point in contact_points(store(objects))}
    assert ports(to_store) == {(p, "TCP") for p in store_ports}
    # Every policy that selects the server's pods together: that egress and none other.
    egress = [rule for o in objects if o["kind"] == "NetworkPolicy"
              and selects(o["spec"]["podSelector"]["matchLabels"], server)
              and "Egress" in o["spec"]["policyTypes"] for rule in o["spec"].get("egress", [])]
    assert set().union(*map(ports, egress)) == {(53, "UDP"), (53, "TCP")} | {(p, "TCP") for p in store_ports}
    if overlay in WITH_NODE:  # narrowed to the in-cluster node's pods
        (target,) = to_store["to"]
        assert selects(target["podSelector"]["matchLabels"], pod_labels(objects, "StatefulSet", NODE))
        assert not selects(target["podSelector"]["matchLabels"], server)
    else:  # any address on the store's port, for the user to narrow (documented)
        assert "to" not in to_store


@pytest.mark.parametrize("overlay", WITH_NODE)
def test_the_node_takes_cql_from_the_server_pods_only_and_calls_no_one(rendered, overlay):
    objects = rendered[overlay]
    node = pod_labels(objects, "StatefulSet", NODE)
    policy = one(objects, "NetworkPolicy", NODE)["spec"]
    assert selects(policy["podSelector"]["matchLabels"], node)
    assert set(policy["policyTypes"]) == {"Ingress", "Egress"} and policy["egress"] == []
    (ingress,) = policy["ingress"]
    (source,) = ingress["from"]
    assert selects(source["podSelector"]["matchLabels"], pod_labels(objects, "Deployment", "rtserve"))
    (c,) = one(objects, "StatefulSet", NODE)["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports(ingress) == {("cql", "TCP")} and named["cql"] in {
        int(p.rsplit(":", 1)[1]) for p in contact_points(store(objects))}
    # the server's objects never select the node's pods, nor its Service the server's
    for obj in server_objects(objects):
        spec = obj.get("spec") or {}
        selector = spec.get("podSelector") or spec.get("selector") or {}
        selector = selector.get("matchLabels", selector)
        assert not selects(selector, node), f"{obj['kind']} {obj['metadata']['name']} selects the node"
    service = one(objects, "Service", NODE)["spec"]
    assert service["clusterIP"] == "None" and selects(service["selector"], node)
    assert not selects(service["selector"], pod_labels(objects, "Deployment", "rtserve"))


def renders() -> dict[str, Path]:
    """Every kustomization with a server Deployment: the overlays and the candidates."""
    return {**{o: K8S_DIR / "overlays" / o for o in OVERLAYS}, "candidate": CANDIDATE_DIR,
            **{f"{o}-candidate": p for o, p in OWN_CANDIDATE.items()}}


@pytest.mark.parametrize("name", sorted(renders()))
def test_the_run_volumes_size_limit_and_the_disk_budget_are_one_value(name):
    objects = load(render(renders()[name]))
    deployment = "rtserve-candidate" if name.endswith("candidate") else "rtserve"
    limit = one_value(objects, deployment)
    budget = DiskBudget.resolve({}, Settings.from_env({VOLUME_ENV: limit}))
    assert budget.total * 2 == byte_size(limit, VOLUME_ENV)  # at most half: the rest is the kubelet's margin


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_patched_size_limit_takes_the_budget_with_it(tmp_path, overlay):
    """An overlay patches the sizeLimit alone (here 48Mi, the cluster test's): the variable
    follows, and the budget is half of it."""
    objects = load(render(with_size_limit(overlay_copy(tmp_path, overlay), "48Mi")))
    assert one_value(objects) == "48Mi"
    assert DiskBudget.resolve({}, Settings.from_env({VOLUME_ENV: "48Mi"})).total == 24 * 2**20


def test_without_the_overlays_replacement_a_patched_limit_drifts_and_is_caught(tmp_path):
    """The check above is not vacuous: without the replacement in the overlay (only the base's,
    which runs before the overlay's patches), the volume gets 48Mi and the budget stays 1Gi's half."""
    overlay = with_size_limit(overlay_copy(tmp_path, "staging"), "48Mi")
    edit(overlay, lambda k: k.pop("replacements"))
    objects = load(render(overlay))
    with pytest.raises(AssertionError, match=f"{VOLUME_ENV} 1Gi is not the run volume's sizeLimit 48Mi"):
        one_value(objects)


def makefile_value(name: str) -> str:
    (value,) = re.findall(rf"^{name} +\?= *(\S+)$", makefile_text(), re.M)
    return value


@pytest.mark.parametrize("overlay", WITH_NODE)
def test_the_node_runs_the_cli_on_the_pods_ip_where_the_contact_points_point(rendered, overlay):
    objects = rendered[overlay]
    sts = one(objects, "StatefulSet", NODE)["spec"]
    (c,) = sts["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    argv = [a.replace("$(POD_IP)", POD_IP) for a in c["args"]]
    assert argv[:3] == ["python", "-m", "rtserve"]
    args = build_parser().parse_args(argv[3:])  # exits (fails) on a bad argument
    assert args.func is cassandra_cli.cmd_run and args.host == POD_IP
    # its data and configuration on the claim's volume; it listens where the Service sends
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    (claim,) = sts["volumeClaimTemplates"]
    assert str(args.run_dir) == mounts[claim["metadata"]["name"]]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (args.port, args.storage_port) == (named["cql"], named["storage"])
    service = one(objects, "Service", NODE)
    assert sts["serviceName"] == service["metadata"]["name"]
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "cql" and [f"{service['metadata']['name']}:{port['port']}"] == \
        contact_points(store(objects))
    layout = Layout(args.run_dir, args.libs, {"native": args.port, "storage": args.storage_port},
                    heap=args.heap, host=args.host)
    config = yaml.safe_load(cassandra_yaml(layout))
    assert config["listen_address"] == config["rpc_address"] == POD_IP
    assert config["native_transport_port"] == port["port"]
    # probes on the CQL port; the start may take as long as make cassandra's; SIGTERM drains it
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[kind]["tcpSocket"] == {"port": "cql"}, kind
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= local_node.READY_TIMEOUT
    assert sts["template"]["spec"]["terminationGracePeriodSeconds"] >= local_node.STOP_TIMEOUT
    assert sts["replicas"] == 1
    # the image make image-cassandra builds, taken as the overlay's images are
    assert c["image"] == f"{makefile_value('CASSANDRA_IMG')}:{makefile_value('CASSANDRA_VERSION')}"
    assert c["imagePullPolicy"] == pull_policy(overlay)


@pytest.mark.parametrize("overlay", WITH_NODE)
def test_the_nodes_pod_is_hardened_like_the_servers(rendered, overlay):
    objects = rendered[overlay]
    pod = one(objects, "StatefulSet", NODE)["spec"]["template"]["spec"]
    served = one(objects, "Deployment", "rtserve")["spec"]["template"]["spec"]
    assert {k: v for k, v in pod["securityContext"].items() if k != "fsGroupChangePolicy"} == \
        served["securityContext"]
    (c,) = pod["containers"]
    assert c["securityContext"] == server_container(objects)["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    one(objects, "ServiceAccount", pod["serviceAccountName"])
    containerfile = (REPO / "deploy" / "cassandra" / "Containerfile").read_text()
    sc = c["securityContext"]
    assert re.search(rf"^USER {sc['runAsUser']}:{sc['runAsGroup']}$", containerfile, re.M)
    # read-only root: it writes to its claim's volume and an emptyDir only
    claims = {t["metadata"]["name"] for t in one(objects, "StatefulSet", NODE)["spec"]["volumeClaimTemplates"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    for mount in c["volumeMounts"]:
        assert mount["name"] in claims or "emptyDir" in volumes[mount["name"]], mount
    assert PurePosixPath("/tmp") in {PurePosixPath(m["mountPath"]) for m in c["volumeMounts"]}
    # memory: requests = limits (never evicted for memory), twice the heap at least (the node's
    # resident set measured about 1.9 times its heap: docs/records.md)
    requests, limits = c["resources"]["requests"], c["resources"]["limits"]
    assert requests["memory"] == limits["memory"] and {"cpu", "memory"} <= set(requests) & set(limits)
    heap = c["args"][c["args"].index("--heap") + 1]  # as -Xmx takes it: 512m, 1g
    heap_bytes = int(heap[:-1]) * {"m": 2**20, "g": 2**30}[heap[-1].lower()]
    assert byte_size(limits["memory"], "memory") >= 2 * heap_bytes


@pytest.mark.parametrize("overlay", WITH_NODE)
def test_the_nodes_data_is_a_volume_bound_to_its_claim_on_the_clusters_node(rendered, overlay):
    """make cluster has no provisioner: a local volume, bound ahead to the StatefulSet's claim,
    on make cluster's node, which make k8s-deploy finds in what it applies."""
    objects = rendered[overlay]
    sts = one(objects, "StatefulSet", NODE)
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    (pv,) = [o for o in objects if o["kind"] == "PersistentVolume"]
    spec = pv["spec"]
    assert spec["claimRef"] == {"namespace": f"rtserve-{overlay}",
                                "name": f"{claim['metadata']['name']}-{sts['metadata']['name']}-0"}
    assert "storageClassName" not in spec and "storageClassName" not in claim["spec"]
    assert set(claim["spec"]["accessModes"]) <= set(spec["accessModes"])
    assert byte_size(spec["capacity"]["storage"], "capacity") >= \
        byte_size(claim["spec"]["resources"]["requests"]["storage"], "request")
    assert spec["persistentVolumeReclaimPolicy"] == "Retain", "the records outlive the claim"
    (term,) = spec["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]
    assert local_volumes(yaml.safe_dump_all(objects)) == [LocalVolume(pv["metadata"]["name"],
                                                                      Path(spec["local"]["path"]))]
