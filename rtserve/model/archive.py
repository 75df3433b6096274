"""What a model archive (``.mar``) says about its model, read without loading the model (no torch).

rtserve's one reader of an archive's ``MAR-INF/MANIFEST.json`` and ``meta.json`` (for the promotion gate, the
OIP routes, the warm-up); :func:`golden_mismatches` compares answers with a golden set,
:func:`golden_label_problem` checks its labels per output kind. Inside the worker the
handler reads ``meta.json`` itself (``handler.model.ModelMetadata``): the archive carries no rtserve.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Sequence
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
        """The golden set (``features``, ``labels`` or None, ``probabilities`` or ``outputs``); {} if none."""
        return self.meta.get("golden") or {}


def read_meta(mar: str | Path) -> dict:
    """The ``meta.json`` of ``mar``, with the fields every rtserve archive has.

    Those fields are the version, the labels and the feature names.

    Raises:
        ArchiveError: the file cannot be read, is not an archive, or lacks its metadata.
    """
    try:
        with zipfile.ZipFile(mar) as zf:
            meta = json.loads(zf.read(METADATA))
        str(meta["version"]), list(meta["labels"]), len(meta["feature_names"])
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
        raise ArchiveError(f"cannot read meta.json from {mar}: {type(exc).__name__}: {exc}") from exc
    return meta


def read_archive(mar: str | Path) -> Archive:
    """The manifest and ``meta.json`` of ``mar``.

    Raises:
        ArchiveError: the file cannot be read, is not an archive, or lacks the manifest, the
            metadata or a field every rtserve archive has (version, labels, feature names).
    """
    meta = read_meta(mar)
    try:
        with zipfile.ZipFile(mar) as zf:
            manifest = json.loads(zf.read(MANIFEST))["model"]
        return Archive(Path(mar), manifest["modelName"], str(manifest["modelVersion"]), meta)
    except (OSError, KeyError, TypeError, ValueError, zipfile.BadZipFile) as exc:
        raise ArchiveError(f"{mar}: not a usable rtserve archive ({type(exc).__name__}: {exc})") from exc


def golden_mismatches(
    expected: Sequence[Sequence[float]], got: Sequence[Sequence[float]], tolerance: float
) -> list[int]:
    """Indices of rows whose probabilities differ by more than ``tolerance`` or have another length.

    The tolerance is absolute plus relative, like ``torch.isclose``.
    """
    bad = []
    for i, (want, have) in enumerate(zip(expected, got)):
        if len(want) != len(have) or any(abs(a - b) > tolerance + tolerance * abs(a) for a, b in zip(want, have)):
            bad.append(i)
    return bad + list(range(min(len(expected), len(got)), max(len(expected), len(got))))


def golden_label_problem(kind: str, width: int, golden: dict) -> str | None:
    """What is wrong with a golden set's ``labels`` (the holdout's truth) for an output of ``kind``; None: nothing.

    ``labels`` is null (unlabelled) or one entry per golden row: a class index in ``[0, width)``
    (classification), a finite number (a regression of width 1) or a list of ``width`` of them
    (several targets), a list of ``width`` 0/1 (multi-label); an embedding has none.
    """
    labels = golden.get("labels")
    if labels is None:
        return None
    rows = len(golden.get("features") or [])
    if not isinstance(labels, list) or len(labels) != rows:
        return f"golden.labels must be null or one entry per golden row ({rows})"

    def number(v: object) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    def row_of(y: object, ok) -> bool:
        return isinstance(y, list) and len(y) == width and all(ok(v) for v in y)

    checks = {
        "classification": (
            lambda y: isinstance(y, int) and not isinstance(y, bool) and 0 <= y < width,
            f"a class index in [0, {width - 1}]",
        ),
        "regression": (
            (lambda y: number(y) or row_of(y, number)) if width == 1 else (lambda y: row_of(y, number)),
            "a finite number (the target)" if width == 1 else f"a list of {width} finite numbers (the targets)",
        ),
        "multi_label": (lambda y: row_of(y, lambda v: type(v) is int and v in (0, 1)), f"a list of {width} 0/1"),
    }
    if kind not in checks:
        return f"golden.labels must be null for an output of kind {kind} (it has no truth), got a list"
    ok, what = checks[kind]
    bad = next((i for i, y in enumerate(labels) if not ok(y)), None)
    if bad is not None:
        return f"golden.labels[{bad}] must be {what} for a {kind} output of width {width}, got {labels[bad]!r}"
    return None
