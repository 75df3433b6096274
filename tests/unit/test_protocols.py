"""KServe v1 and Open Inference Protocol (v2) bodies through the handler, with a real context."""

from __future__ import annotations

import json

import pytest

from handler.config import HandlerConfig
from handler.errors import ConfigError
from tests.helpers import Reference, features, json_row, route_headers, start_batch

pytestmark = pytest.mark.unit

#: Headers of a KServe v1/v2 route: like /predictions, but without ``url_path``.
KSERVE_HEADERS = {k: v for k, v in route_headers(False).items() if k != "url_path"}



def run(handler, ctx, rows, headers=None):
    start_batch(ctx, len(rows), headers or [KSERVE_HEADERS] * len(rows))
    out = handler.handle(rows, ctx)
    assert len(out) == len(rows)
    return [ctx.get_response_status(i)[0] for i in range(len(rows))], [json.loads(o) for o in out]


def v2(rows, **extra):
    return {"inputs": [{"name": "features", "datatype": "FP32", "shape": [len(rows), 32],
                        "data": [v for r in rows for v in r]}], **extra}


def test_mixed_protocols_in_one_batch_match_the_plain_answers(handler_ctx, trained_dir):
    handler, ctx = handler_ctx
    rows = [features(value=v) for v in (-50.0, 0.0, 3.5)]
    ref = Reference.demo(trained_dir)
    probs = ref.probabilities(rows)
    statuses, bodies = run(handler, ctx, [
        json_row({"features": rows[0]}),
        json_row({"instances": rows}),
        json_row(v2(rows, id="req-7")),
        json_row({"features": rows[2]}),
    ])
    assert statuses == [200] * 4
    plain = [bodies[0], None, None, bodies[3]]
    assert bodies[1]["predictions"][0] == plain[0] and bodies[1]["predictions"][2] == plain[3]
    assert [p["prediction"] for p in bodies[1]["predictions"]] == probs.argmax(dim=1).tolist()
    answer = bodies[2]
    assert answer["id"] == "req-7"
    assert answer["model_name"] == "realtime-classifier" and answer["model_version"] == "1.0"
    cls, prob = answer["outputs"]
    assert cls == {"name": "class", "datatype": "INT64", "shape": [3],
                   "data": probs.argmax(dim=1).tolist()}
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
    ({"instances": []}, "'instances' must be a list of 1 to 64 instances (handler.max_instances), "
     "each a list of 32 numbers, got 0 instances"),
    ({"instances": [features()] * 65}, "'instances' must be a list of 1 to 64 instances "
     "(handler.max_instances), each a list of 32 numbers, got 65 instances"),
    ({"instances": [features(), [1, 2]]}, "instances[1] must be a list of 32 numbers, got 2 numbers"),
    ({"instances": [features()[:31] + [float("nan")]]},
     "instances[0][31] must be a finite number within [-1e+06, 1e+06], got nan"),
    ({"instances": [features()[:5] + [True] + features()[6:]]},
     "instances[0][5] must be a number, got boolean"),
    (v2([features()], id=7), "'id' must be a string, got number"),
    ({"inputs": []}, "'inputs' must be a list of one tensor named 'features', got 0 tensors"),
    ({**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "name": "x"}]},
     "inputs[0].name must be 'features', got 'x'"),
    ({**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "datatype": "FP64"}]},
     "inputs[0].datatype must be 'FP32', got 'FP64'"),
    ({**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "shape": [1, 31]}]},
     "inputs[0].shape must be [N, 32] with N in [1, 64] (handler.max_instances), got [1, 31]"),
    ({**v2([features()]), "inputs": [{**v2([features()])["inputs"][0], "shape": [2, 32]}]},
     "inputs[0].data must hold 64 numbers for shape [2, 32], flat or as 2 rows of 32"),
    ({**v2([features()]), "inputs": [{**v2([features()])["inputs"][0],
                                      "data": features()[:3] + [1e7] + features()[4:]}]},
     "inputs[0].data[3] must be in range within [-1e+06, 1e+06], got 10000000.0"),
    ({**v2([features()]), "inputs": [{**v2([features()])["inputs"][0],
                                      "parameters": {"binary_data_size": 128}}]},
     "inputs[0]: the binary tensor data extension is not supported: send the tensor as JSON 'data'"),
    (v2([features()], outputs=[{"name": "logits"}]),
     "outputs[0].name must be one of 'class', 'probabilities', got 'logits'"),
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
    statuses, bodies = run(handler, ctx, [json_row({"instances": [features()]})],
                           [route_headers(False)])
    assert statuses == [400]
    assert bodies == [{"error": "missing required field 'features'", "field": "features"}]


def test_explain_route_refuses_protocol_bodies(handler_ctx):
    handler, ctx = handler_ctx
    headers = {**KSERVE_HEADERS, "explain": "True"}
    statuses, bodies = run(handler, ctx, [json_row({"instances": [features()]})], [headers])
    assert statuses == [400]
    assert bodies == [{"error": "explanations take a {\"features\": [...]} body, not a KServe "
                                "v1/v2 request"}]


@pytest.mark.parametrize("value", [0, 1025])
def test_max_instances_is_bounded(value):
    with pytest.raises(ConfigError, match=r"handler.max_instances must be in \[1, 1024\]"):
        HandlerConfig.from_model_yaml({"handler": {"max_instances": value}})


def test_grpc_model_infer_error_is_an_error_output(handler_ctx):
    """gRPC ``ModelInfer`` rows carry no HTTP headers; their error must still parse as an
    inference response in TorchServe's frontend (id, model_name, model_version, outputs)."""
    handler, ctx = handler_ctx
    body = {"id": "g-9", "model_name": "realtime-classifier",
            "inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": features()}]}
    statuses, bodies = run(handler, ctx, [json_row(body), json_row(v2([features()], id="ok"))],
                           [{}, {}])
    assert bodies[0] == {"model_name": "realtime-classifier", "model_version": "1.0", "id": "g-9",
                         "outputs": [{"name": "error", "datatype": "BYTES", "shape": [1],
                                      "data": ["inputs[0].name must be 'features', got 'x'"]}]}
    assert statuses[1] == 200 and bodies[1]["id"] == "ok"
