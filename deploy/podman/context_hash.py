"""The hash of an image's build context that `make image` labels the image with (rtserve.inputs)
and compares before building: unchanged inputs, no build.

Every file counts by its bytes, except a model archive (.mar), which counts by its entries' names
and bytes with the build times left out: MANIFEST.json's ``createdOn`` (torch-model-archiver
stamps it, and the zip's entry dates) and meta.json's ``provenance.created`` (ours). The demo's
training is deterministic, so two builds of one version differ only there, and an unchanged model
would otherwise rebuild the image, and the cluster's node import it again, in every test session.

    python -m deploy.podman.context_hash CONTEXT_DIR [EXTRA ...]   # EXTRA: e.g. the base's id
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path


def archive_digest(path: Path) -> str:
    """A digest of a .mar's contents that two builds from the same inputs share."""
    h = hashlib.sha256()
    with zipfile.ZipFile(path) as mar:
        for name in sorted(mar.namelist()):
            data = mar.read(name)
            if name.endswith("MANIFEST.json"):
                manifest = json.loads(data)
                manifest.pop("createdOn", None)
                data = json.dumps(manifest, sort_keys=True).encode()
            elif name == "meta.json":
                meta = json.loads(data)
                meta.get("provenance", {}).pop("created", None)
                data = json.dumps(meta, sort_keys=True).encode()
            h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def context_digest(context: Path, extra: list[str]) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        digest = archive_digest(path) if path.suffix == ".mar" else hashlib.sha256(path.read_bytes()).hexdigest()
        h.update(f"{rel}\0{digest}\n".encode())
    for item in extra:
        h.update(f"extra\0{item}\n".encode())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m deploy.podman.context_hash CONTEXT_DIR [EXTRA ...]")
    print(context_digest(Path(sys.argv[1]), sys.argv[2:]))
