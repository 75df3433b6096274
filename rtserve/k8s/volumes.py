"""Prepare the ``local`` PersistentVolumes an overlay applies on ``make cluster``'s node (this machine).

Each volume's directory is made before the apply (the kubelet mounts only an existing one), and a volume left
``Released`` by a deleted claim is deleted so the apply makes it anew on the same directory, data kept.
:func:`local_volumes` is pure; :func:`prepare` runs the steps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from rtserve.errors import DeployError

#: The mode of a volume's directory made here (the kubelet adds the pod's fsGroup to it).
MODE = 0o750


@dataclass(frozen=True)
class LocalVolume:
    """A ``local`` PersistentVolume of rendered manifests: its name and its directory on the node."""

    name: str
    path: Path


def local_volumes(manifests: str) -> list[LocalVolume]:
    """The ``local`` PersistentVolumes in ``manifests`` (a multi-document YAML text), in order.

    Raises:
        DeployError: a local volume's path is not absolute.
    """
    found = []
    for doc in yaml.safe_load_all(manifests):
        if not doc or doc.get("kind") != "PersistentVolume":
            continue
        path = ((doc.get("spec") or {}).get("local") or {}).get("path")
        if path is None:
            continue
        name = doc["metadata"]["name"]
        if not Path(path).is_absolute():
            raise DeployError(f"PersistentVolume {name}: spec.local.path must be absolute, got {path!r}")
        found.append(LocalVolume(name, Path(path)))
    return found


def prepare(kubectl, volumes: list[LocalVolume], say: Callable[[str], None] = print) -> None:
    """Make each volume's directory on this machine, and delete a volume object that is ``Released``.

    The apply then makes it anew, available to the new claim; its data stays.

    Args:
        kubectl: a :class:`rtserve.k8s.deploy.Kubectl` of the cluster.
        volumes: what :func:`local_volumes` found.
        say: where a line about each step goes.

    Raises:
        DeployError: a directory cannot be made, or kubectl failed to delete a released volume.
    """
    for volume in volumes:
        try:
            volume.path.mkdir(mode=MODE, parents=True, exist_ok=True)
        except OSError as exc:
            raise DeployError(
                f"PersistentVolume {volume.name}: cannot make its directory "
                f"{volume.path} on this machine (the node): {exc}"
            ) from exc
        try:
            phase = kubectl(
                "get",
                "persistentvolume",
                volume.name,
                "-o",
                "jsonpath={.status.phase}",
                capture=True,
                quiet=True,
                errors=False,
            ).strip()
        except DeployError:
            phase = ""  # none yet: the apply makes it
        if phase == "Released":
            say(
                f">> PersistentVolume {volume.name} was released by a deleted claim: deleting it, "
                f"the apply makes it anew (its data stays in {volume.path})"
            )
            kubectl("delete", "persistentvolume", volume.name, "--wait=true")
