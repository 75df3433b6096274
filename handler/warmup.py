"""Warm-up requests: answered like any other, kept out of metrics, drift and records.

``rtserve.server`` warms the server with real predictions before it reports ready (:mod:`rtserve.server.warmup`),
each with :data:`HEADER` set to the start's secret key (:data:`KEY_ENV`), so no client can hide its requests.
A batch is left out only when *every* request in it is a warm-up request. No TorchServe import.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Sequence
from typing import Any

#: The request header of a warm-up request; its value is the start's key. TorchServe's frontend
#: hands a request's headers to the worker with the spelling the client sent.
HEADER = "X-Rtserve-Warmup"
#: The environment variable that gives TorchServe's workers this start's warm-up key.
KEY_ENV = "RTSERVE_WARMUP_KEY"
#: The query parameter on a warm-up request's URL: the access log records the URL and nothing
#: else of the request, so the request-duration histogram tells warm-up lines by it.
QUERY_PARAMETER = "rtserve_warmup"
#: Shorter keys are ignored (the server makes 32 random bytes, URL-safe base64).
MIN_KEY_LENGTH = 16


def warmup_key() -> bytes | None:
    """This start's warm-up key from the environment; None when there is none.

    None for a server not started by ``rtserve.server``: then no request is a warm-up request.
    """
    key = os.environ.get(KEY_ENV, "")
    return key.encode() if len(key) >= MIN_KEY_LENGTH else None


def is_warmup_batch(processors: Sequence[Any], key: bytes | None) -> bool:
    """Whether every request of a batch carries the warm-up key.

    ``processors`` are the batch's ``RequestProcessor``s (``context.request_processor``). A
    client batch costs one header lookup: its first request has no such header.
    """
    if key is None or not processors:
        return False
    for rp in processors:
        value = rp.get_request_property(HEADER)
        if not isinstance(value, str) or not hmac.compare_digest(value.encode(), key):
            return False
    return True
