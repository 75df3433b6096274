"""The real API server (``make cluster``) accepts what the overlays render and refuses what a
real cluster refuses, with its own messages."""

from __future__ import annotations

import re
import time
from contextlib import contextmanager

import pytest
import yaml

from tests.cluster.conftest import make
from tests.conftest import REPO

pytestmark = pytest.mark.cluster

PINNED = re.search(r"^\s*k8s\.io/kubernetes (v\S+)", (REPO / "deploy/cluster/go.mod").read_text(), re.M)[1]


def test_cluster_comes_up_and_reports_every_component_running(cluster):
    assert re.search(
        r"^>> cluster ready in [\d.]+ s \(etcd [\d.]+ s, kube-apiserver [\d.]+ s, "
        r"kube-controller-manager [\d.]+ s, kube-scheduler [\d.]+ s, containerd [\d.]+ s, "
        r"kubelet [\d.]+ s, kube-proxy [\d.]+ s, node Ready [\d.]+ s, coredns [\d.]+ s, "
        r"metrics-server [\d.]+ s, prometheus [\d.]+ s, prometheus-adapter [\d.]+ s, kube-router [\d.]+ s\)",
        cluster.start_output,
        re.M,
    )
    status = make("cluster-status", f"CLUSTER_RUN_DIR={cluster.run_dir}")
    assert status.returncode == 0, status.stdout
    for name in (
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "containerd",
        "kubelet",
        "kube-proxy",
        "coredns",
        "metrics-server",
        "prometheus",
        "prometheus-adapter",
        "kube-router",
    ):
        assert re.search(rf"^  {name} +running \(pid \d+\)$", status.stdout, re.M), status.stdout
    assert f"API server: {cluster.api_url}" in status.stdout


def test_kubectl_version_answers_with_the_pinned_version(cluster):
    out = cluster.ok("version")
    assert f"Client Version: {PINNED}\n" in out and f"Server Version: {PINNED}\n" in out, out


def test_server_runs_node_and_rbac_authorization(cluster):
    """The admin (system:masters) may do anything; a service account may not list secrets."""
    assert cluster.ok("auth", "can-i", "list", "secrets", "-A").strip() == "yes"
    denied = cluster.kubectl(
        "auth", "can-i", "list", "secrets", "-n", "default", "--as=system:serviceaccount:default:default"
    )
    assert denied.returncode == 1 and denied.stdout.strip() == "no", denied


@pytest.mark.parametrize("overlay", ["production", "staging", "local", "local-records"])
def test_every_rendered_overlay_is_accepted_by_the_api_server(cluster, rendered, overlay):
    """Server-side dry run of the whole rendering (its namespace created for real first: a dry
    run creates nothing for the namespaced objects to land in), with no PodSecurity warning."""
    objects = [o for o in yaml.safe_load_all(rendered[overlay].read_text()) if o]
    namespaces = [o for o in objects if o["kind"] == "Namespace"]
    cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump_all(namespaces))
    done = cluster.kubectl("apply", "--dry-run=server", "-f", str(rendered[overlay]))
    assert done.returncode == 0, done.stderr
    for obj in objects:  # e.g. "deployment.apps/rtserve created (server dry run)"
        line = rf"^{obj['kind'].lower()}(\.[a-z0-9.]+)?/{re.escape(obj['metadata']['name'])} \w+ \(server dry run\)$"
        assert re.search(line, done.stdout, re.M), (obj["kind"], done.stdout)
    assert "PodSecurity" not in done.stderr, done.stderr


@pytest.mark.parametrize("overlay", ["production", "local"])
def test_the_stream_consumers_component_is_accepted_by_the_api_server(cluster, overlay, tmp_path):
    """An overlay that lists components/stream (as docs/streaming.md tells users to), rendered by
    the cluster's kubectl and dry-run on the server: the consumer's Deployment, PDB, NetworkPolicy
    and ConfigMap are accepted in the restricted namespace, with no PodSecurity warning."""
    from tests.deploy.conftest import with_stream

    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(cluster.ok("kustomize", str(with_stream(overlay, tmp_path))))
    objects = [o for o in yaml.safe_load_all(rendered.read_text()) if o]
    with namespaces_of(cluster, objects):
        done = cluster.kubectl("apply", "--dry-run=server", "-f", str(rendered))
    assert done.returncode == 0, done.stderr
    stream = {(o["kind"], o["metadata"]["name"]) for o in objects if "stream" in o["metadata"]["name"]}
    assert {"Deployment", "PodDisruptionBudget", "NetworkPolicy"} <= {kind for kind, _ in stream}, stream
    for kind, name in stream:
        assert re.search(
            rf"^{kind.lower()}(\.[a-z0-9.]+)?/{re.escape(name)} \w+ \(server dry run\)$", done.stdout, re.M
        ), (kind, done.stdout)
    assert "PodSecurity" not in done.stderr, done.stderr


@pytest.mark.parametrize("overlay,job", [("staging", "verify"), ("local", "local-verify")])
def test_the_verification_job_is_accepted_by_the_api_server(cluster, rendered, overlay, job):
    """The shared Job (rendered in staging's namespace) and the local overlay's own, dry-run as
    new objects in a namespace of their own with the overlay's namespace labels (PodSecurity):
    in the overlay's namespace, the Job an earlier `make k8s-deploy` left would make the apply an
    update, which the API server refuses (a Job's template is immutable)."""
    (namespace,) = [o for o in yaml.safe_load_all(rendered[overlay].read_text()) if o and o["kind"] == "Namespace"]
    name = f"verify-check-{overlay}"
    objects = [o for o in yaml.safe_load_all(rendered[job].read_text()) if o]
    for obj in objects:
        obj["metadata"]["namespace"] = name
    with namespaces_of(cluster, [{**namespace, "metadata": {**namespace["metadata"], "name": name}}]):
        done = cluster.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(objects))
    assert done.returncode == 0, done.stderr
    assert "job.batch/rtserve-verify created (server dry run)" in done.stdout, done.stdout
    assert "PodSecurity" not in done.stderr, done.stderr


PRIVILEGED_POD = """
apiVersion: v1
kind: Pod
metadata: {name: privileged, namespace: restricted-check}
spec:
  containers:
    - name: app
      image: registry.k8s.io/pause:3.10
      securityContext: {privileged: true}
"""
RESTRICTED_POD = """
apiVersion: v1
kind: Pod
metadata: {name: conforming, namespace: restricted-check}
spec:
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
    - name: app
      image: registry.k8s.io/pause:3.10
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
"""


@contextmanager
def removed_on_exit(cluster, namespaces: list[str], *delete: str):
    """On exit, ``kubectl delete <delete>`` (default: the ``namespaces``) without waiting; after a
    body that passed, wait until each namespace is gone, so that the next test meets nothing this
    one made (a pod left pulling an image, or pods left pending, cost the node's CPU)."""
    try:
        yield
    finally:
        if namespaces:
            cluster.ok("delete", *(delete or ("namespace", *namespaces)), "--wait=false")
    for name in namespaces:
        gone(cluster, "namespace", name)


@contextmanager
def namespaces_of(cluster, objects: list[dict]):
    """The Namespace objects among ``objects`` that do not exist yet, made for real (a namespaced
    object's server dry run needs its namespace) and removed on exit: the local overlay's namespace
    is then made by `make k8s-deploy`, as the docs say."""
    made = []
    for namespace in (o for o in objects if o["kind"] == "Namespace"):
        name = namespace["metadata"]["name"]
        if cluster.kubectl("get", "namespace", name).returncode:
            cluster.ok("apply", "-f", "-", stdin=yaml.safe_dump(namespace))
            made.append(name)
    with removed_on_exit(cluster, made):
        yield


def gone(cluster, *resource: str, timeout: float = 120) -> None:
    """Wait until ``kubectl get <resource>`` finds nothing."""
    deadline = time.monotonic() + timeout
    while cluster.kubectl("get", *resource).returncode == 0:
        assert time.monotonic() < deadline, f"{' '.join(resource)} still there after {timeout:.0f} s"
        time.sleep(1)


def test_a_restricted_namespace_refuses_a_privileged_pod(cluster):
    cluster.namespace("restricted-check", **{"pod-security.kubernetes.io/enforce": "restricted"})
    with removed_on_exit(cluster, ["restricted-check"]):
        refused = cluster.kubectl("apply", "-f", "-", stdin=PRIVILEGED_POD)
        assert refused.returncode == 1
        assert (
            'Error from server (Forbidden): error when creating "STDIN": pods "privileged" is forbidden: '
            'violates PodSecurity "restricted:latest": '
        ) in refused.stderr, refused.stderr
        assert 'privileged (container "app" must not set securityContext.privileged=true)' in refused.stderr
        assert cluster.kubectl("get", "pod", "privileged", "-n", "restricted-check").returncode == 1
        # The same namespace takes a pod that meets the restricted level: the refusal is PodSecurity's.
        assert cluster.ok("apply", "-f", "-", stdin=RESTRICTED_POD).strip() == "pod/conforming created"


def test_a_deployment_selector_change_is_refused_on_apply(cluster, rendered):
    """The staging overlay applied for real, then its Deployment with one more selector label
    (and the same on its pods): the selector is immutable, and the running object stays. The
    overlay's objects (its namespace with them) are deleted afterwards."""
    cluster.ok("apply", "-f", str(rendered["staging"]))
    with removed_on_exit(cluster, ["rtserve-staging"], "-f", str(rendered["staging"]), "--ignore-not-found"):
        objects = [o for o in yaml.safe_load_all(rendered["staging"].read_text()) if o]
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        name, namespace = deployment["metadata"]["name"], deployment["metadata"]["namespace"]
        selector = ("get", "deployment", name, "-n", namespace, "-o", "jsonpath={.spec.selector.matchLabels}")
        before = cluster.ok(*selector)
        deployment["spec"]["selector"]["matchLabels"]["track"] = "canary"
        deployment["spec"]["template"]["metadata"]["labels"]["track"] = "canary"
        refused = cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(deployment))
        assert refused.returncode == 1
        assert f'The Deployment "{name}" is invalid: spec.selector: Invalid value: ' in refused.stderr, refused.stderr
        assert refused.stderr.rstrip().endswith("field is immutable"), refused.stderr
        after = cluster.ok(*selector)
        assert after == before and "canary" not in after
