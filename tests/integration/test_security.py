"""Access control on a real TorchServe: tokens, allowed URLs, loopback-only listeners."""

from __future__ import annotations

import ipaddress

import psutil
import pytest
import requests

from rtserve.server.properties import OIP_KEY, read_properties
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import DEFAULT_CONFIG, OIP_ROUTES
from tests.conftest import MODEL_NAME

pytestmark = pytest.mark.integration


def state(server) -> list[tuple]:
    """What a refused call must not change: versions, default, worker counts."""
    client = server.client()
    default = client.describe(MODEL_NAME)[0]["modelVersion"]
    return [
        (d["modelVersion"], d["modelVersion"] == default, d["minWorkers"], len(d["workers"]))
        for d in client.describe(MODEL_NAME, "all")
    ]


def calls(server):
    inf, mgmt = server.props["inference_address"], server.props["management_address"]
    return [
        ("GET", f"{inf}/ping", {}),
        ("POST", f"{inf}/predictions/{MODEL_NAME}", {"json": sample_payload()}),
        ("GET", f"{mgmt}/models", {}),
        ("POST", f"{mgmt}/models", {"params": {"url": f"{MODEL_NAME}_1.0.mar", "model_name": "x"}}),
        ("PUT", f"{mgmt}/models/{MODEL_NAME}", {"params": {"min_worker": 5}}),
        ("PUT", f"{mgmt}/models/{MODEL_NAME}/1.0/set-default", {}),
        ("DELETE", f"{mgmt}/models/{MODEL_NAME}/1.0", {}),
        ("GET", f"{mgmt}/token", {"params": {"type": "inference"}}),
    ]


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", "Basic abc", "Bearer "])
def test_missing_or_wrong_token_is_refused_and_changes_nothing(server, header):
    before = state(server)
    for method, url, kwargs in calls(server):
        headers = {"Authorization": header} if header else {}
        resp = requests.request(method, url, headers=headers, timeout=10, **kwargs)
        assert resp.status_code == 400, (method, url, resp.status_code, resp.text)
        assert resp.json()["type"] == "InvalidKeyException", resp.text
    assert state(server) == before


def test_each_key_opens_only_its_own_api(server):
    keys = server.client().keys
    inf, mgmt = server.props["inference_address"], server.props["management_address"]
    as_mgmt = {"Authorization": f"Bearer {keys.get('management')}"}
    as_inf = {"Authorization": f"Bearer {keys.get('inference')}"}
    assert (
        requests.post(f"{inf}/predictions/{MODEL_NAME}", json=sample_payload(), headers=as_mgmt, timeout=10).status_code
        == 400
    )
    assert requests.get(f"{mgmt}/models", headers=as_inf, timeout=10).status_code == 400
    # renewing keys needs the API key, not the management key
    assert requests.get(f"{mgmt}/token", params={"type": "inference"}, headers=as_mgmt, timeout=10).status_code == 400
    assert requests.get(f"{mgmt}/models", headers=as_mgmt, timeout=10).status_code == 200


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/evil.mar",
        "https://example.com/realtime-classifier_1.0.mar",
        "file:///etc/passwd",
        "file:///tmp/evil.mar",
    ],
)
def test_registration_from_urls_is_refused(server, url):
    before = state(server)
    keys = server.client().keys
    resp = requests.post(
        f"{server.props['management_address']}/models",
        params={"url": url, "model_name": "evil", "initial_workers": 1},
        headers={"Authorization": f"Bearer {keys.get('management')}"},
        timeout=30,
    )
    assert resp.status_code == 404, resp.text
    assert "does not match any allowed URL(s)" in resp.json()["message"]
    assert state(server) == before
    assert [m["modelName"] for m in server.client().list_models()] == [MODEL_NAME]


def test_every_listener_is_on_loopback(server):
    """The frontend's five listeners (its metrics one private, on a port of its own), the
    metrics exporter's, which serves the configured metrics address, and rtserve.server.oip's (the
    OIP model routes the frontend sends there, on a private port)."""
    port = lambda address: int(address.rsplit(":", 1)[1])  # noqa: E731
    effective = read_properties(server.run_dir / "config.properties")
    frontend = [c.laddr for c in psutil.Process(server.pid()).net_connections() if c.status == "LISTEN"]
    ports = {port(server.props[k]) for k in ("inference_address", "management_address")}
    ports |= {
        port(effective["metrics_address"]),
        int(server.props["grpc_inference_port"]),
        int(server.props["grpc_management_port"]),
    }
    assert {a.port for a in frontend} == ports
    assert port(effective["metrics_address"]) != port(server.props["metrics_address"])
    exporter = [c.laddr for c in psutil.Process(server.exporter_pid()).net_connections() if c.status == "LISTEN"]
    assert [a.port for a in exporter] == [port(server.props["metrics_address"])]
    oip = [c.laddr for c in psutil.Process(server.sidecar_pid(OIP_ROUTES)).net_connections() if c.status == "LISTEN"]
    assert [a.port for a in oip] == [port(effective[OIP_KEY])]
    for addr in frontend + exporter + oip:
        ip = ipaddress.ip_address(addr.ip)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:  # Java's ::ffff:127.0.0.1
            ip = ip.ipv4_mapped
        assert ip.is_loopback, addr


def test_shipped_config_keeps_security_on():
    props = read_properties(DEFAULT_CONFIG)
    assert props["disable_token_authorization"] == "false"
    assert props["allowed_urls"] == "^$"
    assert props["install_py_dep_per_model"] == "false"
    for key in ("inference_address", "management_address", "metrics_address"):
        assert props[key].startswith("http://127.0.0.1:"), key
    for key in ("grpc_inference_address", "grpc_management_address"):
        assert props[key] == "127.0.0.1", key
