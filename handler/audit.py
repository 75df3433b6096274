"""The audit trail's one writer: JSON lines appended to ``audit.log`` (no TorchServe, no torch).

Every line is one compact JSON object whose first key is ``event``; a writer appends whole lines
with one ``write`` on a file opened for appending, so the lines of several writers (the
workers' per-batch lines, :class:`handler.telemetry.AuditLog`; the promotion gate's decisions,
``rtserve.promotion.rollout``) never interleave. rtserve imports this module too: the handler
is packed into each archive without rtserve, so the writer lives here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

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


def append_event(path: str | Path, event: dict[str, Any]) -> None:
    """Append one event (see :func:`event_line`) to the audit log at ``path``."""
    audit = AuditFile(path)
    try:
        audit.append([event_line(event)])
    finally:
        audit.close()
