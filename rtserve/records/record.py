"""One request's record as the store keeps it: the keys it is found by, and its JSON line whole.

The worker's line (``handler.records``) always leads with ``request_id``, ``time`` (UTC, ISO 8601, milliseconds,
``Z``), ``model``, ``model_version``, ``route`` and ``status``. The store indexes those and keeps the ``line`` as
written, so a lookup prints exactly what the worker recorded.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from rtserve.errors import RecordsError


@dataclass(frozen=True)
class Record:
    """A record's keys and its line (without the newline)."""

    request_id: str
    time: datetime
    model: str
    model_version: str
    route: str
    status: int
    line: str

    @property
    def document(self) -> dict:
        """The record as a JSON object, its inputs as numbers (:func:`expand_inputs`)."""
        return expand_inputs(json.loads(self.line))


def parse_time(text: str) -> datetime:
    """``2026-12-01T19:50:00.123Z`` (or any ISO 8601 time with an offset) as an aware UTC time.

    Raises:
        RecordsError: not such a time.
    """
    try:
        found = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        raise RecordsError(f"not an ISO 8601 time: {text!r}") from None
    if found.tzinfo is None:
        raise RecordsError(f"a record's time needs its offset (Z for UTC): {text!r}")
    return found.astimezone(UTC)


def format_time(when: datetime) -> str:
    """An aware time as the records write it: UTC, milliseconds, ``Z``."""
    utc = when.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


def parse_line(line: str) -> Record:
    """A spool line (with or without its newline) as a :class:`Record`.

    Raises:
        RecordsError: the line is not a JSON object with the leading keys of a record.
    """
    text = line.rstrip("\n")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise RecordsError(f"not a JSON record: {exc}: {text[:200]!r}") from None
    if not isinstance(doc, dict):
        raise RecordsError(f"not a JSON object: {text[:200]!r}")
    try:
        request_id, model, version, route = (doc["request_id"], doc["model"], doc["model_version"], doc["route"])
        status = doc["status"]
        when = parse_time(doc["time"])
    except KeyError as exc:
        raise RecordsError(f"a record without {exc.args[0]!r}: {text[:200]!r}") from None
    if not all(isinstance(v, str) and v for v in (request_id, model, version, route)) or type(status) is not int:
        raise RecordsError(
            f"a record's request_id, model, model_version and route must be "
            f"non-empty strings and its status an integer: {text[:200]!r}"
        )
    return Record(request_id, when, model, version, route, status, text)


def expand_inputs(document: dict) -> dict:
    """``document`` with its ``inputs`` as numbers when the worker kept them as float32.

    Float32 inputs are ``{"f32": base64, "shape": [...]}`` (:mod:`handler.records`); each value becomes the
    float32 the model saw, in its shortest decimal form. Anything else is returned as it is.

    Raises:
        RecordsError: the float32 data does not fit its shape.
    """
    given = document.get("inputs")
    if not isinstance(given, dict) or not isinstance(given.get("f32"), str):
        return document
    import numpy as np

    try:
        values = np.frombuffer(base64.b64decode(given["f32"], validate=True), dtype="<f4")
        values = values.reshape([int(n) for n in given.get("shape") or [values.size]])
    except (ValueError, TypeError) as exc:
        raise RecordsError(f"record {document.get('request_id')}: inputs do not fit their shape: {exc}") from None
    return {**document, "inputs": _numbers(values)}


def _numbers(values) -> list:
    if values.ndim > 1:
        return [_numbers(row) for row in values]
    return [float(str(v)) for v in values]  # numpy's shortest float32 text, as a float
