"""The hash of an image's build context that `make image` labels the image with (rtserve.inputs)
and compares before building: unchanged inputs, no build.

Every file counts by its bytes, except two kinds:

- A wheel (.whl) counts by its name and size, not its bytes. A wheel's name pins its
  distribution's version, Python and platform (``torch-2.13.0-cp311-cp311-manylinux_...whl``), so
  a changed requirement or platform changes a name; the size catches a wheel rebuilt under the
  same name. (Reading the dependencies image's wheelhouse, 2.7 GB, took about 10 s of every
  `make image`.) A wheel rebuilt at the same size with other bytes goes unnoticed: remove the
  dependencies image (and the images built on it) to rebuild it.
- A model archive (.mar) counts by its entries' names and bytes with the build times left out:
  MANIFEST.json's ``createdOn`` (torch-model-archiver stamps it, and the zip's entry dates) and
  meta.json's ``provenance.created`` (ours). The demo's training is deterministic, so two builds
  of one version differ only there, and an unchanged model would otherwise rebuild the image, and
  the cluster's node import it again, in every test session.

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


def file_digest(path: Path) -> str:
    """What one file of a context counts by (the module's docstring says why)."""
    if path.suffix == ".whl":
        return f"wheel\0{path.name}\0{path.stat().st_size}"
    if path.suffix == ".mar":
        return archive_digest(path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def context_digest(context: Path, extra: list[str]) -> str:
    """16 hex digits of a hash of every file under ``context`` (path, digest) and of ``extra`` (image IDs)."""
    h = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        rel = path.relative_to(context).as_posix()
        digest = file_digest(path)
        h.update(f"{rel}\0{digest}\n".encode())
    for item in extra:
        h.update(f"extra\0{item}\n".encode())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m deploy.podman.context_hash CONTEXT_DIR [EXTRA ...]")
    print(context_digest(Path(sys.argv[1]), sys.argv[2:]))
