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


#: Why a request was rejected, in one word (``InvalidInput.reason``).
REASONS = (
    "not_json",
    "empty_body",
    "not_an_object",
    "missing_field",
    "not_a_list",
    "wrong_length",
    "not_a_number",
    "non_finite",
    "out_of_range",
    "bad_target",
    "wrong_shape",
    "not_an_integer",
    "not_a_boolean",
    "out_of_vocabulary",
    "not_base64",
    "not_an_image",
    "bad_image",
    "wrong_size",
    "wrong_channels",
    "too_long",
    "invalid",
)
#: Response headers carrying an :class:`InvalidInput`'s reason and expected count, so that a
#: client need not read them out of the message.
REASON_HEADER = "X-Rtserve-Reason"
EXPECTED_HEADER = "X-Rtserve-Expected-Count"


class InvalidInput(HandlerError):
    """HTTP 400: the request body is not a valid prediction request.

    Args:
        reason: why, one of :data:`REASONS` (the ``rtserve_schema_violations`` label, the record's
            ``reason`` and the :data:`REASON_HEADER` response header).
        expected: how many elements a list of the wrong length should have held
            (:data:`EXPECTED_HEADER`), when there is such a count.
    """

    status = 400

    def __init__(
        self, message: str, field: str | None = None, reason: str = "invalid", expected: int | None = None
    ) -> None:
        super().__init__(message, field)
        if reason not in REASONS:
            raise ValueError(f"unknown InvalidInput reason {reason!r}")
        self.reason = reason
        self.expected = expected
        self.headers = {REASON_HEADER: reason}
        if expected is not None:
            self.headers[EXPECTED_HEADER] = str(expected)


class ExplainCapacityExceeded(HandlerError):
    """HTTP 503: this batch already holds ``handler.explain_max_per_batch`` explanations.

    Retry shortly (``Retry-After`` is set).
    """

    status = 503
    headers = {"Retry-After": "1"}


class ConfigError(ValueError):
    """Raised while a worker initializes: the model config or its artifacts are invalid.

    TorchServe then fails the model load instead of serving a half-configured model.
    """


class ExplanationUnsupported(HandlerError):
    """HTTP 501: explanations are not offered for this model's output kind (yet)."""

    status = 501
