"""Property-based fuzzing of the handler's parsing and validation (hypothesis).

Thousands of generated batches of hostile payloads go through ``RealTimeHandler.handle`` with a
real TorchServe context. Every request must end in either a correct prediction (exactly when
an independent oracle says the payload is valid) or its own 400 with a message; nothing raises.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.helpers import route_headers, start_batch

pytestmark = pytest.mark.unit

N = 32
LIMIT = 1.0e6

scalars = (
    st.none()
    | st.booleans()
    | st.text(max_size=20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.integers()
    | st.sampled_from([10**400, -(10**400), 2**63, 1e308])
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=40) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)
numbers = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False) | st.integers(min_value=-1000, max_value=1000)
element = st.one_of(numbers, numbers, numbers, numbers, scalars, json_values)
feature_lists = st.one_of(
    st.lists(numbers, min_size=N, max_size=N),  # valid
    st.lists(element, min_size=N, max_size=N),  # right length, maybe junk
    st.lists(element, max_size=2 * N),  # any length
    st.integers(0, 20_000).map(lambda n: [1.0] * n),  # enormous arrays
)
objects = st.one_of(
    st.fixed_dictionaries({"features": feature_lists}),
    st.fixed_dictionaries({"features": feature_lists}, optional={"extra": json_values}),
    json_values,
)


def nested(depth: int) -> list:
    """``[[[...]]]`` nested ``depth`` deep, built without recursion."""
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def encode(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


rows = st.one_of(
    objects.map(lambda v: {"body": v}),  # decoded by TorchServe
    objects.map(lambda v: {"body": encode(v)}),  # raw bytes
    objects.map(lambda v: {"data": encode(v).decode()}),  # text
    st.tuples(objects, st.floats(0, 1)).map(  # truncated JSON
        lambda t: {"body": encode(t[0])[: int(len(encode(t[0])) * t[1])]}
    ),
    st.binary(max_size=300).map(lambda b: {"body": b}),  # arbitrary bytes
    st.integers(1, 20_000).map(lambda n: {"body": b"[" * n + b"]" * n}),  # deep nesting
    st.integers(1, 500).map(lambda n: {"body": {"features": nested(n)}}),
    st.just({}),  # no body at all
)


def oracle_features(row: dict):
    """The feature vector if the request is valid, else None (independent of handler code)."""
    body = row.get("data", row.get("body"))
    if isinstance(body, (bytes, bytearray)):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except (ValueError, RecursionError):
            return None
    if not isinstance(body, dict) or not isinstance(body.get("features"), list):
        return None
    feats = body["features"]
    if len(feats) != N:
        return None
    for v in feats:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if abs(v) > LIMIT:
            return None
    return feats


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(rows, min_size=1, max_size=8))
def test_hostile_batches_get_predictions_or_their_own_400(handler_ctx, batch):
    handler, ctx = handler_ctx
    start_batch(ctx, len(batch), [route_headers(False)] * len(batch))  # POST /predictions
    out = handler.handle(batch, ctx)
    assert len(out) == len(batch)
    for idx, (row, text) in enumerate(zip(batch, out)):
        status, phrase = ctx.get_response_status(idx)
        body = json.loads(text)
        if oracle_features(row) is not None:
            assert status == 200, body
            assert 0 <= body["prediction"] < 3 and body["model_version"] == "1.0"
            assert all(math.isfinite(p) for p in body["probabilities"])
            assert math.isclose(sum(body["probabilities"]), 1.0, abs_tol=1e-5)
        else:
            assert status == 400, (row, body)
            assert body["error"] and phrase and phrase.isascii() and "\n" not in phrase


@st.composite
def binary_requests(draw):
    """The raw body and Inference-Header-Content-Length of a binary tensor data request, each
    part drawn valid or broken, and whether it is valid: (body, header value, valid)."""
    n = draw(st.sampled_from([0, 1, 2, 65]))
    count = min(n, 2) * N
    drawn = draw(
        st.lists(st.floats(-1e3, 1e3, width=32), min_size=count, max_size=count)
        | st.lists(st.floats(width=32), min_size=count, max_size=count)
    )
    values = drawn + [0.0] * (n * N - len(drawn))  # (65 rows: too many, whatever they hold)
    tail = np.array(values, dtype="<f4").tobytes()
    size = draw(st.sampled_from([len(tail)] * 3 + [True, "128"]) | st.integers(-10, 10**13))
    cut = draw(st.sampled_from([0, 0, 0, -4, -1, 1, 8]))
    tail = tail[: len(tail) + cut] if cut < 0 else tail + bytes(cut)
    head = json.dumps(
        {
            "inputs": [
                {"name": "features", "datatype": "FP32", "shape": [n, N], "parameters": {"binary_data_size": size}}
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()  # as tritonclient
    header = draw(
        st.sampled_from([str(len(head))] * 3 + [f" {len(head)} "])
        | st.integers(-5, len(head) + len(tail) + 5).map(str)
        | st.text(max_size=14)
    )
    valid = (
        header.strip() == str(len(head))
        and 1 <= n <= 64
        and type(size) is int
        and size == n * N * 4
        and cut == 0
        and all(math.isfinite(v) and abs(v) <= LIMIT for v in values)
    )
    return head + tail, header, valid


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(binary_requests(), min_size=1, max_size=6))
def test_hostile_binary_requests_get_answers_or_their_own_400(handler_ctx, batch):
    """The binary tensor data extension (Open Inference Protocol, Triton's clients' default):
    a valid request gets its binary answer, any other its own 400; nothing raises."""
    handler, ctx = handler_ctx
    headers = {k: v for k, v in route_headers(False).items() if k != "url_path"}  # /v2/.../infer
    start_batch(ctx, len(batch), [{**headers, "Inference-Header-Content-Length": h} for _, h, _ in batch])
    out = handler.handle([{"body": body} for body, _, _ in batch], ctx)
    assert len(out) == len(batch)
    for idx, (_, _, valid) in enumerate(batch):
        status, phrase = ctx.get_response_status(idx)
        event("valid" if valid else "invalid")
        if valid:
            assert status == 200, out[idx]
            length = int(ctx.get_response_headers(idx)["Inference-Header-Content-Length"])
            assert json.loads(out[idx][:length])["outputs"][0]["parameters"]["binary_data_size"] > 0
        else:
            assert status == 400, (batch[idx], out[idx])
            assert json.loads(out[idx])["error"] and phrase and phrase.isascii()
