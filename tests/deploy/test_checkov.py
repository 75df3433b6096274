"""checkov over every rendered overlay: no failed check; every skip is in the manifest with a reason.

checkov runs from its own virtualenv (`make k8s-deps`, pinned in requirements-checkov.txt):
its pins conflict with the test tools'. ``--skip-download`` keeps it offline.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO
from tests.deploy.conftest import (CANDIDATE_DIR, K8S_DIR, OVERLAYS, OWN_CANDIDATE, OWN_VERIFY, VERIFY_DIR,
                                   load, render, with_stream)

pytestmark = pytest.mark.deploy

CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"


@pytest.fixture(scope="module")
def checkov_report(tmp_path_factory) -> list[dict]:
    subprocess.run(["make", "-s", "k8s-deps"], cwd=REPO, check=True, timeout=600)
    out = tmp_path_factory.mktemp("rendered")
    for overlay in OVERLAYS:
        (out / f"{overlay}.yaml").write_text(render(K8S_DIR / "overlays" / overlay))
    (out / "verify.yaml").write_text(render(VERIFY_DIR))
    for overlay, path in OWN_VERIFY.items():
        (out / f"{overlay}-verify.yaml").write_text(render(path))
    (out / "candidate.yaml").write_text(render(CANDIDATE_DIR))
    for overlay, path in OWN_CANDIDATE.items():
        (out / f"{overlay}-candidate.yaml").write_text(render(path))
    for overlay in OVERLAYS:  # with the stream consumer's component enabled
        (out / f"{overlay}-stream.yaml").write_text(render(with_stream(overlay, tmp_path_factory.mktemp("stream"))))
    result = subprocess.run([str(CHECKOV), "-d", str(out), "--framework", "kubernetes",
                             "--skip-download", "--output", "json", "--compact"],
                            capture_output=True, text=True, timeout=300, cwd=out)
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    assert result.returncode == (1 if any(r["summary"]["failed"] for r in reports) else 0), result.stderr
    return reports


def manifest_skips(tmp_path) -> dict[str, str]:
    """check id -> reason, from the checkov.io/skip annotations of every rendered object."""
    skips: dict[str, str] = {}
    streams = [with_stream(overlay, tmp_path) for overlay in OVERLAYS]
    others = [VERIFY_DIR, *OWN_VERIFY.values(), *streams, CANDIDATE_DIR, *OWN_CANDIDATE.values()]
    for path in [K8S_DIR / "overlays" / overlay for overlay in OVERLAYS] + others:
        for obj in load(render(path)):
            for key, value in (obj["metadata"].get("annotations") or {}).items():
                if key.startswith("checkov.io/skip"):
                    check, _, reason = value.partition("=")
                    skips[check] = reason
    return skips


def test_no_failed_check(checkov_report):
    (report,) = checkov_report
    assert report["check_type"] == "kubernetes"
    failed = [(c["check_id"], c["resource"]) for c in report["results"]["failed_checks"]]
    assert failed == []
    assert report["summary"]["passed"] > 100  # it really looked at the Deployment's pod spec
    looked_at = {c["resource"].split(".")[0] + "/" + c["resource"].split(".")[-1]
                 for c in report["results"]["passed_checks"]}
    assert "Job/rtserve-verify" in looked_at, "the verification Job was not checked"
    assert "Deployment/rtserve-stream" in looked_at, "the stream consumer was not checked"
    assert "Deployment/rtserve-candidate" in looked_at, "the candidate was not checked"
    assert "StatefulSet/rtserve-cassandra" in looked_at, "the records store's node was not checked"
    assert "StatefulSet/rtserve-kafka" in looked_at, "the stream's broker was not checked"
    passed = {c["check_id"] for c in report["results"]["passed_checks"]}
    # a few that the issue names: non-root, read-only root, probes, limits, no SA token, seccomp
    assert {"CKV_K8S_23", "CKV_K8S_22", "CKV_K8S_8", "CKV_K8S_9", "CKV_K8S_11", "CKV_K8S_13",
            "CKV_K8S_38", "CKV_K8S_31", "CKV_K8S_37", "CKV_K8S_14"} <= passed


def test_every_skip_is_annotated_with_a_written_reason(checkov_report, tmp_path):
    (report,) = checkov_report
    skipped = {c["check_id"] for c in report["results"]["skipped_checks"]}
    reasons = manifest_skips(tmp_path)
    assert skipped == set(reasons)
    for check, reason in reasons.items():
        assert len(reason.split()) >= 10, f"{check}: the reason is too short: {reason!r}"
    # CKV_K8S_15 (pull policy Always) only where the images come from the node: the local overlay.
    assert skipped == {"CKV_K8S_43", "CKV_K8S_15"}, "a new skip: name it in docs/kubernetes.md's offline checks"
    pull = [c["resource"] for c in report["results"]["skipped_checks"] if c["check_id"] == "CKV_K8S_15"]
    assert pull and all("rtserve-local" in r for r in pull), pull
