"""The stream consumer's process imports no torch: it validates events with handler.schema but
never makes a tensor (torch alone is ~500 MiB of RSS per process with the CUDA build)."""

import subprocess
import sys

from tests.conftest import REPO


def test_the_stream_consumer_imports_no_torch():
    code = (
        "import sys, psutil; import rtserve.stream.service, rtserve.stream.consumer, rtserve.cli; "
        "print(sorted(m for m in ('torch', 'handler.model') if m in sys.modules), "
        "psutil.Process().memory_info().rss // 2**20)"
    )  # (ru_maxrss would count the forked parent's)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported, rss_mib = done.stdout.split("] ")
    assert imported + "]" == "[]", done.stdout
    assert int(rss_mib) < 200, f"{rss_mib} MiB at import"
