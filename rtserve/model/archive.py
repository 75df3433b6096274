"""What a model archive (``.mar``) says about its model, read without loading the model (no torch).

rtserve's one reader of an archive's ``MAR-INF/MANIFEST.json`` and the ``meta.json`` that
:func:`rtserve.model.package.export` wrote: the promotion gate takes the golden set and labels
from it (:class:`rtserve.promotion.gate.ArchiveMeta`), the OIP model routes the tensor shapes
(:mod:`rtserve.server.oip`). The handler reads ``meta.json`` itself, inside the worker, through
``handler.model.ModelMetadata`` (the archive carries the handler, not rtserve).
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

from rtserve.errors import ArchiveError

MANIFEST = "MAR-INF/MANIFEST.json"
METADATA = "meta.json"


@dataclass(frozen=True)
class Archive:
    """One archive's manifest and metadata.

    Attributes:
        path: the ``.mar`` file.
        name, version: the manifest's ``modelName`` and ``modelVersion`` (what TorchServe serves).
        meta: ``meta.json`` as written at packaging time.
    """

    path: Path
    name: str
    version: str
    meta: dict

    @property
    def meta_version(self) -> str:
        """The version ``meta.json`` records (the packaged model's own)."""
        return str(self.meta["version"])

    @property
    def labels(self) -> list[str]:
        """Class labels, in output column order."""
        return list(self.meta["labels"])

    @property
    def n_features(self) -> int:
        """Number of input features."""
        return len(self.meta["feature_names"])

    @property
    def golden(self) -> dict:
        """The golden set (``features``, ``labels`` or None, ``probabilities``); {} if none."""
        return self.meta.get("golden") or {}


def read_archive(mar: str | Path) -> Archive:
    """The manifest and ``meta.json`` of ``mar``.

    Raises:
        ArchiveError: the file cannot be read, is not an archive, or lacks the manifest, the
            metadata or a field every rtserve archive has (version, labels, feature names).
    """
    mar = Path(mar)
    try:
        with zipfile.ZipFile(mar) as zf:
            manifest = json.loads(zf.read(MANIFEST))["model"]
            meta = json.loads(zf.read(METADATA))
        archive = Archive(mar, manifest["modelName"], str(manifest["modelVersion"]), meta)
        archive.meta_version, archive.labels, archive.n_features  # noqa: B018 - present?
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
        raise ArchiveError(f"{mar}: not a usable rtserve archive ({type(exc).__name__}: {exc})") from exc
    return archive
