"""The pod gateway's nginx config and map files: accepted by the real nginx (`nginx -t`), and
the key sync that rewrites them and signals nginx (a real child process stands in for nginx's
master: it records the SIGHUP it gets)."""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from rtserve.gateway import nginx as gateway
from rtserve.settings import Settings
from tests.conftest import REPO

pytestmark = pytest.mark.unit


def local(tmp_path) -> gateway.GatewaySettings:
    return replace(
        gateway.POD,
        listen="127.0.0.1:18080",
        health_listen="127.0.0.1:18086",
        gateway_dir=str(tmp_path),
        tmp_dir=str(tmp_path),
        access_log=str(tmp_path / "access.log"),
        error_log=str(tmp_path / "error.log"),
    )


def test_the_configmap_file_is_the_rendered_pod_config():
    shipped = (REPO / "deploy" / "k8s" / "base" / "gateway-nginx.conf").read_text()
    assert shipped == gateway.render_nginx_conf(gateway.POD), (
        "regenerate: .venv/bin/python -m rtserve gateway conf > deploy/k8s/base/gateway-nginx.conf"
    )


def test_config_routes_and_upstream():
    text = gateway.render_nginx_conf(gateway.POD)
    public = text.split("server {  # the Service's inference port")[1].split("server {  # the kubelet")[0]
    assert "listen 8080;" in public and "if ($rtserve_client_ok = 0)" in public
    assert [
        line.strip() for line in public.splitlines() if line.strip().startswith("location ") and "@" not in line
    ] == [
        "location = /ping {",
        "location /predictions/ {",
        "location /explanations/ {",
        "location /v1/models/ {",
        "location = /v2 {",
        "location /v2/ {",
        "location / {",
    ]
    # (TorchServe answers the OIP model metadata and readiness routes too: rtserve's agent)
    # each route, and the same request answered with Connection: close while the pod drains
    assert public.count("proxy_pass http://torchserve;") == 7
    assert public.count(f"if (-f /var/run/rtserve-gateway/{gateway.CLOSING}) {{ return 418; }}") == 6
    closing = public.split("location @closing {")[1].split("}")[0]
    assert "keepalive_timeout 0;" in closing and "error_page 418 = @closing;" in public
    assert "server 127.0.0.1:8090;" in text and "client_max_body_size 65536;" in text
    assert re.findall(r"Bearer [A-Za-z0-9_+/=-]{4,}", text) == ["Bearer realm="], "no key belongs in the static config"


@pytest.mark.usefixtures("nginx_installed")
def test_real_nginx_accepts_the_config_with_and_without_the_map_files(tmp_path):
    conf = tmp_path / "nginx.conf"
    conf.write_text(gateway.render_nginx_conf(local(tmp_path)))
    before = gateway.nginx_check(conf)  # nginx starts before rtserve wrote the maps
    assert before.returncode == 0 and "syntax is ok" in before.stdout, before.stdout
    longest = [secrets.token_urlsafe(192)[:256], secrets.token_urlsafe(32)]
    assert len(longest[0]) == 256
    (tmp_path / gateway.CLIENT_TOKENS).write_text(gateway.render_client_tokens(longest))
    (tmp_path / gateway.UPSTREAM_KEY).write_text(gateway.render_upstream_key("YWd-EO+z/A=="))
    after = gateway.nginx_check(conf)
    assert after.returncode == 0 and "syntax is ok" in after.stdout, after.stdout


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "no token in the file"),
        ("# only a comment\n\n", "no token in the file"),
        ("short\n", "tokens line 1: a token is 32-256 characters"),
        ("a" * 40 + "\n" + 'x" 1; "Bearer y' + "a" * 40 + "\n", "tokens line 2"),
        ("a" * 257, "tokens line 1"),
    ],
)
def test_bad_token_files_are_refused_by_line_never_echoing_the_value(text, message):
    with pytest.raises(gateway.GatewayError, match=message) as err:
        gateway.parse_tokens(text)
    assert 'x" 1' not in str(err.value) and "short" not in str(err.value)


def test_tokens_one_per_line_with_comments():
    a, b = "A" * 32, "b-_9" * 10
    assert gateway.parse_tokens(f"# rotation: old then new\n {a} \n\n{b}\n") == [a, b]
    assert gateway.render_client_tokens([a, b]).splitlines()[1:] == [f'"Bearer {a}" 1;', f'"Bearer {b}" 1;']


def test_a_pod_key_that_could_break_the_config_is_refused():
    with pytest.raises(gateway.GatewayError):
        gateway.render_upstream_key('abc"; }')
    assert gateway.render_upstream_key("YWd-EO-z").endswith('default "Bearer YWd-EO-z";\n')


@pytest.fixture
def fake_master(tmp_path):
    """A real process that records each SIGHUP, its PID where nginx keeps its own."""
    out = tmp_path / "hups"
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGHUP, lambda *a: open(sys.argv[1], 'a').write('hup\\n'))\n"
        "open(sys.argv[1], 'w').close()\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)])
    deadline = time.monotonic() + 10
    while not out.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (tmp_path / gateway.PID_FILE).write_text(f"{proc.pid}\n")
    try:
        yield proc, out
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)


def hups(out, expected: int) -> int:
    deadline = time.monotonic() + 5
    while out.read_text().count("hup") < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return out.read_text().count("hup")


def test_key_sync_writes_once_and_signals_only_on_change(tmp_path, fake_master):
    proc, out = fake_master
    key_file, tokens = tmp_path / "key_file.json", tmp_path / "tokens"
    token = secrets.token_urlsafe(32)
    tokens.write_text(token + "\n")
    sync = gateway.KeySync(tmp_path, key_file, tokens)
    assert sync.sync() is True and hups(out, 1) == 1  # tokens written, no key yet
    assert not (tmp_path / gateway.UPSTREAM_KEY).exists()
    key_file.write_text(json.dumps({"inference": {"key": "k1k1k1k1"}, "API": {"key": "x"}}))
    assert sync.sync() is True and hups(out, 2) == 2
    assert sync.sync() is False  # nothing changed
    assert (tmp_path / gateway.UPSTREAM_KEY).read_text().endswith('"Bearer k1k1k1k1";\n')
    assert (tmp_path / gateway.CLIENT_TOKENS).stat().st_mode & 0o777 == 0o600
    key_file.write_text(json.dumps({"inference": {"key": "k2k2k2k2"}}))  # TorchServe restarted
    assert sync.sync() is True and hups(out, 3) == 3
    tokens.write_text("not a token\n")  # a bad Secret edit: the last good tokens stay
    assert sync.sync() is False
    assert token in (tmp_path / gateway.CLIENT_TOKENS).read_text()


def test_key_sync_reloads_a_new_nginx_master_once(tmp_path, fake_master):
    proc, out = fake_master
    (tmp_path / "tokens").write_text(secrets.token_urlsafe(32))
    sync = gateway.KeySync(tmp_path, tmp_path / "key_file.json", tmp_path / "tokens")
    sync.signalled_pid = proc.pid + 1  # files unchanged, but the master is not the one signalled
    (tmp_path / gateway.CLIENT_TOKENS).write_text(
        gateway.render_client_tokens(gateway.parse_tokens((tmp_path / "tokens").read_text()))
    )
    assert sync.sync() is True and sync.signalled_pid == proc.pid
    assert sync.sync() is False and hups(out, 1) == 1


def test_no_gateway_without_its_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("RTSERVE_GATEWAY_DIR", raising=False)
    assert gateway.key_sync(Settings.from_env(run_dir=tmp_path)) is None
    monkeypatch.setenv("RTSERVE_GATEWAY_DIR", str(tmp_path / "gw"))
    monkeypatch.setenv("RTSERVE_GATEWAY_TOKENS", str(tmp_path / "t"))
    sync = gateway.key_sync(Settings.from_env(run_dir=tmp_path))
    assert (sync.gateway_dir, sync.key_file, sync.tokens_file) == (
        tmp_path / "gw",
        tmp_path / "key_file.json",
        tmp_path / "t",
    )


def test_the_closing_flag_is_set_once_and_a_starting_pod_clears_it(tmp_path, monkeypatch):
    assert gateway.closing(tmp_path, True) is True
    assert (tmp_path / gateway.CLOSING).exists()
    assert gateway.closing(tmp_path, True) is False  # already on
    from rtserve import container

    monkeypatch.setenv("RTSERVE_GATEWAY_DIR", str(tmp_path))
    monkeypatch.setenv("RTSERVE_GATEWAY_TOKENS", str(tmp_path / "tokens"))
    hooks = container.syncs(Settings.from_env(run_dir=tmp_path / "run"))
    assert hooks and not (tmp_path / gateway.CLOSING).exists()  # a restarted container's flag went
    assert gateway.closing(tmp_path, False) is False
