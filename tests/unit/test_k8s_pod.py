"""rtserve.k8s.pod's pure parts: a pod's state from the API server's JSON, its cgroup paths on
the node, and bench/pod_report.py's CPU limit (the cluster tier runs them against real pods)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.pod_report import cpu_limit
from rtserve.k8s.pod import PodState, cgroup_dir

pytestmark = pytest.mark.unit


def pod_json(qos: str = "Burstable", ready: str = "True") -> dict:
    return {
        "metadata": {"name": "rtserve-abc", "uid": "1234-5678", "creationTimestamp": "2026-11-30T23:00:00Z"},
        "spec": {
            "initContainers": [{"name": "gateway", "resources": {"limits": {"cpu": "250m"}}}],
            "containers": [
                {
                    "name": "rtserve",
                    "image": "registry.example.com/ml/rtserve:2.0",
                    "resources": {"limits": {"cpu": "2"}},
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.244.0.7",
            "qosClass": qos,
            "conditions": [{"type": "Ready", "status": ready}],
            "initContainerStatuses": [{"name": "gateway", "restartCount": 0, "containerID": "containerd://aaa"}],
            "containerStatuses": [{"name": "rtserve", "restartCount": 2, "containerID": "containerd://bbb"}],
        },
    }


def test_a_pods_state_includes_its_native_sidecar():
    pod = PodState.of(pod_json())
    assert (pod.name, pod.ip, pod.phase, pod.ready, pod.version) == (
        "rtserve-abc",
        "10.244.0.7",
        "Running",
        True,
        "2.0",
    )
    assert pod.restarts == {"gateway": 0, "rtserve": 2}
    assert pod.container_ids == {"gateway": "aaa", "rtserve": "bbb"}
    assert PodState.of(pod_json(ready="False")).ready is False


@pytest.mark.parametrize(
    "qos,middle",
    [("Guaranteed", "kubepods"), ("Burstable", "kubepods/burstable"), ("BestEffort", "kubepods/besteffort")],
)
def test_cgroup_paths_follow_the_qos_class(qos, middle):
    pod = PodState.of(pod_json(qos))
    assert cgroup_dir(pod, "cpuacct") == Path(f"/sys/fs/cgroup/cpuacct/{middle}/pod1234-5678")
    assert cgroup_dir(pod, "memory", "rtserve") == Path(f"/sys/fs/cgroup/memory/{middle}/pod1234-5678/bbb")


def test_the_pods_cpu_limit_is_the_sum_of_its_containers():
    assert cpu_limit(pod_json()) == 2.25
    unlimited = pod_json()
    del unlimited["spec"]["containers"][0]["resources"]["limits"]
    assert cpu_limit(unlimited) is None
