"""The local cluster's custom metrics programs, Prometheus and prometheus-adapter: their Go modules
(rtserve/cluster/gomod.py, deploy/cluster/metrics/) and how make builds them into their own cache
directory (mk/cluster.mk, read from `make -n` plans: nothing is built)."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

from rtserve.cluster import gomod
from tests.conftest import REPO, go_pin

pytestmark = pytest.mark.unit

METRICS = REPO / "deploy" / "cluster" / "metrics"


def plan(*args: str) -> list[str]:
    """The commands `make -n` would run (lines joined), with no variables from an outer make."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", *args, f"VENV={REPO / '.venv'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.replace("\\\n", " ").splitlines()


def test_each_module_has_its_own_header_path_and_builds_its_program_as_a_tool():
    upstream = {"Go": "1.26.7", "Require": [{"Path": "k8s.io/client-go", "Version": "v0.37.1"}]}
    prometheus = gomod.prometheus_module(upstream, "v0.316.0").render()
    assert (
        prometheus.startswith(gomod.METRICS_HEADER)
        and "module rtserve/deploy/cluster/metrics/prometheus\n" in prometheus
    )
    assert "go 1.26.7\n" in prometheus and "\tgithub.com/prometheus/prometheus v0.316.0\n" in prometheus
    assert "tool (\n\tgithub.com/prometheus/prometheus/cmd/prometheus\n)" in prometheus
    adapter = gomod.prometheus_adapter_module({"Go": "1.22.1"}, "v0.12.0").render()
    assert adapter.startswith(gomod.METRICS_HEADER) and "module rtserve/deploy/cluster/metrics/adapter\n" in adapter
    assert "go 1.22.1\n" in adapter and "\tsigs.k8s.io/prometheus-adapter v0.12.0\n" in adapter
    assert "tool (\n\tsigs.k8s.io/prometheus-adapter/cmd/adapter\n)" in adapter
    assert "replace" not in prometheus + adapter


@pytest.mark.parametrize(
    "sub, module, version",
    [("prometheus", gomod.PROMETHEUS, "v0.316.0"), ("adapter", gomod.PROMETHEUS_ADAPTER, "v0.12.0")],
)
def test_the_committed_modules_are_the_generators_at_the_pinned_versions(sub, module, version):
    path = METRICS / sub / "go.mod"
    assert path.read_text().startswith(gomod.METRICS_HEADER)
    assert go_pin(path, module) == version
    assert (METRICS / sub / "go.sum").is_file()


def test_make_builds_both_into_a_cache_directory_keyed_by_their_go_mod_and_go_sum(tmp_path):
    files = [METRICS / m / f for m in ("prometheus", "adapter") for f in ("go.mod", "go.sum")]
    key = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    bin_dir = tmp_path / "cluster" / f"metrics-{key}" / "bin"
    lines = plan("cluster-metrics-deps", f"CACHE_DIR={tmp_path}")
    build = [line for line in lines if line.endswith("scripts/cluster build metrics")]
    assert len(build) == 1, lines
    env = dict(word.split("=", 1) for word in build[0].split()[:-3])
    assert env["CLUSTER_METRICS_DIR"] == "deploy/cluster/metrics"
    assert env["CLUSTER_METRICS_BIN"] == str(bin_dir)
    assert (env["CLUSTER_PROMETHEUS"], env["CLUSTER_PROMETHEUS_ADAPTER"]) == ("v0.316.0", "v0.12.0")
    assert lines[-1].endswith(f'in {bin_dir}"')
    assert any(line.endswith("scripts/cluster build metrics") for line in plan("cluster-deps", f"CACHE_DIR={tmp_path}"))


def test_a_built_cache_directory_is_not_built_again(tmp_path):
    lines = plan("cluster-metrics-deps", f"CACHE_DIR={tmp_path}", f"CLUSTER_METRICS_BIN={tmp_path}")
    assert any(line.endswith("scripts/cluster build metrics") for line in lines)
    (tmp_path / ".complete").touch()
    lines = plan("cluster-metrics-deps", f"CACHE_DIR={tmp_path}", f"CLUSTER_METRICS_BIN={tmp_path}")
    assert not any("scripts/cluster build" in line for line in lines), lines
