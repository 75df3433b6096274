"""The pod's authenticating gateway: a real nginx in front of a real TorchServe started like the pod.

TorchServe runs as the container runs it (``python -m rtserve server run`` with the cluster's
``config.properties``: inference on loopback only), with ``$RTSERVE_GATEWAY_DIR`` set so it
keeps the gateway's map files in sync. nginx runs the config the ConfigMap ships
(:func:`rtserve.gateway.nginx.render_nginx_conf`), with loopback ports and this test's directories,
started and stopped by its PID. What the cluster adds (a Secret mounted as a file, one process
namespace for both containers) is a file and a shared PID here.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import tritonclient.http as triton

from rtserve.gateway import nginx as gateway
from rtserve.runtime.ports import free_ports
from rtserve.server.properties import port_overrides, write_properties
from tests.conftest import MODEL_NAME, REPO
from tests.integration.test_probe import Pod, pod_properties

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("nginx_installed")]

PAYLOAD = {"features": [1.0] * 32}


class Gateway:
    """nginx with the gateway config, as the sidecar runs it (foreground, stopped by PID)."""

    def __init__(self, root: Path, settings: gateway.GatewaySettings) -> None:
        self.root = root
        self.settings = settings
        self.conf = root / "nginx.conf"
        self.conf.write_text(gateway.render_nginx_conf(settings))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.listen}"

    @property
    def same_user(self) -> str:
        """Run as root, nginx's workers would switch to ``nobody``, who cannot see into this
        test's private directories (the closing flag is checked per request, by a worker); in
        the pod, nginx and rtserve run as the same user (10001), so here the workers stay root."""
        return " user root;" if os.geteuid() == 0 else ""

    def start(self) -> None:
        check = gateway.nginx_check(self.conf)
        assert check.returncode == 0, check.stdout
        with open(self.root / "nginx.out", "wb") as out:
            self.proc = subprocess.Popen(
                [
                    gateway.find_nginx(),
                    "-c",
                    str(self.conf),
                    "-e",
                    str(self.root / "error.log"),
                    "-g",
                    "daemon off;" + self.same_user,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "error.log").read_text()
            try:
                requests.get(f"http://{self.settings.health_listen}/livez", timeout=2)
                return
            except requests.ConnectionError:
                time.sleep(0.05)
        raise AssertionError("nginx did not come up")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)  # graceful, as the image's STOPSIGNAL
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def post(self, token: str | None, path: str = f"/predictions/{MODEL_NAME}", **kwargs):
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return requests.post(self.url + path, json=kwargs.pop("json", PAYLOAD), headers=headers, timeout=10, **kwargs)


def until(check, timeout: float = 20.0, what: str = "condition"):
    """Poll ``check()`` until it returns a truthy value; that value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def pod_gateway(mar_v1, tmp_path_factory):
    root = tmp_path_factory.mktemp("gateway-pod")
    gateway_dir, nginx_tmp = root / "gateway", root / "nginx-tmp"
    gateway_dir.mkdir()
    nginx_tmp.mkdir()
    ports = free_ports(8)
    config = root / "config.properties"
    props = pod_properties()
    props.update(port_overrides(ports[:6]))
    write_properties(config, props)
    tokens = [secrets.token_urlsafe(32), secrets.token_urlsafe(32)]
    tokens_file = root / "tokens"
    tokens_file.write_text("\n".join(tokens) + "\n")
    settings = gateway.GatewaySettings(
        listen=f"127.0.0.1:{ports[6]}",
        health_listen=f"127.0.0.1:{ports[7]}",
        upstream=props["inference_address"].removeprefix("http://"),
        gateway_dir=str(gateway_dir),
        tmp_dir=str(nginx_tmp),
        access_log=str(root / "access.log"),
        error_log=str(root / "error.log"),
        max_body=int(props["max_request_size"]),
    )
    nginx = Gateway(root, settings)
    pod = Pod(root / "pod", config, mar_v1, sandbox=False)
    pod.env.update(RTSERVE_GATEWAY_DIR=str(gateway_dir), RTSERVE_GATEWAY_TOKENS=str(tokens_file))
    nginx.start()  # first, as the native sidecar starts before the server
    pod.start()
    try:
        yield pod, nginx, tokens, tokens_file
    finally:
        pod.kill()
        nginx.stop()


def ready_through_gateway(nginx: Gateway) -> bool:
    return requests.get(f"http://{nginx.settings.health_listen}/readyz", timeout=5).status_code == 200


def test_only_the_shared_token_gets_a_prediction(pod_gateway):
    pod, nginx, tokens, _ = pod_gateway
    pod.wait_ready()
    until(lambda: ready_through_gateway(nginx), what="/readyz through the gateway")
    pod_key = json.loads((pod.run_dir / "key_file.json").read_text())["inference"]["key"]
    unauthorized = {"error": "missing or wrong token: send Authorization: Bearer <gateway token>"}
    for label, token in (
        ("no token", None),
        ("wrong token", secrets.token_urlsafe(32)),
        ("the pod's own TorchServe key", pod_key),
    ):
        resp = nginx.post(token)
        assert (resp.status_code, resp.json()) == (401, unauthorized), label
        assert resp.headers["WWW-Authenticate"] == 'Bearer realm="rtserve"', label
    for token in tokens:  # every token in the Secret's file is accepted
        resp = nginx.post(token)
        assert resp.status_code == 200, resp.text
        assert resp.json()["model_version"] == "1.0" and "prediction" in resp.json()
    ping = requests.get(nginx.url + "/ping", headers={"Authorization": f"Bearer {tokens[0]}"}, timeout=5)
    assert (ping.status_code, ping.json()["status"]) == (200, "Healthy")
    assert requests.get(nginx.url + "/ping", timeout=5).status_code == 401


def test_only_inference_routes_pass_and_bodies_are_bounded(pod_gateway):
    pod, nginx, tokens, _ = pod_gateway
    pod.wait_ready()
    auth = {"Authorization": f"Bearer {tokens[0]}"}
    for method, path in (
        ("GET", "/models"),
        ("OPTIONS", "/"),
        ("GET", "/metrics"),
        ("GET", "/api-description"),
        ("GET", "/v1"),
        ("GET", "/v2x"),
    ):
        resp = requests.request(method, nginx.url + path, headers=auth, timeout=5)
        assert resp.status_code == 404, (path, resp.text)
        assert resp.json()["error"].startswith("not found: the gateway passes /ping"), path
    big = {"features": [1.0] * 32, "pad": "x" * (nginx.settings.max_body + 1)}
    resp = nginx.post(tokens[0], json=big)
    assert (resp.status_code, resp.json()) == (
        413,
        {"error": f"request body larger than {nginx.settings.max_body} bytes"},
    )
    # An explanation goes through too.
    resp = nginx.post(tokens[0], path=f"/explanations/{MODEL_NAME}")
    assert resp.status_code == 200, resp.text
    # KServe v1 and Open Inference Protocol routes reach TorchServe (what it answers there
    # depends on its protocol settings): its own access log has them.
    for path in (f"/v1/models/{MODEL_NAME}:predict", "/v2", f"/v2/models/{MODEL_NAME}/infer"):
        resp = nginx.post(tokens[0], path=path)
        assert "the gateway passes" not in resp.text, path
    # (the access log's appender is asynchronous: its last lines may be written a moment later)
    wanted = [
        f'"POST {path}' for path in (f"/v1/models/{MODEL_NAME}:predict", "/v2 ", f"/v2/models/{MODEL_NAME}/infer")
    ]
    deadline = time.monotonic() + 10
    while True:
        access = (pod.run_dir / "logs" / "access_log.log").read_text()
        missing = [line for line in wanted if line not in access]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not missing, missing


def test_tritonclient_with_its_defaults_through_the_gateway(pod_gateway):
    """The Open Inference Protocol flow of a generic client with no option changed, through the
    gateway with the shared token: model readiness and metadata (rtserve's agent in TorchServe,
    rtserve.server.oip), then binary tensor data in and out, equal to /predictions' answers."""
    pod, nginx, _, tokens_file = pod_gateway
    pod.wait_ready()
    auth = {"Authorization": f"Bearer {gateway.parse_tokens(tokens_file.read_text())[0]}"}
    rows = [[v + i for i in range(32)] for v in (-50.0, 0.0, 3.5)]
    plain = [nginx.post(auth["Authorization"].removeprefix("Bearer "), json={"features": row}).json() for row in rows]
    client = triton.InferenceServerClient(nginx.settings.listen, connection_timeout=10, network_timeout=10)
    try:
        assert client.is_server_ready(headers=auth) and client.is_model_ready(MODEL_NAME, headers=auth)
        meta = client.get_model_metadata(MODEL_NAME, headers=auth)
        assert meta["versions"] == ["1.0"] and meta["inputs"][0]["shape"] == [-1, 32]
        tensor = triton.InferInput("features", [len(rows), 32], "FP32")
        tensor.set_data_from_numpy(np.array(rows, dtype=np.float32))
        result = client.infer(MODEL_NAME, [tensor], headers=auth)
        assert "binary_data_size" in result.get_response()["outputs"][1]["parameters"]
        assert result.as_numpy("class").tolist() == [p["prediction"] for p in plain]
        np.testing.assert_allclose(
            result.as_numpy("probabilities"), [p["probabilities"] for p in plain], rtol=0, atol=1e-6
        )
        as_json = client.infer(
            MODEL_NAME, [tensor], headers=auth, outputs=[triton.InferRequestedOutput("class", binary_data=False)]
        )
        assert as_json.get_response()["outputs"][0]["data"] == [p["prediction"] for p in plain]
        assert client.is_model_ready(MODEL_NAME) is False  # no token
    finally:
        client.close()
    resp = requests.get(f"{nginx.url}/v2/models/{MODEL_NAME}/ready", timeout=5)
    assert (resp.status_code, resp.json()) == (
        401,
        {"error": "missing or wrong token: send Authorization: Bearer <gateway token>"},
    )


def test_torchserve_inference_listens_on_loopback_only(pod_gateway):
    pod, nginx, tokens, _ = pod_gateway
    pod.wait_ready()
    address = pod.server.props["inference_address"]
    host, port = address.removeprefix("http://").rsplit(":", 1)
    assert host == "127.0.0.1"
    # (Java lists an IPv4 listener as IPv4-mapped IPv6.)
    listening = {
        c.laddr.ip.removeprefix("::ffff:")
        for c in psutil.Process(pod.server.pid()).net_connections("tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == int(port)
    }
    assert listening == {host}, listening
    # Through any other address of this machine, the port refuses the connection.
    others = [
        a.address if a.family == socket.AF_INET else f"[{a.address}]"
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if (a.family == socket.AF_INET and not a.address.startswith("127."))
        or (a.family == socket.AF_INET6 and a.address != "::1" and "%" not in a.address)
    ]
    for other in others:
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://{other}:{port}/ping", timeout=2)


def test_a_new_pod_key_is_picked_up_after_a_restart(pod_gateway):
    pod, nginx, tokens, _ = pod_gateway
    pod.wait_ready()
    until(lambda: nginx.post(tokens[0]).status_code == 200, what="gateway answering")
    old_key = json.loads((pod.run_dir / "key_file.json").read_text())["inference"]["key"]
    upstream_map = Path(nginx.settings.gateway_dir) / gateway.UPSTREAM_KEY
    assert f'"Bearer {old_key}"' in upstream_map.read_text()
    assert upstream_map.stat().st_mode & 0o777 == 0o600

    assert pod.terminate() == 0  # the container stops; nginx stays, and says what is wrong
    resp = nginx.post(tokens[0])
    assert (resp.status_code, resp.json()) == (502, {"error": "TorchServe is not answering in this pod"})

    pod.start()  # the container restarts: TorchServe draws new keys
    pod.wait_ready()
    new_key = json.loads((pod.run_dir / "key_file.json").read_text())["inference"]["key"]
    assert new_key != old_key
    resp = until(
        lambda: (r := nginx.post(tokens[0])).status_code == 200 and r,
        timeout=10,
        what="the gateway to send the new key",
    )
    assert resp.json()["model_version"] == "1.0"
    assert f'"Bearer {new_key}"' in upstream_map.read_text()
    assert nginx.post(old_key).status_code == 401
    assert f"gateway: nginx (pid {nginx.proc.pid}) reloads the updated keys" in pod.out.read_text()


def test_rotating_the_shared_token_needs_no_restart(pod_gateway):
    pod, nginx, tokens, tokens_file = pod_gateway
    pod.wait_ready()
    frontend = pod.server.pid()
    new = secrets.token_urlsafe(32)
    tokens_file.write_text(f"# rotated\n{new}\n")  # what the kubelet does when the Secret changes
    until(lambda: nginx.post(new).status_code == 200, timeout=30, what="the new token accepted")
    # (nginx's old worker may still take a connection or two while it shuts down after the
    # reload: wait until the old token is refused three times in a row)
    until(
        lambda: [nginx.post(tokens[0]).status_code for _ in range(3)] == [401] * 3,
        timeout=30,
        what="the old token refused",
    )
    # A bad edit of the Secret is refused with a log line; nginx keeps the last good tokens.
    tokens_file.write_text("too short\n")
    until(
        lambda: "gateway tokens not updated: tokens line 1" in pod.out.read_text(),
        timeout=30,
        what="the refusal in the log",
    )
    assert nginx.post(new).status_code == 200
    assert pod.server.pid() == frontend, "TorchServe restarted"
    tokens_file.write_text(new + "\n")  # the good file again for the next test


def test_rotating_the_management_key_leaves_the_gateway_alone(pod_gateway):
    """README's management-key rotation, run in the pod: the inference key stays."""
    pod, nginx, _, tokens_file = pod_gateway
    pod.wait_ready()
    token = gateway.parse_tokens(tokens_file.read_text())[0]
    before = json.loads((pod.run_dir / "key_file.json").read_text())
    code = (
        "from pathlib import Path; from rtserve.server.probe import local_client; "
        f"local_client(Path({str(pod.run_dir)!r}), 5).refresh_key('management')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=pod.env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    after = json.loads((pod.run_dir / "key_file.json").read_text())
    assert after["management"]["key"] != before["management"]["key"]
    assert after["inference"] == before["inference"]
    assert nginx.post(token).status_code == 200


def ask(conn: http.client.HTTPConnection, token: str) -> tuple[int, str | None, dict]:
    """One prediction on ``conn``: status, the Connection header, the JSON answer."""
    conn.request(
        "POST",
        f"/predictions/{MODEL_NAME}",
        body=json.dumps(PAYLOAD),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    answer = conn.getresponse()
    return answer.status, answer.getheader("Connection"), json.loads(answer.read())


def test_a_draining_pod_closes_each_client_connection_after_its_answer(pod_gateway):
    """The preStop drain (``python -m rtserve probe drain``), with a keep-alive client sending
    through the gateway: from its start the gateway's ``/readyz`` (the kubelet's readiness check)
    answers 503, so the pod leaves the Service's serving endpoints while it still answers every
    request; once the propagation wait is over, each answer carries
    ``Connection: close`` (the client reconnects after it: to a ready pod, in a cluster), so no
    request meets a connection closed under it; the drain ends with nginx's reload for the idle
    ones. A restarted server clears both flags. (Runs last here: it drains and restarts the pod.)"""
    pod, nginx, _, tokens_file = pod_gateway
    pod.wait_ready()
    assert ready_through_gateway(nginx)
    token = gateway.parse_tokens(tokens_file.read_text())[0]  # (an earlier test rotated them)
    host, port = nginx.settings.listen.rsplit(":", 1)
    flag = Path(nginx.settings.gateway_dir) / gateway.CLOSING
    assert not flag.exists()
    error_log = nginx.root / "error.log"
    reloads_before = error_log.read_text().count("signal 1 (SIGHUP) received")
    answers: list[tuple[int, int, str | None]] = []  # (connection number, status, Connection)
    conn, number = None, 0
    drain = subprocess.Popen(
        [sys.executable, "-m", "rtserve", "probe", "drain", "--propagation", "1", "--timeout", "20", "--quiet", "1"],
        cwd=REPO,
        env=pod.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    flagged = None  # (the answer count when the flag appeared, for a failure's message)
    unready = None  # the answer count when /readyz first answered 503
    try:
        deadline = time.monotonic() + 30  # bounded: 30 s or 3,000 requests
        while sum(1 for a in answers if a[2] == "close") < 5:
            if drain.poll() is not None or time.monotonic() > deadline or len(answers) >= 3000:
                drain.kill()
                raise AssertionError(
                    f"{answers[-5:]} {len(answers)} answers, flag since {flagged}; the drain: {drain.communicate()[0]}"
                )
            if conn is None:
                conn, number = http.client.HTTPConnection(host, int(port), timeout=10), number + 1
            if flagged is None and flag.exists():
                flagged = len(answers)
            if unready is None and not ready_through_gateway(nginx):
                unready = len(answers)
            status, connection, body = ask(conn, token)
            assert status == 200 and body["model_version"] == "1.0", (status, body)
            answers.append((number, status, connection))
            if connection == "close":
                conn.close()
                conn = None
            time.sleep(0.02)
        out, _ = drain.communicate(timeout=60)
    finally:
        if conn is not None:
            conn.close()
        if drain.poll() is None:
            drain.kill()
            drain.wait()
    assert drain.returncode == 0, out
    kept = [a for a in answers if a[2] == "keep-alive"]
    closed = [a for a in answers if a[2] == "close"]
    # Before the flag: one connection for every answer; after it: one answer per connection.
    assert kept and {a[0] for a in kept} == {1}, answers[:10]
    assert answers.index(closed[0]) == len(kept) and len(closed) == 5, answers[-10:]
    assert len({a[0] for a in closed}) == 5, closed
    assert flag.exists()
    # unready first, within the propagation second, and answering every request since
    assert unready is not None and unready < answers.index(closed[0]), (unready, len(kept))
    assert requests.get(f"http://{nginx.settings.health_listen}/readyz", timeout=5).status_code == 503
    reloads = error_log.read_text().count("signal 1 (SIGHUP) received") - reloads_before
    assert reloads == 1, "the drain's end did not reload nginx to close the idle connections"
    print(
        f"drain: /readyz 503 after {unready} answers; {len(kept)} answers on one keep-alive "
        f"connection, then {len(closed)} answers each closing its own"
    )

    assert pod.terminate() == 0
    pod.start()  # the restarted container: the flag goes, connections are kept alive again
    pod.wait_ready()
    until(lambda: ready_through_gateway(nginx), what="/readyz through the gateway (the new key)")
    assert not flag.exists() and not (Path(nginx.settings.gateway_dir) / gateway.DRAINING).exists()
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        assert [ask(conn, token)[:2] for _ in range(3)] == [(200, "keep-alive")] * 3
    finally:
        conn.close()
