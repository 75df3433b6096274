"""Hostile input over HTTP against a real TorchServe (a short run of bench/hostile_input.py's main)."""

import pytest

from bench import hostile_input
from tests.helpers import bench_main

pytestmark = pytest.mark.integration


def test_hostile_corpus_mixed_with_valid_traffic(server, tmp_path):
    rc, report = bench_main(
        hostile_input.main, tmp_path / "report.json", "--attach", server.run_dir, "--bad", 300, "--concurrency", 12
    )
    assert rc == 0
    assert report["sent"] == 600
    assert report["valid_ok"] == 300 and report["valid_failed"] == 0, report["examples_wrong_status"]
    assert report["bad_expected_status"] == 300 and report["five_xx"] == 0, report["examples_wrong_status"]
    assert report["worker_pids_unchanged"]
    # Each bad kind got exactly its own status: 413 for a body over max_request_size (the
    # frontend's size limit, before a worker sees it), 400 from the handler for every other kind;
    # so a regression to 401, 404, 429 or any other 4xx fails here.
    seen = {}
    for key in report["by_kind"]:
        kind, status = key.split(" -> ")
        seen.setdefault(kind, set()).add(status)
    assert seen.pop("valid") == {"200"}
    assert seen == {kind: {"413" if kind == "oversized" else "400"} for kind in hostile_input.KINDS}, report[
        "by_kind"
    ]  # (300 bad requests cover every kind)
