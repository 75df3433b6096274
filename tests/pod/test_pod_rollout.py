"""Rolling replacement with real pods behind a real nginx under load (bench/pod_rollout.py).

Two 1.0 pods are replaced one at a time by 2.0 pods (`make pod-rollout` also rolls back to 1.0,
the same replacement in reverse; docs/image-and-pod.md has its figures). The suite runs the
forward half to stay within its time budget.
"""

from __future__ import annotations

import os

import pytest

from bench import pod_rollout
from tests.helpers import bench_main
from tests.pod.conftest import podman

pytestmark = pytest.mark.pod


def test_pods_are_replaced_one_at_a_time_without_a_failed_request(images, tmp_path):
    prefix = f"rtserve-pytest-roll-{os.getpid()}"
    tags = ",".join(f"{version}={tag}" for version, tag in images.items())
    rc, report = bench_main(pod_rollout.main, tmp_path / "report.json", "--tags", tags,
                            "--work-dir", tmp_path / "rollout", "--hold", 1.0, "--rate", 40,
                            "--concurrency", 3, "--pod-prefix", prefix, "--no-roll-back")
    assert rc == 0
    # No request failed, counted on the first try: none needed rtserve's resend.
    assert report["failed_first"] == 0, [p["errors"] for p in report["phases"] if p["errors"]]
    assert report["resent"] == report["failed_after_resend"] == 0
    assert report["requests"] == report["sent"] == sum(p["sent"] for p in report["phases"])
    assert report["requests"] > 300
    phases = report["phases"]
    assert phases[0]["phase"] == "all on 1.0 [r1:1.0+r2:1.0]"
    assert [p["phase"] for p in phases if p["phase"].startswith("all on")] == [
        "all on 1.0 [r1:1.0+r2:1.0]", "all on 2.0 [r3:2.0+r4:2.0]"]
    assert report["steady_ok"]  # each steady phase answered by its version only
    assert any(p["versions"].keys() == {"1.0", "2.0"} for p in phases)
    actions = [(s["action"], s["replica"]) for s in report["steps"]]
    assert actions[:4] == [("start", "r1+r2"), ("start", "r3"), ("add", "r3"), ("remove", "r1")]
    # One at a time: each new pod is in the balancer before an old one goes out, and each old
    # one drains and stops only once out (its termination may overlap the next pod's start).
    for new, old in (("r3", "r1"), ("r4", "r2")):
        order = [actions.index(a) for a in (("start", new), ("add", new), ("remove", old),
                                            ("drain", old), ("stop", old))]
        assert order == sorted(order), (new, old, actions)
    assert [a for a, _ in actions].count("drain") == 2
    assert all(s["seconds"] >= 10 for s in report["steps"] if s["action"] == "drain"), \
        "preStop waits the manifest's 10 s propagation"
    assert report["auth"] == {
        "balancer without a key": 401, "balancer with a wrong key": 401,
        "balancer with a pod's TorchServe key": 401, "hop without a key": 401,
        "pod gateway without a key": 401, "balancer with the gateway key": 200,
    }
    pods = podman("pod", "ps", "--format", "{{.Name}}").stdout.split()
    assert not [p for p in pods if p.startswith(prefix)], pods
