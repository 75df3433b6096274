"""Log files that rotate to one backup, ``NAME.1`` (:func:`backup`): follow one, read one whole, cap one.

Following returns the lines appended since the last read, across rotations. TorchServe's logs, the agent's live log
and the audit log rotate by rename; output files whose writers cannot rename are capped by :func:`copy_truncate`.
"""

from __future__ import annotations

import os
from collections import deque
from pathlib import Path
from typing import BinaryIO


def backup(path: str | Path) -> Path:
    """The one backup of a rotating file: ``NAME.1`` beside it."""
    path = Path(path)
    return path.with_name(path.name + ".1")


def read_rotated(path: str | Path) -> str:
    """What a rotating file holds: its backup's lines, then its own ("" when neither exists)."""
    parts = []
    for name in (backup(path), Path(path)):
        try:
            parts.append(name.read_text(errors="replace"))
        except OSError:
            continue
    return "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts)


def copy_truncate(path: str | Path, cap: int) -> bool:
    """Keep an output file and its backup within ``cap`` bytes.

    Once the file holds more than half of it, copy its last lines (at most half the cap) to its backup and truncate
    it to nothing. For files whose writer keeps them open for appending (a child's stdout, O_APPEND) and cannot
    reopen them: the writer goes on at the new end. A line written between the copy and the truncation is lost.

    Returns:
        Whether it was rotated.
    """
    path, half = Path(path), cap // 2
    keep = backup(path)
    partial = keep.with_name(keep.name + ".tmp")
    try:
        with open(path, "r+b") as src:
            size = os.fstat(src.fileno()).st_size
            if size <= half:
                return False
            src.seek(size - half - 1)
            inside = src.read(1) != b"\n"
            data = src.read(half)
            if inside:  # started inside a line: whole lines only
                data = data[data.find(b"\n") + 1 :]
            partial.write_bytes(data)
            os.replace(partial, keep)
            src.truncate(0)
    except OSError:
        return False
    return True


class LogFollower:
    """The complete lines appended to a log file since the last call, across rotations.

    The file is followed by its inode (an open file): when the path names another file (renamed
    to its backup and started anew, or deleted and created again), the followed file is read to
    its end, then a file rotated away in between (the backup, if it is neither), then the new
    file: no line lost or read twice while at most one rotation passes between two calls.
    A file truncated in place is read again from its start.

    Args:
        path: the log file (it may not exist yet).
        from_end: skip what the file holds now; else read its backup, then the file.
        tail_bytes: with ``from_end``, start this many bytes before the end (a partial first
            line is dropped).
    """

    def __init__(self, path: str | Path, from_end: bool = True, tail_bytes: int = 0) -> None:
        self.path = Path(path)
        self._files: deque[BinaryIO] = deque()  # the followed file last; older ones to finish first
        self._last: tuple[int, int] | None = None  # the last file read to its end
        self._partial = b""
        self._skip_partial = False
        if not from_end:
            self._open(backup(self.path))
        elif (old := self._open(backup(self.path))) is not None:
            self._last = _identity(old)  # what it held before is not new
            self._files.pop().close()
        current = self._open(self.path)
        if from_end and current is not None:
            offset = max(0, os.fstat(current.fileno()).st_size - tail_bytes)
            if offset:  # starting inside a line: drop its rest
                current.seek(offset - 1)
                self._skip_partial = current.read(1) != b"\n"
            current.seek(offset)

    def _open(self, path: Path) -> BinaryIO | None:
        try:
            f = open(path, "rb")
        except OSError:
            return None
        self._files.append(f)
        return f

    def lines(self) -> list[str]:
        """Complete lines written since the previous call (oldest first)."""
        data = self._partial
        while True:
            if not self._files:
                self._next()
                if not self._files:
                    break
            f = self._files[0]
            if f.tell() > os.fstat(f.fileno()).st_size:  # truncated in place: from its start
                f.seek(0)
                data = data[: data.rfind(b"\n") + 1]  # a torn line before it is dropped
            data += f.read()
            if len(self._files) == 1 and not self._replaced(f):
                break
            data += f.read()  # what its writer wrote before it rotated
            if data and not data.endswith(b"\n"):
                data += b"\n"  # a rotated file's torn last line ends with it
            self._last = _identity(f)
            self._files.popleft().close()
        *complete, self._partial = data.split(b"\n")
        if self._skip_partial and complete:
            complete, self._skip_partial = complete[1:], False
        return [line.decode("utf-8", "replace") for line in complete]

    def _replaced(self, f: BinaryIO) -> bool:
        """Whether ``f`` was rotated away.

        The path names another file, or (while it names none, in the middle of a rotation) the backup does.
        """
        for name in (self.path, backup(self.path)):
            try:
                st = os.stat(name)
            except OSError:
                continue
            return (st.st_ino, st.st_dev) != _identity(f)
        return False

    def _next(self) -> None:
        """With no file open: follow the path's file, after the backup when that is a file not read yet.

        Rotated away since the last file was finished, or before any was opened.
        """
        current = self._open(self.path)
        try:
            between = open(backup(self.path), "rb")
        except OSError:
            return
        seen = {self._last} | ({_identity(current)} if current is not None else set())
        if _identity(between) in seen:
            between.close()
        else:
            self._files.appendleft(between)

    def close(self) -> None:
        """Close the followed files."""
        while self._files:
            self._files.popleft().close()


def _identity(f: BinaryIO) -> tuple[int, int]:
    st = os.fstat(f.fileno())
    return st.st_ino, st.st_dev


def complete_lines(path: Path, offset: int, limit: int | None = None) -> tuple[list[bytes], int]:
    """The complete lines of ``path`` from byte ``offset``, and the offset just past the last one read.

    At most about ``limit`` bytes of them, never less than one line; a torn last line is left for later. A missing
    file reads as nothing.
    """
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
    return data[: end - 1].split(b"\n"), offset + end


class SegmentsFollower:
    """Reads the complete lines appended to a directory's segment files since the last call.

    Segments (``*<suffix>``, not dot files) in name order, each from where it was left; a segment that disappears is
    forgotten.

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
            return sorted(n for n in os.listdir(self.directory) if n.endswith(self.suffix) and not n.startswith("."))
        except FileNotFoundError:
            return []

    def lines(self) -> list[str]:
        """Complete lines written since the previous call."""
        out: list[str] = []
        names = self.names()
        for name in names:
            lines, self.offsets[name] = complete_lines(self.directory / name, self.offsets.get(name, 0))
            out += [line.decode("utf-8", "replace") for line in lines]
        for gone in set(self.offsets) - set(names):
            del self.offsets[gone]
        return out
