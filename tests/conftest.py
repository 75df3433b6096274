"""Fixtures: trained artifacts (unit tier) and Makefile-built archives (integration tier)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from rtserve.gateway.nginx import find_nginx
from rtserve.model.train import package
from tests.helpers import demo_eager, make

REPO = Path(__file__).resolve().parent.parent

# The examples' training (examples/script.py fit) is kept beside the Makefile's other caches, keyed by
# everything it reads: each example trains once per change, in this process and in `make example`.
os.environ.setdefault(
    "RTSERVE_TRAIN_CACHE",
    str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rtserve" / "trained"),
)

# The JVMs the tests start on this machine (TorchServe's frontends, the Kafka broker, the Cassandra
# node; the `java` launcher reads this variable, the pods of the cluster tier never see it) compile
# with C1 alone. Each lives seconds to minutes, where C2's compilations cost more CPU than they
# save: a frontend took 11.1 CPU-s to start and 15.4 more for 3,000 requests with C2, 6.5 and 6.1
# with C1 alone (its steady state, after C2's warm-up, is 0.37 ms of CPU per request against C1's
# 0.50: what production and `make bench-quick` keep). Set it empty to test with C2.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")


def go_pin(gomod: Path, module: str) -> str:
    """The version ``gomod`` requires ``module`` at, as make reads it (scripts/cluster pin)."""
    done = subprocess.run(
        [str(REPO / "scripts" / "cluster"), "pin", str(gomod), module], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


MODEL_NAME = "realtime-classifier"


#: The tools some tests need: the make target that installs each (`make test` runs them all
#: first), and how to tell it is there.
TOOLS = {
    "nginx": ("make nginx-deps", lambda: find_nginx() is not None),
    "wrk": ("make bench-deps", lambda: shutil.which("wrk") is not None),
    "fastapi": ("make bench-deps", lambda: all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn"))),
}


def require(tool: str) -> None:
    """Fail, never skip, a test whose ``tool`` is missing, naming the target that installs it."""
    target, present = TOOLS[tool]
    if not present():
        pytest.fail(f"{tool} is missing: `{target}` installs it (`make test` runs it first)")


@pytest.fixture()
def nginx_installed() -> None:
    """nginx (`make nginx-deps`); the test fails without it."""
    require("nginx")


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory) -> Path:
    """The demo's artifact directory (model.pt2 + meta.json, laid out like an unpacked archive),
    exported from the in-process eager model (:func:`tests.helpers.demo_eager`)."""
    out = tmp_path_factory.mktemp("model_v1")
    package(demo_eager("1.0"), "1.0", out)
    return out


@pytest.fixture(scope="session")
def build_root(tmp_path_factory) -> Path:
    """Where the Makefile puts artifacts and archives for this test session."""
    return tmp_path_factory.mktemp("build")


def make_archive(build_root: Path, version: str, store: Path | None = None, **variables: str) -> Path:
    """Build ``<name>_<version>.mar`` with the project's own Makefile (what users run): the demo,
    or the artifact directory given as ``ARTIFACTS=`` (with ``MODEL_NAME=``), into ``store``
    (default ``build_root/model_store``)."""
    store = store or build_root / "model_store"
    name = variables.get("MODEL_NAME", MODEL_NAME)
    args = [
        f"MODEL_VERSION={version}",
        f"MODEL_STORE={store}",
        # Staged under the session's own directory: the tiers' pytest processes run at once and
        # build the same versions (the Makefile's default, build/stage/<name>_<version>, is shared).
        f"STAGE={build_root / 'stage' / f'{name}_{version}'}",
        f"DEMO_ARTIFACTS={build_root / 'artifacts'}",
        f"VENV={REPO / '.venv'}",
    ]
    args += [f"{k}={v}" for k, v in variables.items()]
    done = subprocess.run(
        ["make", "-s", "archive", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ),
        text=True,
    )
    assert done.returncode == 0, f"make archive failed:\n{done.stdout[-3000:]}"
    mar = store / f"{name}_{version}.mar"
    assert mar.is_file(), f"make archive did not produce {mar}"
    return mar


@pytest.fixture(scope="session")
def mar_v1(build_root) -> Path:
    """The default archive, built by `make archive`."""
    return make_archive(build_root, "1.0")


@pytest.fixture(scope="session")
def image_vars(build_root, mar_v1) -> list[str]:
    """Make variables that point the image and pod targets at this session's archives."""
    assert shutil.which("podman"), "podman is missing: `make test` installs it (make pod-deps)"
    make_archive(build_root, "2.0")
    return [
        f"MODEL_STORE={mar_v1.parent}",
        f"DEMO_ARTIFACTS={build_root / 'artifacts'}",
        f"VENV={REPO / '.venv'}",
        "DOCKER=podman",
    ]


#: A cold `make cluster-deps` compiles Kubernetes, etcd and the add-ons (tens of minutes on 2 cores).
CLUSTER_BUILD_TIMEOUT = 3 * 3600


def _cluster_deps() -> subprocess.CompletedProcess:
    return make("cluster-deps", timeout=CLUSTER_BUILD_TIMEOUT)


#: `make cluster-deps` in a background thread, started once the session's tests are collected when
#: it has cluster tests (cold, the builds take long enough to overlap the tiers before).
_CLUSTER_BUILD: Future | None = None


def pytest_configure(config):
    from tests.interrupts import install

    install()  # SIGINT and SIGTERM tear the fixtures down (a tier in the background included)


def pytest_collection_finish(session):
    global _CLUSTER_BUILD
    if session.config.option.collectonly:  # (nothing runs: nothing to build for)
        return
    if _CLUSTER_BUILD is None and any(item.get_closest_marker("cluster") for item in session.items):
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cluster-deps")
        _CLUSTER_BUILD = pool.submit(_cluster_deps)
        pool.shutdown(wait=False)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A cluster test waits here for the build, before its own time limit (pytest-timeout's, armed
    inside this wrapper) starts: a cold build takes longer than any test may."""
    if _CLUSTER_BUILD is not None and item.get_closest_marker("cluster"):
        _CLUSTER_BUILD.exception(timeout=CLUSTER_BUILD_TIMEOUT)  # its failure is the fixture's to report
    yield


@pytest.fixture(scope="session")
def cluster_build() -> Future:
    """The background `make cluster-deps` (tests/cluster/conftest.py reads its result)."""
    assert _CLUSTER_BUILD is not None, "no cluster test was collected"
    yield _CLUSTER_BUILD
    try:  # never leave a build running past the session
        _CLUSTER_BUILD.exception(timeout=CLUSTER_BUILD_TIMEOUT)
    except Exception:  # noqa: BLE001 - reported by the tests
        pass


def monitoring_binary(*names: str) -> str:
    """The path of the first of ``names`` installed, installing Debian's prometheus packages
    (``make monitor-deps``) when none is."""
    import shutil

    for attempt in range(2):
        for name in names:
            found = shutil.which(name)
            if found:
                return found
        if attempt == 0:
            subprocess.run(
                ["make", "-s", "monitor-deps"], cwd=REPO, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
    pytest.fail(f"{names[0]} is missing and `make monitor-deps` could not install it")


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool (Debian's prometheus package)."""
    return monitoring_binary("promtool")
