"""Fixtures: trained artifacts (unit tier) and Makefile-built archives (integration tier)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rtserve.train import package
from tests.helpers import demo_eager

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "realtime-classifier"


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
    args = [f"MODEL_VERSION={version}", f"MODEL_STORE={store}",
            f"DEMO_ARTIFACTS={build_root / 'artifacts'}", f"VENV={REPO / '.venv'}"]
    args += [f"{k}={v}" for k, v in variables.items()]
    done = subprocess.run(["make", "-s", "archive", *args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=dict(os.environ), text=True)
    assert done.returncode == 0, f"make archive failed:\n{done.stdout[-3000:]}"
    mar = store / f"{variables.get('MODEL_NAME', MODEL_NAME)}_{version}.mar"
    assert mar.is_file(), f"make archive did not produce {mar}"
    return mar


@pytest.fixture(scope="session")
def mar_v1(build_root) -> Path:
    """The default archive, built by `make archive`."""
    return make_archive(build_root, "1.0")


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
            subprocess.run(["make", "-s", "monitor-deps"], cwd=REPO, check=False,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pytest.fail(f"{names[0]} is missing and `make monitor-deps` could not install it")


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool (Debian's prometheus package)."""
    return monitoring_binary("promtool")
