"""Fixtures: trained artifacts (unit tier) and Makefile-built archives (integration tier)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from rtserve.train import train

REPO = Path(__file__).resolve().parent.parent
MODEL_NAME = "realtime-classifier"


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory) -> Path:
    """A model directory laid out like an unpacked archive: weights.pt + meta.json."""
    import torch

    out = tmp_path_factory.mktemp("model_v1")
    model, meta = train("1.0", epochs=1, hidden=64)
    torch.save(model.state_dict(), out / "weights.pt")
    meta.save(out / "meta.json")
    return out


@pytest.fixture(scope="session")
def build_root(tmp_path_factory) -> Path:
    """Where the Makefile puts artifacts and archives for this test session."""
    return tmp_path_factory.mktemp("build")


def make_archive(build_root: Path, version: str, store: Path | None = None, **variables: str) -> Path:
    """Build ``<name>_<version>.mar`` with the project's own Makefile (what users run), into
    ``store`` (default ``build_root/model_store``)."""
    store = store or build_root / "model_store"
    args = [f"MODEL_VERSION={version}", f"MODEL_STORE={store}",
            f"ARTIFACTS={build_root / 'artifacts'}", f"VENV={REPO / '.venv'}"]
    args += [f"{k}={v}" for k, v in variables.items()]
    subprocess.run(["make", "-s", "archive", *args], cwd=REPO, check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ))
    mar = store / f"{MODEL_NAME}_{version}.mar"
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
