"""The buffered worker-protocol reader, under TorchServe's own protocol code, over a real socket."""

from __future__ import annotations

import json
import socket
import struct

import pytest
from ts.protocol import otf_message_handler as otf

from handler import worker_io

pytestmark = pytest.mark.unit
#: TorchServe's own reader and batch parser, as collected (a test that starts a handler in this
#: process installs rtserve's for good).
STOCK_READER, STOCK_PARSER = otf._retrieve_buffer, otf._retrieve_inference_msg


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
    batch1 = [(f"id-{i}", {"url_path": "", "explain": "False"}, {"features": [float(i)] * 32}) for i in range(5)]
    batch2 = [("next", {"Content-Type": "application/json"}, {"features": [9.5] * 32})]
    wire = predict_message(batch1) + predict_message(batch2)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(wire[:7])  # a partial first frame ...
        theirs.sendall(wire[7:3001])  # ... then the rest in odd pieces, both messages back to back
        theirs.sendall(wire[3001:])
        cmd1, msg1 = otf.retrieve_msg(ours)
        cmd2, msg2 = otf.retrieve_msg(ours)
    assert cmd1 == cmd2 == b"I"
    assert [bytes(r["requestId"]).decode() for r in msg1] == [f"id-{i}" for i in range(5)]
    assert [r["parameters"][0]["value"] for r in msg1] == [body for _, _, body in batch1]
    assert {bytes(h["name"]): bytes(h["value"]) for h in msg1[0]["headers"]} == {b"url_path": b"", b"explain": b"False"}
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


# --------------------------------------------------------------------------- the lean worker loop

import logging  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

import torch  # noqa: E402
import ts  # noqa: E402
import ts.service as service  # noqa: E402
from ts.context import Context, RequestProcessor  # noqa: E402

METRIC_LOGGER = "ts.metrics.caching_metric"


@pytest.fixture()
def stock(monkeypatch):
    """TorchServe's own functions, restored after the test whatever it installs."""
    monkeypatch.setattr(otf, "retrieve_msg", otf.retrieve_msg)
    monkeypatch.setattr(service, "create_predict_response", otf.create_predict_response)
    monkeypatch.setattr(otf, "_retrieve_buffer", STOCK_READER)
    monkeypatch.setattr(otf, "_retrieve_inference_msg", STOCK_PARSER)
    return monkeypatch


def batch_context(n: int) -> Context:
    ctx = Context("m", "/tmp", {}, 32, None, "0.12.0")
    ctx.request_processor = [RequestProcessor({}) for _ in range(n)]
    return ctx


def answered(ctx: Context) -> None:
    """Per-request statuses, phrases and headers as a handler sets them."""
    ctx.set_response_content_type(0, "application/json")
    ctx.set_response_content_type(1, "application/octet-stream")
    ctx.set_response_header(1, "Inference-Header-Content-Length", "42")
    ctx.set_response_status(400, "features[3] must be a number, got ?", 2)
    ctx.set_response_content_type(2, "application/json")
    ctx.set_response_header(2, "ts_stream_next", "true")  # a stream's last answer
    ctx.set_response_content_type(3, "text/plain; charset=é")  # TorchServe writes len(str)


def test_the_lean_encoder_writes_torchserves_frame_byte_for_byte(stock):
    ours = worker_io._predict_response_for(otf.create_predict_response)
    ids = {i: f"id-{i}-é" for i in range(4)}
    answers = ['{"prediction": 1}', b"\x00\x01binary", '{"error": "bad é"}', bytearray(b"xy")]
    frames = []
    for encode in (otf.create_predict_response, ours):
        ctx = batch_context(4)
        answered(ctx)
        frames.append(
            (
                bytes(encode(answers, ids, "Prediction success", 200, context=ctx)),
                [rp.get_response_headers() for rp in ctx.request_processor],
            )
        )
    assert frames[0] == frames[1]
    assert b"features[3] must be a number" in frames[1][0]


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((None, {0: "a"}, "Prediction failed", 503), {}),  # an error frame
        (([torch.ones(2)], {0: "a"}, "Prediction success", 200), {"context": "ctx"}),  # a tensor
        ((["x"], {0: "a"}, "Prediction success", 200), {"context": "ctx", "ts_stream_next": True}),
    ],
)
def test_anything_else_goes_to_torchserves_own_encoder(stock, args, kwargs):
    calls = []

    def original(*a):
        calls.append(a)
        return bytearray(b"theirs")

    if kwargs.get("context") == "ctx":
        kwargs["context"] = batch_context(1)
    assert worker_io._predict_response_for(original)(*args, **kwargs) == b"theirs"
    assert len(calls) == 1


def worker_main(monkeypatch) -> types.ModuleType:
    """``__main__`` as TorchServe's frontend starts it: ts/model_service_worker.py, which holds
    its own reference to retrieve_msg."""
    main = types.ModuleType("__main__")
    main.__file__ = "/venv/lib/python3.11/site-packages/ts/model_service_worker.py"
    main.retrieve_msg = otf.retrieve_msg
    monkeypatch.setitem(sys.modules, "__main__", main)
    return main


def test_lean_worker_reads_the_same_messages_without_a_log_record_per_batch(stock, caplog):
    main = worker_main(stock)
    ctx = batch_context(1)
    ctx.metrics = None
    assert worker_io.install_lean(ctx, METRIC_LOGGER) == ["retrieve_msg", "predict_response"]
    assert main.retrieve_msg is worker_io.retrieve_msg is otf.retrieve_msg
    assert service.create_predict_response.original is not None
    batch = [("id-0", {"url_path": "", "explain": "False"}, {"features": [1.5] * 32})]
    ours, theirs = socket.socketpair()
    with ours, theirs, caplog.at_level(logging.INFO):
        theirs.sendall(predict_message(batch))
        cmd, msg = main.retrieve_msg(ours)
    assert cmd == b"I" and msg[0]["parameters"][0]["value"] == {"features": [1.5] * 32}
    assert not [r for r in caplog.records if "Backend received inference" in r.getMessage()]
    assert worker_io.install_lean(ctx, METRIC_LOGGER) == ["retrieve_msg", "predict_response"]


def test_outside_the_worker_script_retrieve_msg_stays_and_the_log_says_so(stock, caplog):
    ctx = batch_context(1)
    ctx.metrics = None
    with caplog.at_level(logging.WARNING):
        assert worker_io.install_lean(ctx, METRIC_LOGGER) == ["predict_response"]
    assert "per-batch log call kept: not in TorchServe's worker script" in caplog.text
    assert otf.retrieve_msg is not worker_io.retrieve_msg


def test_every_part_is_refused_on_sources_that_are_not_the_pinned_ones(stock, caplog):
    main = worker_main(stock)

    def retrieve_msg(conn):  # a TorchServe whose functions changed
        return otf._retrieve_buffer(conn, 1), []

    def create_predict_response(ret, req_id_map, message, code, context=None, ts_stream_next=False):
        return bytearray()

    stock.setattr(otf, "retrieve_msg", retrieve_msg)
    main.retrieve_msg = retrieve_msg
    stock.setattr(service, "create_predict_response", create_predict_response)
    ctx = batch_context(1)
    metrics = types.SimpleNamespace(add_time=lambda *a, **k: None)
    ctx.metrics = metrics
    with caplog.at_level(logging.WARNING):
        assert worker_io.install_lean(ctx, METRIC_LOGGER) == []
    assert "per-batch log call kept: retrieve_msg is not the pinned 0.12.0 source" in caplog.text
    assert "response encoder kept: create_predict_response is not the pinned 0.12.0" in caplog.text
    assert "PredictionTime kept: the metrics cache's add_time is not the pinned" in caplog.text
    assert otf.retrieve_msg is main.retrieve_msg is retrieve_msg
    assert service.create_predict_response is create_predict_response


def test_another_torchserve_version_gets_nothing(stock, caplog):
    worker_main(stock)
    stock.setattr(ts, "__version__", "0.12.1")
    ctx = batch_context(1)
    ctx.metrics = None
    with caplog.at_level(logging.WARNING):
        assert worker_io.install_lean(ctx, METRIC_LOGGER) == []
    assert caplog.text.count("TorchServe 0.12.1 is not the pinned 0.12.0 source") == 2


def test_prediction_time_is_skipped_only_while_its_line_would_be_dropped(stock):
    from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

    from rtserve.testing.worker import METRICS_YAML

    cache = MetricsCacheYamlImpl(config_file_path=str(METRICS_YAML))
    cache.initialize_cache()
    ctx = batch_context(1)
    ctx.metrics = cache
    assert "prediction_time" in worker_io.install_lean(ctx, METRIC_LOGGER)
    quiet = cache.add_time
    assert isinstance(quiet, worker_io.QuietPredictionTime)
    seen = []
    quiet.add_time = lambda name, value, *a, **k: seen.append(name)
    metric_logger = logging.getLogger(METRIC_LOGGER)
    level = metric_logger.level
    try:
        metric_logger.setLevel(logging.WARNING)  # as the handler leaves it
        quiet(service.PREDICTION_METRIC, 1.5)
        quiet("HandlerTime", 2.0)
        metric_logger.setLevel(logging.INFO)
        quiet(service.PREDICTION_METRIC, 1.5)
    finally:
        metric_logger.setLevel(level)
    assert seen == ["HandlerTime", service.PREDICTION_METRIC]


def mixed_message(requests: list[tuple[bytes, list, list]]) -> bytes:
    """An inference command of raw parts: per request its id, (name, value) headers and
    (name, content type, value) parameters."""
    out = b"I"
    for request_id, headers, parameters in requests:
        out += frame(request_id)
        for name, value in headers:
            out += frame(name) + frame(value)
        out += struct.pack("!i", -1)
        for name, content_type, value in parameters:
            out += frame(name) + frame(content_type) + frame(value)
        out += struct.pack("!i", -1)
    return out + struct.pack("!i", -1)


MIXED = [
    (
        b"id-json",
        [(b"Host", b"127.0.0.1:8080"), (b"Authorization", b"Bearer k"), (b"x", b"")],
        [(b"body", b"application/json", b'{"features": [1.5, -2, 3e-7]}')],
    ),
    (b"id-text", [], [(b"body", b"text/plain", "caf\u00e9".encode())]),
    (
        b"id-binary",
        [(b"Content-Type", b"application/octet-stream")],
        [(b"body", b"application/octet-stream", bytes(range(256)))],
    ),
    (b"id-bad-json", [], [(b"body", b"application/json", b'{"features": [1,')]),
    (b"id-bad-text", [], [(b"body", b"text/csv", b"\xff\xfe")]),
    (b"id-nothing", [], []),
    (b"id-two", [(b"h", b"v")], [(b"a", b"application/json", b"1"), (b"b", b"text/x", b"two")]),
]


@pytest.mark.parametrize("decode", [None, "false"])
def test_the_lean_batch_parser_returns_torchserves_batch(buffered, monkeypatch, caplog, decode):
    """Back-to-back messages in odd pieces, every kind of value, undecodable ones included, with
    and without TS_DECODE_INPUT_REQUEST: TorchServe's parser and the buffer's give equal lists."""
    if decode is None:
        monkeypatch.delenv("TS_DECODE_INPUT_REQUEST", raising=False)
    else:
        monkeypatch.setenv("TS_DECODE_INPUT_REQUEST", decode)
    wire = mixed_message(MIXED) + mixed_message(MIXED[:1]) + mixed_message([])
    got = {}
    for name, parse in (("theirs", otf._retrieve_inference_msg), ("ours", buffered.inference_msg)):
        a, b = socket.socketpair()
        with a, b, caplog.at_level(logging.WARNING):
            for start in range(0, len(wire), 37):  # pieces that cut fields and lengths
                b.sendall(wire[start : start + 37])
            msgs = []
            for _ in range(3):
                assert otf._retrieve_buffer(a, 1) == b"I"
                msgs.append(parse(a))
            got[name] = msgs
    assert got["ours"] == got["theirs"]
    first = got["ours"][0]
    assert [bytes(r["requestId"]) for r in first] == [r[0] for r in MIXED]
    if decode is None:
        assert first[0]["parameters"][0]["value"] == {"features": [1.5, -2, 3e-7]}
        assert first[1]["parameters"][0]["value"] == "caf\u00e9"
        assert "undecodable JSON input" in caplog.text and "undecodable text input" in caplog.text
    else:
        assert first[0]["parameters"][0]["value"] == b'{"features": [1.5, -2, 3e-7]}'
    assert got["ours"][2] == []


def test_the_lean_batch_parser_stands_in_only_over_the_pinned_parser(stock, caplog):
    ctx = batch_context(1)
    ctx.metrics = None
    with caplog.at_level(logging.WARNING):
        assert "inference_msg" not in worker_io.install_lean(ctx, METRIC_LOGGER)
    assert "batch parser kept: the buffered reads are off" in caplog.text
    original_reader, original_parser = otf._retrieve_buffer, otf._retrieve_inference_msg
    stock.setattr(otf, "_retrieve_buffer", worker_io.BufferedReader())
    original = otf._retrieve_request

    def changed(conn):  # a TorchServe whose request parser changed
        return original(conn)

    stock.setattr(otf, "_retrieve_request", changed)
    with caplog.at_level(logging.WARNING):
        assert "inference_msg" not in worker_io.install_lean(ctx, METRIC_LOGGER)
    assert "batch parser kept: _retrieve_request is not the pinned 0.12.0 source" in caplog.text
    stock.setattr(otf, "_retrieve_request", original)
    assert "inference_msg" in worker_io.install_lean(ctx, METRIC_LOGGER)
    lean = otf._retrieve_inference_msg
    assert lean.original is original_parser
    assert "inference_msg" in worker_io.install_lean(ctx, METRIC_LOGGER)  # once
    assert otf._retrieve_inference_msg is lean
    batch = [("id-0", {"url_path": ""}, {"features": [1.5] * 4})]
    for current in (worker_io.BufferedReader(), original_reader):  # whichever reader is in place
        stock.setattr(otf, "_retrieve_buffer", current)
        ours, theirs = socket.socketpair()
        with ours, theirs:
            theirs.sendall(predict_message(batch)[1:])
            (request,) = lean(ours)
        assert request["parameters"][0]["value"] == {"features": [1.5] * 4}
