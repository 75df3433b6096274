"""KServe v1 and Open Inference Protocol (v2) bodies through the handler, with a real context."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as triton

from handler.config import HandlerConfig
from handler.errors import ConfigError
from handler.protocols import BINARY_HEADER, encode_binary
from tests.helpers import Reference, features, json_row, raw_row, route_headers, start_batch

pytestmark = pytest.mark.unit

#: Headers of a KServe v1/v2 route: like /predictions, but without ``url_path``.
KSERVE_HEADERS = {k: v for k, v in route_headers(False).items() if k != "url_path"}


def run(handler, ctx, rows, headers=None):
    start_batch(ctx, len(rows), headers or [KSERVE_HEADERS] * len(rows))
    out = handler.handle(rows, ctx)
    assert len(out) == len(rows)
    return [ctx.get_response_status(i)[0] for i in range(len(rows))], [json.loads(o) for o in out]


def v2(rows, **extra):
    return {
        "inputs": [
            {"name": "features", "datatype": "FP32", "shape": [len(rows), 32], "data": [v for r in rows for v in r]}
        ],
        **extra,
    }


def test_mixed_protocols_in_one_batch_match_the_plain_answers(handler_ctx, trained_dir):
    handler, ctx = handler_ctx
    rows = [features(value=v) for v in (-50.0, 0.0, 3.5)]
    ref = Reference.demo(trained_dir)
    probs = ref.probabilities(rows)
    statuses, bodies = run(
        handler,
        ctx,
        [
            json_row({"features": rows[0]}),
            json_row({"instances": rows}),
            json_row(v2(rows, id="req-7")),
            json_row({"features": rows[2]}),
        ],
    )
    assert statuses == [200] * 4
    plain = [bodies[0], None, None, bodies[3]]
    assert bodies[1]["predictions"][0] == plain[0] and bodies[1]["predictions"][2] == plain[3]
    assert [p["prediction"] for p in bodies[1]["predictions"]] == probs.argmax(dim=1).tolist()
    answer = bodies[2]
    assert answer["id"] == "req-7"
    assert answer["model_name"] == "realtime-classifier" and answer["model_version"] == "1.0"
    cls, prob = answer["outputs"]
    assert cls == {"name": "class", "datatype": "INT64", "shape": [3], "data": probs.argmax(dim=1).tolist()}
    assert prob["name"] == "probabilities" and prob["datatype"] == "FP32"
    assert prob["shape"] == [3, 3]
    assert prob["data"] == pytest.approx(probs.flatten().tolist(), abs=1e-6)


def test_v2_nested_data_and_requested_outputs(handler_ctx):
    handler, ctx = handler_ctx
    rows = [features(value=1.0), features(value=2.0)]
    body = v2(rows, outputs=[{"name": "probabilities"}])
    body["inputs"][0]["data"] = rows
    statuses, bodies = run(handler, ctx, [json_row(body), json_row(v2(rows))])
    assert statuses == [200, 200]
    assert "id" not in bodies[0]
    assert [o["name"] for o in bodies[0]["outputs"]] == ["probabilities"]
    assert bodies[0]["outputs"][0] == bodies[1]["outputs"][1]


BAD = [
    (
        {"instances": []},
        "'instances' must be a list of 1 to 64 instances (handler.max_instances), "
        "each a list of 32 numbers, got 0 instances",
    ),
    (
        {"instances": [features()] * 65},
        "'instances' must be a list of 1 to 64 instances "
        "(handler.max_instances), each a list of 32 numbers, got 65 instances",
    ),
    ({"instances": [features(), [1, 2]]}, "instances[1] must be a list of 32 numbers, got 2 numbers"),
    (
        {"instances": [features()[:31] + [float("nan")]]},
        "instances[0][31] must be a finite number within [-1e+06, 1e+06], got nan",
    ),
    ({"instances": [features()[:5] + [True] + features()[6:]]}, "instances[0][5] must be a number, got boolean"),
    (v2([features()], id=7), "'id' must be a string, got number"),
    ({"inputs": []}, "'inputs' must be a list of one tensor named 'features', got 0 tensors"),
    (
        {**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "name": "x"}]},
        "inputs[0].name must be 'features', got 'x'",
    ),
    (
        {**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "datatype": "FP64"}]},
        "inputs[0].datatype must be 'FP32', got 'FP64'",
    ),
    (
        {**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "shape": [1, 31]}]},
        "inputs[0].shape must be [N, 32] with N in [1, 64] (handler.max_instances), got [1, 31]",
    ),
    (
        {**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "shape": [2, 32]}]},
        "inputs[0].data must hold 64 numbers for shape [2, 32], flat or as 2 rows of 32",
    ),
    (
        {
            **v2([features()]),
            "inputs": [{**v2([features()])["inputs"][0], "data": features()[:3] + [1e7] + features()[4:]}],
        },
        "inputs[0].data[3] must be in range within [-1e+06, 1e+06], got 10000000.0",
    ),
    (
        {**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "parameters": {"binary_data_size": 128}}]},
        "inputs[0].parameters.binary_data_size needs the binary tensor data extension: send the "
        "JSON header's length in the Inference-Header-Content-Length header, or send the tensor as "
        "JSON 'data' (Triton's clients: binary_data=False)",
    ),
    (
        v2([features()], parameters={"binary_data_output": "yes"}),
        "parameters.binary_data_output must be true or false, got string",
    ),
    (v2([features()], parameters=[]), "'parameters' must be an object, got array"),
    (
        v2([features()], outputs=[{"name": "class", "parameters": {"binary_data": 1}}]),
        "outputs[0].parameters.binary_data must be true or false, got number",
    ),
    (
        v2([features()], outputs=[{"name": "class", "parameters": {"classification": 2}}]),
        "outputs[0].parameters.classification is not supported here",
    ),
    (
        v2([features()], outputs=[{"name": "logits"}]),
        "outputs[0].name must be one of 'class', 'probabilities', got 'logits'",
    ),
]


@pytest.mark.parametrize("body,message", BAD, ids=[m[:40] for _, m in BAD])
def test_bad_protocol_request_gets_its_own_400_in_the_protocol_form(handler_ctx, body, message):
    handler, ctx = handler_ctx
    statuses, bodies = run(handler, ctx, [json_row({"features": features()}), json_row(body)])
    assert statuses == [200, 400]
    assert bodies[1] == {"error": message}
    assert "prediction" in bodies[0]


def test_plain_route_accepts_only_features(handler_ctx):
    """``/predictions`` keeps its contract: a KServe body there is a missing ``features``."""
    handler, ctx = handler_ctx
    statuses, bodies = run(handler, ctx, [json_row({"instances": [features()]})], [route_headers(False)])
    assert statuses == [400]
    assert bodies == [{"error": "missing required field 'features'", "field": "features"}]


def test_explain_route_refuses_protocol_bodies(handler_ctx):
    handler, ctx = handler_ctx
    headers = {**KSERVE_HEADERS, "explain": "True"}
    statuses, bodies = run(handler, ctx, [json_row({"instances": [features()]})], [headers])
    assert statuses == [400]
    assert bodies == [{"error": 'explanations take a {"features": [...]} body, not a KServe v1/v2 request'}]


@pytest.mark.parametrize("value", [0, 1025])
def test_max_instances_is_bounded(value):
    with pytest.raises(ConfigError, match=r"handler.max_instances must be in \[1, 1024\]"):
        HandlerConfig.from_model_yaml({"handler": {"max_instances": value}})


def test_grpc_model_infer_error_is_an_error_output(handler_ctx):
    """gRPC ``ModelInfer`` rows carry no HTTP headers; their error must still parse as an
    inference response in TorchServe's frontend (id, model_name, model_version, outputs)."""
    handler, ctx = handler_ctx
    body = {
        "id": "g-9",
        "model_name": "realtime-classifier",
        "inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": features()}],
    }
    statuses, bodies = run(handler, ctx, [json_row(body), json_row(v2([features()], id="ok"))], [{}, {}])
    assert bodies[0] == {
        "model_name": "realtime-classifier",
        "model_version": "1.0",
        "id": "g-9",
        "outputs": [
            {"name": "error", "datatype": "BYTES", "shape": [1], "data": ["inputs[0].name must be 'features', got 'x'"]}
        ],
    }
    assert statuses[1] == 200 and bodies[1]["id"] == "ok"


# -- the binary tensor data extension (Triton's clients' default) ------------------------------
ROWS = [features(value=v) for v in (-50.0, 0.0, 3.5)]


def triton_body(rows, outputs=None, request_id="", dtype=np.float32, datatype="FP32", shape=None) -> tuple[bytes, dict]:
    """A request body and its headers exactly as ``tritonclient.http`` sends them with its
    defaults (tensor bytes after the JSON header), made by the client's own request encoder."""
    tensor = triton.InferInput("features", shape or [len(rows), 32], datatype)
    tensor.set_data_from_numpy(np.array(rows, dtype=dtype).reshape(shape or (len(rows), 32)))
    body, header_length = triton.InferenceServerClient.generate_request_body(
        [tensor], outputs=outputs, request_id=request_id
    )
    return body, {**KSERVE_HEADERS, BINARY_HEADER: str(header_length)}


def hand_made(header: dict, tail: bytes, length: int | None = None) -> tuple[bytes, dict]:
    """A binary body from a JSON header and raw bytes, with any header length."""
    head = json.dumps(header).encode()
    return head + tail, {**KSERVE_HEADERS, BINARY_HEADER: str(len(head) if length is None else length)}


def v2_binary_header(n_rows, size=None, **extra) -> dict:
    tensor = {
        "name": "features",
        "datatype": "FP32",
        "shape": [n_rows, 32],
        "parameters": {"binary_data_size": n_rows * 128 if size is None else size},
    }
    return {"inputs": [tensor], **extra}


def raw_run(handler, ctx, rows, headers):
    """The handler's answers as they leave the worker: status, body (bytes or str), headers."""
    start_batch(ctx, len(rows), headers)
    out = handler.handle(rows, ctx)
    assert len(out) == len(rows)
    return [
        (ctx.get_response_status(i)[0], out[i], ctx.get_response_headers(i), ctx.get_response_content_type(i))
        for i in range(len(rows))
    ]


def parse_answer(body, headers) -> triton.InferResult:
    """The answer as Triton's client reads it (binary outputs after the JSON header, if any)."""
    raw = body if isinstance(body, bytes) else body.encode()
    length = headers.get(BINARY_HEADER)
    return triton.InferenceServerClient.parse_response_body(
        raw, header_length=int(length) if length is not None else None
    )


def test_tritonclient_default_request_gets_binary_outputs_equal_to_the_json_answer(handler_ctx, trained_dir):
    handler, ctx = handler_ctx
    body, headers = triton_body(ROWS, request_id="b-1")
    [(status, answer, answer_headers, content_type), (_, plain, _, _)] = raw_run(
        handler, ctx, [raw_row(body), json_row(v2(ROWS))], [headers, KSERVE_HEADERS]
    )
    assert status == 200 and isinstance(answer, bytes)
    assert content_type == "application/octet-stream"
    length = int(answer_headers[BINARY_HEADER])
    head = json.loads(answer[:length])
    assert head["id"] == "b-1" and head["model_version"] == "1.0"
    assert [(o["name"], o["datatype"], o["shape"], o["parameters"]) for o in head["outputs"]] == [
        ("class", "INT64", [3], {"binary_data_size": 24}),
        ("probabilities", "FP32", [3, 3], {"binary_data_size": 36}),
    ]
    assert len(answer) == length + 24 + 36
    result, expected = parse_answer(answer, answer_headers), json.loads(plain)
    assert result.as_numpy("class").tolist() == expected["outputs"][0]["data"]
    assert result.as_numpy("probabilities").flatten().tolist() == expected["outputs"][1]["data"]
    probs = Reference.demo(trained_dir).probabilities(ROWS)
    np.testing.assert_allclose(result.as_numpy("probabilities"), probs.numpy(), atol=1e-6)


def test_outputs_come_in_the_form_each_asks_for(handler_ctx):
    handler, ctx = handler_ctx
    as_json, headers = triton_body(
        ROWS,
        outputs=[
            triton.InferRequestedOutput("probabilities", binary_data=False),
            triton.InferRequestedOutput("class", binary_data=False),
        ],
    )
    mixed, _ = triton_body(
        ROWS,
        outputs=[triton.InferRequestedOutput("class", binary_data=False), triton.InferRequestedOutput("probabilities")],
    )
    mixed_headers = {**headers, BINARY_HEADER: str(len(mixed) - 3 * 128)}
    (s1, a1, h1, t1), (s2, a2, h2, t2) = raw_run(
        handler, ctx, [raw_row(as_json), raw_row(mixed)], [headers, mixed_headers]
    )
    assert (s1, s2) == (200, 200)
    assert BINARY_HEADER not in h1 and t1 == "application/json"
    first = json.loads(a1)
    assert [o["name"] for o in first["outputs"]] == ["probabilities", "class"]
    assert all("parameters" not in o for o in first["outputs"])
    assert t2 == "application/octet-stream"
    second = parse_answer(a2, h2)
    cls, prob = second.get_response()["outputs"]
    assert "data" in cls and "parameters" not in cls and "data" not in prob
    assert second.as_numpy("class").tolist() == first["outputs"][1]["data"]
    assert second.as_numpy("probabilities").flatten().tolist() == first["outputs"][0]["data"]


def test_the_header_is_found_in_any_spelling_and_text_bodies_pass(handler_ctx):
    """A proxy may lower the header's name; a ``text/*`` content type makes TorchServe hand the
    body over as text when it happens to be valid UTF-8 (all-zero features are)."""
    handler, ctx = handler_ctx
    zeros = [[0.0] * 32]
    body, headers = triton_body(zeros)
    lower = {**KSERVE_HEADERS, BINARY_HEADER.lower(): headers[BINARY_HEADER]}
    answers = raw_run(handler, ctx, [raw_row(body), raw_row(body.decode("utf-8"))], [lower, headers])
    assert [a[0] for a in answers] == [200, 200]
    assert answers[0][1] == answers[1][1]


def length(request: tuple[bytes, dict], value: str) -> tuple[bytes, dict]:
    """``request`` with its Inference-Header-Content-Length set to ``value``."""
    body, headers = request
    return body, {**headers, BINARY_HEADER: value}


def floats(*values) -> bytes:
    """32 little-endian FP32 values: ``values`` first, zeros after."""
    return np.array(list(values) + [0.0] * (32 - len(values)), dtype="<f4").tobytes()


#: (request builder, message): the body of ROWS from tritonclient is 528 bytes, 144 of JSON.
BAD_BINARY = [
    (
        lambda: length(triton_body(ROWS), "abc"),
        "Inference-Header-Content-Length must be the length in bytes of the JSON header at the start "
        "of the body, an integer in [1, 528], got 'abc'",
    ),
    (lambda: length(triton_body(ROWS), "-5"), "an integer in [1, 528], got '-5'"),
    (lambda: length(triton_body(ROWS), "0"), "an integer in [1, 528], got '0'"),
    (lambda: length(triton_body(ROWS), "529"), "an integer in [1, 528], got '529'"),
    (lambda: length(triton_body(ROWS), "9" * 40), "got '" + "9" * 28 + "..."),
    (
        lambda: length(triton_body(ROWS), "100"),
        "the first 100 bytes of the body (Inference-Header-Content-Length) are not a valid UTF-8 JSON inference header",
    ),
    (
        lambda: hand_made(["inputs"], b""),
        "the first 10 bytes of the body (Inference-Header-Content-Length) must be a JSON object, got array",
    ),
    (
        lambda: hand_made(v2_binary_header(3, size=127), bytes(384)),
        "inputs[0].parameters.binary_data_size must be 384 (shape [3, 32] of FP32, 4 bytes each), got 127",
    ),
    (
        lambda: hand_made(v2_binary_header(3, size=-384), bytes(384)),
        "binary_data_size must be 384 (shape [3, 32] of FP32, 4 bytes each), got -384",
    ),
    (
        lambda: hand_made(v2_binary_header(3, size=10**30), bytes(384)),
        "binary_data_size must be 384 (shape [3, 32] of FP32, 4 bytes each), got 10000000000000000",
    ),
    (
        lambda: hand_made(v2_binary_header(3, size=True), bytes(384)),
        "binary_data_size must be 384 (shape [3, 32] of FP32, 4 bytes each), got boolean",
    ),
    (
        lambda: hand_made(v2_binary_header(3, size="384"), bytes(384)),
        "binary_data_size must be 384 (shape [3, 32] of FP32, 4 bytes each), got string",
    ),
    (
        lambda: hand_made(v2_binary_header(3), bytes(380)),
        "inputs[0].parameters.binary_data_size is 384 but 380 bytes follow the JSON header "
        "(Inference-Header-Content-Length)",
    ),
    (
        lambda: hand_made(v2_binary_header(3), bytes(400)),
        "inputs[0].parameters.binary_data_size is 384 but 400 bytes follow the JSON header",
    ),
    (lambda: triton_body(ROWS, dtype=np.float64, datatype="FP64"), "inputs[0].datatype must be 'FP32', got 'FP64'"),
    (
        lambda: triton_body([features()[:16]] * 2, shape=[2, 16]),
        "inputs[0].shape must be [N, 32] with N in [1, 64] (handler.max_instances), got [2, 16]",
    ),
    (
        lambda: hand_made({"inputs": [{**v2_binary_header(1)["inputs"][0], "data": features()}]}, bytes(128)),
        "inputs[0] has both 'data' and parameters.binary_data_size: send one",
    ),
    (
        lambda: hand_made(v2_binary_header(1), floats(0, 0, 0, 0, 0, np.nan)),
        "inputs[0] binary data[5] must be a finite number within [-1e+06, 1e+06], got nan",
    ),
    (
        lambda: hand_made(v2_binary_header(1), floats(-np.inf)),
        "inputs[0] binary data[0] must be a finite number within [-1e+06, 1e+06], got -inf",
    ),
    (
        lambda: hand_made(v2_binary_header(1), floats(0, 2e6)),
        "inputs[0] binary data[1] must be in range within [-1e+06, 1e+06], got 2000000.0",
    ),
    (
        lambda: hand_made(v2([features()]), bytes(8)),
        "8 bytes follow the JSON header (Inference-Header-Content-Length) but inputs[0] has no "
        "parameters.binary_data_size",
    ),
    (
        lambda: hand_made({"instances": [features()]}, b""),
        "Inference-Header-Content-Length (binary tensor data) is for Open Inference Protocol "
        "requests only: the JSON header has no 'inputs'",
    ),
    (
        lambda: hand_made(
            {**v2_binary_header(1), "outputs": [{"name": "class", "parameters": {"shared_memory_region": "r"}}]},
            bytes(128),
        ),
        "outputs[0].parameters.shared_memory_region is not supported here",
    ),
]


@pytest.mark.parametrize("make_request,message", BAD_BINARY, ids=[m[:48] for _, m in BAD_BINARY])
def test_bad_binary_requests_get_their_own_400_naming_the_field(handler_ctx, make_request, message):
    """Each hostile binary request in a batch with good ones (plain JSON, binary): its own 400
    in the protocol's JSON error form, never a crash or a failed batch."""
    handler, ctx = handler_ctx
    body, headers = make_request()
    good, good_headers = triton_body(ROWS[:1])
    answers = raw_run(
        handler,
        ctx,
        [json_row({"features": features()}), raw_row(body), raw_row(good)],
        [KSERVE_HEADERS, headers, good_headers],
    )
    assert [a[0] for a in answers] == [200, 400, 200]
    error = json.loads(answers[1][1])
    assert set(error) == {"error"} and message in error["error"], error
    assert BINARY_HEADER not in answers[1][2] and answers[1][3] == "application/json"
    assert parse_answer(answers[2][1], answers[2][2]).as_numpy("class").shape == (1,)


def test_a_mixed_batch_keeps_every_request_status(handler_ctx):
    """Binary, JSON v2, KServe v1, plain and bad requests in one batch, each answered alone."""
    handler, ctx = handler_ctx
    binary, binary_headers = triton_body(ROWS)
    bad, bad_headers = length(triton_body(ROWS), "10")
    rows = [
        raw_row(binary),
        json_row(v2(ROWS)),
        json_row({"instances": ROWS}),
        raw_row(bad),
        json_row({"features": ROWS[2]}),
        raw_row(b"not json"),
    ]
    headers = [binary_headers, KSERVE_HEADERS, KSERVE_HEADERS, bad_headers, route_headers(False), KSERVE_HEADERS]
    answers = raw_run(handler, ctx, rows, headers)
    assert [a[0] for a in answers] == [200, 200, 200, 400, 200, 400]
    as_json = json.loads(answers[1][1])
    assert (
        parse_answer(answers[0][1], answers[0][2]).as_numpy("probabilities").flatten().tolist()
        == as_json["outputs"][1]["data"]
    )
    assert json.loads(answers[2][1])["predictions"][2] == json.loads(answers[4][1])
    assert json.loads(answers[5][1]) == {"error": "request body is not valid JSON"}


def test_binary_bodies_on_plain_and_explain_routes(handler_ctx):
    """``/predictions`` keeps its JSON-only contract; explanations take no v2 body."""
    handler, ctx = handler_ctx
    body, headers = triton_body(ROWS[:1])
    plain = {**route_headers(False), BINARY_HEADER: headers[BINARY_HEADER]}
    explain = {**headers, "explain": "True"}
    answers = raw_run(handler, ctx, [raw_row(body), raw_row(body)], [plain, explain])
    assert [a[0] for a in answers] == [400, 400]
    assert json.loads(answers[0][1]) == {"error": "request body is not valid UTF-8 JSON"}
    assert json.loads(answers[1][1]) == {
        "error": 'explanations take a {"features": [...]} body, not a KServe v1/v2 request'
    }


def test_encode_binary_is_what_tritonclient_reads():
    document = {
        "model_name": "m",
        "model_version": "1",
        "outputs": [
            {"name": "class", "datatype": "INT64", "shape": [2], "data": [2, -1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [2, 2], "data": [0.25, 0.75, 1.0, 0.0]},
        ],
    }
    body, header_length = encode_binary(document, {"class", "probabilities"})
    assert header_length == len(body) - 16 - 16
    result = triton.InferenceServerClient.parse_response_body(body, header_length=header_length)
    assert result.as_numpy("class").tolist() == [2, -1]
    assert result.as_numpy("probabilities").tolist() == [[0.25, 0.75], [1.0, 0.0]]
    assert document["outputs"][0]["data"] == [2, -1]  # the document itself is left alone
