"""Small exception classes; each docstring names the HTTP status it maps to."""

from __future__ import annotations


class HandlerError(Exception):
    """Base class of the handler's errors (HTTP 500 unless a subclass says otherwise)."""

    status: int = 500
    #: Extra HTTP response headers for this error (read-only).
    headers: dict[str, str] = {}

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def body(self) -> dict:
        """The JSON body a client receives: ``{"error": ..., "field": ...}``."""
        out = {"error": self.message}
        if self.field is not None:
            out["field"] = self.field
        return out


class InvalidInput(HandlerError):
    """HTTP 400: the request body is not a valid prediction request."""

    status = 400


class ExplainCapacityExceeded(HandlerError):
    """HTTP 503: this batch already holds as many explanations as the handler computes per
    batch (``handler.explain_max_per_batch``); retry shortly (``Retry-After`` is set)."""

    status = 503
    headers = {"Retry-After": "1"}


class ConfigError(ValueError):
    """Raised while a worker initializes: the model config or its artifacts are invalid.

    TorchServe then fails the model load instead of serving a half-configured model.
    """
