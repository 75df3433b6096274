"""Explanations through the handler with a real ts.context.Context, no server.

Each request carries the headers TorchServe's frontend sets (``tests.helpers.route_headers``),
so the handler decides per request, as in production. Reference attributions come from Captum
run directly on the raw-input model ``softmax(model((x - mean) / std))`` for one row at a time.

Tolerance: attributions and convergence deltas agree with that reference to ``ATOL`` = 1e-5
absolute (attributions are shares of a probability, at most 1 in size; the measured gap is
below 1e-6, float32 rounding between the raw and the normalized input space and between
batched and single-row passes).
"""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from requests import Response

from handler.errors import ConfigError
from handler.rtserve_handler import RealTimeHandler
from rtserve.client.rest import Overloaded, _error
from rtserve.model.data import make_dataset
from tests.conftest import REPO
from tests.helpers import Reference, json_row, make_context, route_headers, start_batch
from tests.unit.test_fuzz import json_values, numbers, oracle_features, rows

pytestmark = pytest.mark.unit

MODEL_YAML = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
ATOL = 1e-5
PREDICT, EXPLAIN = route_headers(False), route_headers(True)


@pytest.fixture(scope="module")
def served(trained_dir):
    """(handler, context, reference) for the default model config."""
    ctx = make_context(trained_dir, MODEL_YAML)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    ref = Reference.demo(trained_dir)
    return handler, ctx, ref


@pytest.fixture(scope="module")
def samples() -> list[list[float]]:
    """Held-out rows in raw units, as clients send them."""
    return make_dataset().x_test[:6].tolist()


def run(handler, ctx, requests: list[tuple[dict, dict]]):
    """Send ``(headers, body)`` requests as one batch; return (statuses, bodies, contexts)."""
    start_batch(ctx, len(requests), [h for h, _ in requests])
    out = handler.handle([json_row(b) for _, b in requests], ctx)
    assert isinstance(out, list) and len(out) == len(requests)
    statuses = [ctx.get_response_status(i)[0] for i in range(len(requests))]
    return statuses, [json.loads(o) for o in out]


def explain_calls(monkeypatch, handler) -> list[int]:
    """Record how many rows each call of the handler's Captum explainer gets."""
    calls: list[int] = []
    original = handler.explainer.explain

    def spy(inputs, targets):
        calls.append(len(inputs))
        return original(inputs, targets)

    monkeypatch.setattr(handler.explainer, "explain", spy)
    return calls


def assert_explains(body: dict, ref: Reference, row: list[float], target: int) -> None:
    """The explanation equals Captum run directly, and is complete within its delta."""
    expected, delta = ref.integrated_gradients(row, target)
    names = ref.meta.feature_names
    assert body["target"] == target and body["label"] == ref.meta.labels[target]
    assert list(body["attributions"]) == names
    assert list(body["attributions"].values()) == pytest.approx(expected, abs=ATOL)
    assert body["convergence_delta"] == pytest.approx(delta, abs=ATOL)
    assert body["baseline"] == pytest.approx(dict(zip(names, ref.meta.mean)), rel=1e-6)
    probs = ref.probabilities([row, ref.meta.mean])
    assert body["target_probability"] == pytest.approx(float(probs[0, target]), abs=1e-6)
    assert body["baseline_probability"] == pytest.approx(float(probs[1, target]), abs=1e-6)
    assert body["prediction"] == int(probs[0].argmax())
    assert body["method"] == "integrated_gradients" and body["n_steps"] == 50
    assert body["model_version"] == "1.0"


def test_explanations_equal_captum_run_directly(served, samples, monkeypatch):
    handler, ctx, ref = served
    calls = explain_calls(monkeypatch, handler)
    targets = [0, 1, 2]
    statuses, bodies = run(
        handler, ctx, [(EXPLAIN, {"features": row, "target": t}) for row, t in zip(samples, targets)]
    )
    assert statuses == [200] * 3
    assert calls == [3], "the three explanations should share one Captum call"
    for body, row, target in zip(bodies, samples, targets):
        assert_explains(body, ref, row, target)


def test_completeness_within_convergence_delta(served, samples):
    handler, ctx, _ = served
    statuses, bodies = run(handler, ctx, [(EXPLAIN, {"features": row}) for row in samples[:4]])
    assert statuses == [200] * 4
    for body in bodies:
        total = sum(body["attributions"].values())
        gap = body["target_probability"] - body["baseline_probability"]
        # Captum's delta is exactly sum(attributions) - (F(x) - F(baseline)) ...
        assert total - gap == pytest.approx(body["convergence_delta"], abs=ATOL)
        # ... and 50 Gauss-Legendre steps make it small for this model.
        assert abs(body["convergence_delta"]) < 1e-2


def test_default_target_is_the_prediction_and_targets_are_respected(served, samples):
    handler, ctx, ref = served
    row = samples[0]
    requests = [(EXPLAIN, {"features": row})] + [(EXPLAIN, {"features": row, "target": t}) for t in (0, 1, 2)]
    assert handler.config.explain_max_per_batch >= len(requests)
    statuses, bodies = run(handler, ctx, requests)
    assert statuses == [200] * 4
    predicted = int(ref.probabilities([row])[0].argmax())
    assert bodies[0]["target"] == bodies[0]["prediction"] == predicted
    assert [b["target"] for b in bodies[1:]] == [0, 1, 2]
    assert bodies[0]["attributions"] == bodies[1 + predicted]["attributions"]
    # Probabilities sum to 1, so the three classes' attributions cancel feature by feature.
    for name in ref.meta.feature_names:
        assert sum(b["attributions"][name] for b in bodies[1:]) == pytest.approx(0.0, abs=ATOL)


def test_mixed_batch_gives_each_request_its_own_answer(served, samples, monkeypatch):
    handler, ctx, ref = served
    calls = explain_calls(monkeypatch, handler)
    requests = [
        (PREDICT, {"features": samples[0]}),
        (EXPLAIN, {"features": samples[1], "target": 2}),
        (EXPLAIN, {"features": samples[2], "target": "2"}),
        (PREDICT, {"features": samples[3], "target": 1}),  # predictions ignore 'target'
        (EXPLAIN, {"features": samples[4]}),
        (PREDICT, {"features": [1.0]}),
        ({}, {"features": samples[5]}),  # no explain header (e.g. /invocations): a prediction
    ]
    statuses, bodies = run(handler, ctx, requests)
    assert statuses == [200, 200, 400, 200, 200, 400, 200]
    assert calls == [2]
    expected = ref.probabilities([samples[0], samples[3], samples[5]])
    for body, probs in zip([bodies[0], bodies[3], bodies[6]], expected):
        assert set(body) == {"prediction", "label", "probabilities", "model_version"}
        assert body["probabilities"] == pytest.approx(probs.tolist(), abs=1e-6)
    assert_explains(bodies[1], ref, samples[1], 2)
    predicted = int(ref.probabilities([samples[4]])[0].argmax())
    assert_explains(bodies[4], ref, samples[4], predicted)
    assert bodies[2] == {"error": "'target' must be a class index, an integer in [0, 2], got string", "field": "target"}
    assert bodies[5]["field"] == "features"


def test_explain_header_is_read_per_request_not_from_request_zero(served, samples, monkeypatch):
    handler, ctx, _ = served
    calls = explain_calls(monkeypatch, handler)
    statuses, bodies = run(handler, ctx, [(EXPLAIN, {"features": samples[0]}), (PREDICT, {"features": samples[1]})])
    assert statuses == [200, 200] and calls == [1]
    assert "attributions" in bodies[0] and "probabilities" in bodies[1]


def test_prediction_batches_never_reach_captum(served, samples, monkeypatch):
    handler, ctx, _ = served
    calls = explain_calls(monkeypatch, handler)
    statuses, bodies = run(
        handler, ctx, [(PREDICT, {"features": r}) for r in samples] + [({"explain": "false"}, {"features": samples[0]})]
    )
    assert statuses == [200] * 7 and calls == []
    assert all("probabilities" in b for b in bodies)


BAD_TARGETS = [
    ("string", "1", "got string"),
    ("float", 1.0, "got number"),
    ("bool", True, "got boolean"),
    ("null", None, "got null"),
    ("list", [1], "got array"),
    ("negative", -1, "got -1"),
    ("too large", 3, "got 3"),
    ("huge", 10**30, "got 1000000000000000000000000000000"),
]


@pytest.mark.parametrize("target,got", [b[1:] for b in BAD_TARGETS], ids=[b[0] for b in BAD_TARGETS])
def test_bad_target_gets_its_own_400(served, samples, target, got):
    handler, ctx, _ = served
    statuses, bodies = run(
        handler, ctx, [(EXPLAIN, {"features": samples[0], "target": target}), (EXPLAIN, {"features": samples[1]})]
    )
    assert statuses == [400, 200]
    assert bodies[0] == {"error": f"'target' must be a class index, an integer in [0, 2], {got}", "field": "target"}
    assert ctx.get_response_status(0)[1].startswith("'target' must be a class index")


def test_bad_features_on_the_explain_route_get_400(served):
    handler, ctx, _ = served
    statuses, bodies = run(handler, ctx, [(EXPLAIN, {"features": [1.0] * 31, "target": 0}), (EXPLAIN, {"target": 0})])
    assert statuses == [400, 400]
    assert bodies == [
        {"error": "'features' must have exactly 32 numbers, got 31", "field": "features"},
        {"error": "missing required field 'features'", "field": "features"},
    ]


def test_explanations_past_the_ceiling_get_503_and_predictions_are_kept(served, samples, monkeypatch):
    handler, ctx, ref = served
    limit = handler.config.explain_max_per_batch
    calls = explain_calls(monkeypatch, handler)
    requests = [(EXPLAIN, {"features": samples[i % 6]}) for i in range(limit + 2)]
    requests.insert(1, (PREDICT, {"features": samples[0]}))
    statuses, bodies = run(handler, ctx, requests)
    assert statuses == [200] * (limit + 1) + [503, 503]
    assert calls == [limit]
    assert "probabilities" in bodies[1]
    assert all("attributions" in b for b in bodies[:1] + bodies[2 : limit + 1])
    message = (
        f"this batch already holds {limit} explanation(s), the most the model computes per "
        "batch (handler.explain_max_per_batch): retry shortly"
    )
    for idx in (limit + 1, limit + 2):
        assert bodies[idx] == {"error": message}
        assert ctx.get_response_headers(idx)["Retry-After"] == "1"
        assert ctx.get_response_content_type(idx) == "application/json"
    # rtserve's client reads this 503 as "overloaded, retry later"
    resp = Response()
    resp.status_code, resp._content = 503, json.dumps(bodies[limit + 1]).encode()
    error = _error("POST", "/explanations/realtime-classifier", resp)
    assert isinstance(error, Overloaded) and "retry with backoff" in str(error)


def test_zero_baseline(trained_dir, samples):
    cfg = {**MODEL_YAML, "handler": {**MODEL_YAML["handler"], "explain_baseline": "zero", "explain_steps": 64}}
    ctx = make_context(trained_dir, cfg)
    handler = RealTimeHandler()
    handler.initialize(ctx)
    ref = Reference.demo(trained_dir)
    _, bodies = run(handler, ctx, [(EXPLAIN, {"features": samples[0], "target": 1})])
    body = bodies[0]
    assert set(body["baseline"].values()) == {0.0} and body["n_steps"] == 64
    expected, delta = ref.integrated_gradients(samples[0], 1, n_steps=64, baseline="zero")
    assert list(body["attributions"].values()) == pytest.approx(expected, abs=ATOL)
    assert body["convergence_delta"] == pytest.approx(delta, abs=ATOL)
    zero_prob = float(ref.probabilities([[0.0] * 32])[0, 1])
    assert body["baseline_probability"] == pytest.approx(zero_prob, abs=1e-6)


def _escape(text: str) -> str:
    return "".join("\\" + c if c in "[]()" else c for c in text)


@pytest.mark.parametrize(
    "handler_cfg,message",
    [
        ({"explain_steps": 1}, "handler.explain_steps must be in [2, 1000]"),
        ({"explain_steps": 5000}, "handler.explain_steps must be in [2, 1000]"),
        ({"explain_steps": "50"}, "handler.explain_steps must be int"),
        ({"explain_baseline": "median"}, "handler.explain_baseline must be one of: mean, zero"),
        ({"explain_max_per_batch": 0}, "handler.explain_max_per_batch must be in [1, 32]"),
        (
            {"explain_max_per_batch": 8, "explain_internal_batch_size": 4},
            "handler.explain_internal_batch_size must be in [explain_max_per_batch, 32768]",
        ),
        ({"explain_step": 50}, "unknown handler setting(s): explain_step"),
    ],
)
def test_bad_explain_config_fails_initialize(trained_dir, handler_cfg, message):
    ctx = make_context(trained_dir, {"handler": handler_cfg})
    with pytest.raises(ConfigError, match=_escape(message)):
        RealTimeHandler().initialize(ctx)


# -- hostile input on the explain route (strategies and oracle shared with test_fuzz.py) -----------


def explain_oracle(row: dict, explain: bool) -> bool:
    """Whether the request is valid (independent of handler code): valid features, and on the
    explain route an absent target or an int class index."""
    if oracle_features(row) is None:
        return False
    if not explain:
        return True
    body = row.get("data", row.get("body"))
    body = json.loads(body) if isinstance(body, (bytes, bytearray, str)) else body
    target = body.get("target", 0)
    return type(target) is int and 0 <= target < 3


targets = st.one_of(st.integers(0, 2), st.integers(-2, 4), st.integers(), json_values)
valid_features = st.lists(numbers, min_size=32, max_size=32)
explain_rows = st.one_of(
    rows,  # test_fuzz's hostile rows
    st.tuples(valid_features, targets).map(lambda t: {"body": {"features": t[0], "target": t[1]}}),
    valid_features.map(lambda f: {"body": {"features": f}}),
    st.lists(st.sampled_from([-1e6, 1e6, 0.0]), min_size=32, max_size=32).map(
        lambda f: {"body": {"features": f}}
    ),  # extreme but valid
)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(batch=st.lists(st.tuples(explain_rows, st.booleans()), min_size=1, max_size=8))
def test_hostile_explain_batches_get_answers_or_their_own_errors(served, batch):
    handler, ctx, _ = served
    start_batch(ctx, len(batch), [route_headers(explain) for _, explain in batch])
    out = handler.handle([row for row, _ in batch], ctx)
    assert len(out) == len(batch)
    explained = 0
    for idx, ((row, explain), text) in enumerate(zip(batch, out)):
        status, phrase = ctx.get_response_status(idx)
        body = json.loads(text)  # strict JSON: a NaN would not parse below
        json.dumps(body, allow_nan=False)
        if not explain_oracle(row, explain):
            assert status == 400, (row, body)
            assert body["error"] and phrase and phrase.isascii()
        elif not explain:
            assert status == 200 and "probabilities" in body, body
        elif explained < handler.config.explain_max_per_batch:
            explained += 1
            assert status == 200, body
            total = sum(body["attributions"].values())
            gap = body["target_probability"] - body["baseline_probability"]
            assert abs(total - gap - body["convergence_delta"]) < 1e-3
        else:
            assert status == 503 and "explain_max_per_batch" in body["error"], body
