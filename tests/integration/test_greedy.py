"""Greedy batching (agent/, loaded by rtserve.server) on a real TorchServe.

The archive here waits up to 500 ms for each further request of a batch (``maxBatchDelay``), so
TorchServe's own batching shows plainly in the frontend's own timings (its access log's
milliseconds per request): a lone request waits the whole delay. With the agent it does not
wait, and requests that arrive together still share batches.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import yaml

from rtserve.server.properties import GREEDY_KEY, read_properties
from rtserve.server.torchserve import DEFAULT_CONFIG
from rtserve.settings import Settings
from tests.conftest import MODEL_NAME, REPO, make_archive
from tests.helpers import features, record_batches
from tests.integration.conftest import start_server

pytestmark = pytest.mark.integration

DELAY_MS = 500


@pytest.fixture(scope="module")
def slow_batching_mar(build_root, tmp_path_factory):
    """The default archive with maxBatchDelay 500 ms, built by `make archive`."""
    config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    config["maxBatchDelay"] = DELAY_MS
    path = tmp_path_factory.mktemp("config") / "model-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return make_archive(build_root, "1.0", store=build_root / "store-slow-batching", MODEL_CONFIG=str(path))


def server_vmargs() -> str:
    """The shipped JVM options (config.properties)."""
    return read_properties(DEFAULT_CONFIG)["vmargs"]


def serve(tmp_path_factory, mar, **overrides):
    server = start_server(tmp_path_factory.mktemp("run"), mar, overrides_extra=overrides)
    try:
        server.wait_ready(timeout=120, models=[MODEL_NAME])
    except Exception:
        server.stop()
        raise
    return server


def post(server, session=requests) -> requests.Response:
    key = server.client().keys.get("inference")
    return session.post(
        f"{server.props['inference_address']}/predictions/{MODEL_NAME}",
        data=json.dumps({"features": features()}),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=30,
    )


def frontend_ms(server) -> list[int]:
    """The frontend's milliseconds for every 200 prediction so far (access_log.log)."""
    pattern = re.compile(rf'"POST /predictions/{MODEL_NAME} HTTP/1.1" 200 (\d+)')
    log = server.log_dir / "access_log.log"
    return [int(ms) for ms in pattern.findall(log.read_text())] if log.exists() else []


def one_at_a_time(server, n: int) -> list[int]:
    """Send ``n`` predictions one after the other; the frontend's milliseconds for each, once
    its asynchronous appender has written them to the access log (at most 10 s later)."""
    logged = len(frontend_ms(server))
    with requests.Session() as session:
        for _ in range(n):
            assert post(server, session).status_code == 200
    deadline = time.monotonic() + 10
    while len(found := frontend_ms(server)[logged:]) < n:
        assert time.monotonic() < deadline, f"{len(found)} of {n} requests in the access log"
        time.sleep(0.05)
    return found


def agent_lines(server) -> list[str]:
    return [
        line
        for line in (server.run_dir / "launcher.log").read_text().splitlines()
        if line.startswith("[rtserve-agent]")
    ]


def test_greedy_answers_lone_requests_without_the_batch_delay_and_still_batches(slow_batching_mar, tmp_path_factory):
    server = serve(tmp_path_factory, slow_batching_mar)
    try:
        assert server.client().describe(MODEL_NAME)[0]["maxBatchDelay"] == DELAY_MS
        assert sorted(line.split(" (")[0] for line in agent_lines(server)) == [
            "[rtserve-agent] OIP model routes ON: patched "
            "org/pytorch/serve/http/api/rest/InferenceRequestHandler.handleRequest",
            "[rtserve-agent] greedy batching ON: patched org/pytorch/serve/wlm/Model.pollBatch",
            "[rtserve-agent] live routes ON: patched org/pytorch/serve/util/ApiUtils.addRESTInferenceJob",
        ]
        assert (
            "[rtserve-agent] greedy batching ON: patched org/pytorch/serve/wlm/Model.pollBatch "
            "(no wait for further jobs of a batch)" in agent_lines(server)
        )
        one_at_a_time(server, 4)  # warm-up: the first requests after a start pay one-off costs
        timings = one_at_a_time(server, 9)
        # Without the agent each would take the whole delay (the test below); the median is
        # robust to one request slowed by other work on a shared machine.
        assert statistics.median(timings) < DELAY_MS / 2, timings
        before = len(record_batches(server.files.records))
        with ThreadPoolExecutor(max_workers=32) as pool:
            answers = list(pool.map(lambda _: post(server), range(96)))
        assert [a.status_code for a in answers] == [200] * 96
        batches = record_batches(server.files.records)[before:]
        assert sum(size for size, _, _ in batches) == 96
        assert max(size for size, _, _ in batches) > 1, batches
    finally:
        server.stop()


@pytest.mark.parametrize("how", ["switched off", "wrong checksum"])
def test_without_the_agent_torchserve_waits_the_batch_delay(how, slow_batching_mar, tmp_path_factory):
    """The off switch, and an agent that finds another frontend than the pinned one: TorchServe's
    own batching, whose lone requests wait maxBatchDelay; the agent says why it did not patch."""
    if how == "switched off":
        server = serve(tmp_path_factory, slow_batching_mar, **{GREEDY_KEY: "false"})
    else:
        vmargs = f"{server_vmargs()} -javaagent:{Settings.from_env().agent_jar}=sha256={'0' * 64}"
        server = serve(tmp_path_factory, slow_batching_mar, vmargs=vmargs)
    try:
        lines = agent_lines(server)
        if how == "switched off":  # the agent still serves the OIP model routes and live routes
            assert sorted(line.split(":")[0] for line in lines) == [
                "[rtserve-agent] OIP model routes ON",
                "[rtserve-agent] live routes ON",
            ]
            assert ",greedy=off" in (server.run_dir / "config.properties").read_text()
        else:
            assert len(lines) == 1 and "greedy batching OFF" in lines[0]
            assert f"not the pinned {'0' * 64}" in lines[0] and "TorchServe runs stock" in lines[0]
        timings = one_at_a_time(server, 2)
        assert min(timings) >= DELAY_MS, timings
    finally:
        server.stop()
