"""Following a log file: the lines a process appended since the last read."""

from __future__ import annotations

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
