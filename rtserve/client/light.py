"""A stand-in for ``requests.Session`` on the standard library's ``socket``, for
:class:`rtserve.client.rest.Client` in a process that makes a few calls and exits.

The pod's exec probes (``python -m rtserve probe ready|live``) start a new Python every few
seconds; importing ``requests`` (and urllib3, charset_normalizer, ...) was most of a probe's CPU.
``Client(..., session=Session())`` makes the same calls, with the same key handling and error
answers, through this instead. It does what the client's calls need, no more:

- ``session.headers`` go with every request (a request's own ``headers`` win);
- ``request(method, url, json=, params=, headers=, timeout=)`` and ``get(url, ...)``: ``json``
  is sent as requests sends it (``allow_nan=False``, UTF-8, ``Content-Type: application/json``),
  the path percent-encoded as requests does, ``params`` as the URL's query, ``timeout`` seconds
  for the connection and for each read;
- each request on a new connection, closed once its answer is read: ``http`` over a plain
  socket (HTTP/1.1, ``Connection: close``; a body by ``Content-Length``, chunked, or up to the
  close), ``https`` through ``http.client`` with the system's CA certificates (imported only
  then: ``http.client`` brings ``email`` and ``ssl``, about a tenth of a probe's CPU); no proxy,
  redirect, retry or compressed answer;
- a :class:`Response` with ``status_code``, ``headers`` (names in any case), ``content``,
  ``text`` and ``json()``; no ``raise_for_status`` (``Client.metrics`` needs ``requests``).
"""

from __future__ import annotations

import json as jsonlib
import socket
from typing import Any, Mapping
from urllib.parse import quote, urlencode, urlsplit

#: What a path keeps as it is; anything else is percent-encoded (as requests' ``requote_uri``).
PATH_SAFE = "!#$%&'()*+,/:;=?@[]~"


class Headers(dict):
    """An answer's header fields by lower-cased name (the last of a repeated one);
    ``get(name)`` in any case, as ``http.client.HTTPMessage.get``."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get_content_charset(self) -> str | None:
        """The ``charset`` parameter of ``Content-Type``, lower-cased, or None."""
        for param in (self.get("content-type") or "").split(";")[1:]:
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "charset" and value.strip():
                return value.strip().strip('"').lower()
        return None


class Response:
    """A read answer: ``status_code``, ``headers``, ``content`` (bytes), ``text`` and ``json()``."""

    def __init__(self, status_code: int, headers: Any, content: bytes) -> None:
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


def complete(raw: bytes, method: str) -> bool:
    """Whether ``raw`` holds a whole answer by its own framing (a server that keeps the
    connection open despite ``Connection: close`` is not waited for); without
    ``Content-Length`` or chunks, only the close ends it."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    try:
        answer = parse_answer(raw, method)
    except ConnectionError:
        return False
    fields = answer.headers
    return ("content-length" in fields or "chunked" in (fields.get("transfer-encoding") or "").lower()
            or method == "HEAD" or answer.status_code in (204, 304) or answer.status_code < 200)


def parse_answer(raw: bytes, method: str) -> Response:
    """An HTTP/1.x answer read up to the connection's close: status, headers, body (by
    ``Content-Length``, chunked, or all that came).

    Raises:
        ConnectionError: it is not an HTTP answer, or its body is cut short.
    """
    head, sep, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("iso-8859-1").split("\r\n")
    version, _, status = lines[0].partition(" ")
    code = status[:3]
    if not sep or not version.startswith("HTTP/1.") or not code.isdigit():
        raise ConnectionError(f"not an HTTP answer: {raw[:80]!r}")
    headers = Headers()
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ConnectionError(f"not an HTTP answer: header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    if method == "HEAD" or code in ("204", "304") or code.startswith("1"):
        return Response(int(code), headers, b"")
    if "chunked" in (headers.get("transfer-encoding") or "").lower():
        body = bytearray()
        while True:
            size_line, crlf, rest = rest.partition(b"\r\n")
            size = size_line.split(b";")[0].strip()
            if not crlf or not size or any(c not in b"0123456789abcdefABCDEF" for c in size):
                raise ConnectionError("a chunked answer cut short")
            n = int(size, 16)
            if n == 0:
                return Response(int(code), headers, bytes(body))
            if len(rest) < n + 2:
                raise ConnectionError("a chunked answer cut short")
            body += rest[:n]
            rest = rest[n + 2:]
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit() or len(rest) < int(length):
            raise ConnectionError(f"an answer cut short: {len(rest)} of {length} bytes")
        rest = rest[:int(length)]
    return Response(int(code), headers, rest)


class Session:
    """Sends requests over a socket (see the module's docstring for what it covers)."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}

    def get(self, url: str, **kwargs: Any) -> Response:
        """A GET request: :meth:`request`."""
        return self.request("GET", url, **kwargs)

    def request(self, method: str, url: str, *, json: Any = None,
                params: Mapping[str, Any] | None = None, headers: Mapping[str, str] | None = None,
                timeout: float | None = None) -> Response:
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
        query = "&".join(q for q in (parts.query, urlencode(
            [(k, v) for k, v in (params or {}).items() if v is not None])) if q)
        if query:
            target += f"?{query}"
        sent = {**self.headers, **(headers or {})}
        body = None
        if json is not None:
            body = jsonlib.dumps(json, allow_nan=False).encode()
            sent.setdefault("Content-Type", "application/json")
        if parts.scheme == "https":
            return _https(parts, method, target, body, sent, timeout)
        host = parts.hostname
        port = parts.port or 80
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}" if parts.port else f"Host: {host}",
                 "Connection: close", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in sent.items() if k.lower() not in ("host", "connection")]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("iso-8859-1") + (body or b"")
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.sendall(request)
            raw = b""
            while not complete(raw, method) and (chunk := conn.recv(65536)):
                raw += chunk
        return parse_answer(raw, method)


def _https(parts, method: str, target: str, body: bytes | None, headers: dict[str, str],
           timeout: float | None) -> Response:
    """One request over ``http.client``'s TLS connection (the system's CA certificates)."""
    import http.client

    conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request(method, target, body=body, headers=headers)
        answer = conn.getresponse()
        return Response(answer.status, answer.headers, answer.read())
    except http.client.HTTPException as exc:
        raise ConnectionError(f"not an HTTP answer: {exc!r}") from exc
    finally:
        conn.close()
