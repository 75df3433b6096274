"""The audit trail's one writer: JSON lines appended to ``audit.log`` (no TorchServe, no torch).

Each line is a compact JSON object, ``event`` first, appended whole with one ``write`` so that several
writers (the promotion gate, ``rtserve.promotion.rollout``; the live routes, also inside each pod)
never interleave. It lives in the handler because each archive carries the handler without rtserve.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.log"
#: The audit trail's file mode: the server's user and group only.
MODE = 0o640


def event_line(event: dict[str, Any]) -> str:
    """One audit line: ``event`` first, then the other keys in the order given, compact."""
    ordered = {"event": event["event"], **event}
    return json.dumps(ordered, separators=(",", ":")) + "\n"


class AuditFile:
    """``audit.log`` opened for appending (created, with its directory, when missing)."""

    def __init__(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, MODE)

    def append(self, lines: Iterable[str]) -> None:
        """Append whole lines (each ending in a newline) with one write."""
        data = "".join(lines).encode()
        if data:
            os.write(self.fd, data)

    def close(self) -> None:
        os.close(self.fd)


def append_event(path: str | Path, event: dict[str, Any], max_bytes: int | None = None) -> None:
    """Append one event (see :func:`event_line`) to the audit log at ``path``.

    With ``max_bytes``, the log and its one backup (``audit.log.1``) stay within it: an event that
    would take the file past half of it first renames the file to its backup (under an exclusive
    lock on the file, so two writers never rotate twice).
    """
    data = event_line(event).encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                continue  # rotated away while this one waited for the lock
            if (now.st_ino, now.st_dev) != (held.st_ino, held.st_dev):
                continue
            if max_bytes is not None and held.st_size and held.st_size + len(data) > max_bytes // 2:
                os.replace(path, path.with_name(path.name + ".1"))
                continue
            os.write(fd, data)
            return
        finally:
            os.close(fd)
