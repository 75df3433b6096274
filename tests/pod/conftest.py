"""Real podman pods: images built with `make image`, the pod run with `make pod` (deploy/podman/pod.py).

The images are tagged ``pytest-<version>`` so that a test run never replaces the images users
built; `make image` reuses an image whose inputs did not change (its ``rtserve.inputs`` label).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

import yaml

from deploy.podman.pod import CONTAINERS_CONF, read_status, render
from rtserve.runtime.ports import free_ports
from tests.conftest import REPO

VERSIONS = ("1.0", "2.0")


def make(*args: str, timeout: float = 900) -> str:
    """Run the project's Makefile (no variables inherited from an outer make); its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["CONTAINERS_CONF"] = str(CONTAINERS_CONF)
    result = subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"make {' '.join(args)} failed:\n{result.stdout[-4000:]}"
    return result.stdout


def podman(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=env)


def build_images(image_vars: list[str], build_root: Path) -> dict[str, str]:
    """`make image` of 1.0 and 2.0 (tagged ``pytest-<version>``) and the gateway stand-in;
    version -> image tag."""
    tags = {}
    for version in VERSIONS:
        tag = f"pytest-{version}"
        make("image", f"MODEL_VERSION={version}", f"IMAGE_TAG={tag}",
             f"IMAGE_CONTEXT={build_root / 'image' / version}", *image_vars)
        tags[version] = tag
    make("image-gateway", "DOCKER=podman")
    return tags


@pytest.fixture(scope="session")
def images(pod_image_build) -> dict[str, str]:
    """Images 1.0 and 2.0 and the gateway stand-in (version -> image tag): the build that
    tests/conftest.py started in the background when the session began."""
    return pod_image_build.result(timeout=1800)


@dataclass
class LocalPod:
    """A pod started with `make pod`, with what a test needs to reach it."""

    name: str
    pod_dir: Path
    ports: dict[str, int]
    version: str
    output: str

    @property
    def token(self) -> str:
        return (self.pod_dir / "gateway-token").read_text().strip()

    def url(self, port: str = "inference") -> str:
        return f"http://127.0.0.1:{self.ports[port]}"

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def keys(self) -> dict[str, str]:
        """TorchServe's keys, from the pod's run volume (an emptyDir: a host directory here)."""
        data = json.loads((self.pod_dir / "volumes" / "run" / "key_file.json").read_text())
        return {kind: data[kind]["key"] for kind in ("inference", "management")}

    def container(self, name: str) -> str:
        return f"{self.name}-{name}"

    def exec(self, container: str, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return podman("exec", self.container(container), *cmd, timeout=timeout)

    def status(self) -> dict:
        return read_status(self.pod_dir)

    def wait(self, predicate, timeout: float, what: str) -> dict:
        """Poll status.json until ``predicate(status)``; the status then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.status()
            if status and predicate(status):
                return status
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {timeout:.0f}s; status {self.status()}")


def start_pod(image_vars, images, tmp: Path, version: str, name: str,
              manifest: Path | None = None) -> LocalPod:
    """`make pod` on free loopback ports (of ``manifest``'s objects when given, else the
    production overlay's); the caller stops it with `make pod-stop`."""
    ports = dict(zip(("inference", "management", "metrics"), free_ports(3)))
    pod_dir = tmp / name
    extra = f" --manifest {manifest}" if manifest else ""
    out = make("pod", f"POD_DIR={pod_dir}", f"MODEL_VERSION={version}",
               f"POD_IMAGE_TAG={images[version]}",
               f"POD_ARGS=--name {name} --ports {ports['inference']},{ports['management']},{ports['metrics']}{extra}",
               *image_vars, timeout=600)
    return LocalPod(name, pod_dir, ports, version, out)


#: How much shorter the fast-probe copy's liveness period, probe timeout, grace period and
#: preStop waits are than the rendered manifest's.
FAST = 5


def fast_probe_manifest(path: Path) -> tuple[Path, dict]:
    """A test copy of the rendered production manifest whose rtserve liveness probe, grace period
    and preStop waits are ``FAST`` times shorter (thresholds unchanged), so that a liveness
    restart takes seconds instead of a minute and a half. Returns the file and the liveness
    probe it states."""
    objects = render("production")
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (rtserve,) = [c for c in pod["containers"] if c["name"] == "rtserve"]
    live = rtserve["livenessProbe"]
    live["periodSeconds"] = max(2, live["periodSeconds"] // FAST)
    live["timeoutSeconds"] = min(live["timeoutSeconds"], live["periodSeconds"])
    pod["terminationGracePeriodSeconds"] = max(5, pod["terminationGracePeriodSeconds"] // FAST)
    hook = rtserve["lifecycle"]["preStop"]["exec"]["command"]
    rtserve["lifecycle"]["preStop"]["exec"]["command"] = [
        str(max(1, int(arg) // FAST)) if arg.isdigit() else arg for arg in hook]
    path.write_text(yaml.safe_dump_all(objects))
    return path, live


def stop_pod(pod_dir: Path) -> str:
    return make("pod-stop", f"POD_DIR={pod_dir}", timeout=180)


@pytest.fixture(scope="module")
def pod(image_vars, images, tmp_path_factory):
    """The production pod of version 1.0, stopped (preStop, grace period) in ``finally``."""
    pod_dir = tmp_path_factory.mktemp("pods")
    name = f"rtserve-pytest-{os.getpid()}"
    try:
        yield start_pod(image_vars, images, pod_dir, "1.0", name)
    finally:
        if (pod_dir / name / "config.json").exists():
            stop_pod(pod_dir / name)
