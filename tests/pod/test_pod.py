"""The production pod, run locally by `make pod` from the rendered manifest, with real images.

One pod of the production manifest for the module, checked by every test but the liveness
restart, which runs on a pod of its own made from a copy of the rendered manifest with shorter
probe periods (its fixture says how much shorter); the tests that break something come last.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time

import numpy as np
import pytest
import requests
import tritonclient.http as triton
import yaml

from bench import pod_report
from deploy.podman.pod import pod_spec, render
from rtserve.promotion.gate import ArchiveMeta, GateConfig
from tests.conftest import MODEL_NAME, REPO, require
from tests.helpers import bench_main, features
from tests.pod.conftest import fast_probe_manifest, podman, start_pod, stop_pod

pytestmark = pytest.mark.pod

ROW = features(value=1.5)


def predict(pod, headers=None, body=None) -> requests.Response:
    return requests.post(f"{pod.url()}/predictions/{MODEL_NAME}", json=body or {"features": ROW},
                         headers=headers if headers is not None else pod.auth, timeout=30)


def test_make_pod_prints_how_to_call_it(pod):
    assert f"pod {pod.name} ready in" in pod.output
    assert f"http://127.0.0.1:{pod.ports['inference']}/predictions/{MODEL_NAME}" in pod.output
    # The manifest's gateway image cannot be pulled here: the stand-in is used, and it says so.
    assert "using the stand-in" in pod.output
    token_file = pod.pod_dir / "gateway-token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    listed = podman("pod", "ps", "--format", "{{.Name}} {{.Status}}").stdout
    assert f"{pod.name} Running" in listed


def test_gateway_answers_with_the_shared_token_only(pod):
    resp = predict(pod)
    assert resp.status_code == 200, resp.text
    assert resp.json()["model_version"] == "1.0"
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": f"Bearer {pod.keys()['inference']}"}):
        resp = predict(pod, headers=headers)
        assert resp.status_code == 401, headers
        assert resp.json()["error"].startswith("missing or wrong token")


def test_management_and_metrics_ports(pod):
    resp = requests.get(f"{pod.url('management')}/models/{MODEL_NAME}",
                        headers={"Authorization": f"Bearer {pod.keys()['management']}"}, timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.json()[0]["modelVersion"] == "1.0"
    assert requests.get(f"{pod.url('management')}/models", timeout=10).status_code in (400, 401)
    metrics = requests.get(f"{pod.url('metrics')}/metrics", timeout=10)
    assert metrics.status_code == 200
    assert "ts_inference_requests_total" in metrics.text
    # rtserve's exporter serves the handler's own metrics beside TorchServe's.
    assert 'rtserve_handler_requests_total{model_name="realtime-classifier",model_version="1.0"}' \
        in metrics.text


def test_the_frontend_runs_the_greedy_batching_agent(pod):
    """The image built the Java agent from agent/; rtserve.server loaded it into the frontend."""
    log = podman("logs", pod.container("rtserve")).stdout + podman("logs", pod.container("rtserve")).stderr
    assert "[rtserve-agent] greedy batching ON" in log, log[-2000:]
    jar = pod.exec("rtserve", "ls", "/opt/rtserve/build/agent/rtserve-agent.jar")
    assert jar.returncode == 0, jar.stderr


def test_ports_are_published_on_loopback_only(pod):
    ports = podman("port", pod.container("rtserve")).stdout.split()
    published = sorted(p for p in ports if ":" in p)
    assert published == sorted(f"127.0.0.1:{p}" for p in pod.ports.values())


def test_open_inference_protocol_flow_with_tritonclient(pod):
    client = triton.InferenceServerClient(url=pod.url().removeprefix("http://"),
                                          connection_timeout=10, network_timeout=10)
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
        np.testing.assert_allclose(result.as_numpy("probabilities"),
                                   np.array([plain["probabilities"]] * 2, dtype=np.float32), atol=1e-6)
        assert not client.is_model_ready("no-such-model", headers=pod.auth)
        # The model routes sit behind the token check like every other route.
        assert not client.is_model_ready(MODEL_NAME)
    finally:
        client.close()
    resp = requests.get(f"{pod.url()}/v2/models/{MODEL_NAME}/versions/9.9", headers=pod.auth, timeout=10)
    assert resp.status_code == 404 and "no version '9.9'" in resp.json()["error"]


def test_oversized_bodies_get_a_json_413(pod):
    big = {"features": ROW, "pad": "x" * 70000}
    resp = requests.post(f"{pod.url()}/predictions/{MODEL_NAME}", json=big, headers=pod.auth, timeout=30)
    assert (resp.status_code, resp.json()) == (413, {"error": "request body larger than 65536 bytes"})
    # Several megabytes with Connection: close, written whole before the answer is read.
    body = b'{"features": [' + b"0.5, " * 1_000_000 + b'0.5]}'
    head = (f"POST /predictions/{MODEL_NAME} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {pod.token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", pod.ports["inference"]), timeout=30) as s:
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
    for container in ("rtserve", "gateway"):
        wrote = pod.exec(container, "sh", "-c", "echo x > /probe-write")
        assert wrote.returncode != 0 and "Read-only file system" in wrote.stderr, container
    # One PID namespace for the pod: read every process's ids from /proc inside it. PID 1 is the
    # pod's infra process (catatonit, Kubernetes' pause); every other one runs as 10001:10001.
    script = ("import os\nfor p in filter(str.isdigit, os.listdir('/proc')):\n"
              " s = open(f'/proc/{p}/status').read().split('\\n')\n"
              " ids = [l.split()[1] for l in s if l.startswith(('Uid:', 'Gid:'))]\n"
              " print(p, *ids, open(f'/proc/{p}/cmdline').read().replace('\\0', ' ').replace('\\n', ' ')[:60])")
    procs = pod.exec("rtserve", "python", "-c", script).stdout.splitlines()
    others = [(line.split(None, 3) + [""])[:4] for line in procs if not line.startswith("1 ")]
    assert len(others) >= 4, procs  # tini, rtserve, java, worker, nginx master and worker, ...
    for pid, uid, gid, cmd in others:
        assert (uid, gid) == ("10001", "10001"), (pid, cmd)
    assert any("nginx: master" in cmd for *_, cmd in others)
    caps = pod.exec("rtserve", "sh", "-c", "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status").stdout
    assert "CapEff:\t0000000000000000" in caps and "NoNewPrivs:\t1" in caps


def test_the_pod_follows_the_rendered_manifest(pod):
    spec = pod_spec(render("production"), "x" * 43)
    for c in spec.containers:
        info = json.loads(podman("inspect", pod.container(c.name)).stdout)[0]
        config, host = info["Config"], info["HostConfig"]
        assert config["User"] == f"{c.user}:{c.group}"
        assert host["ReadonlyRootfs"] is True
        env = dict(e.split("=", 1) for e in config["Env"])
        assert {k: env[k] for k in c.env} == c.env
        mounts = {m["Destination"]: m for m in info["Mounts"]}
        assert sorted(mounts) == sorted(path for _, path, _ in c.mounts)
        for _, path, read_only in c.mounts:
            assert mounts[path]["RW"] is (not read_only), path


def test_probes_pass_as_the_kubelet_runs_them(pod):
    status = pod.status()
    assert status["ready"] is True
    rtserve, gateway = status["containers"]["rtserve"], status["containers"]["gateway"]
    assert rtserve["started"] and rtserve["ready"] and rtserve["restarts"] == 0
    assert gateway["started"] and gateway["ready"] and gateway["restarts"] == 0
    # The exec probes themselves, as the kubelet runs them.
    ready = pod.exec("rtserve", "python", "-m", "rtserve", "probe", "ready")
    assert ready.returncode == 0 and ready.stdout.startswith(f"ready: {MODEL_NAME} 1.0 answers")


def verify_job(pod, image: str) -> tuple[subprocess.CompletedProcess, float]:
    """deploy/k8s/verify/job.yaml's command, in a container of ``image`` set up as the Job's
    (its user, read-only root, a /tmp of its own, no capabilities, the gateway Secret's files
    mounted read-only where the Job mounts them: here the pod's copy of that Secret), against
    the pod's gateway on the host's loopback in place of the Service http://rtserve:8080.
    Returns the run and its seconds."""
    (job,) = [d for d in yaml.safe_load_all((REPO / "deploy" / "k8s" / "verify" / "job.yaml").read_text()) if d]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (secret,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == secret["name"]]
    context = container["securityContext"]
    args = [pod.url() if a == "http://rtserve:8080" else a for a in container["args"]]
    assert args != container["args"], "the Job no longer calls the Service at http://rtserve:8080"
    started = time.monotonic()
    done = podman("run", "--rm", "--network", "host", "--read-only", "--tmpfs", "/tmp",
                  "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                  "--user", f"{context['runAsUser']}:{context['runAsGroup']}",
                  "-v", f"{pod.pod_dir / 'volumes' / secret['name']}:{mount['mountPath']}:ro",
                  *[f"--env={e['name']}={e['value']}" for e in container["env"]],
                  image, *args, timeout=120)
    return done, time.monotonic() - started


def test_the_verification_job_passes_for_the_served_version_and_fails_for_another(pod, images, mar_v1):
    """The verification Job's command (what `make deploy` runs after `rollout status`) against
    the pod's gateway with the Secret's token, from a container of the same image: it passes
    for the version the pod serves, with the figures the Job's log shows.

    The bad case is the 2.0 image's Job against this pod, which serves 1.0: what the Job sees
    when the Service's pods do not serve the model packed in the image being verified (the
    rollout served something else), so its golden set comes back different and the report names
    the rows. It costs one container run; a pod serving a wrong model of its own would need
    another image build and pod start (minutes, over the pod tier's budget). Wrong models
    themselves (an altered golden set, shuffled labels, wrong normalization) are verified and
    refused on a real TorchServe in tests/integration/test_promotion.py."""
    served = json.loads(podman("inspect", pod.container("rtserve")).stdout)[0]["ImageName"]
    assert served.endswith(f":{images['1.0']}"), served
    good, seconds = verify_job(pod, served)
    assert good.returncode == 0, good.stdout + good.stderr
    figures = json.loads(good.stdout.split("verified ", 1)[1])
    config = GateConfig.load()
    golden = ArchiveMeta.from_mar(mar_v1).golden
    assert (figures["model"], figures["version"]) == (MODEL_NAME, "1.0")
    assert figures["golden_rows"] == len(golden["features"]) > 0
    assert figures["requests"] == config.burst_requests
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_p99_ms"] == config.max_p99_ms
    print(f"verify 1.0 image against the 1.0 pod: {seconds:.1f} s: {good.stdout.strip()}")

    bad, seconds = verify_job(pod, f"{served.rsplit(':', 1)[0]}:{images['2.0']}")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = re.search(rf"^error: {MODEL_NAME} \(default\) answers (\d+) of (\d+) golden rows "
                       r"differently from its archive \(rows \[[\d, ]+\]( \.\.\.)?; max \|difference\| "
                       r"\S+, tolerance \S+\): the served model is not the one packaged", bad.stdout, re.M)
    assert report and 0 < int(report[1]) <= int(report[2]) == len(golden["features"]), bad.stdout
    print(f"verify 2.0 image against the 1.0 pod: {seconds:.1f} s: {bad.stdout.strip()}")
    assert predict(pod).json()["model_version"] == "1.0"  # the check changed nothing


def worker_pids(pod) -> list[int]:
    resp = requests.get(f"{pod.url('management')}/models/{MODEL_NAME}",
                        headers={"Authorization": f"Bearer {pod.keys()['management']}"}, timeout=10)
    return [w["pid"] for w in resp.json()[0]["workers"] if w["status"] == "READY"]


def test_pod_report_main_measures_the_running_pod(pod, tmp_path):
    """bench/pod_report.py's main (`make pod-report`) attached to this module's pod with tiny
    settings: the image breakdown, memory idle and under load, a load with no failure, and a
    one-point sizing sweep (wrk: `make bench-deps`; the test fails without it)."""
    require("wrk")
    rc, report = bench_main(pod_report.main, tmp_path / "report.json", "--attach", pod.pod_dir,
                            "--settle", 0.5, "--seconds", 2, "--rate", 30, "--concurrency", 2,
                            "--concurrency-sweep", "1", "--sweep-seconds", 1)
    assert rc == 0
    assert report["seconds_to_ready"] is None  # attached: not measured
    assert report["image"]["size_mb"] > 0 and report["image"]["layers"], report["image"]
    assert set(report["memory_idle"]) == set(report["memory_load"]) >= {"rtserve"}
    assert report["load"]["failed_first"] == 0 and report["load"]["sent"] > 20, report["load"]
    (point,) = report["sweep"]
    assert point["per_second"] > 0 and point["errors"] == 0 and point["pod_cores"] > 0, point
    assert "capacity_per_second" in report["sizing"], report["sizing"]
    assert predict(pod).status_code == 200  # left running


def test_a_killed_worker_comes_back(pod):
    before = worker_pids(pod)
    assert before
    killed = pod.exec("rtserve", "python", "-c", f"import os, signal; os.kill({before[0]}, signal.SIGKILL)")
    assert killed.returncode == 0, killed.stderr
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        now = worker_pids(pod)
        if len(now) == len(before) and before[0] not in now:
            break
        time.sleep(0.5)
    else:
        raise AssertionError(f"worker {before[0]} was not replaced: {worker_pids(pod)}")
    assert predict(pod).status_code == 200


def test_pod_stop_runs_prestop_and_removes_the_pod(pod):
    out = stop_pod(pod.pod_dir)
    # The hook's output follows its name (the gateway's reload, which closes its clients'
    # keep-alive connections once the endpoints are gone, may log first).
    assert "rtserve preStop: " in out and "drain: idle after" in out, out
    assert podman("pod", "exists", pod.name).returncode == 1
    with pytest.raises(requests.ConnectionError):
        predict(pod)


@pytest.fixture
def fast_probe_pod(image_vars, images, tmp_path):
    """A second pod, of a test copy of the rendered manifest with a 5x shorter liveness period,
    grace period and preStop waits (tests/pod/conftest.py: fast_probe_manifest); the liveness
    threshold is the manifest's."""
    manifest, live = fast_probe_manifest(tmp_path / "fast-probes.yaml")
    name = f"rtserve-pytest-live-{os.getpid()}"
    started = start_pod(image_vars, images, tmp_path, "1.0", name, manifest=manifest)
    try:
        yield started, live
    finally:
        stop_pod(started.pod_dir)


def test_a_liveness_failure_restarts_the_container(fast_probe_pod):
    """The frontend frozen (SIGSTOP): liveness fails its threshold's times in a row, the kubelet
    runs preStop and restarts the container, which starts and becomes ready again."""
    pod, live = fast_probe_pod
    pid = (pod.pod_dir / "volumes" / "run" / "tmp" / ".model_server.pid").read_text().strip()
    frozen = pod.exec("rtserve", "python", "-c", f"import os, signal; os.kill({pid}, signal.SIGSTOP)")
    assert frozen.returncode == 0, frozen.stderr
    pod.wait(lambda s: s["containers"]["rtserve"]["restarts"] >= 1, 120, "liveness restart")
    pod.wait(lambda s: s["ready"], 180, "ready after the restart")
    log = (pod.pod_dir / "kubelet.log").read_text()
    assert f"rtserve: liveness probe failed {live['failureThreshold']} times" in log
    resp = predict(pod)
    assert resp.status_code == 200 and resp.json()["model_version"] == "1.0"
