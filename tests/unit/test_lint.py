"""The code's style holds without review: ruff's checks and its format (pyproject.toml), and the
project installs and imports outside the checkout."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )


def test_ruff_finds_nothing():
    done = ruff("check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-6000:]


def test_the_code_is_formatted():
    done = ruff("format", "--no-cache", "--check", ".")
    assert done.returncode == 0, done.stdout[-6000:]


def test_the_project_installs_and_imports_outside_the_checkout(tmp_path):
    source, target = tmp_path / "source", tmp_path / "site"
    for name in ("pyproject.toml", "README.md", "requirements.txt"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, source / name)
    for package in ("rtserve", "handler"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout[-4000:]

    def outside(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(cmd),
            cwd=tmp_path,
            env={"PYTHONPATH": str(target)},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
        )

    run = outside(
        sys.executable, "-c", "import rtserve.cli, handler.rtserve_handler, rtserve.server; print(rtserve.__file__)"
    )
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == str(target / "rtserve" / "__init__.py"), run.stdout
    assert (target / "rtserve" / "server" / "log4j2.xml").is_file()  # package data travels
    help_ = outside(str(target / "bin" / "rtserve"), "--help")
    assert help_.returncode == 0 and "usage: " in help_.stdout, help_.stdout
