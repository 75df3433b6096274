"""The workers' metrics directory kept bounded: the files of dead workers merged into one archive.

:func:`compact` merges dead PIDs' multiprocess files into one ``<kind>_archive.db`` per kind (sums add up;
``max``, ``min`` and ``mostrecent`` gauges keep theirs; ``live*`` and ``all`` gauges drop), so scrapes see the
same figures. A manifest's rename commits it: an interrupted one is finished or forgotten, never counted twice.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

from rtserve.runtime.process import alive

ARCHIVE = "archive"
#: The manifest of a compaction between its commit and its end.
MANIFEST = "compaction.json"
#: A staged archive's suffix (not ``.db``: the collector does not read it).
STAGED = ".next"
#: Gauge modes whose dead workers' values are dropped.
DROPPED_MODES = ("all", "liveall", "livesum", "livemax", "livemin", "livemostrecent")


@dataclass(frozen=True)
class Compaction:
    """What one :func:`compact` did.

    Attributes:
        merged: dead workers' files merged into the archives.
        dropped: dead workers' files deleted without merging (``live*`` and ``all`` gauges).
    """

    merged: int = 0
    dropped: int = 0


def kind_and_pid(name: str) -> tuple[str, str] | None:
    """(kind, pid) of a multiprocess file's name; None for any other file.

    ``gauge_max_12.db`` -> ``("gauge_max", "12")``.
    """
    if not name.endswith(".db"):
        return None
    kind, _, pid = name[:-3].rpartition("_")
    return (kind, pid) if kind else None


def merge(kind: str, files: Iterable[Path]) -> dict[str, tuple[float, float]]:
    """The values of ``files`` (all of metric file ``kind``) as one file would hold them.

    Returns key -> (value, timestamp).
    """
    mode = kind.split("_", 1)[1] if kind.startswith("gauge_") else None
    merged: dict[str, tuple[float, float]] = {}
    for path in files:
        for key, value, stamp, _ in MmapedDict.read_all_values_from_file(str(path)):
            if key not in merged:
                merged[key] = (value, stamp)
                continue
            old, old_stamp = merged[key]
            if mode == "max":
                merged[key] = max((old, old_stamp), (value, stamp))
            elif mode == "min":
                merged[key] = min((old, old_stamp), (value, stamp))
            elif mode == "mostrecent":
                merged[key] = (value, stamp) if stamp >= old_stamp else (old, old_stamp)
            else:  # counter, histogram, summary, sum gauge
                merged[key] = (old + value, max(old_stamp, stamp))
    return merged


def compact(directory: Path, is_alive: Callable[[int], bool] = alive) -> Compaction:
    """Merge the files of dead workers in ``directory`` into its archives and delete them.

    Args:
        directory: the workers' ``PROMETHEUS_MULTIPROC_DIR``.
        is_alive: whether a PID runs (a zombie does not).

    Returns:
        How many files were merged and dropped.
    """
    directory = Path(directory)
    _finish(directory)
    dead: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(directory.glob("*.db")):
        found = kind_and_pid(path.name)
        if found and found[1].isdigit() and not is_alive(int(found[1])):
            dead[found[0]].append(path)
    if not dead:
        return Compaction()
    staged, dropped = [], 0
    for kind, files in dead.items():
        if kind.startswith("gauge_") and kind.split("_", 1)[1] in DROPPED_MODES:
            dropped += len(files)
            continue
        archive = directory / f"{kind}_{ARCHIVE}.db"
        values = merge(kind, ([archive] if archive.exists() else []) + files)
        _write(directory / f"{archive.name}{STAGED}", values)
        staged.append(archive.name)
    absorbed = [p.name for files in dead.values() for p in files]
    manifest = directory / MANIFEST
    manifest.with_suffix(".tmp").write_text(json.dumps({"staged": staged, "absorbed": absorbed}))
    os.replace(manifest.with_suffix(".tmp"), manifest)  # the commit
    _finish(directory)
    return Compaction(merged=len(absorbed) - dropped, dropped=dropped)


def _write(path: Path, values: dict[str, tuple[float, float]]) -> None:
    path.unlink(missing_ok=True)
    out = MmapedDict(str(path))
    try:
        for key, (value, stamp) in values.items():
            out.write_value(key, value, stamp)
    finally:
        out.close()


def _finish(directory: Path) -> None:
    """End a committed compaction; forget one that was not committed.

    A committed one (its manifest exists) puts its archives in place and deletes what they
    absorbed; an uncommitted one's staged archives are deleted.
    """
    manifest = directory / MANIFEST
    try:
        done = json.loads(manifest.read_text())
    except (OSError, ValueError):
        done = {"staged": [], "absorbed": []}
    for name in done["staged"]:
        staged = directory / f"{name}{STAGED}"
        if staged.exists():
            os.replace(staged, directory / name)
    for name in done["absorbed"]:
        (directory / name).unlink(missing_ok=True)
    manifest.unlink(missing_ok=True)
    for leftover in directory.glob(f"*{STAGED}"):
        leftover.unlink()
