"""A stand-in for ``requests.Session`` on the standard library's ``http.client``, for short-lived processes.

The pod's exec probes start a new Python every few seconds, and importing ``requests`` was most of a
probe's CPU: ``Client(..., session=Session())`` (:class:`rtserve.client.rest.Client`) makes the same
calls, with the same key handling and error answers, through this instead.
"""

from __future__ import annotations

import http.client
import json as jsonlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

#: What a path keeps as it is; anything else is percent-encoded (as requests' ``requote_uri``).
PATH_SAFE = "!#$%&'()*+,/:;=?@[]~"


class Response:
    """A read answer: ``status_code``, ``headers``, ``content`` (bytes), ``text`` and ``json()``."""

    def __init__(self, status_code: int, headers: http.client.HTTPMessage, content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        """The body decoded with the charset the answer names (UTF-8 when it names none)."""
        return self.content.decode(self.headers.get_content_charset() or "utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: it is not JSON.
        """
        return jsonlib.loads(self.content)


class Session:
    """Sends requests with http.client: what the client's calls need, no more.

    ``headers`` go with every request (a request's own win); ``json`` is sent as requests sends it
    (``allow_nan=False``, UTF-8, ``Content-Type: application/json``), the path percent-encoded as
    requests does, ``params`` as the query. Each request opens a new connection (``http``, or
    ``https`` with the system's CA certificates), closed once its answer is read; no proxy,
    redirect, retry or compressed answer, and no ``raise_for_status`` (``Client.metrics`` needs
    ``requests``).
    """

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}

    def get(self, url: str, **kwargs: Any) -> Response:
        """A GET request: :meth:`request`."""
        return self.request("GET", url, **kwargs)

    def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Send one request and read its whole answer, whatever its status.

        Raises:
            OSError: no HTTP answer came (``timeout`` seconds to connect and per read): refused,
                timed out, closed, or what came back was not HTTP (a ``ConnectionError``). The
                client takes any ``OSError`` from its session as no answer
                (``requests.RequestException`` is one too).
            ValueError: ``json`` cannot be encoded (NaN or infinity included), or ``url`` is
                not an http or https URL.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http or https URL: {url!r}")
        target = quote(parts.path or "/", safe=PATH_SAFE)
        query = "&".join(
            q for q in (parts.query, urlencode([(k, v) for k, v in (params or {}).items() if v is not None])) if q
        )
        if query:
            target += f"?{query}"
        sent = {**self.headers, **(headers or {})}
        body = None
        if json is not None:
            body = jsonlib.dumps(json, allow_nan=False).encode()
            sent.setdefault("Content-Type", "application/json")
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname, parts.port, timeout=timeout)
        try:
            conn.request(method, target, body=body, headers=sent)
            answer = conn.getresponse()
            return Response(answer.status, answer.headers, answer.read())
        except http.client.HTTPException as exc:
            raise ConnectionError(f"not an HTTP answer: {exc!r}") from exc
        finally:
            conn.close()
