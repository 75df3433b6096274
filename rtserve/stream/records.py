"""The stream's records as pure functions: an event validated as the handler would, its prediction or dead letter.

Validation uses the same :mod:`handler.schema` functions as the handler, so the refusals read alike.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from handler.errors import InvalidInput
from handler.schema import DEFAULT_FEATURE_LIMIT, json_type, parse_features, request_body


@dataclass(frozen=True)
class Source:
    """Where an event came from: its coordinates and its timestamp (ms since the epoch, or None)."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None = None

    def as_dict(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset}


@dataclass(frozen=True)
class Event:
    """A valid event: the request to send (``{"features": [...]}``, or a named-input model's inputs) and its ``id``."""

    request: dict
    id: Any = None


def parse_event(value: bytes | None, n_features: int | None = None, limit: float = DEFAULT_FEATURE_LIMIT) -> Event:
    """An event's value as the request TorchServe gets.

    With ``n_features`` None the count is left to the server (its 400 names it); everything else is checked here.

    Raises:
        InvalidInput: naming the field, exactly as the handler would answer over HTTP.
    """
    body = request_body({"data": value})
    if isinstance(body, dict) and "features" not in body and set(body) - {"id"}:
        # a model with named inputs (``{"image": ..., "id": ...}``): its server checks each input and
        # names the one at fault; the consumer sends the event's inputs as one KServe v1 instance
        return Event({k: v for k, v in body.items() if k != "id"}, body.get("id"))
    count = n_features
    if count is None and isinstance(body, dict) and "features" in body:
        if not isinstance(body["features"], list):  # (the handler's message names the count)
            raise InvalidInput(
                f"'features' must be a list of numbers, got {json_type(body['features'])}",
                field="features",
                reason="not_a_list",
            )
        count = len(body["features"])
    features = parse_features(body, count or 0, limit)
    return Event({"features": features}, body.get("id"))


def prediction(source: Source, event: Event, answer: dict) -> bytes:
    """The output record: TorchServe's answer, the event's ``id``, its coordinates and timestamp.

    The answer holds prediction, label, probabilities and ``model_version``.
    """
    record = {**answer, "source": source.as_dict(), "event_timestamp": source.timestamp}
    if event.id is not None:
        record["id"] = event.id
    return json.dumps(record, separators=(",", ":")).encode()


def dead_letter(source: Source, error: str, field: str | None, reason: str) -> bytes:
    """The dead-letter record: why the event was refused (naming the field) and where it was."""
    record = {
        "error": error,
        "field": field,
        "reason": reason,
        "source": source.as_dict(),
        "event_timestamp": source.timestamp,
    }
    return json.dumps(record, separators=(",", ":")).encode()


def refused(source: Source, exc: InvalidInput) -> bytes:
    """The dead letter of an event the validation refused."""
    return dead_letter(source, exc.message, exc.field, exc.reason)


def too_large(source: Source, size: int, limit: int) -> bytes:
    """The dead letter of an event larger than the consumer scores (its value is not read)."""
    return dead_letter(source, f"event of {size} bytes is larger than {limit} bytes", None, "too_large")
