"""The exec probes' client: :class:`rtserve.client.light.Session` makes the same calls as
``requests`` (keys, renewal, the probe's route, error answers), the probes report as before
through it, and a probe command imports neither ``requests`` nor any other command group."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from handler.errors import EXPECTED_HEADER, REASON_HEADER
from handler.records import ROUTE_HEADER
from rtserve.cli import GROUPS
from rtserve.client.light import Session
from rtserve.client.rest import Client, TorchServeError
from rtserve.runtime.ports import free_ports
from rtserve.server.probe import live, ready
from rtserve.server.readiness import probe_prediction
from rtserve.settings import WARM_FILE
from tests.conftest import REPO

pytestmark = pytest.mark.unit

API_KEY = "api-key"
WIDTH = 3  # the fake model's feature count (the probe sends 32 first)


def in_an_hour() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


def key_file_text(inference: str, expires: datetime) -> str:
    """key_file.json as TorchServe writes it."""
    stamp = expires.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps(
        {
            "management": {"key": "mgmt-key", "expiration time": stamp},
            "inference": {"key": inference, "expiration time": stamp},
            "API": {"key": API_KEY},
        }
    )


class FakeTorchServe(ThreadingHTTPServer):
    """TorchServe's answers to what the probes send: /ping, a prediction of WIDTH features (the
    handler's 400 with the expected count otherwise), the token API renewing the inference key
    (written to ``key_file``, as TorchServe does); 401 for a wrong or expired key. It starts with
    an expired key; ``seen`` records every request."""

    daemon_threads = True

    def __init__(self, key_file: Path) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.key_file = key_file
        self.ping_status = 200
        self.seen: list[tuple] = []
        self.renewals = 0
        self.new_key("first", datetime.now(UTC) - timedelta(seconds=1))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def new_key(self, key: str, expires: datetime) -> None:
        self.key, self.expires = key, expires
        self.key_file.write_text(key_file_text(key, expires))


class Handler(BaseHTTPRequestHandler):
    server: FakeTorchServe

    def log_message(self, *args) -> None:
        pass

    def answer(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def record(self, body: bytes) -> None:
        self.server.seen.append(
            (
                self.command,
                self.path,
                self.headers.get("Authorization"),
                self.headers.get(ROUTE_HEADER),
                self.headers.get("Content-Type"),
                json.loads(body) if body else None,
            )
        )

    def authorized(self) -> bool:
        server = self.server
        if self.headers.get("Authorization") == f"Bearer {server.key}" and server.expires > datetime.now(UTC):
            return True
        self.answer(
            401,
            {
                "code": 401,
                "type": "InvalidKeyException",
                "message": "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
            },
        )
        return False

    def do_GET(self) -> None:
        self.record(b"")
        url = urlsplit(self.path)
        if url.path == "/token":
            assert self.headers.get("Authorization") == f"Bearer {API_KEY}"
            kind = parse_qs(url.query)["type"]
            assert kind == ["inference"], kind
            self.server.renewals += 1
            self.server.new_key(f"renewed-{self.server.renewals}", in_an_hour())
            self.answer(200, {"message": "renewed"})
        elif self.authorized():
            status = self.server.ping_status
            self.answer(status, {"status": "Healthy" if status == 200 else "Partial Healthy"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.record(body)
        if not self.authorized():
            return
        if self.path != "/predictions/m":
            self.answer(
                404,
                {
                    "code": 404,
                    "type": "ModelNotFoundException",
                    "message": f"Model not found: {self.path.rsplit('/', 1)[-1]}",
                },
            )
            return
        features = json.loads(body)["features"]
        if len(features) != WIDTH:
            self.answer(
                400,
                {"error": f"expected {WIDTH} features, got {len(features)}"},
                {EXPECTED_HEADER: str(WIDTH), REASON_HEADER: "wrong_length"},
            )
            return
        self.answer(200, {"prediction": 0, "model_version": "1.0", "probabilities": [1.0, 0.0]})


@pytest.fixture()
def torchserve(tmp_path):
    """A fake TorchServe on a free loopback port, with a run directory as the server leaves it
    (effective config, an expired inference key, the warm file)."""
    server = FakeTorchServe(tmp_path / "key_file.json")
    (tmp_path / "config.properties").write_text(
        f"inference_address=http://0.0.0.0:{server.server_address[1]}\nmanagement_address={server.url}\n"
    )
    (tmp_path / WARM_FILE).write_text("1\n")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run_dir_of(server: FakeTorchServe) -> Path:
    return server.key_file.parent


@pytest.mark.parametrize("session", [None, Session], ids=["requests", "light"])
def test_the_light_session_sends_what_requests_sends(torchserve, session):
    """The probe's calls (ping, a prediction that learns the feature count, an expired key
    renewed with the API key) go out and come back the same through either session."""
    client = Client(
        torchserve.url,
        torchserve.url,
        key_file=torchserve.key_file,
        timeout=3,
        retries=0,
        session=session and session(),
    )
    assert client.ping() is True
    answer = probe_prediction(client, "m")
    assert answer == {"prediction": 0, "model_version": "1.0", "probabilities": [1.0, 0.0]}
    torchserve.ping_status = 500
    assert client.ping() is False
    with pytest.raises(TorchServeError, match="POST /predictions/no such -> 404: Model not found: no%20such"):
        client.predict("no such", {"features": [0.0] * WIDTH})  # the path percent-encoded
    bearer, zeros = "Bearer renewed-1", {"features": [0.0] * WIDTH}
    assert torchserve.seen == [
        ("GET", "/ping", "Bearer first", None, None, None),  # expired: 401, renewed, sent again
        ("GET", "/token?type=inference", f"Bearer {API_KEY}", None, None, None),
        ("GET", "/ping", bearer, None, None, None),
        ("POST", "/predictions/m", bearer, "probe", "application/json", {"features": [0.0] * 32}),
        ("POST", "/predictions/m", bearer, "probe", "application/json", zeros),
        ("GET", "/ping", bearer, "probe", None, None),
        ("POST", "/predictions/no%20such", bearer, "probe", "application/json", zeros),
    ]


@pytest.mark.parametrize("session", [None, Session], ids=["requests", "light"])
def test_no_answer_is_a_torchserve_error_without_a_status(session):
    closed = free_ports(1)[0]
    client = Client(
        f"http://127.0.0.1:{closed}", f"http://127.0.0.1:{closed}", timeout=3, retries=0, session=session and session()
    )
    with pytest.raises(TorchServeError, match=f"GET /ping: no answer from http://127.0.0.1:{closed}: ") as err:
        client.ping()
    assert not err.value.status


def test_a_silent_server_times_out_as_no_answer():
    """A frozen frontend (it accepts connections, answers nothing) fails within the timeout."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        client = Client(url, url, timeout=0.3, retries=0, session=Session())
        with pytest.raises(TorchServeError, match="no answer from .*: timed out") as err:
            client.ping()
        assert not err.value.status


def test_the_probes_report_as_before(torchserve):
    run_dir = run_dir_of(torchserve)
    assert ready(run_dir, "m").message == "ready: m 1.0 answers"
    assert torchserve.renewals == 1  # the expired key, renewed as the client always did
    assert live(run_dir).message == "live: /ping 200"
    result = ready(run_dir, "nope")
    assert not result.ok
    assert result.message == "not ready: POST /predictions/nope -> 404: Model not found: nope"
    torchserve.ping_status = 500
    assert ready(run_dir, "m").message == "/ping: a model is not healthy yet"
    assert live(run_dir).message == "live: /ping 500"
    torchserve.key_file.write_text(key_file_text("wrong", in_an_hour()))
    assert live(run_dir).message == "live: frontend answered 401"  # not expired: not renewed
    assert not ready(run_dir, "m").ok


def imported(check: str, run_dir: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -m rtserve probe <check>`` as the pod runs it, and the modules it imported."""
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "rtserve",
            "probe",
            check,
            "--run-dir",
            str(run_dir),
            "--model",
            "m",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, set(re.findall(r"(?m)^import time:.*\| *(\S+)$", done.stderr))


@pytest.mark.parametrize("check", ["ready", "live"])
def test_a_probe_imports_neither_requests_nor_the_other_command_groups(tmp_path, check):
    """The kubelet starts a probe every few seconds: importing requests and every command group
    made it cost about 0.4 s of CPU (make bench-probe). Here the probe gets as far as its client's
    first call: the server it names is gone."""
    closed = free_ports(1)[0]
    (tmp_path / "config.properties").write_text(
        f"inference_address=http://127.0.0.1:{closed}\nmanagement_address=http://127.0.0.1:{closed}\n"
    )
    (tmp_path / "key_file.json").write_text(key_file_text("k", in_an_hour()))
    (tmp_path / WARM_FILE).write_text("1\n")
    done, modules = imported(check, tmp_path)
    verdict = {
        "ready": "not ready: GET /ping: no answer from",
        "live": "frontend does not answer: GET /ping: no answer from",
    }
    assert done.returncode == 1 and done.stdout.startswith(verdict[check]), done.stdout + done.stderr
    assert "rtserve.server.probe" in modules
    assert not {"requests", "urllib3"} & modules
    others = {f"rtserve.cli.{group}" for group in GROUPS} - {"rtserve.cli.probe"}
    assert not others & modules, sorted(others & modules)
