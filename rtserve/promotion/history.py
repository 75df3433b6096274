"""The rollout history: default-version changes and gate decisions, one JSON object per line.

TorchServe keeps no record of which version was the default before a ``set-default``; this file,
in the server's run directory (``RUN_DIR/rollout-history.jsonl``, cleared when that server
starts), is what ``rollback`` reads.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

from rtserve.errors import RolloutError
from rtserve.settings import HISTORY_FILE  # noqa: F401 - the file's name in a run directory


class History:
    """Append-only record of default-version changes and gate decisions: one JSON object per line.

    Each :meth:`append` is one ``write`` of one line to a file opened with ``O_APPEND``, so records
    of concurrent writers (two ``make promote`` runs) never interleave and nothing already
    recorded is rewritten.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def events(self, model: str | None = None) -> list[dict]:
        """All recorded events, oldest first (optionally for one model).

        Raises:
            RolloutError: a line is not a JSON object (the file was edited or truncated).
        """
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        events = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise RolloutError(
                    f"{self.path}:{number}: not a JSON line ({exc}); move the file away to start a new history"
                ) from exc
            if not isinstance(event, dict):
                raise RolloutError(f"{self.path}:{number}: not a JSON object")
            events.append(event)
        return [e for e in events if model is None or e.get("model") == model]

    def append(self, event: dict) -> None:
        """Record one event as one line (``at``: now, unless the event has its own time)."""
        line = (
            json.dumps({**event, "at": event.get("at") or datetime.now(UTC).isoformat()}, separators=(",", ":")) + "\n"
        )
        data = line.encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
        if written != len(data):
            raise RolloutError(
                f"{self.path}: only {written} of {len(data)} bytes of a history line were written (disk full?)"
            )

    def previous_default(self, model: str) -> str | None:
        """The version ``rollback`` returns to: promotes push their previous default, rollbacks pop."""
        stack: list[str] = []
        for event in self.events(model):
            if event["action"] == "promote":
                stack.append(event["from"])
            elif event["action"] == "rollback" and stack:
                stack.pop()
        return stack[-1] if stack else None
