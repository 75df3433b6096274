"""The buffered worker-protocol reader, under TorchServe's own protocol code, over a real socket."""

from __future__ import annotations

import json
import socket
import struct

import pytest
from ts.protocol import otf_message_handler as otf

from handler import worker_io

pytestmark = pytest.mark.unit


def frame(data: bytes) -> bytes:
    return struct.pack("!i", len(data)) + data


def predict_message(requests: list[tuple[str, dict, dict]]) -> bytes:
    """An inference command as the frontend encodes it: b"I", then per request its id, headers
    and parameters, each list ended by -1, and -1 after the last request."""
    out = b"I"
    for request_id, headers, body in requests:
        out += frame(request_id.encode())
        for name, value in headers.items():
            out += frame(name.encode()) + frame(value.encode())
        out += struct.pack("!i", -1)
        out += frame(b"body") + frame(b"application/json") + frame(json.dumps(body).encode())
        out += struct.pack("!i", -1)
    return out + struct.pack("!i", -1)


@pytest.fixture()
def buffered(monkeypatch):
    reader = worker_io.BufferedReader()
    monkeypatch.setattr(otf, "_retrieve_buffer", reader)
    return reader


def test_protocol_reads_the_same_through_the_buffer_across_chunks_and_messages(buffered):
    batch1 = [(f"id-{i}", {"url_path": "", "explain": "False"}, {"features": [float(i)] * 32})
              for i in range(5)]
    batch2 = [("next", {"Content-Type": "application/json"}, {"features": [9.5] * 32})]
    wire = predict_message(batch1) + predict_message(batch2)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(wire[:7])        # a partial first frame ...
        theirs.sendall(wire[7:3001])    # ... then the rest in odd pieces, both messages back to back
        theirs.sendall(wire[3001:])
        cmd1, msg1 = otf.retrieve_msg(ours)
        cmd2, msg2 = otf.retrieve_msg(ours)
    assert cmd1 == cmd2 == b"I"
    assert [bytes(r["requestId"]).decode() for r in msg1] == [f"id-{i}" for i in range(5)]
    assert [r["parameters"][0]["value"] for r in msg1] == [body for _, _, body in batch1]
    assert {bytes(h["name"]): bytes(h["value"]) for h in msg1[0]["headers"]} == {
        b"url_path": b"", b"explain": b"False"}
    assert msg2[0]["parameters"][0]["value"] == {"features": [9.5] * 32}


def test_a_closed_connection_ends_the_worker_as_torchserve_does(buffered):
    ours, theirs = socket.socketpair()
    with ours:
        theirs.sendall(b"I" + struct.pack("!i", 10) + b"abc")
        theirs.close()
        with pytest.raises(SystemExit):
            otf.retrieve_msg(ours)


def test_installed_only_over_the_pinned_reader(monkeypatch):
    monkeypatch.setattr(otf, "_retrieve_buffer", otf._retrieve_buffer)  # restored afterwards
    assert worker_io.install() and isinstance(otf._retrieve_buffer, worker_io.BufferedReader)
    assert worker_io.install()  # once per process

    def other_reader(conn, length):  # a TorchServe whose reader changed
        return conn.recv(length)

    monkeypatch.setattr(otf, "_retrieve_buffer", other_reader)
    assert not worker_io.install()
    assert otf._retrieve_buffer is other_reader
