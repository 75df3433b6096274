"""make gpu-check without a GPU: it says so and fails; its parts run with the CPU standing in.

No GPU exists here or on CI, so the forward check runs with ``device="cpu"`` in the GPU's place (the
same loading, agreement and timing code), and the GPU tests' verdict is checked on JUnit reports
and on a missing import.
"""

from __future__ import annotations

import pytest
import torch

from bench import gpu_check
from bench.example_models import Example

pytestmark = pytest.mark.unit

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_device" name="test_no_gpu_id_means_the_cpu" time="0.01" />
<testcase classname="tests.unit.test_device" name="test_handler_on_a_real_gpu" time="0.0">
<skipped type="pytest.skip" message="needs a CUDA GPU (none here or on CI)">skip</skipped></testcase>
<testcase classname="tests.unit.test_device" name="test_broken" time="0.0">
<failure message="assert 1 == 2">trace</failure></testcase>
</testsuite></testsuites>"""


def test_without_a_gpu_it_says_so_and_exits_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "gpu.json")]) == gpu_check.NO_GPU == 2
    out = capsys.readouterr().out
    assert out.startswith("no CUDA GPU found: torch ") and out.rstrip().endswith("nothing was checked"), out
    assert not (tmp_path / "gpu.json").exists()


def test_junit_outcomes():
    assert gpu_check.junit_outcomes(JUNIT) == {
        "test_no_gpu_id_means_the_cpu": ("passed", ""),
        "test_handler_on_a_real_gpu": ("skipped", "needs a CUDA GPU (none here or on CI)"),
        "test_broken": ("failed", "assert 1 == 2"),
    }


def test_the_gpu_tests_need_their_imports(monkeypatch):
    monkeypatch.setattr(gpu_check, "importable", lambda module: module not in ("ts", "captum"))
    passed, lines = gpu_check.run_gpu_tests("python3")
    assert not passed
    assert lines == [
        "GPU tests not run: python3 lacks ts (torchserve), captum (captum) (carry their wheels: docs/performance.md)"
    ]


def test_the_forward_check_with_the_cpu_in_the_gpus_place(trained_dir):
    result = gpu_check.check_example(Example("demo", ""), trained_dir, calls=5, device="cpu")
    assert result["agrees"] and result["max_abs_diff"] == 0.0
    assert result["forward_path"].startswith("direct forward")
    assert set(result["batches"]) == set(gpu_check.BATCHES)
    assert all(v > 0 for b in result["batches"].values() for v in b.values()), result
    lines = gpu_check.table([result]).splitlines()
    assert lines[0].split()[:2] == ["example", "batch"]
    assert [line.split()[:2] for line in lines[1:]] == [["demo", "1"], ["demo", "64"]]
    assert all(line.endswith("(agrees)") for line in lines[1:])
