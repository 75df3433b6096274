"""`make k8s-deploy OVERLAY=local` on the real cluster: the production pod on a real kubelet,
reached through its Service (kube-proxy), rolled out and back under steady traffic, verified by
the real Job, undone by itself when a version fails, drained within its disruption budget.

The tests share one Deployment, each finding 1.0 serving whichever ran before it
(:meth:`tests.cluster.conftest.Served.ensure`). The accepted rollout of 2.0 and `make k8s-rollback` under traffic are
test_live_traffic.py's promotion with the shadow's evidence (the same phases, one rollout fewer
for the tier). Traffic goes to the Service's cluster IP from this machine, as a
client in the cluster would; every request is counted on its first try.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from bench.loadgen import Counts
from bench.pod_rollout import settle_after, settled
from tests.cluster.conftest import NAMESPACE, autoscaler_held, deploy, no_failures
from tests.conftest import MODEL_NAME, REPO

pytestmark = pytest.mark.cluster


def test_deploy_completes_and_answers_through_the_service_with_the_token(served):
    out = served.deploy_output
    assert 'deployment "rtserve" successfully rolled out' in out, out[-3000:]
    assert re.search(r">> registry\.example\.com/ml/rtserve:1\.0 verified on local", out), out[-3000:]
    import requests

    answer = requests.post(
        served.url, json={"features": [0.25] * 32}, timeout=10, headers={"Authorization": f"Bearer {served.token}"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_version"] == "1.0"
    refused = requests.post(served.url, json={"features": [0.25] * 32}, timeout=10)
    assert refused.status_code == 401, refused.text
    bad = requests.post(
        served.url, json={"features": [0.25] * 3}, timeout=10, headers={"Authorization": f"Bearer {served.token}"}
    )
    assert bad.status_code == 400 and bad.json()["field"] == "features", bad.text


def test_the_namespace_enforces_restricted_pod_security(served):
    labels = json.loads(served.cluster.ok("get", "namespace", NAMESPACE, "-o", "jsonpath={.metadata.labels}"))
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted", labels
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {"name": "app", "image": "registry.example.com/ml/rtserve:1.0", "securityContext": {"privileged": True}}
            ]
        },
    }
    refused = served.cluster.kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    assert refused.returncode == 1, refused.stdout
    assert re.search(
        r'pods "privileged" is forbidden: violates PodSecurity "restricted:[\w.]+": privileged', refused.stderr
    ), refused.stderr


def test_a_failed_verification_is_undone_by_k8s_deploy(served, image_vars):
    """1.0 serves; 2.0 is rolled out with a p99 bound no server meets: the real Job fails, and
    `make k8s-deploy` undoes the rollout to 1.0 by itself while traffic flows."""
    load = served.load()
    try:
        failed = deploy(served.cluster, image_vars, "2.0", "VERIFY_MAX_P99_MS=0.001")
        settle_after(served.deployed, load, "undo")
    finally:
        records = load.stop()
    assert failed.returncode != 0, failed.stdout[-4000:]
    assert "is above max_p99_ms 0.001 ms" in failed.stdout, failed.stdout[-4000:]
    assert re.search(
        r"registry\.example\.com/ml/rtserve:2\.0 failed its verification on local and was "
        r"rolled back",
        failed.stdout,
    ), failed.stdout[-3000:]
    assert served.versions() == {"1.0"}
    print(
        f"failed verification of 2.0 and its undo: {Counts.of(records).text()} of {len(records)}; "
        f"versions answered {dict(Counter(r.version for r in records))}"
    )
    no_failures(records, "a failed verification and its undo")
    assert not settled(records, "undo", "1.0")  # every caller back on 1.0 once the undo ended


def wrong_archive(store: Path, version: str) -> Path:
    """The 2.0 archive relabelled ``version`` with two golden rows' probabilities reversed: the
    model now answers those rows differently from its own golden set (as a bad export would)."""
    source, target = store / f"{MODEL_NAME}_2.0.mar", store / f"{MODEL_NAME}_{version}.mar"
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            raw = zin.read(item.filename)
            if item.filename == "MAR-INF/MANIFEST.json":
                manifest = json.loads(raw)
                manifest["model"]["modelVersion"] = version
                raw = json.dumps(manifest).encode()
            elif item.filename == "meta.json":
                meta = json.loads(raw)
                meta["version"] = version
                for row in (3, 7):
                    meta["golden"]["probabilities"][row] = meta["golden"]["probabilities"][row][::-1]
                raw = json.dumps(meta).encode()
            zout.writestr(item, raw)
    return target


def test_a_version_that_answers_wrongly_is_undone_by_k8s_deploy(served, image_vars, mar_v1):
    """Its pods check their answers against the golden set while starting and exit: the rollout
    fails at the first restart, `make k8s-deploy` undoes it, and the version before never stops
    serving."""
    wrong_archive(mar_v1.parent, "2.9")
    before = served.versions()
    load = served.load()
    try:
        failed = deploy(served.cluster, image_vars, "2.9")
        settle_after(served.deployed, load, "undo")
    finally:
        records = load.stop()
    assert failed.returncode != 0, failed.stdout[-4000:]
    assert re.search(r"container rtserve of pod rtserve-\S+ exited \d+ \(Error\) and restarted", failed.stdout), (
        failed.stdout[-4000:]
    )
    assert "the served model is not the one packaged" in failed.stdout, failed.stdout[-4000:]  # its log
    assert "the rollout of registry.example.com/ml/rtserve:2.9 to local failed and was rolled back" in failed.stdout
    assert served.versions() == before
    print(f"bad version 2.9 undone: {Counts.of(records).text()} of {len(records)}")
    no_failures(records, "a bad version's rollout and its undo")
    (version,) = before
    assert not settled(records, "undo", version)


def test_a_change_the_api_server_refuses_fails_k8s_deploy_and_the_running_version_serves(served, image_vars, tmp_path):
    """A copy of deploy/k8s whose local overlay adds a label to the Deployment's selector (an
    immutable field): `make k8s-deploy K8S_DIR=<copy>` fails with the API server's own message,
    and the pods serving are untouched."""
    k8s = tmp_path / "k8s"
    shutil.copytree(REPO / "deploy" / "k8s", k8s)
    (k8s / "overlays" / "local" / "selector.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: rtserve\nspec:\n  selector:\n"
        "    matchLabels:\n      track: stable\n  template:\n    metadata:\n      labels:\n        track: stable\n"
    )
    kustomization = k8s / "overlays" / "local" / "kustomization.yaml"
    text = kustomization.read_text().replace("  - path: hpa.yaml\n", "  - path: hpa.yaml\n  - path: selector.yaml\n")
    assert "selector.yaml" in text, "the local overlay's patches list has moved"
    kustomization.write_text(text)
    with autoscaler_held(served):
        pods_before = served.pods()
        versions = served.versions()
        load = served.load()
        try:
            refused = deploy(served.cluster, image_vars, "2.0", f"K8S_DIR={k8s}")
            settle_after(served.deployed, load, "refused")
        finally:
            records = load.stop()
        pods_after = served.pods()
    assert refused.returncode != 0, refused.stdout[-3000:]
    assert 'The Deployment "rtserve" is invalid: spec.selector: Invalid value: ' in refused.stdout, refused.stdout[
        -3000:
    ]
    assert "field is immutable" in refused.stdout, refused.stdout[-3000:]
    assert served.versions() == versions
    assert pods_after == pods_before
    print(f"a refused apply: {Counts.of(records).text()} of {len(records)}")
    no_failures(records, "a refused apply")
    (version,) = versions
    assert not settled(records, "refused", version)


def test_draining_the_node_honours_the_disruption_budget(served):
    """Two replicas on the one node, maxUnavailable 1: the drain evicts one pod, and the API
    server refuses to evict the second while the first has no replacement (the node is
    cordoned). Traffic keeps being answered by the pod left."""
    cluster = served.cluster
    with autoscaler_held(served):
        ready = cluster.ok("-n", NAMESPACE, "get", "deployment", "rtserve", "-o", "jsonpath={.status.readyReplicas}")
        assert ready == "2", f"expected 2 ready replicas before the drain, got {ready}"
        load = served.load()
        try:
            drain = cluster.kubectl(
                "drain",
                cluster.node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--pod-selector=app.kubernetes.io/name=rtserve",
                "--timeout=45s",
                timeout=120,
            )
            pods = json.loads(
                cluster.ok("-n", NAMESPACE, "get", "pods", "-l", "app.kubernetes.io/name=rtserve", "-o", "json")
            )
        finally:
            cluster.ok("uncordon", cluster.node)
            time.sleep(2)
            records = load.stop()
    assert drain.returncode != 0, drain.stdout
    assert "Cannot evict pod as it would violate the pod's disruption budget" in drain.stderr, drain.stderr
    running = [
        p for p in pods["items"] if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    assert len(running) == 1, [p["metadata"]["name"] for p in running]
    print(f"a node drain: {Counts.of(records).text()} of {len(records)}")
    no_failures(records, "a node drain")
    cluster.ok("-n", NAMESPACE, "rollout", "status", "deployment/rtserve", "--timeout=300s", timeout=320)
