"""Every overlay rendered by the real ``kubectl kustomize`` (what ``make k8s-deploy`` applies)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

K8S_DIR = REPO / "deploy" / "k8s"
#: The verification Job's kustomization (`make k8s-verify`), rendered and checked like an overlay.
VERIFY_DIR = K8S_DIR / "verify"
OVERLAYS = sorted(p.name for p in (K8S_DIR / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
#: Overlays with a verification Job of their own (overlays/<name>/verify), rendered and checked too.
OWN_VERIFY = {o: K8S_DIR / "overlays" / o / "verify" for o in OVERLAYS
              if (K8S_DIR / "overlays" / o / "verify" / "kustomization.yaml").is_file()}
#: A candidate beside the default (`make k8s-shadow`, `make k8s-canary`): the shared kustomization
#: and the overlays' own (overlays/<name>/candidate), rendered and checked like an overlay.
CANDIDATE_DIR = K8S_DIR / "candidate"
OWN_CANDIDATE = {o: K8S_DIR / "overlays" / o / "candidate" for o in OVERLAYS
                 if (K8S_DIR / "overlays" / o / "candidate" / "kustomization.yaml").is_file()}
#: The component of the overlays whose images are built here and loaded into the node.
LOCAL_IMAGES = K8S_DIR / "components" / "local-images"
#: The stream consumer's component, which an overlay enables by listing it (docs/streaming.md).
STREAM = K8S_DIR / "components" / "stream"
#: The records' components: the store's contact points and egress (every overlay lists it), and
#: the in-cluster Cassandra node (the local overlay's).
RECORDS = K8S_DIR / "components" / "records"
CASSANDRA = K8S_DIR / "components" / "cassandra"
#: The stream's in-cluster broker (the local-stream overlay's).
KAFKA = K8S_DIR / "components" / "kafka"
#: The ``app.kubernetes.io/component`` labels of the records' objects, and of the stream's.
RECORDS_COMPONENTS = ("records", "records-store")
STREAM_COMPONENTS = ("stream", "stream-broker")
#: The cluster DNS of make cluster's node: CoreDNS on the node's address, which components/local-dns
#: adds to every policy that allows DNS in the local overlays.
LOCAL_DNS = K8S_DIR / "components" / "local-dns"
#: The gateway's inference port, which every policy names by number (base/networkpolicy.yaml says why).
INFERENCE_PORT = 8080
#: The DNS rules of a policy that allows DNS: kube-system's pods (any cluster) and, where the
#: overlay lists components/local-dns, the local cluster's node (rtserve.cluster.node.NODE_IP).
DNS_PORTS = [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]
KUBE_SYSTEM_DNS = {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}],
                   "ports": DNS_PORTS}
#: The Kubernetes version the manifests are validated against (kubernetes-validate ships it).
K8S_VERSION = "1.32.0"


def pull_policy(overlay: str) -> str:
    """The pull policy the overlay's containers must have: IfNotPresent where its images come from
    the node (it uses components/local-images), else Always (a registry's tag re-checked)."""
    return "IfNotPresent" if lists_component(overlay, LOCAL_IMAGES) else "Always"


def render(path: Path) -> str:
    """``kubectl kustomize path``; the output as text."""
    result = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def load(text: str) -> list[dict]:
    """The objects of a multi-document YAML text."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    """The single object of ``kind`` (and ``name``)."""
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def lists_component(overlay: str, component: Path) -> bool:
    """Whether the overlay's kustomization.yaml lists ``component``, or an overlay it builds on
    (local-records lists ../local among its resources) does."""
    overlay_dir = K8S_DIR / "overlays" / overlay
    kustomization = yaml.safe_load((overlay_dir / "kustomization.yaml").read_text())
    if any((overlay_dir / c).resolve() == component for c in kustomization.get("components", [])):
        return True
    return any(lists_component(r.name, component) for r in (overlay_dir / p for p in kustomization.get("resources", []))
               if r.resolve().parent == (K8S_DIR / "overlays").resolve() and (r / "kustomization.yaml").is_file())


def dns_rules(overlay: str) -> list[dict]:
    """The egress rules a policy that allows DNS has in ``overlay``: kube-system's DNS pods, and the
    local cluster's node where the overlay lists components/local-dns."""
    from rtserve.cluster.node import NODE_IP

    node = [{"to": [{"ipBlock": {"cidr": f"{NODE_IP}/32"}}], "ports": DNS_PORTS}]
    return [KUBE_SYSTEM_DNS, *(node if lists_component(overlay, LOCAL_DNS) else [])]


def records_objects(objects: list[dict]) -> list[dict]:
    """The records' objects (:data:`RECORDS_COMPONENTS`): the store's ConfigMap and policy, the
    in-cluster node's StatefulSet, Service, policy and volume."""
    return [o for o in objects
            if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") in RECORDS_COMPONENTS]


def server_objects(objects: list[dict]) -> list[dict]:
    """The server's objects: all but :func:`records_objects` and the stream's (its consumers and broker,
    :data:`STREAM_COMPONENTS`)."""
    records = records_objects(objects)
    return [o for o in objects if o not in records
            and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") not in STREAM_COMPONENTS]


def makefile_text() -> str:
    """The Makefile and the domain files it includes (mk/*.mk), as one text."""
    return "\n".join(f.read_text() for f in [REPO / "Makefile", *sorted((REPO / "mk").glob("*.mk"))])


def pinned_tag(overlay: str) -> str:
    """The image tag an overlay's kustomization.yaml pins, as make reads it (scripts/k8s pin)."""
    done = subprocess.run([str(REPO / "scripts" / "k8s"), "pin", overlay], capture_output=True, text=True,
                          env={**os.environ, "K8S_DIR": str(K8S_DIR)}, check=True)
    return done.stdout.strip()


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict]]:
    """overlay name -> its rendered objects."""
    assert OVERLAYS, "no overlays found"
    return {overlay: load(render(K8S_DIR / "overlays" / overlay)) for overlay in OVERLAYS}


def with_stream(overlay: str, into: Path) -> Path:
    """A copy of the kustomize tree under ``into`` (one per overlay: local-records builds on
    local, which must stay as it is) whose ``overlay`` lists components/stream first, as
    docs/streaming.md tells a user to (local-stream lists it already: left as it is); returns
    that overlay's directory."""
    tree = into / overlay / "k8s"
    if not tree.exists():
        shutil.copytree(K8S_DIR, tree)
    path = tree / "overlays" / overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    if lists_component(overlay, STREAM):
        return path.parent
    kustomization["components"] = ["../../components/stream", *kustomization.get("components", [])]
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return path.parent


@pytest.fixture(scope="session")
def rendered_stream(tmp_path_factory) -> dict[str, list[dict]]:
    """overlay name -> its rendered objects with the stream consumer's component enabled."""
    into = tmp_path_factory.mktemp("with-stream")
    return {overlay: load(render(with_stream(overlay, into))) for overlay in OVERLAYS}
