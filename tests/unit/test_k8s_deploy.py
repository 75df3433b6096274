"""rtserve.k8s.deploy's pure parts: the kustomizations it writes, how it reads a Job's conditions,
a duration and a crashed pod, and what it refuses before any call to a cluster. The steps
themselves (apply, wait, verify, undo) run against a real API server and node in the cluster
tier (tests/cluster/test_deploy.py); the two tests here that need answers no healthy cluster
gives at will (a Job that never ends) use a recording fake, and say so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rtserve.errors import DeployError
from rtserve.k8s.deploy import (
    JOB_CONDITIONS,
    JOB_FAILURE,
    Kubectl,
    Target,
    crashed,
    deploy,
    deploy_kustomization,
    job_result,
    seconds,
    uses_image,
    verify,
    verify_kustomization,
    why_stuck,
)

pytestmark = pytest.mark.unit

IMG = "registry.example.com/ml/rtserve"


class FakeKubectl:
    """Records each call; ``kustomize`` writes manifests naming ``image``; ``get`` of the Job
    answers ``conditions`` in turn; a call whose first words are in ``fail`` raises."""

    binary = "kubectl"

    def shown(self, *args: str) -> str:
        return " ".join([self.binary, *args])

    def __init__(self, image: str, conditions=("Complete",), fail=()) -> None:
        self.image, self.conditions, self.fail = image, list(conditions), fail
        self.calls: list[tuple[str, ...]] = []

    def __call__(
        self, *args: str, capture: bool = False, into: Path | None = None, quiet: bool = False, errors: bool = True
    ) -> str:
        self.calls.append(args)
        words = tuple(a for a in args if not a.startswith("-") and a != "rtserve-staging")
        if any(words[: len(f)] == f for f in self.fail):
            raise DeployError(f"kubectl {' '.join(args)} exited 1")
        if args[0] == "kustomize":
            into.write_text(f"kind: Deployment\nspec:\n  containers:\n    - args: []\n      image: {self.image}\n")
        if "get" in args:
            return self.conditions.pop(0) if len(self.conditions) > 1 else self.conditions[0]
        return ""


def target(tmp_path: Path, overlay: str = "staging", timeout: int = 10) -> Target:
    k8s = tmp_path / "k8s"
    (k8s / "overlays" / "staging").mkdir(parents=True, exist_ok=True)
    (k8s / "verify").mkdir(exist_ok=True)
    return Target(
        k8s,
        overlay,
        f"rtserve-{overlay}",
        "rtserve",
        IMG,
        "2.0",
        "realtime-classifier",
        tmp_path / "build" / overlay,
        tmp_path / "build" / f"{overlay}-verify",
        verify_timeout=timeout,
    )


def test_the_kustomizations_are_the_overlay_and_the_job_with_this_rollouts_image(tmp_path):
    t = target(tmp_path)
    assert deploy_kustomization(t).splitlines() == [
        "# Written by make k8s-deploy: the overlay with this rollout's image and change cause.",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        "  - ../../k8s/overlays/staging",
        "images:",
        f"  - name: {IMG}",
        '    newTag: "2.0"',
        "patches:",
        "  - patch: |-",
        "      apiVersion: apps/v1",
        "      kind: Deployment",
        "      metadata:",
        "        name: rtserve",
        "        annotations:",
        f'          kubernetes.io/change-cause: "realtime-classifier 2.0 ({IMG}:2.0) by make k8s-deploy"',
    ]
    assert verify_kustomization(t).splitlines() == [
        "# Written by make k8s-verify: the verification Job for this rollout.",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "namespace: rtserve-staging",
        "resources:",
        "  - ../../k8s/verify",
        "images:",
        f"  - name: {IMG}",
        '    newTag: "2.0"',
    ]


def test_image_and_job_conditions_are_read_exactly():
    assert uses_image(f"spec:\n    image: {IMG}:2.0\n", f"{IMG}:2.0")  # as kustomize writes it
    assert not uses_image(f"    image: {IMG}:2.0.1\n", f"{IMG}:2.0")
    assert not uses_image(f"    image: other/{IMG}:2.0\n", f"{IMG}:2.0")
    assert job_result("Complete") == "Complete" and job_result("Failed") == "Failed"
    assert job_result("") is None and job_result("Suspended") is None


def verify_steps(t: Target, polls: int = 1) -> list[tuple[str, ...]]:
    job = "job/rtserve-verify"
    return [
        ("kustomize", str(t.verify_build_dir)),
        ("-n", t.namespace, "delete", job, "--ignore-not-found", "--wait=true"),
        ("apply", "-f", str(t.verify_build_dir / "manifests.yaml")),
        *[("-n", t.namespace, "get", job, "-o", JOB_CONDITIONS)] * polls,
        ("-n", t.namespace, "logs", job),
    ]


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
    assert kubectl.calls[:-2] == verify_steps(t, polls=3) and slept == [2, 2, 2]
    assert [c[:4] for c in kubectl.calls[-2:]] == [
        ("-n", t.namespace, "get", "pods"),
        ("-n", t.namespace, "get", "events"),
    ]


def test_a_failed_verification_says_why_the_job_failed_and_shows_the_pods(tmp_path, capsys):
    """CI's log said only "(Failed)" when the Job's pod had been deleted at its deadline (no log to
    show): the Failed condition's reason and the namespace's pods and warnings now come with it."""
    t = target(tmp_path)
    deadline = "DeadlineExceeded: Job was active longer than specified deadline"
    kubectl = FakeKubectl(f"{IMG}:2.0", conditions=("Failed", deadline, "NAME READY STATUS", "LAST COUNT"))
    with pytest.raises(DeployError, match=rf"failed \(Failed: {deadline}\)"):
        verify(t, kubectl, sleep=lambda _: None)
    assert kubectl.calls[: len(verify_steps(t))] == verify_steps(t)
    assert [c[:4] for c in kubectl.calls[len(verify_steps(t)) :]] == [
        ("-n", t.namespace, "get", "job/rtserve-verify"),
        ("-n", t.namespace, "get", "pods"),
        ("-n", t.namespace, "get", "events"),
    ]
    unknown = FakeKubectl(f"{IMG}:2.0", conditions=("Failed",), fail=(("get", "job/rtserve-verify", JOB_FAILURE),))
    with pytest.raises(DeployError, match=r"failed \(Failed\)"):
        verify(t, unknown, sleep=lambda _: None)


def test_a_stuck_rollout_shows_the_pods_and_the_latest_warning_events(tmp_path, capsys):
    """What CI's log lacked when two pods stayed unready past the progress deadline (a fake:
    the events a starved node gives cannot be made at will)."""
    events = ["LAST COUNT OBJECT REASON MESSAGE"] + [f"t{i} 1 pod-{i} Unhealthy probe timed out" for i in range(20)]
    kubectl = FakeKubectl(f"{IMG}:2.0", conditions=("\n".join(events),))
    why_stuck(target(tmp_path), kubectl, events=3)
    assert [c[:4] for c in kubectl.calls] == [
        ("-n", "rtserve-staging", "get", "pods"),
        ("-n", "rtserve-staging", "get", "events"),
    ]
    assert capsys.readouterr().out.splitlines() == [
        ">> the namespace's last 3 warning events:",
        events[0],
        *events[-3:],
    ]
    broken = FakeKubectl(f"{IMG}:2.0", fail=(("get", "pods"),))
    why_stuck(target(tmp_path), broken)  # a lookup that fails is skipped: the rollout's error stays
    assert capsys.readouterr().out == ""


def test_a_stricter_p99_for_the_verification_is_added_to_the_jobs_arguments(tmp_path):
    import dataclasses

    import yaml

    t = dataclasses.replace(target(tmp_path), verify_max_p99_ms=12.5)
    patch = yaml.safe_load(yaml.safe_load(verify_kustomization(t))["patches"][0]["patch"])
    assert patch == [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--max-p99-ms=12.5"}]
    assert "patches" not in yaml.safe_load(verify_kustomization(target(tmp_path)))


def test_durations_read_as_kubectl_writes_them():
    assert [seconds(d) for d in ("15m", "90s", "1h30m", "120")] == [900, 90, 5400, 120]
    with pytest.raises(DeployError, match="not a duration: '15 minutes'"):
        seconds("15 minutes")


def _pod(name: str, template: str, restarts: int, exit_code: int) -> dict:
    last = {"terminated": {"exitCode": exit_code, "reason": "Error"}} if restarts else {}
    return {
        "metadata": {"name": name, "labels": {"pod-template-hash": template}},
        "status": {"containerStatuses": [{"name": "rtserve", "restartCount": restarts, "lastState": last}]},
    }


def test_a_new_pod_that_exited_with_an_error_and_restarted_has_crashed():
    pods = {"items": [_pod("old", "aaa", 3, 1), _pod("new-1", "bbb", 0, 0)]}
    assert crashed(pods, "bbb") is None  # the old revision's restarts are not the rollout's
    pods["items"].append(_pod("new-2", "bbb", 1, 1))
    assert crashed(pods, "bbb") == ("container rtserve of pod new-2 exited 1 (Error) and restarted 1 time(s)")
    assert crashed({"items": [_pod("new-3", "bbb", 1, 0)]}, "bbb") is None  # a clean exit


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
    script.write_text('#!/bin/sh\necho "$@"\n')
    script.chmod(0o755)
    said = []
    kubectl = Kubectl(f"{script} --kubeconfig '{tmp_path}/admin kubeconfig'", out=said.append)
    assert kubectl("get", "nodes", capture=True) == f"--kubeconfig {tmp_path}/admin kubeconfig get nodes\n"
    assert said == [f"{script} --kubeconfig '{tmp_path}/admin kubeconfig' get nodes"]
    with pytest.raises(DeployError, match="no kubectl command given"):
        Kubectl("  ")
    with pytest.raises(DeployError, match=r"cannot run /nowhere/kubectl: \[Errno 2\]"):
        Kubectl("/nowhere/kubectl --kubeconfig x")("version")
