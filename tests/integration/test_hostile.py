"""Hostile input over HTTP against a real TorchServe (a short run of bench/hostile_input.py's main)."""

import pytest

from bench import hostile_input
from tests.helpers import bench_main

pytestmark = pytest.mark.integration


def test_hostile_corpus_mixed_with_valid_traffic(server, tmp_path):
    rc, report = bench_main(hostile_input.main, tmp_path / "report.json", "--attach", server.run_dir,
                            "--bad", 300, "--concurrency", 12)
    assert rc == 0
    assert report["sent"] == 600
    assert report["valid_ok"] == 300 and report["valid_failed"] == 0, report["examples_not_4xx"]
    assert report["bad_4xx"] == 300 and report["five_xx"] == 0, report["examples_not_4xx"]
    assert report["worker_pids_unchanged"]
    assert report["by_kind"].get("oversized -> 413", 0) > 0  # the size limit answered, not the handler
