"""rtserve.k8s.volumes: which local PersistentVolumes rendered manifests hold, and what a deploy on
make cluster's node does with each. The kubectl here is a recording fake (it says so): a volume
released by a deleted claim is the cluster tier's (tests/cluster/test_records.py, against the
real API server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from rtserve.errors import DeployError
from rtserve.k8s.volumes import MODE, LocalVolume, local_volumes, prepare

pytestmark = pytest.mark.unit


def pv(name: str, path: str | None, kind: str = "PersistentVolume") -> dict:
    spec = {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}
    spec.update({"local": {"path": path}} if path else {"hostPath": {"path": "/srv"}})
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def test_only_local_volumes_are_found_in_order():
    text = yaml.safe_dump_all(
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
            pv("b-data", "/var/lib/b"),
            pv("host", None),
            None,
            pv("a-data", "/var/lib/a"),
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"local": "path"}},
        ]
    )
    assert local_volumes(text) == [LocalVolume("b-data", Path("/var/lib/b")), LocalVolume("a-data", Path("/var/lib/a"))]
    assert local_volumes("") == []


def test_a_relative_path_is_refused_naming_the_volume():
    with pytest.raises(
        DeployError,
        match=r"PersistentVolume data: spec.local.path must be absolute, "
        r"got 'var/lib/x'",
    ):
        local_volumes(yaml.safe_dump(pv("data", "var/lib/x")))


class FakeKubectl:
    """Records each call; ``get`` answers the volume's phase from ``phases`` (absent: kubectl's
    NotFound, a DeployError)."""

    def __init__(self, phases: dict[str, str]) -> None:
        self.phases, self.calls = phases, []

    def __call__(self, *args: str, capture: bool = False, quiet: bool = False, errors: bool = True) -> str:
        self.calls.append(args)
        if args[0] == "get":
            if args[2] not in self.phases:
                raise DeployError(f"kubectl {' '.join(args)} exited 1")
            return self.phases[args[2]]
        return ""


def test_prepare_makes_each_directory_and_deletes_only_a_released_volume(tmp_path):
    volumes = [
        LocalVolume("new", tmp_path / "a" / "b"),
        LocalVolume("bound", tmp_path / "c"),
        LocalVolume("released", tmp_path / "d"),
    ]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "records").write_text("kept")
    kubectl, said = FakeKubectl({"bound": "Bound", "released": "Released"}), []
    prepare(kubectl, volumes, said.append)
    for volume in volumes:
        assert volume.path.is_dir()
    assert (tmp_path / "a" / "b").stat().st_mode & 0o777 == MODE & ~_umask()
    assert (tmp_path / "c" / "records").read_text() == "kept"
    deletes = [c for c in kubectl.calls if c[0] == "delete"]
    assert deletes == [("delete", "persistentvolume", "released", "--wait=true")]
    assert said == [
        f">> PersistentVolume released was released by a deleted claim: deleting it, the "
        f"apply makes it anew (its data stays in {tmp_path / 'd'})"
    ]


def test_a_directory_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(
        DeployError,
        match=r"PersistentVolume data: cannot make its directory .*file/data "
        r"on this machine \(the node\)",
    ):
        prepare(FakeKubectl({}), [LocalVolume("data", tmp_path / "file" / "data")])


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
