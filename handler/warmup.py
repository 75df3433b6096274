"""Warm-up requests: answered like any other, kept out of metrics, drift and the audit trail.

Before ``rtserve.server`` reports a server ready it sends a few hundred real predictions through
the inference port, so that the frontend's JIT-compiled code, its connection handling and the
workers are warm when the first client arrives (:mod:`rtserve.server.warmup`). Those requests are not
traffic: the handler answers them but records nothing for them.

A warm-up request carries :data:`HEADER` with this start's secret key, which ``rtserve.server``
generates at each start and hands to TorchServe (and so to every worker) in :data:`KEY_ENV`. A
client without the key cannot hide its requests from the audit trail. A batch is left out only
when *every* request in it is a warm-up request (the server sends none once it reports ready;
a client request that shares a batch with one is recorded, with the warm-up rows beside it).

No TorchServe import (the constants are shared with :mod:`rtserve.server.warmup`).
"""

from __future__ import annotations

import hmac
import os
from typing import Any, Sequence

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
    """This start's warm-up key from the environment; None when there is none (a server not
    started by ``rtserve.server``: then no request is a warm-up request)."""
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
