"""The node's pod sandbox ("pause") image, packed as an OCI archive from the pause program ``make cluster-deps`` builds.

One uncompressed layer holding ``/pause``, made byte for byte reproducibly, so the image's name carries its digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path

REPOSITORY = "localhost/rtserve-pause"
#: What the kernel calls the machine -> what OCI calls the architecture.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}
#: The user the sandbox's process runs as (nobody can write anything of the pod's).
USER = "65535:65535"


def architecture() -> str:
    machine = platform.machine()
    return ARCHITECTURES.get(machine, machine)


def _tar(members: dict[str, tuple[bytes, int]]) -> bytes:
    """A reproducible tar of ``{name: (content, mode)}`` (owner root, time 0)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (content, mode) in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _descriptor(media_type: str, digest: str, data: bytes, **extra) -> dict:
    return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}


def _json(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def image(pause: bytes, arch: str | None = None) -> tuple[str, bytes]:
    """The sandbox image of the ``pause`` program: its name and the OCI archive ``ctr images import`` reads.

    The name is tagged with the first 12 hex digits of the manifest's digest.
    """
    arch = arch or architecture()
    layer_digest, layer = _blob(_tar({"pause": (pause, 0o755)}))
    config_digest, config = _blob(
        _json(
            {
                "architecture": arch,
                "os": "linux",
                "config": {"Entrypoint": ["/pause"], "User": USER},
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            }
        )
    )
    manifest_digest, manifest = _blob(
        _json(
            {
                "schemaVersion": 2,
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": _descriptor("application/vnd.oci.image.config.v1+json", config_digest, config),
                "layers": [_descriptor("application/vnd.oci.image.layer.v1.tar", layer_digest, layer)],
            }
        )
    )
    tag = manifest_digest.removeprefix("sha256:")[:12]
    name = f"{REPOSITORY}:{tag}"
    index = _json(
        {
            "schemaVersion": 2,
            "manifests": [
                _descriptor(
                    "application/vnd.oci.image.manifest.v1+json",
                    manifest_digest,
                    manifest,
                    platform={"architecture": arch, "os": "linux"},
                    annotations={"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag},
                )
            ],
        }
    )
    blobs = {
        f"blobs/sha256/{d.removeprefix('sha256:')}": (b, 0o644)
        for d, b in ((layer_digest, layer), (config_digest, config), (manifest_digest, manifest))
    }
    return name, _tar(
        {"oci-layout": (_json({"imageLayoutVersion": "1.0.0"}), 0o644), "index.json": (index, 0o644), **blobs}
    )


def image_of(binary: Path) -> tuple[str, bytes]:
    """:func:`image` of the pause program at ``binary``."""
    return image(binary.read_bytes())
