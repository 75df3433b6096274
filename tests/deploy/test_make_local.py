"""`make k8s-deploy OVERLAY=local` (and local-records) and `make cluster-load`: what they run on `make cluster`'s
cluster and elsewhere (kind, minikube), read from `make -n` plans, and what it applies, rendered
by the real kubectl kustomize. No API server and no containerd run in this tier:
tests/cluster/test_deploy.py deploys and tests/cluster/test_images.py loads into a real node.

A running local cluster is a run directory whose ``kube-apiserver.pid`` names a live process
(the Makefile's CLUSTER_RUNS): this test's own PID stands in for the API server's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rtserve.k8s.deploy import Target, deploy_kustomization, verify_kustomization
from tests.conftest import REPO
from tests.deploy.conftest import K8S_DIR, load, one, render
from tests.deploy.test_make_targets import IMG, plan

pytestmark = pytest.mark.deploy

GATEWAY = "localhost/rtserve-gateway-standin:nginx-bookworm"
#: Where the loads keep the images' layers (the Makefile's CLUSTER_LAYERS, in its CACHE_DIR).
LAYERS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rtserve" / "image-layers"
STORE = "registry.example.com/ml/rtserve-cassandra:5.0.6"
BROKER = "registry.example.com/ml/rtserve-kafka:4.4.0"
BIN, KUBECONFIG = "/c/bin", "/c/admin.kubeconfig"
LOCAL_KUBECTL = f"{BIN}/kubectl --kubeconfig {KUBECONFIG}"


def run_dir(tmp_path: Path, pid: int | None) -> Path:
    """A cluster run directory whose API server's PID file names ``pid`` (None: no file)."""
    path = tmp_path / "cluster-run"
    path.mkdir(exist_ok=True)
    if pid is not None:
        (path / "kube-apiserver.pid").write_text(f"{pid}\n{BIN}/kube-apiserver\n")
    return path


def dead_pid() -> int:
    """A PID no process has."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


#: The overlays on this machine's node, the image of its own store or broker each loads with its
#: own, that image's target and what the reminder calls it.
LOCAL = {"local": "", "local-records": STORE, "local-stream": BROKER}
TARGET = {"": "", STORE: "image-cassandra ", BROKER: "image-kafka "}
WHAT = {STORE: "the records store's", BROKER: "the stream's broker's"}


def local_plan(tmp_path: Path, *args: str, pid: int | None = None, overlay: str = "local") -> list[str]:
    """`make -n k8s-deploy OVERLAY=<overlay> ...` without KUBECTL (each line with spaces collapsed)."""
    lines = plan("k8s-deploy", f"OVERLAY={overlay}", f"CLUSTER_RUN_DIR={run_dir(tmp_path, pid)}",
                 f"CLUSTER_BIN={BIN}", f"CLUSTER_KUBECONFIG={KUBECONFIG}", *args)
    return [" ".join(line.split()) for line in lines]


def after(lines: list[str], marker: str) -> list[str]:
    """The plan from the first line containing ``marker`` on (the venv's own steps dropped)."""
    (first,) = [i for i, line in enumerate(lines) if marker in line][:1]
    return lines[first:]


@pytest.mark.parametrize("overlay", sorted(LOCAL))
def test_on_the_local_cluster_it_builds_loads_makes_the_token_and_uses_the_clusters_kubectl(tmp_path, overlay):
    """MODEL_VERSION=2.0: the image is built only when podman lacks it, the gateway stand-in's
    (and for local-records the records store's) builds are skipped when up to date, all are loaded
    (the Job runs the same image), the namespace and the token's Secret come before the deploy,
    every kubectl is the cluster's, and the deploy makes the local volumes' directories on this
    machine (the node)."""
    cluster, store = run_dir(tmp_path, os.getpid()), LOCAL[overlay]
    lines = after(local_plan(tmp_path, "MODEL_VERSION=2.0", pid=os.getpid(), overlay=overlay), "pod-deps")
    py = f"{REPO / '.venv'}/bin/python"
    assert lines[:6] == [
        "make --no-print-directory pod-deps",
        # Built when missing, and rebuilt (when its inputs changed) wherever its archive is here.
        f"if [ -f model_store/realtime-classifier_2.0.mar ] || ! podman image inspect {IMG}:2.0 >/dev/null 2>&1; "
        "then make --no-print-directory image DOCKER=podman MODEL_VERSION=2.0 IMAGE_TAG=2.0; fi",
        f"make --no-print-directory image-gateway {TARGET[store]}DOCKER=podman",
        f"{py} -m rtserve cluster load --run-dir {cluster} --engine podman --layers {LAYERS} {IMG}:2.0 {GATEWAY} "
        f"{store}".strip(),
        f"{LOCAL_KUBECTL} apply -f deploy/k8s/overlays/{overlay}/namespace.yaml",
        f"{LOCAL_KUBECTL} -n rtserve-{overlay} get secret rtserve-gateway-tokens >/dev/null 2>&1 || "
        f"{LOCAL_KUBECTL} -n rtserve-{overlay} create secret generic rtserve-gateway-tokens "
        f"--from-literal=tokens=\"$({py} -c 'import secrets; print(secrets.token_urlsafe(32))')\"",
    ]
    (deploy,) = lines[6:]
    assert deploy.startswith(f"{py} -m rtserve k8s deploy --overlay {overlay} --image {IMG} --version \"2.0\" "
                             f"--namespace rtserve-{overlay} ")
    assert f'--kubectl "{LOCAL_KUBECTL}"' in deploy
    assert "--verify-dir" not in deploy, "the Job's kustomization is Python's to choose (Target.verify_dir)"
    assert deploy.endswith(" --local-volumes")


@pytest.mark.parametrize("overlay", sorted(LOCAL))
def test_the_overlays_pin_is_built_and_loaded_without_a_version(tmp_path, overlay):
    lines = local_plan(tmp_path, pid=os.getpid(), overlay=overlay)
    loads = f"--engine podman --layers {LAYERS} {IMG}:1.0 {GATEWAY} {LOCAL[overlay]}".strip()
    assert any(line.endswith(loads) for line in lines), lines
    assert any('--version "1.0"' in line for line in lines), lines


@pytest.mark.parametrize("overlay", sorted(LOCAL))
@pytest.mark.parametrize("pid", [None, "dead"], ids=["never-started", "stopped"])
def test_without_a_running_local_cluster_it_reminds_to_load_and_uses_plain_kubectl(tmp_path, pid, overlay):
    """kind, minikube, k3d: their kubectl context; the node must get the images another way."""
    lines = local_plan(tmp_path, pid=dead_pid() if pid else None, overlay=overlay)
    lines = after(lines, ">> no cluster runs")
    store = f" (and {WHAT[LOCAL[overlay]]} {LOCAL[overlay]})" if LOCAL[overlay] else ""
    assert lines[0] == (f'echo ">> no cluster runs from {tmp_path}/cluster-run (make cluster): the node must '
                        f'hold {IMG}:1.0 and {GATEWAY}{store} (kind load docker-image, minikube image load)"')
    assert lines[1] == f"kubectl apply -f deploy/k8s/overlays/{overlay}/namespace.yaml"
    assert '--kubectl "kubectl"' in lines[-1] and len(lines) == 4
    assert "--local-volumes" not in lines[-1], "this machine is not the node"
    assert not any("cluster load" in line or "image-gateway" in line for line in lines)


def test_another_overlay_never_loads_nor_uses_the_local_clusters_kubectl(tmp_path):
    lines = plan("k8s-deploy", "OVERLAY=staging", f"CLUSTER_RUN_DIR={run_dir(tmp_path, os.getpid())}",
                 f"CLUSTER_BIN={BIN}")
    (deploy,) = [line for line in lines if "rtserve k8s deploy" in line]
    assert '--kubectl "kubectl"' in deploy and "--verify-dir" not in deploy
    assert "--local-volumes" not in deploy
    assert not any("cluster load" in line or "secret" in line or "podman" in line for line in lines)
    status = plan("k8s-status", "OVERLAY=local", f"CLUSTER_RUN_DIR={run_dir(tmp_path, os.getpid())}",
                  f"CLUSTER_BIN={BIN}", f"CLUSTER_KUBECONFIG={KUBECONFIG}")
    assert status == [f"{LOCAL_KUBECTL} -n rtserve-local rollout status deployment/rtserve --timeout=15m"]


@pytest.mark.parametrize("overlay", sorted(LOCAL))
def test_what_the_local_deploy_applies_takes_every_image_from_the_node(tmp_path, overlay):
    """The overlay and the verification Job as `make k8s-deploy OVERLAY=<local overlay>
    MODEL_VERSION=2.0` renders them (rtserve.k8s.deploy's kustomizations, the real kubectl
    kustomize): the overlay's own Job in its namespace, and every container with the rollout's,
    the stand-in's or the records store's image and IfNotPresent."""
    t = Target(K8S_DIR, overlay, f"rtserve-{overlay}", "rtserve", IMG, "2.0", "realtime-classifier",
               tmp_path / "local", tmp_path / "local-verify")
    assert t.verify_dir == K8S_DIR / "overlays" / overlay / "verify"
    rendered = {}
    for build, kustomization in ((t.build_dir, deploy_kustomization(t)), (t.verify_build_dir, verify_kustomization(t))):
        build.mkdir()
        (build / "kustomization.yaml").write_text(kustomization)
        rendered[build.name] = load(render(build))
    pod = one(rendered["local"], "Deployment", "rtserve")["spec"]["template"]["spec"]
    assert [(c["image"], c["imagePullPolicy"]) for c in pod["initContainers"] + pod["containers"]] == \
        [(GATEWAY, "IfNotPresent"), (f"{IMG}:2.0", "IfNotPresent")]
    # local-stream's consumers run the server's image: the rollout's version too
    consumers = [c for o in rendered["local"] if o["kind"] == "Deployment" and o["metadata"]["name"] != "rtserve"
                 for c in o["spec"]["template"]["spec"]["containers"]]
    assert [(c["image"], c["imagePullPolicy"]) for c in consumers] == \
        ([(f"{IMG}:2.0", "IfNotPresent")] if LOCAL[overlay] == BROKER else [])
    stores = [o for o in rendered["local"] if o["kind"] == "StatefulSet"]
    assert [(c["image"], c["imagePullPolicy"]) for o in stores for c in o["spec"]["template"]["spec"]["containers"]] == \
        ([(LOCAL[overlay], "IfNotPresent")] if LOCAL[overlay] else [])
    (job,) = [o for o in rendered["local-verify"] if o["kind"] == "Job"]
    (verify,) = job["spec"]["template"]["spec"]["containers"]
    assert (job["metadata"]["namespace"], verify["image"], verify["imagePullPolicy"]) == \
        (f"rtserve-{overlay}", f"{IMG}:2.0", "IfNotPresent")
    assert verify["resources"]["requests"]["cpu"] == "100m"  # the local Job's own sizing


def test_make_cluster_load_needs_images_and_passes_them_on(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "--no-print-directory", "cluster-load", f"VENV={REPO / '.venv'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == 'usage: make cluster-load IMAGES="registry.example.com/ml/rtserve:1.0 ..."\n'
    lines = plan("cluster-load", f"IMAGES={IMG}:1.0 {GATEWAY}", f"CLUSTER_RUN_DIR={tmp_path}")
    assert lines[-1] == (f"{REPO / '.venv'}/bin/python -m rtserve cluster load --run-dir {tmp_path} "
                         f"--engine podman --layers {LAYERS} {IMG}:1.0 {GATEWAY}")
