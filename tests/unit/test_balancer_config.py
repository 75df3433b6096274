"""The rehearsal's nginx config: valid for the real nginx (`nginx -t`), auth at every hop."""

from __future__ import annotations

import subprocess

import pytest

from bench.balancer import Backend, BalancerError, find_nginx, render_config

pytestmark = pytest.mark.unit

BACKENDS = [
    Backend("r1", "http://127.0.0.1:18080", "key-one", 19001),
    Backend("r2", "http://127.0.0.1:28080", "key-two", 19002),
]


def test_config_balances_over_hops_in_rotation_and_each_hop_carries_its_key(tmp_path):
    text = render_config(tmp_path, 19000, "gw", BACKENDS, ["r2"], generation=7)
    upstream = text.split("upstream replicas {")[1].split("}")[0]
    assert "127.0.0.1:19002" in upstream and "127.0.0.1:19001" not in upstream  # r1 out of rotation
    for b in BACKENDS:  # both still have a hop (r1 finishes its in-flight requests)
        hop = text.split(f"listen 127.0.0.1:{b.hop_port};")[1].split("server {")[0]
        assert f"proxy_pass {b.inference_url};" in hop
        assert f'proxy_set_header Authorization "Bearer {b.key}";' in hop
        assert "if ($gateway_ok = 0) { return 401" in hop
    assert '"Bearer gw" 1;' in text and 'return 200 "7\\n";' in text
    assert "keepalive_timeout 0;" in text


@pytest.mark.parametrize("rotation", [[], ["r3"]])
def test_bad_rotation_is_refused(tmp_path, rotation):
    with pytest.raises(BalancerError, match="must be a non-empty subset"):
        render_config(tmp_path, 19000, "gw", BACKENDS, rotation, generation=1)


@pytest.mark.usefixtures("nginx_installed")
def test_real_nginx_accepts_the_config(tmp_path):
    (tmp_path / "tmp").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(render_config(tmp_path, 19000, "gw", BACKENDS, ["r1", "r2"], generation=1))
    done = subprocess.run(
        [find_nginx(), "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout
    assert "syntax is ok" in done.stdout
