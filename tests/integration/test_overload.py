"""Overload: a burst far above a small queue's capacity gets fast, explicit 503s, then normal service."""

import pytest
import requests

from bench.overload import run
from rtserve.client import Overloaded, _error
from tests.conftest import MODEL_NAME
from tests.integration.conftest import start_server

pytestmark = pytest.mark.integration


def test_burst_is_refused_fast_then_served(mar_v1, tmp_path):
    ts = start_server(tmp_path / "run", mar_v1, overrides_extra={"job_queue_size": "4"})
    try:
        ts.wait_ready(120, [MODEL_NAME])
        ts.client(timeout=60).scale(MODEL_NAME, 1)
        report = run(ts, MODEL_NAME, n=150, after=50)
    finally:
        ts.stop()
    assert report["ok"] + report["refused_503"] == 150 and report["other"] == 0, report
    assert report["refused_503"] > 0, "the burst never filled a queue of 4"
    assert report["refusals_say_queue_full"], report["refusal_message"]
    # refused at once by the frontend, far below responseTimeout (10 s) and the client's 60 s
    assert report["server_refused_max_ms"] < 1000, report
    assert report["after_ok"] == report["after_sent"] == 50

    # rtserve's client turns TorchServe's misleading "no worker" 503 into a clear Overloaded
    resp = requests.Response()
    resp.status_code, resp._content = 503, report["refusal_body"].encode()
    error = _error("POST", f"/predictions/{MODEL_NAME}", resp)
    assert isinstance(error, Overloaded)
    assert "job queue is full" in str(error) and "retry with backoff" in str(error)
