"""components/gpu, validated offline: production with one GPU per pod, scaled on the GPU's
utilization beside its other signals, the rest of the overlay unchanged (no GPU is needed here:
nothing runs)."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.conftest import K8S_DIR, K8S_VERSION, load, render

pytestmark = pytest.mark.deploy

RULES = K8S_DIR.parent / "monitoring" / "prometheus-adapter.yaml"


def with_gpu(into: Path, overlay: str = "production") -> Path:
    """A copy of the kustomize tree whose ``overlay`` lists components/gpu, as its kustomization.yaml
    tells a user to; returns that overlay's directory."""
    tree = into / "k8s"
    shutil.copytree(K8S_DIR, tree)
    path = tree / "overlays" / overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    kustomization["components"] = [*kustomization.get("components", []), "../../components/gpu"]
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return path.parent


def by_kind(objects: list[dict]) -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_gpu_component_adds_a_gpu_per_pod_and_scales_on_its_utilization(tmp_path):
    plain = by_kind(load(render(K8S_DIR / "overlays" / "production")))
    gpu = by_kind(load(render(with_gpu(tmp_path))))
    for obj in gpu.values():
        # strict: unknown fields fail (an extended resource is a valid quantity name)
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == "1.32"
    assert set(gpu) == set(plain)
    dep = gpu[("Deployment", "rtserve")]["spec"]["template"]["spec"]
    (rtserve,) = [c for c in dep["containers"] if c["name"] == "rtserve"]
    assert rtserve["resources"]["requests"]["nvidia.com/gpu"] == 1 == rtserve["resources"]["limits"]["nvidia.com/gpu"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in dep["tolerations"]
    metrics = gpu[("HorizontalPodAutoscaler", "rtserve")]["spec"]["metrics"]
    before = plain[("HorizontalPodAutoscaler", "rtserve")]["spec"]["metrics"]
    assert metrics[: len(before)] == before and len(metrics) == len(before) + 1
    added = metrics[-1]["pods"]
    served = {r["name"]["as"] for r in yaml.safe_load(RULES.read_text())["rules"]}
    assert added["metric"]["name"] == "rtserve_gpu_utilization" in served
    assert 0 < float(added["target"]["averageValue"]) <= 100
    # Nothing else changed: the Deployment without the GPU and the toleration is production's.
    undone = copy.deepcopy(gpu[("Deployment", "rtserve")])
    spec = undone["spec"]["template"]["spec"]
    del spec["tolerations"]
    for side in ("requests", "limits"):
        del next(c for c in spec["containers"] if c["name"] == "rtserve")["resources"][side]["nvidia.com/gpu"]
    assert undone == plain[("Deployment", "rtserve")]
    assert all(gpu[key] == plain[key] for key in plain if key[0] not in ("Deployment", "HorizontalPodAutoscaler"))
