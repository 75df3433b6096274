"""Overload: a burst far above a small queue's capacity gets fast, explicit 503s, then normal service."""

import pytest
import requests

from bench import overload
from rtserve.client.rest import Overloaded, _error
from tests.conftest import MODEL_NAME
from tests.helpers import bench_main

pytestmark = pytest.mark.integration


def test_burst_is_refused_fast_then_served(mar_v1, tmp_path):
    """bench/overload.py's main on a server of its own: queue of 4, 1 worker."""
    rc, report = bench_main(
        overload.main,
        tmp_path / "report.json",
        "--model-store",
        mar_v1.parent,
        "--run-root",
        tmp_path,
        "--queue",
        4,
        "--workers",
        1,
        "--burst",
        150,
        "--after",
        50,
    )
    assert rc == 0 and report["queue_size"] == 4 and report["workers"] == 1, report
    assert report["ok"] + report["refused_503"] == 150 and report["other"] == 0, report
    assert report["refused_503"] > 0, "the burst never filled a queue of 4"
    assert report["refusals_say_queue_full"], report["refusal_message"]
    # refused at once by the frontend, far below responseTimeout (10 s) and the client's 60 s,
    # as TorchServe's access log times them: it holds every request of the burst, and exactly
    # the 503s the client saw (so the maximum below is over parsed 503 lines, never a default)
    assert report["server_logged"] == 150, report
    assert report["server_refused_503"] == report["refused_503"], report
    assert report["server_refused_max_ms"] is not None and report["server_refused_max_ms"] < 1000, report
    assert report["after_ok"] == report["after_sent"] == 50

    # rtserve's client turns TorchServe's misleading "no worker" 503 into a clear Overloaded
    resp = requests.Response()
    resp.status_code, resp._content = 503, report["refusal_body"].encode()
    error = _error("POST", f"/predictions/{MODEL_NAME}", resp)
    assert isinstance(error, Overloaded)
    assert "job queue is full" in str(error) and "retry with backoff" in str(error)
