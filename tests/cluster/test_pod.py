"""`make pod`: the production pod on the local cluster's real kubelet, with the images `make image`
builds, called as a user calls it (the Service, through kube-proxy, with the gateway token).

These run after tests/cluster/test_deploy.py on the Deployment it leaves (1.0, two replicas, or
three when the autoscaler, reading the node's real CPU beside the other tiers, added one);
`make pod-stop` comes last and removes it. What Kubernetes does for the pod (probes, restarts,
the preStop hook, the security context) is the kubelet's own work here: the tests check what
our manifest and image ask of it.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from urllib.parse import urlparse

import numpy as np
import pytest
import requests
import tritonclient.http as triton

from bench import pod_report
from bench.loadgen import SteadyLoad, summarize
from rtserve.k8s.pod import memory_mib
from tests.cluster.conftest import DEPLOY_TIMEOUT, NAMESPACE, RATE, make
from tests.conftest import MODEL_NAME, require
from tests.helpers import bench_main, features

pytestmark = pytest.mark.cluster

ROW = features(value=1.5)


@pytest.fixture(scope="module")
def pod(served, image_vars, tmp_path_factory):
    """`make pod` against the test cluster: the rollout of the version the local overlay pins
    (1.0, already serving: nothing changes), verified again, then how to call it."""
    pod_dir = tmp_path_factory.mktemp("pod")
    served.ensure()
    done = make("pod", *served.cluster.make_vars, *image_vars, f"POD_DIR={pod_dir}", timeout=DEPLOY_TIMEOUT)
    assert done.returncode == 0, done.stdout[-6000:]
    served.pod_output, served.token_file = done.stdout, pod_dir / "gateway-token"
    return served


def predict(pod, headers=None, body=None) -> requests.Response:
    return requests.post(
        pod.url, json=body or {"features": ROW}, headers=headers if headers is not None else pod.auth, timeout=30
    )


def test_make_pod_rolls_out_verifies_and_prints_how_to_call_it(pod):
    out = pod.pod_output
    assert "registry.example.com/ml/rtserve:1.0 verified on local" in out, out[-3000:]
    # (2 replicas, or more when the autoscaler, reading the node's real CPU, added one)
    ready = re.search(rf"^>> (\d+) of \1 pods ready in namespace {NAMESPACE}, serving {MODEL_NAME} 1\.0: ", out, re.M)
    assert ready and int(ready[1]) >= 2, out[-2000:]
    assert f"predictions (the Service, through kube-proxy): {pod.url}" in out, out[-2000:]
    assert pod.token_file.stat().st_mode & 0o777 == 0o600
    assert pod.token_file.read_text().strip() == pod.token
    status = make("pod-status", *pod.cluster.make_vars)
    assert status.returncode == 0, status.stdout
    lines = [line for line in status.stdout.splitlines() if line.startswith("rtserve-")]
    assert len(lines) >= 2, status.stdout
    for line in lines:
        assert re.search(
            r" Running +ready +1\.0 +gateway: \d+ restarts rtserve: \d+ restarts +10\.244\.0\.\d+ +Burstable$", line
        ), line


def test_gateway_answers_with_the_shared_token_only(pod):
    resp = predict(pod)
    assert resp.status_code == 200, resp.text
    assert resp.json()["model_version"] == "1.0"
    first = pod.deployed.pods()[0]
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {pod.deployed.keys(first.name)['inference']}"},
    ):
        resp = predict(pod, headers=headers)
        assert resp.status_code == 401, headers
        assert resp.json()["error"].startswith("missing or wrong token")


def test_management_and_metrics_ports(pod):
    first = pod.deployed.pods()[0]
    url = f"http://{first.ip}:8081/models/{MODEL_NAME}"
    resp = requests.get(
        url, headers={"Authorization": f"Bearer {pod.deployed.keys(first.name)['management']}"}, timeout=10
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()[0]["modelVersion"] == "1.0"
    assert requests.get(url, timeout=10).status_code in (400, 401)
    metrics = requests.get(f"http://{first.ip}:8082/metrics", timeout=10)
    assert metrics.status_code == 200
    assert "ts_inference_requests_total" in metrics.text
    # rtserve's exporter serves the handler's own metrics beside TorchServe's.
    assert 'rtserve_handler_requests_total{model_name="realtime-classifier",model_version="1.0"}' in metrics.text


def test_the_frontend_runs_the_greedy_batching_agent(pod):
    """The image built the Java agent from agent/; rtserve.server loaded it into the frontend."""
    first = pod.deployed.pods()[0]
    log = pod.cluster.ok("-n", NAMESPACE, "logs", first.name, "-c", "rtserve", timeout=60)
    assert "[rtserve-agent] greedy batching ON" in log, log[-2000:]


def test_open_inference_protocol_flow_with_tritonclient(pod):
    client = triton.InferenceServerClient(url=urlparse(pod.base).netloc, connection_timeout=10, network_timeout=10)
    try:
        assert client.is_server_ready(headers=pod.auth)
        assert client.is_model_ready(MODEL_NAME, headers=pod.auth)
        meta = client.get_model_metadata(MODEL_NAME, headers=pod.auth)
        assert meta["name"] == MODEL_NAME and meta["versions"] == ["1.0"]
        (inp,) = meta["inputs"]
        assert (inp["name"], inp["datatype"], inp["shape"]) == ("features", "FP32", [-1, len(ROW)])
        assert {o["name"] for o in meta["outputs"]} == {"class", "probabilities"}
        # The client's defaults: the binary tensor data extension, both ways.
        tensor = triton.InferInput(inp["name"], [2, len(ROW)], inp["datatype"])
        tensor.set_data_from_numpy(np.array([ROW, ROW], dtype=np.float32))
        result = client.infer(MODEL_NAME, [tensor], headers=pod.auth)
        plain = predict(pod).json()
        assert result.as_numpy("class").tolist() == [plain["prediction"]] * 2
        np.testing.assert_allclose(
            result.as_numpy("probabilities"), np.array([plain["probabilities"]] * 2, dtype=np.float32), atol=1e-6
        )
        assert not client.is_model_ready("no-such-model", headers=pod.auth)
        # The model routes sit behind the token check like every other route.
        assert not client.is_model_ready(MODEL_NAME)
    finally:
        client.close()
    resp = requests.get(f"{pod.base}/v2/models/{MODEL_NAME}/versions/9.9", headers=pod.auth, timeout=10)
    assert resp.status_code == 404 and "no version '9.9'" in resp.json()["error"]


def test_oversized_bodies_get_a_json_413(pod):
    big = {"features": ROW, "pad": "x" * 70000}
    resp = requests.post(pod.url, json=big, headers=pod.auth, timeout=30)
    assert (resp.status_code, resp.json()) == (413, {"error": "request body larger than 65536 bytes"})
    # Several megabytes with Connection: close, written whole before the answer is read.
    body = b'{"features": [' + b"0.5, " * 1_000_000 + b"0.5]}"
    address = urlparse(pod.base)
    head = (
        f"POST /predictions/{MODEL_NAME} HTTP/1.1\r\nHost: {address.hostname}\r\n"
        f"Authorization: Bearer {pod.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection((address.hostname, address.port), timeout=30) as s:
        try:
            s.sendall(head + body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # nginx may answer and stop reading early; the answer must still be readable
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 413 Request Entity Too Large", answer[:300]
    assert json.loads(rest.split(b"\r\n\r\n", 1)[1]) == {"error": "request body larger than 65536 bytes"}


def test_read_only_root_and_user_10001(pod):
    first = pod.deployed.pods()[0]
    for container in ("rtserve", "gateway"):
        wrote = pod.cluster.kubectl(
            "-n", NAMESPACE, "exec", first.name, "-c", container, "--", "sh", "-c", "echo x > /probe-write"
        )
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, (container, wrote.stderr)
    # One PID namespace for the pod: read every process's ids from /proc inside it. PID 1 is the
    # pod's sandbox (deploy/cluster/pause); every other one runs as 10001:10001.
    script = (
        "import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
        " s = open(f'/proc/{p}/status').read().split('\\n')\n"
        " ids = [l.split()[1] for l in s if l.startswith(('Uid:', 'Gid:'))]\n"
        " print(p, *ids, open(f'/proc/{p}/cmdline').read().replace('\\0', ' ').replace('\\n', ' ')[:60])"
    )
    procs = pod.deployed.exec(first.name, "rtserve", "python", "-c", script).splitlines()
    others = [(line.split(None, 3) + [""])[:4] for line in procs if not line.startswith("1 ")]
    assert len(others) >= 4, procs  # tini, rtserve, java, worker, nginx master and worker, ...
    for pid, uid, gid, cmd in others:
        assert (uid, gid) == ("10001", "10001"), (pid, cmd)
    assert any("nginx: master" in cmd for *_, cmd in others)
    caps = pod.deployed.exec(first.name, "rtserve", "sh", "-c", "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status")
    assert "CapEff:\t0000000000000000" in caps and "NoNewPrivs:\t1" in caps


def worker_pids(pod, ip: str, key: str) -> list[int]:
    resp = requests.get(f"http://{ip}:8081/models/{MODEL_NAME}", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    return [w["pid"] for w in resp.json()[0]["workers"] if w["status"] == "READY"]


def test_a_killed_worker_comes_back(pod):
    first = pod.deployed.pods()[0]
    key = pod.deployed.keys(first.name)["management"]
    before = worker_pids(pod, first.ip, key)
    assert before
    pod.deployed.exec(first.name, "rtserve", "python", "-c", f"import os, signal; os.kill({before[0]}, signal.SIGKILL)")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now = worker_pids(pod, first.ip, key)
        if len(now) == len(before) and before[0] not in now:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"worker {before[0]} was not replaced: {worker_pids(pod, first.ip, key)}")
    assert pod.deployed.pods()[0].restarts["rtserve"] == first.restarts["rtserve"]  # the worker, not the container
    assert predict(pod).status_code == 200


def test_pod_report_main_measures_the_running_pod(pod, tmp_path):
    """bench/pod_report.py's main (`make pod-report`) with tiny settings: the image breakdown, a
    replica's time to ready, memory idle and under load from the pod's cgroups, a load with no
    failure, and a one-point sizing sweep (wrk: `make bench-deps`; the test fails without it)."""
    require("wrk")
    kubectl = f"{pod.cluster.bin_dir / 'kubectl'} --kubeconfig {pod.cluster.kubeconfig}"
    rc, report = bench_main(
        pod_report.main,
        tmp_path / "report.json",
        "--kubectl",
        kubectl,
        "--settle",
        0.5,
        "--seconds",
        2,
        "--rate",
        30,
        "--concurrency",
        2,
        "--concurrency-sweep",
        "1",
        "--sweep-seconds",
        1,
    )
    assert rc == 0
    print(
        f"pod-report: a replica ready {report['seconds_to_ready']} s after its pod's deletion; "
        f"memory idle {report['memory_idle']}, under load {report['memory_load']} MiB"
    )
    assert 0 < report["seconds_to_ready"] < 600  # the local overlay's start-up budget
    assert report["image"]["size_mb"] > 0 and report["image"]["layers"], report["image"]
    assert set(report["memory_idle"]) == set(report["memory_load"]) == {"rtserve", "gateway"}
    assert report["memory_load"]["rtserve"] > 100, report["memory_load"]  # TorchServe, torch: hundreds of MiB
    assert report["load"]["failed_first"] == 0 and report["load"]["sent"] > 20, report["load"]
    (point,) = report["sweep"]
    assert point["per_second"] > 0 and point["errors"] == 0 and point["pod_cores"] > 0, point
    assert "capacity_per_second" in report["sizing"], report["sizing"]
    # the autoscaler's minimum ready again (more when it chose more under the report's load)
    assert len(pod.deployed.wait_ready(2, 600)) >= 2 and predict(pod).status_code == 200


def test_cgroup_memory_agrees_with_the_metrics_server(pod):
    """The pod report's cgroup reading is the kubelet's own working set: `kubectl top` (metrics-server,
    from the kubelet's summary) reads the same container within a scrape's drift."""
    first = pod.deployed.pods()[0]
    deadline = time.monotonic() + 90
    while True:
        top = pod.cluster.kubectl("-n", NAMESPACE, "top", "pod", first.name, "--containers", "--no-headers")
        found = re.search(r"^\S+ +rtserve +\d+m +(\d+)Mi\s*$", top.stdout, re.M)
        if found or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert found, top.stdout + top.stderr
    ours = memory_mib(first, "rtserve")
    assert abs(ours - int(found[1])) < max(64, 0.15 * ours), (ours, top.stdout)


def test_pod_stop_drains_each_pod_and_removes_the_namespace(pod):
    """`make pod-stop` under steady traffic through the Service until its pods are gone: each
    request is answered 200, or refused at connect once no pod is ready (kube-proxy rejects a
    Service without endpoints: nothing reached a pod); none is cut, reset or timed out by a pod
    that stopped under it. Then the namespace is gone and the address gives no prediction."""
    gone = threading.Event()

    def watch() -> None:  # the traffic ends once no pod of the Deployment is left, terminating or not
        while not gone.is_set():
            if not pod.deployed.get("pods", "-l", "app.kubernetes.io/name=rtserve", "-o", "name").strip():
                gone.set()
            time.sleep(1)  # a kubectl run per look (rtserve.k8s.deploy.POLL_SECONDS)

    load = SteadyLoad(
        pod.url,
        {"features": ROW},
        lambda: pod.token,
        rate=RATE,
        concurrency=4,
        max_seconds=600,
        gate=lambda: not gone.is_set(),
        resend_worker_lost=False,
    ).start("up")
    watcher = threading.Thread(target=watch, daemon=True)
    try:
        time.sleep(2)
        load.mark("pod-stop")
        watcher.start()
        out = make("pod-stop", *pod.cluster.make_vars, timeout=300)
    finally:
        gone.set()
        records = load.stop()
    assert out.returncode == 0, out.stdout
    answered = [r for r in records if r.status == 200]
    cut = [r for r in records if r.status != 200 and not r.refused]
    stopping = [r for r in answered if r.phase == "pod-stop"]
    print(
        f"make pod-stop under {RATE:g} requests/s: {len(records)} sent, {len(answered)} answered "
        f"({len(stopping)} after the stop began, the last {max(r.start for r in answered):.1f} s into the "
        f"traffic), {sum(r.refused for r in records)} refused at connect once no pod was ready, {len(cut)} cut"
    )
    assert not cut, summarize(cut)
    assert stopping, "no request was answered after the stop began (the drain served none)"
    found = re.search(
        r"^>> (\d+) pods stopped in ([\d.]+) s, each after its preStop hook \(none failed\)", out.stdout, re.M
    )
    assert found and int(found[1]) >= 2, out.stdout
    print(f"make pod-stop: {found[0]}")
    assert f"namespace {NAMESPACE} deleted" in out.stdout
    assert pod.cluster.kubectl("get", "namespace", NAMESPACE).returncode == 1
    # kube-proxy drops the Service's rules on its next sync, shortly after the namespace went;
    # then the address is no longer the cluster's (this machine routes it to its default
    # gateway, which may refuse it or answer something of its own): no prediction comes back
    predictions, after = 0, "no answer"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            resp = requests.post(pod.url, json={"features": ROW}, headers=pod.auth, timeout=2)
        except requests.RequestException as exc:
            after = type(exc).__name__
            break
        if resp.status_code != 200:
            after = f"HTTP {resp.status_code}, not rtserve's"
            break
        predictions += 1
        time.sleep(0.5)
    else:
        pytest.fail(f"{pod.url} still gives predictions 30 s after make pod-stop")
    print(f"the Service's address gave {predictions} more predictions, then {after}")
