"""Buffered reads for TorchServe 0.12's worker protocol (installed by the handler, per worker).

The worker reads every frame the frontend sends with ``otf_message_handler._retrieve_buffer``,
one ``recv()`` per field: a request's id, each of its headers' name and value lengths and bytes,
each parameter... about forty system calls per request. :class:`BufferedReader` takes its
place: one ``recv()`` of up to :data:`CHUNK` bytes serves every field already received, and what
is left over stays for the next call (the frontend may send the next batch early). Every read
still goes through the same function, so the protocol code itself is unchanged.

It is installed only into the TorchServe it was written against: version 0.12.0 and the very
``_retrieve_buffer`` whose source hash is :data:`PINNED_SHA256`; otherwise the worker keeps
TorchServe's reads and says why in its log.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import sys
import weakref

logger = logging.getLogger(__name__)

#: Bytes asked for per ``recv()``: a batch of 32 requests is about 40 KiB.
CHUNK = 65536
#: SHA-256 of ``inspect.getsource(ts.protocol.otf_message_handler._retrieve_buffer)`` in 0.12.0.
PINNED_SHA256 = "aa64bcd2010ef54923e4e97c528f525f5a2348f852435a929e04efe497cf135a"
PINNED_VERSION = "0.12.0"


class BufferedReader:
    """``_retrieve_buffer(conn, length)`` with a read-ahead buffer per connection."""

    def __init__(self) -> None:
        self._state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __call__(self, conn, length: int) -> bytearray:
        state = self._state.get(conn)
        if state is None:
            state = self._state[conn] = [bytearray(), 0]  # received bytes, read offset
        buf, pos = state
        while len(buf) - pos < length:
            if pos:
                del buf[:pos]
                pos = 0
            pkt = conn.recv(max(CHUNK, length - len(buf)))
            if not pkt:  # as TorchServe's own reader does
                logging.info("Frontend disconnected.")
                sys.exit(0)
            buf += pkt
        out = buf[pos:pos + length]
        pos += length
        if pos == len(buf):
            buf.clear()
            pos = 0
        state[1] = pos
        return out


def install() -> bool:
    """Put :class:`BufferedReader` in place of TorchServe's reader (once per process).

    Returns:
        Whether the buffered reader is in place.
    """
    import ts
    from ts.protocol import otf_message_handler as otf

    if isinstance(otf._retrieve_buffer, BufferedReader):
        return True
    try:
        source = inspect.getsource(otf._retrieve_buffer)
    except (OSError, TypeError) as exc:
        source = f"(no source: {exc})"
    digest = hashlib.sha256(source.encode()).hexdigest()
    if ts.__version__ != PINNED_VERSION or digest != PINNED_SHA256:
        logger.warning("buffered worker reads OFF: TorchServe %s's reader (SHA-256 %s) is not the "
                       "pinned %s one; its own reads stay", ts.__version__, digest, PINNED_VERSION)
        return False
    otf._retrieve_buffer = BufferedReader()
    return True
