"""bench/cpu_split.py: command lines to kinds, and a busy process's CPU counted under its kind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench import cpu_split


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (
            "/v/bin/python /v/lib/python3.11/site-packages/ts/model_service_worker.py --sock-type unix",
            "torchserve worker",
        ),
        ("java -Dmodel_server_home=/v/site-packages -cp x org.pytorch.serve.ModelServer", "torchserve frontend (JVM)"),
        ("/root/.cache/rtserve/cluster/v1.36.3-x/bin/kubectl --kubeconfig k get pods", "kubectl"),
        (".venv/bin/python -m pytest tests/cluster -raP", "pytest: cluster tier"),
        (".venv/bin/python -m pytest --ignore=tests/cluster", "pytest: main tier"),
        ("[kdamond.0]", "kernel threads (kdamond, kswapd, ...)"),
        ("/usr/bin/skopeo copy --quiet containers-storage:x oci:/y:image", "podman, buildah, skopeo"),
    ],
)
def test_a_command_line_gets_its_kind(cmdline, expected):
    assert cpu_split.kind(cmdline) == expected


def test_a_busy_process_is_counted_under_its_kind():
    code = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"
    busy = subprocess.Popen([sys.executable, "-c", code])
    try:
        report = cpu_split.sample(busy.pid, seconds=30, interval=0.2)
    finally:
        busy.wait(30)
    assert report["kinds"].get("other python", 0) >= 0.6, report
    assert report["machine"]["busy"] >= report["kinds"]["other python"] - 0.2, report
