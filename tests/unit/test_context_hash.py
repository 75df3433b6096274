"""deploy/podman/context_hash.py: two builds of one model version share an image's inputs label
(their archives differ only in build times), a changed weight or handler does not; a wheel counts
by its name and size (the dependencies image's 2.7 GB wheelhouse is never read)."""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

import pytest

from deploy.podman.context_hash import archive_digest, context_digest

pytestmark = pytest.mark.unit


def mar(path: Path, created: str, weights: bytes = b"w" * 64) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("MAR-INF/MANIFEST.json", json.dumps({"createdOn": created, "model": {"modelVersion": "1.0"}}))
        z.writestr("meta.json", json.dumps({"version": "1.0", "provenance": {"created": created, "seed": 7}}))
        z.writestr("model.pt2", weights)
    return path


def test_build_times_do_not_change_the_digest_and_contents_do(tmp_path):
    first = mar(tmp_path / "a.mar", "30/11/2026 23:00:00")
    time.sleep(1.1)  # the zip's entry dates differ too
    second = mar(tmp_path / "b.mar", "30/11/2026 23:20:46")
    assert first.read_bytes() != second.read_bytes()
    assert archive_digest(first) == archive_digest(second)
    assert archive_digest(mar(tmp_path / "c.mar", "30/11/2026 23:00:00", b"x" * 64)) != archive_digest(first)


def test_the_context_digest_follows_every_file(tmp_path):
    (tmp_path / "ctx" / "handler").mkdir(parents=True)
    (tmp_path / "ctx" / "handler" / "h.py").write_text("a = 1\n")
    mar(tmp_path / "ctx" / "m.mar", "30/11/2026 23:00:00")
    before = context_digest(tmp_path / "ctx", ["base-id"])
    mar(tmp_path / "ctx" / "m.mar", "01/12/2026 01:00:00")
    assert context_digest(tmp_path / "ctx", ["base-id"]) == before
    assert context_digest(tmp_path / "ctx", ["other-base"]) != before
    (tmp_path / "ctx" / "handler" / "h.py").write_text("a = 2\n")
    assert context_digest(tmp_path / "ctx", ["base-id"]) != before


def test_a_wheel_counts_by_its_name_and_size_not_its_bytes(tmp_path):
    wheelhouse = tmp_path / "ctx" / "wheelhouse"
    wheelhouse.mkdir(parents=True)
    (wheelhouse / "requirements.txt").write_text("torch==2.13.0\n")
    wheel = wheelhouse / "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"a" * 100)
    before = context_digest(tmp_path / "ctx", ["base-id"])
    wheel.write_bytes(b"b" * 100)  # other bytes, the same size: not read
    assert context_digest(tmp_path / "ctx", ["base-id"]) == before
    wheel.write_bytes(b"b" * 101)  # rebuilt under the same name
    assert context_digest(tmp_path / "ctx", ["base-id"]) != before
    wheel.write_bytes(b"a" * 100)
    assert context_digest(tmp_path / "ctx", ["base-id"]) == before
    wheel.rename(wheelhouse / "torch-2.13.1-cp311-cp311-manylinux_2_28_x86_64.whl")  # another version
    assert context_digest(tmp_path / "ctx", ["base-id"]) != before
    # Any other file still counts by its bytes.
    (wheelhouse / "torch-2.13.1-cp311-cp311-manylinux_2_28_x86_64.whl").rename(wheel)
    (wheelhouse / "requirements.txt").write_text("torch==2.13.9\n")
    assert context_digest(tmp_path / "ctx", ["base-id"]) != before
