"""The start-up warm-up on a real TorchServe: a freshly started server has answered a few
hundred warm-up requests before ``wait_ready`` returns, none of them is in the audit trail, the
handler's counters or the request-duration histogram, and the first client request is served
about as fast as the steady ones."""

from __future__ import annotations

import re
import time

import pytest
import requests

from bench.perf import timed_post
from handler.warmup import HEADER
from rtserve.server.warmup import WarmupConfig
from rtserve.settings import WARM_FILE
from tests.conftest import MODEL_NAME, REPO
from tests.helpers import records
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

ACCESS = re.compile(r'"POST (?P<uri>/predictions/\S+) HTTP/1.1" (?P<status>\d{3}) (?P<ms>\d+)$')
#: Sequential client requests after the first, whose server-side times are "steady".
STEADY = 100


@pytest.fixture(scope="module")
def fresh(server):
    """This module's server (tests/integration/conftest.py), just started and reported ready:
    the first test runs before any client traffic."""
    return server


def access_lines(server, at_least: int) -> list[re.Match]:
    """The inference lines of the access log, once it holds ``at_least`` of them (the frontend
    writes it asynchronously)."""
    deadline = time.monotonic() + 10
    while True:
        text = (server.log_dir / "access_log.log").read_text()
        found = [m for m in map(ACCESS.search, text.splitlines()) if m]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def scraped(server, name: str) -> float:
    text = requests.get(f"{server.props['metrics_address']}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{")
        and f'model_name="{MODEL_NAME}"' in line
        and 'status_class="4xx"' not in line
        and 'status_class="5xx"' not in line
    )


def audit(server) -> list[dict]:
    return records(server.files.records)


def test_warm_up_answers_are_correct_and_kept_out_of_every_record(fresh):
    config = WarmupConfig.from_props(fresh.props)
    assert (fresh.run_dir / WARM_FILE).is_file()
    lines = access_lines(fresh, 2)
    warm = [m for m in lines if "?rtserve_warmup=1" in m["uri"]]
    client = [m for m in lines if "?rtserve_warmup=1" not in m["uri"]]
    # bounded by count and time: all of them on a quiet machine; on a busy one, as many as its
    # seconds allowed (and then it stopped because they were spent), each in the access log
    report = fresh.warmed[MODEL_NAME]
    assert 1 <= report.requests <= config.requests and len(warm) == report.requests, (report, len(warm))
    assert report.requests == config.requests or report.seconds >= config.seconds - 0.001, report
    assert {m["status"] for m in warm} == {"200"}  # wait_ready also checked each answer's probabilities
    # what was recorded is exactly the one readiness prediction wait_ready sends before the warm-up
    assert len(client) == 1
    assert len(audit(fresh)) == 1
    assert scraped(fresh, "rtserve_handler_requests_total") == 1
    assert scraped(fresh, "rtserve_request_duration_seconds_count") == 1


def first_and_steady(server) -> tuple[int, list[int]]:
    """One client request on a new connection, then ``STEADY`` more and one carrying the warm-up
    header with a key of its own (served and recorded like any other): the first's server-side
    ms and the steady ones', sorted; each is checked in the audit trail and the metrics."""
    url = f"{server.props['inference_address']}/predictions/{MODEL_NAME}"
    token = {"Authorization": f"Bearer {server.client().keys.get('inference')}"}
    body = (REPO / "examples" / "request.json").read_bytes()
    before = len(access_lines(server, 2))
    client_ms = []
    for _ in range(1 + STEADY):  # the first on a new connection, as each of these is
        status, seconds = timed_post(url, body, token)
        assert status == 200
        client_ms.append(seconds * 1000)
    guess = requests.post(
        url, data=body, timeout=10, headers={**token, "Content-Type": "application/json", HEADER: "x" * 43}
    )
    assert guess.status_code == 200
    lines = access_lines(server, before + STEADY + 2)[before:]
    server_ms = [int(m["ms"]) for m in lines]
    assert len(server_ms) == STEADY + 2
    steady = sorted(server_ms[1 : STEADY + 1])
    print(
        f"first request: {server_ms[0]} ms in the server ({client_ms[0]:.2f} ms at the client); "
        f"the next {STEADY}: server p50 {steady[STEADY // 2]} ms, p99 {p99_of(steady)} ms; client p50 "
        f"{sorted(client_ms[1:])[STEADY // 2]:.2f} ms"
    )
    time.sleep(1.5)  # the exporter reads the access log every second
    assert len(audit(server)) == 1 + STEADY + 2
    assert scraped(server, "rtserve_handler_requests_total") == 1 + STEADY + 2
    assert scraped(server, "rtserve_request_duration_seconds_count") == 1 + STEADY + 2
    return server_ms[0], steady


def p99_of(steady: list[int]) -> int:
    return steady[int(0.99 * STEADY) - 1]


def test_the_first_request_is_served_like_the_steady_ones_and_recorded(fresh, mar_v1, tmp_path_factory):
    """The frontend's own time for the first request, in whole ms: within one millisecond (its
    resolution) of 2x the steady p99 (before the warm-up it spent about 6 ms more). A single
    first request is one sample: on a machine busy with other work (CI runs tiers side by side)
    a scheduling stall can land on it, so a miss is measured once more on a second fresh server,
    and the test fails when both miss: a warm-up that does not work misses every time."""
    first, steady = first_and_steady(fresh)
    if first > 2 * p99_of(steady) + 1:
        print(f"{first} ms > 2 x {p99_of(steady)} + 1 ms: once more, on a second fresh server")
        with serve(tmp_path_factory.mktemp("run"), mar_v1) as again:
            first, steady = first_and_steady(again)
    assert first <= 2 * p99_of(steady) + 1, (first, steady)
