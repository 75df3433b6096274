"""The spool as the shipper and the local lookups see it: segments, which are closed, how far each was shipped.

The workers write it (:mod:`handler.records`); only the shipper deletes from it. A segment is *closed* when no
process holds its ``flock``: nobody appends to it again. :data:`CHECKPOINT` (a dot file, not a segment) is
replaced atomically after each write the store acknowledged.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from handler.records import SEGMENT_SUFFIX, usage
from rtserve.errors import RecordsError
from rtserve.records.record import Record, parse_line
from rtserve.runtime.logs import complete_lines

#: How far each segment was shipped: ``{"segments": {name: offset}}``.
CHECKPOINT = ".shipped.json"


@dataclass(frozen=True)
class Segment:
    """A segment file as seen once: its name, size and whether it is closed."""

    path: Path
    size: int
    closed: bool

    @property
    def name(self) -> str:
        return self.path.name


def is_closed(path: Path) -> bool:
    """Whether no writer holds ``path`` (a shared ``flock`` can be taken at once).

    Raises:
        FileNotFoundError: it is gone.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    finally:
        os.close(fd)  # releases the shared lock


def segments(directory: Path) -> list[Segment]:
    """The spool's segments in creation order.

    Each is checked for closure first, then sized, so a closed segment's size is final.
    """
    found = []
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(SEGMENT_SUFFIX) and not n.startswith("."))
    except FileNotFoundError:
        return []
    for name in names:
        path = Path(directory) / name
        try:
            closed = is_closed(path)
            found.append(Segment(path, path.stat().st_size, closed))
        except FileNotFoundError:
            continue
    return found


def count_lines(path: Path, chunk: int = 1 << 20) -> int:
    """How many complete lines ``path`` holds (a torn last line is not one); 0 when it is gone.

    Read a chunk at a time.
    """
    count = 0
    try:
        with open(path, "rb") as f:
            while data := f.read(chunk):
                count += data.count(b"\n")
    except FileNotFoundError:
        return 0
    return count


def load_checkpoint(directory: Path) -> dict[str, int]:
    """How far each segment was shipped.

    Empty when nothing was, or the file is unreadable: then everything is shipped again, which the store's key
    (the request id) makes harmless.
    """
    try:
        found = json.loads((Path(directory) / CHECKPOINT).read_text()).get("segments", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(k): int(v) for k, v in found.items() if isinstance(v, int)}


def save_checkpoint(directory: Path, shipped: dict[str, int]) -> None:
    """Replace the checkpoint at once (a temporary file renamed over it)."""
    path = Path(directory) / CHECKPOINT
    tmp = path.with_name(CHECKPOINT + ".tmp")
    tmp.write_text(json.dumps({"segments": shipped}, separators=(",", ":")))
    os.replace(tmp, path)


def lines_of(directory: Path) -> Iterator[str]:
    """Every complete line in the spool, segment by segment in creation order."""
    for segment in segments(directory):
        lines, _ = complete_lines(segment.path, 0)
        for line in lines:
            yield line.decode("utf-8", "replace")


def local_records(directory: Path) -> Iterator[Record]:
    """Every well-formed record in the spool (a line that is not one is skipped)."""
    for line in lines_of(directory):
        try:
            yield parse_line(line)
        except RecordsError:
            continue


def find_local(directory: Path, request_id: str) -> Record | None:
    """The spool's record of ``request_id`` (the last one, if a line were there twice)."""
    found = None
    for line in lines_of(directory):
        if request_id in line:
            try:
                record = parse_line(line)
            except RecordsError:
                continue
            if record.request_id == request_id:
                found = record
    return found


def select(
    records: Iterable[Record],
    model: str | None,
    since: datetime,
    until: datetime | None = None,
    version: str | None = None,
) -> list[Record]:
    """``records`` of ``model`` and ``version`` (None: any) with ``since <= time < until``, in time order."""
    return sorted(
        (
            r
            for r in records
            if (model is None or r.model == model)
            and (version is None or r.model_version == version)
            and r.time >= since
            and (until is None or r.time < until)
        ),
        key=lambda r: (r.time, r.request_id),
    )


def spool_usage(directory: Path) -> int:
    """Bytes of the spool's files (segments and the checkpoint)."""
    return usage(str(directory))
