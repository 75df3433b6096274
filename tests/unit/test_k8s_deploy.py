"""rtserve.k8s.deploy: the kustomizations it writes, the order of its kubectl steps, and what a
failed step does. No cluster exists here, so ``kubectl`` is a recording fake that answers as the
API server would (the deploy tier, tests/deploy/test_make_targets.py, runs the same steps through
``make`` with a stand-in script and the real ``kubectl kustomize``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserve.errors import DeployError
from rtserve.k8s.deploy import (JOB_CONDITIONS, Kubectl, Target, deploy, deploy_kustomization, job_result,
                                uses_image, verify, verify_kustomization)

pytestmark = pytest.mark.unit

IMG = "registry.example.com/ml/rtserve"


class FakeKubectl:
    """Records each call; ``kustomize`` writes manifests naming ``image``; ``get`` of the Job
    answers ``conditions`` in turn; a call whose first words are in ``fail`` raises."""

    def __init__(self, image: str, conditions=("Complete",), fail=()) -> None:
        self.image, self.conditions, self.fail = image, list(conditions), fail
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, *args: str, capture: bool = False, into: Path | None = None) -> str:
        self.calls.append(args)
        words = tuple(a for a in args if not a.startswith("-") and a != "rtserve-staging")
        if any(words[:len(f)] == f for f in self.fail):
            raise DeployError(f"kubectl {' '.join(args)} exited 1")
        if args[0] == "kustomize":
            into.write_text(f"kind: Deployment\nspec:\n  containers:\n    - args: []\n"
                            f"      image: {self.image}\n")
        if "get" in args:
            return self.conditions.pop(0) if len(self.conditions) > 1 else self.conditions[0]
        return ""


def target(tmp_path: Path, overlay: str = "staging", timeout: int = 10) -> Target:
    k8s = tmp_path / "k8s"
    (k8s / "overlays" / "staging").mkdir(parents=True, exist_ok=True)
    (k8s / "verify").mkdir(exist_ok=True)
    return Target(k8s, overlay, f"rtserve-{overlay}", "rtserve", IMG, "2.0", "realtime-classifier",
                  tmp_path / "build" / overlay, tmp_path / "build" / f"{overlay}-verify",
                  verify_timeout=timeout)


def test_the_kustomizations_are_the_overlay_and_the_job_with_this_rollouts_image(tmp_path):
    t = target(tmp_path)
    assert deploy_kustomization(t).splitlines() == [
        "# Written by make k8s-deploy: the overlay with this rollout's image and change cause.",
        "apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", "resources:",
        "  - ../../k8s/overlays/staging", "images:", f"  - name: {IMG}", '    newTag: "2.0"',
        "patches:", "  - patch: |-", "      apiVersion: apps/v1", "      kind: Deployment",
        "      metadata:", "        name: rtserve", "        annotations:",
        f'          kubernetes.io/change-cause: "realtime-classifier 2.0 ({IMG}:2.0) by make k8s-deploy"']
    assert verify_kustomization(t).splitlines() == [
        "# Written by make k8s-verify: the verification Job for this rollout.",
        "apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization",
        "namespace: rtserve-staging", "resources:", "  - ../../k8s/verify", "images:",
        f"  - name: {IMG}", '    newTag: "2.0"']


def test_image_and_job_conditions_are_read_exactly():
    assert uses_image(f"spec:\n    image: {IMG}:2.0\n", f"{IMG}:2.0")  # as kustomize writes it
    assert not uses_image(f"    image: {IMG}:2.0.1\n", f"{IMG}:2.0")
    assert not uses_image(f"    image: other/{IMG}:2.0\n", f"{IMG}:2.0")
    assert job_result("Complete") == "Complete" and job_result("Failed") == "Failed"
    assert job_result("") is None and job_result("Suspended") is None


def verify_steps(t: Target, polls: int = 1) -> list[tuple[str, ...]]:
    job = "job/rtserve-verify"
    return [("kustomize", str(t.verify_build_dir)),
            ("-n", t.namespace, "delete", job, "--ignore-not-found", "--wait=true"),
            ("apply", "-f", str(t.verify_build_dir / "manifests.yaml")),
            *[("-n", t.namespace, "get", job, "-o", JOB_CONDITIONS)] * polls,
            ("-n", t.namespace, "logs", job)]


def test_deploy_applies_waits_and_verifies(tmp_path, capsys):
    t = target(tmp_path)
    kubectl = FakeKubectl(f"{IMG}:2.0")
    deploy(t, kubectl, sleep=lambda s: None)
    status = ("-n", "rtserve-staging", "rollout", "status", "deployment/rtserve", "--timeout=15m")
    assert kubectl.calls == [("kustomize", str(t.build_dir)),
                             ("apply", "-f", str(t.build_dir / "manifests.yaml")), status,
                             *verify_steps(t)]
    assert (t.build_dir / "kustomization.yaml").read_text() == deploy_kustomization(t)
    assert (t.verify_build_dir / "kustomization.yaml").read_text() == verify_kustomization(t)
    assert f">> {IMG}:2.0 verified on staging" in capsys.readouterr().out


def test_a_failed_verification_undoes_the_rollout(tmp_path, capsys):
    t = target(tmp_path)
    kubectl = FakeKubectl(f"{IMG}:2.0", conditions=("", "Failed"))
    with pytest.raises(DeployError, match="failed its verification on staging and was rolled back"):
        deploy(t, kubectl, sleep=lambda s: None)
    assert kubectl.calls[3:] == [
        *verify_steps(t, polls=2),
        ("-n", "rtserve-staging", "rollout", "undo", "deployment/rtserve"),
        ("-n", "rtserve-staging", "rollout", "status", "deployment/rtserve", "--timeout=15m")]
    out = capsys.readouterr().out
    assert "verification of registry.example.com/ml/rtserve:2.0 on staging failed (Failed)" in out
    assert f">> {IMG}:2.0 failed its verification on staging: rolling back" in out


def test_a_failed_rollout_says_how_to_go_back_and_verifies_nothing(tmp_path):
    kubectl = FakeKubectl(f"{IMG}:2.0", fail=[("rollout", "status")])
    with pytest.raises(DeployError, match="make k8s-rollback OVERLAY=staging"):
        deploy(target(tmp_path), kubectl)
    assert [c[0] if c[0] != "-n" else c[2] for c in kubectl.calls] == ["kustomize", "apply", "rollout"]


def test_an_overlay_with_another_image_or_none_applies_nothing(tmp_path):
    kubectl = FakeKubectl("other.example.com/rtserve:2.0")
    with pytest.raises(DeployError, match=f"the staging overlay's image is not {IMG}"):
        deploy(target(tmp_path), kubectl)
    assert [c[0] for c in kubectl.calls] == ["kustomize"]
    kubectl = FakeKubectl(f"{IMG}:2.0")
    with pytest.raises(DeployError, match=r"no overlay .*nowhere \(have: staging\)"):
        deploy(target(tmp_path, overlay="nowhere"), kubectl)
    assert kubectl.calls == []


def test_verify_gives_up_after_its_timeout_and_still_shows_the_log(tmp_path):
    t = target(tmp_path, timeout=7)
    kubectl = FakeKubectl(f"{IMG}:2.0", conditions=("",))
    slept = []
    with pytest.raises(DeployError, match=r"failed \(no result in 7 s\)"):
        verify(t, kubectl, sleep=slept.append)
    assert kubectl.calls == verify_steps(t, polls=3) and slept == [2, 2, 2]


def test_an_overlay_with_its_own_verify_dir_gets_that_job(tmp_path):
    """The local overlay's Job takes its image from the node (deploy/k8s/overlays/local/verify)."""
    t = target(tmp_path)
    assert t.verify_dir == t.k8s_dir / "verify"
    (t.overlay_dir / "verify").mkdir()
    assert t.verify_dir == t.k8s_dir / "verify", "a directory without a kustomization is not one"
    (t.overlay_dir / "verify" / "kustomization.yaml").write_text("kind: Kustomization\n")
    assert t.verify_dir == t.overlay_dir / "verify"
    assert "  - ../../k8s/overlays/staging/verify" in verify_kustomization(t).splitlines()
    given = Target(**{**t.__dict__, "verify_source": tmp_path / "mine"})
    assert given.verify_dir == tmp_path / "mine"


def test_kubectl_is_a_command_line_with_its_options(tmp_path):
    """The local cluster's kubectl comes with its kubeconfig (KUBECTL="kubectl --kubeconfig F")."""
    script = tmp_path / "kubectl"
    script.write_text("#!/bin/sh\necho \"$@\"\n")
    script.chmod(0o755)
    said = []
    kubectl = Kubectl(f"{script} --kubeconfig '{tmp_path}/admin kubeconfig'", out=said.append)
    assert kubectl("get", "nodes", capture=True) == f"--kubeconfig {tmp_path}/admin kubeconfig get nodes\n"
    assert said == [f"{script} --kubeconfig '{tmp_path}/admin kubeconfig' get nodes"]
    with pytest.raises(DeployError, match="no kubectl command given"):
        Kubectl("  ")
    with pytest.raises(DeployError, match=r"cannot run /nowhere/kubectl: \[Errno 2\]"):
        Kubectl("/nowhere/kubectl --kubeconfig x")("version")
