"""Following a log file: the lines a process appended since the last read."""

from __future__ import annotations

import os
from pathlib import Path


class LogFollower:
    """Reads the lines appended to a log file since the last call (survives rotation)."""

    def __init__(self, path: Path, from_end: bool = True, tail_bytes: int = 0) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""
        self._skip_partial = False
        if not from_end:
            return
        try:
            self.offset = max(0, path.stat().st_size - tail_bytes)
            if self.offset:  # starting inside a line: drop its rest
                with open(path, "rb") as f:
                    f.seek(self.offset - 1)
                    self._skip_partial = f.read(1) != b"\n"
        except OSError:
            self.offset = 0

    def lines(self) -> list[str]:
        """Complete lines written since the previous call."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return []
        if size < self.offset:  # rotated or truncated: start over on the new file
            self.offset, self._partial, self._skip_partial = 0, b"", False
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        self.offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if self._skip_partial and complete:
            complete, self._skip_partial = complete[1:], False
        return [line.decode("utf-8", "replace") for line in complete]


def complete_lines(path: Path, offset: int, limit: int | None = None) -> tuple[list[bytes], int]:
    """The complete lines of ``path`` from byte ``offset`` (at most about ``limit`` bytes of
    them, never less than one line), and the offset just past the last one read; a torn last
    line is left for later. A missing file reads as nothing."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read() if limit is None else f.read(limit)
            if limit is not None and data and b"\n" not in data:  # one line longer than limit
                data += f.readline()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    if not end:
        return [], offset
    return data[:end - 1].split(b"\n"), offset + end


class SegmentsFollower:
    """Reads the complete lines appended to a directory's segment files since the last call:
    segments (``*<suffix>``, not dot files) in name order, each from where it was left; a
    segment that disappears is forgotten.

    Args:
        from_end: segments present at the start are read from their end then (only what is
            written afterwards counts); else from their start.
    """

    def __init__(self, directory: Path, suffix: str, from_end: bool = True) -> None:
        self.directory = Path(directory)
        self.suffix = suffix
        self.offsets: dict[str, int] = {}
        if from_end:
            for name in self.names():
                try:
                    self.offsets[name] = (self.directory / name).stat().st_size
                except FileNotFoundError:
                    continue

    def names(self) -> list[str]:
        """The segments there now, in name order."""
        try:
            return sorted(n for n in os.listdir(self.directory)
                          if n.endswith(self.suffix) and not n.startswith("."))
        except FileNotFoundError:
            return []

    def read(self) -> list[str]:
        """Complete lines written since the previous call."""
        out: list[str] = []
        names = self.names()
        for name in names:
            lines, self.offsets[name] = complete_lines(self.directory / name, self.offsets.get(name, 0))
            out += [line.decode("utf-8", "replace") for line in lines]
        for gone in set(self.offsets) - set(names):
            del self.offsets[gone]
        return out
