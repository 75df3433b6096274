"""A candidate beside the default (`make k8s-shadow`, `make k8s-canary`): deploy/k8s/candidate and
the local overlay's own, rendered by the real ``kubectl kustomize`` and checked against the
overlays they run beside (checkov runs over them in test_checkov.py)."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest

from rtserve.k8s.deploy import Target
from rtserve.promotion.live.kubectl import (CANDIDATE, CANDIDATE_SELECTOR, POD_RUN, ROUTES_CONFIGMAP, ROUTES_KEY,
                                           candidate_kustomization, candidate_target, candidate_url)
from tests.deploy.conftest import (CANDIDATE_DIR, INFERENCE_PORT, K8S_DIR, K8S_VERSION, OVERLAYS, OWN_CANDIDATE,
                                   dns_rules, load, one, pull_policy, render)

pytestmark = pytest.mark.deploy

#: What each overlay's candidate renders from: its own candidate/ or the shared one.
SOURCES = {o: OWN_CANDIDATE.get(o, CANDIDATE_DIR) for o in OVERLAYS}


@pytest.fixture(scope="module")
def candidates() -> dict[str, list[dict]]:
    """source name ("candidate", "<overlay>-candidate") -> its rendered objects."""
    out = {"candidate": load(render(CANDIDATE_DIR))}
    out.update({f"{o}-candidate": load(render(path)) for o, path in OWN_CANDIDATE.items()})
    return out


@pytest.fixture(scope="module")
def overlays() -> dict[str, list[dict]]:
    return {o: load(render(K8S_DIR / "overlays" / o)) for o in OVERLAYS}


def pod(objects: list[dict], name: str) -> dict:
    return one(objects, "Deployment", name)["spec"]["template"]


def test_the_local_overlay_has_its_own_candidate():
    assert set(OWN_CANDIDATE) == {"local", "local-records", "local-stream"}


@pytest.mark.parametrize("name", ["candidate", "local-candidate"])
def test_candidate_validates_strictly_and_holds_only_its_own_objects(candidates, name):
    objects = candidates[name]
    for obj in objects:
        assert kubernetes_validate.validate(obj, K8S_VERSION, strict=True) == "1.32"
        labels = obj["metadata"]["labels"]
        # make k8s-live-stop deletes by this label: every object carries it
        key, value = CANDIDATE_SELECTOR.split("=")
        assert labels[key] == value, obj["metadata"]["name"]
    names = {(o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] == "ConfigMap"
              else o["metadata"]["name"]) for o in objects}
    assert names == {("ServiceAccount", CANDIDATE), ("ConfigMap", "rtserve-config-candidate"),
                     ("ConfigMap", "rtserve-gateway-candidate"), ("Service", CANDIDATE),
                     ("Deployment", CANDIDATE), ("NetworkPolicy", CANDIDATE),
                     ("NetworkPolicy", "rtserve-to-candidate")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_selector_of_the_default_matches_the_candidate_and_the_other_way_round(candidates, overlays, overlay):
    source = "local-candidate" if overlay in OWN_CANDIDATE else "candidate"
    objects, default = candidates[source], overlays[overlay]
    cand_labels = pod(objects, CANDIDATE)["metadata"]["labels"]
    default_labels = pod(default, "rtserve")["metadata"]["labels"]

    def matches(selector: dict, labels: dict) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    selectors = [one(default, "Deployment", "rtserve")["spec"]["selector"]["matchLabels"],
                 one(default, "Service", "rtserve")["spec"]["selector"],
                 one(default, "Service", "rtserve-management")["spec"]["selector"],
                 one(default, "PodDisruptionBudget", "rtserve")["spec"]["selector"]["matchLabels"],
                 one(default, "NetworkPolicy", "rtserve")["spec"]["podSelector"]["matchLabels"]]
    assert all(matches(s, default_labels) and not matches(s, cand_labels) for s in selectors)
    deployment = one(objects, "Deployment", CANDIDATE)
    assert deployment["spec"]["replicas"] == 1
    for selector in (deployment["spec"]["selector"]["matchLabels"], one(objects, "Service", CANDIDATE)["spec"]["selector"]):
        assert matches(selector, cand_labels) and not matches(selector, default_labels)
    assert "version" not in str(deployment["spec"]["selector"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_candidate_pod_is_the_defaults_but_for_names_image_and_live_routes(candidates, overlays, overlay):
    source = "local-candidate" if overlay in OWN_CANDIDATE else "candidate"
    cand = pod(candidates[source], CANDIDATE)["spec"]
    default = pod(overlays[overlay], "rtserve")["spec"]
    # the default pods follow the ConfigMap rtserve-live-routes (optional: made by make k8s-shadow)
    (volume,) = [v for v in default["volumes"] if v["name"] == "live-routes"]
    assert volume["configMap"] == {"name": ROUTES_CONFIGMAP, "optional": True}
    (rtserve,) = default["containers"]
    mount = next(m for m in rtserve["volumeMounts"] if m["name"] == "live-routes")
    variables = {e["name"]: e.get("value") for e in rtserve["env"]}
    assert mount["readOnly"] is True
    assert variables["RTSERVE_LIVE_ROUTES"] == f"{mount['mountPath']}/{ROUTES_KEY}"
    assert variables["RTSERVE_RUN_DIR"] == str(POD_RUN.path)
    # the candidate does not: else the same with the candidate's names
    (c_rtserve,) = cand["containers"]
    assert "RTSERVE_LIVE_ROUTES" not in {e["name"] for e in c_rtserve["env"]}
    assert "live-routes" not in {v["name"] for v in cand["volumes"]}
    for key in ("probes", "securityContext", "resources", "lifecycle", "args", "ports"):
        for c, d in ((c_rtserve, rtserve), (cand["initContainers"][0], default["initContainers"][0])):
            for field in ([key] if key != "probes" else ["startupProbe", "readinessProbe", "livenessProbe"]):
                assert c.get(field) == d.get(field), (c["name"], field)
    for key in ("securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken",
                "shareProcessNamespace"):
        assert cand[key] == default[key], key
    assert cand["serviceAccountName"] == CANDIDATE
    assert {c["imagePullPolicy"] for c in cand["containers"] + cand["initContainers"]} == {pull_policy(overlay)}
    assert cand["initContainers"][0]["image"] == default["initContainers"][0]["image"]
    assert c_rtserve["image"].rsplit(":", 1)[0] == rtserve["image"].rsplit(":", 1)[0]


def test_network_policies_let_only_the_default_pods_reach_the_candidate(candidates):
    objects = candidates["local-candidate"]
    ingress = one(objects, "NetworkPolicy", CANDIDATE)
    assert ingress["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": CANDIDATE}
    assert ingress["spec"]["egress"] == []
    inference = [r for r in ingress["spec"]["ingress"] if r["ports"][0]["port"] == INFERENCE_PORT]
    assert inference == [{"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rtserve"}}}],
                          "ports": [{"port": INFERENCE_PORT, "protocol": "TCP"}]}]
    egress = one(objects, "NetworkPolicy", "rtserve-to-candidate")
    assert egress["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "rtserve"}
    assert egress["spec"]["policyTypes"] == ["Egress"]
    to = [(r["to"][0], [p["port"] for p in r["ports"]]) for r in egress["spec"]["egress"]]
    assert to[0] == ({"podSelector": {"matchLabels": {"app.kubernetes.io/name": CANDIDATE}}}, [INFERENCE_PORT])
    # the cluster DNS: the routes name the Service by its DNS name (kube-system's, and the local node's)
    assert egress["spec"]["egress"][1:] == dns_rules("local")
    assert {o["metadata"]["namespace"] for o in objects} == {"rtserve-local"}


def test_the_rollouts_kustomization_sets_the_namespace_and_the_candidates_tag(tmp_path):
    t = candidate_target(Target(K8S_DIR, "local", "rtserve-local", "rtserve", "registry.example.com/ml/rtserve",
                                "3.1", "realtime-classifier", tmp_path / "local", tmp_path / "local-verify"),
                         SOURCES["local"])
    assert t.app == CANDIDATE and t.build_dir == Path(f"{tmp_path / 'local'}-candidate")
    t.build_dir.mkdir(parents=True)
    (t.build_dir / "kustomization.yaml").write_text(candidate_kustomization(t))
    objects = load(render(t.build_dir))
    (rtserve,) = pod(objects, CANDIDATE)["spec"]["containers"]
    assert rtserve["image"] == "registry.example.com/ml/rtserve:3.1"
    assert {o["metadata"]["namespace"] for o in objects} == {"rtserve-local"}
    url = candidate_url("rtserve-local", "realtime-classifier", "3.1")
    assert url == "http://rtserve-candidate.rtserve-local.svc:8080/predictions/realtime-classifier/3.1"
    service = one(objects, "Service", CANDIDATE)
    assert service["spec"]["ports"][0]["port"] == 8080 and service["spec"]["ports"][0]["targetPort"] == "inference"
