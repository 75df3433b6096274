"""KServe v1, Open Inference Protocol (v2) over REST, and TorchServe's gRPC APIs, on a real
TorchServe started as ``make serve`` starts it (rtserve.server), spoken by clients this project
did not write: Triton's ``tritonclient[http]`` (an Open Inference Protocol client, used with its
defaults: binary tensor data) and gRPC stubs generated from the proto files inside the installed
TorchServe frontend jar. KServe v1 has no light published client; its requests are plain HTTP
(``requests``). Every answer is compared with the plain ``/predictions`` answer for the same
features."""

from __future__ import annotations

import json
import time

import grpc
import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from rtserve.client.grpc_stubs import generate
from rtserve.server.torchserve import OIP_ROUTES
from rtserve.settings import DRAIN_FILE
from tests.conftest import MODEL_NAME
from tests.helpers import features, records

pytestmark = pytest.mark.integration

ROWS = [features(value=v) for v in (-50.0, 0.0, 3.5, 40.0)]


@pytest.fixture(scope="module")
def keys(server):
    data = json.loads(server.key_file.read_text())
    return {kind: data[kind]["key"] for kind in ("inference", "management")}


@pytest.fixture(scope="module")
def plain(server):
    """The plain route's answers for ROWS: what every protocol must agree with."""
    client = server.client()
    return [client.predict(MODEL_NAME, {"features": row}) for row in ROWS]


@pytest.fixture(scope="module")
def triton_client(server):
    url = server.props["inference_address"].removeprefix("http://")
    client = triton.InferenceServerClient(url=url, connection_timeout=10, network_timeout=10)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stubs():
    """Generated from the installed frontend jar's protos into build/grpc (once per jar)."""
    return generate()


def assert_same(answers: list[dict], expected: list[dict]) -> None:
    """Same predictions as the plain route; probabilities to float32 rounding (a batch of
    different size may sum in another order)."""
    assert len(answers) == len(expected)
    for got, want in zip(answers, expected):
        assert {k: v for k, v in got.items() if k != "probabilities"} == {
            k: v for k, v in want.items() if k != "probabilities"
        }
        assert got["probabilities"] == pytest.approx(want["probabilities"], abs=1e-6)


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


# -- KServe v1 -------------------------------------------------------------------------------
def test_v1_predict_gives_one_prediction_per_instance(server, keys, plain):
    url = f"{server.props['inference_address']}/v1/models/{MODEL_NAME}:predict"
    resp = requests.post(url, json={"instances": ROWS}, headers=bearer(keys["inference"]), timeout=10)
    assert resp.status_code == 200
    assert list(resp.json()) == ["predictions"]
    assert_same(resp.json()["predictions"], plain)


def test_v1_bad_instance_gets_a_400_in_the_v1_form(server, keys):
    url = f"{server.props['inference_address']}/v1/models/{MODEL_NAME}:predict"
    resp = requests.post(url, json={"instances": [ROWS[0], [1, 2]]}, headers=bearer(keys["inference"]), timeout=10)
    assert resp.status_code == 400
    assert resp.json() == {"error": "instances[1] must be a list of 32 numbers, got 2 numbers"}


# -- Open Inference Protocol (v2) over REST, with Triton's client ------------------------------
def test_v2_server_metadata_and_health(triton_client, keys):
    headers = bearer(keys["inference"])
    assert triton_client.is_server_live(headers=headers) is True
    assert triton_client.is_server_ready(headers=headers) is True
    meta = triton_client.get_server_metadata(headers=headers)
    assert meta["name"] == "Torchserve" and meta["version"] == "0.12.0"


def test_v2_infer_matches_the_plain_route(triton_client, keys, plain):
    inp = triton.InferInput("features", [len(ROWS), 32], "FP32")
    inp.set_data_from_numpy(np.array(ROWS, dtype=np.float32), binary_data=False)
    outputs = [triton.InferRequestedOutput(name, binary_data=False) for name in ("class", "probabilities")]
    result = triton_client.infer(
        MODEL_NAME, [inp], outputs=outputs, request_id="req-42", headers=bearer(keys["inference"])
    )
    response = result.get_response()
    assert response["id"] == "req-42"
    assert response["model_name"] == MODEL_NAME and response["model_version"] == "1.0"
    assert result.as_numpy("class").tolist() == [p["prediction"] for p in plain]
    np.testing.assert_allclose(result.as_numpy("probabilities"), [p["probabilities"] for p in plain], atol=1e-6)
    assert result.as_numpy("probabilities").shape == (len(ROWS), 3)


@pytest.mark.parametrize(
    "name,shape,datatype,message",
    [
        ("x", [1, 32], "FP32", "inputs[0].name must be 'features', got 'x'"),
        ("features", [1, 32], "FP64", "inputs[0].datatype must be 'FP32', got 'FP64'"),
        (
            "features",
            [2, 16],
            "FP32",
            "inputs[0].shape must be [N, 32] with N in [1, 64] (handler.max_instances), got [2, 16]",
        ),
    ],
)
def test_v2_bad_request_gets_a_400_in_the_v2_form(triton_client, keys, name, shape, datatype, message):
    inp = triton.InferInput(name, shape, datatype)
    inp.set_data_from_numpy(np.zeros(shape, dtype=np.float64 if datatype == "FP64" else np.float32), binary_data=False)
    with pytest.raises(InferenceServerException) as err:
        triton_client.infer(MODEL_NAME, [inp], headers=bearer(keys["inference"]))
    assert err.value.status() == "400"
    assert err.value.message() == message


#: TorchServe's answer to a request without its token (0.12.0 has no 401).
NO_TOKEN = {
    "code": 400,
    "type": "InvalidKeyException",
    "message": "Token Authorization failed. Token either incorrect, expired, or not provided correctly",
}


def test_tritonclient_with_its_defaults_from_readiness_to_binary_inference(triton_client, keys, plain):
    """A generic OIP client's whole flow on the local server, with no option changed: model
    readiness and metadata (rtserve's agent and rtserve.server.oip), then inference with the input and
    every output as binary tensor data."""
    auth = bearer(keys["inference"])
    assert triton_client.is_server_live(headers=auth) and triton_client.is_server_ready(headers=auth)
    assert triton_client.is_model_ready(MODEL_NAME, headers=auth) is True
    assert triton_client.is_model_ready(MODEL_NAME, "1.0", headers=auth) is True
    meta = triton_client.get_model_metadata(MODEL_NAME, headers=auth)
    assert meta == {
        "name": MODEL_NAME,
        "versions": ["1.0"],
        "platform": "pytorch_torchserve",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 32]}],
        "outputs": [
            {"name": "class", "datatype": "INT64", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
        ],
    }
    assert triton_client.get_model_metadata(MODEL_NAME, "1.0", headers=auth) == meta
    (spec,) = meta["inputs"]
    tensor = triton.InferInput(spec["name"], [len(ROWS), 32], spec["datatype"])
    tensor.set_data_from_numpy(np.array(ROWS, dtype=np.float32))  # binary_data=True
    result = triton_client.infer(MODEL_NAME, [tensor], headers=auth)
    response = result.get_response()
    assert [o["parameters"] for o in response["outputs"]] == [
        {"binary_data_size": 8 * len(ROWS)},
        {"binary_data_size": 4 * 3 * len(ROWS)},
    ]
    assert result.as_numpy("class").tolist() == [p["prediction"] for p in plain]
    np.testing.assert_allclose(result.as_numpy("probabilities"), [p["probabilities"] for p in plain], rtol=0, atol=1e-6)


def test_v2_binary_input_answers_json_outputs_when_asked(server, triton_client, keys, plain):
    tensor = triton.InferInput("features", [len(ROWS), 32], "FP32")
    tensor.set_data_from_numpy(np.array(ROWS, dtype=np.float32))
    outputs = [
        triton.InferRequestedOutput("probabilities", binary_data=False),
        triton.InferRequestedOutput("class", binary_data=False),
    ]
    result = triton_client.infer(
        MODEL_NAME, [tensor], outputs=outputs, request_id="j-1", headers=bearer(keys["inference"])
    )
    response = result.get_response()
    assert response["id"] == "j-1" and [o["name"] for o in response["outputs"]] == ["probabilities", "class"]
    assert all("parameters" not in o and "data" in o for o in response["outputs"])
    assert result.as_numpy("class").tolist() == [p["prediction"] for p in plain]
    np.testing.assert_allclose(result.as_numpy("probabilities"), [p["probabilities"] for p in plain], rtol=0, atol=1e-6)
    # Over plain HTTP: a JSON answer carries no Inference-Header-Content-Length.
    body, length = triton.InferenceServerClient.generate_request_body([tensor], outputs=outputs)
    resp = requests.post(
        f"{server.props['inference_address']}/v2/models/{MODEL_NAME}/infer",
        data=body,
        timeout=10,
        headers={**bearer(keys["inference"]), "Inference-Header-Content-Length": str(length)},
    )
    assert resp.status_code == 200 and "Inference-Header-Content-Length" not in resp.headers
    assert resp.headers["Content-Type"] == "application/json"


def test_v2_bad_binary_request_gets_a_400_naming_the_field(server, keys):
    tensor = triton.InferInput("features", [2, 32], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 32), dtype=np.float32))
    body, length = triton.InferenceServerClient.generate_request_body([tensor])
    resp = requests.post(
        f"{server.props['inference_address']}/v2/models/{MODEL_NAME}/infer",
        data=body[:-4],
        timeout=10,
        headers={**bearer(keys["inference"]), "Inference-Header-Content-Length": str(length)},
    )
    assert resp.status_code == 400
    assert resp.json() == {
        "error": "inputs[0].parameters.binary_data_size is 256 but 252 bytes "
        "follow the JSON header (Inference-Header-Content-Length)"
    }


def test_v2_model_routes_need_the_token_and_name_what_is_missing(server, keys, triton_client):
    base = f"{server.props['inference_address']}/v2/models"
    for headers in ({}, bearer("wrong"), bearer(keys["management"])):
        for path in (f"/{MODEL_NAME}", f"/{MODEL_NAME}/ready", f"/{MODEL_NAME}/versions/1.0/ready"):
            resp = requests.get(base + path, headers=headers, timeout=10)
            assert (resp.status_code, resp.json()) == (400, NO_TOKEN), (path, headers)
    assert triton_client.is_model_ready(MODEL_NAME) is False  # no token: not ready
    auth = bearer(keys["inference"])
    for path, error in (
        ("/nope/ready", "model 'nope' is not served here (have: ['realtime-classifier'])"),
        (f"/{MODEL_NAME}/versions/9.9", f"model '{MODEL_NAME}' has no version '9.9' here (have: 1.0)"),
        (f"/{MODEL_NAME}/labels", f"not found: /v2/models/{MODEL_NAME}/labels"),
    ):
        resp = requests.get(base + path, headers=auth, timeout=10)
        assert (resp.status_code, resp.json()) == (404, {"error": error}), path
    assert triton_client.is_model_ready("nope", headers=auth) is False
    # What TorchServe answers itself is unchanged: versioned inference is not implemented.
    resp = requests.post(f"{base}/{MODEL_NAME}/versions/1.0/infer", json={}, headers=auth, timeout=10)
    assert (resp.status_code, resp.json()) == (501, {"error": "Model versioning is not yet supported."})
    access = (server.log_dir / "access_log.log").read_text()
    assert f'"GET /v2/models/{MODEL_NAME}/ready HTTP/1.1" 200' in access


def test_v2_model_readiness_follows_draining_and_says_when_its_routes_are_down(server, keys, triton_client):
    auth = bearer(keys["inference"])
    url = f"{server.props['inference_address']}/v2/models/{MODEL_NAME}/ready"
    marker = server.run_dir / DRAIN_FILE
    marker.touch()
    try:
        resp = requests.get(url, headers=auth, timeout=10)
        assert (resp.status_code, resp.json()) == (400, {"name": MODEL_NAME, "ready": False, "reason": "draining"})
    finally:
        marker.unlink()
    assert triton_client.is_model_ready(MODEL_NAME, headers=auth) is True
    pid = server.sidecar_pid(OIP_ROUTES)
    server.stop_sidecars()  # the routes' process gone (the metrics exporter with it)
    try:
        assert server.sidecar_pid(OIP_ROUTES) is None and pid is not None
        resp = requests.get(url, headers=auth, timeout=10)
        assert (resp.status_code, resp.json()) == (
            503,
            {"error": "the model metadata and readiness routes (rtserve.server.oip) are not answering"},
        )
        assert (
            requests.post(
                f"{server.props['inference_address']}/predictions/{MODEL_NAME}",
                json={"features": ROWS[0]},
                headers=auth,
                timeout=10,
            ).status_code
            == 200
        )
    finally:
        server.start_sidecars()
    deadline = time.monotonic() + 30
    while requests.get(url, headers=auth, timeout=10).status_code != 200:
        assert time.monotonic() < deadline, "rtserve.server.oip did not come back"
        time.sleep(0.2)


# -- gRPC, with stubs generated from the installed frontend jar's proto files ------------------
def test_grpc_predictions_match_the_plain_route(server, keys, stubs, plain):
    port = server.props["grpc_inference_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        md = (("authorization", f"Bearer {keys['inference']}"),)
        health = stub.Ping(stubs.inference_pb2.google_dot_protobuf_dot_empty__pb2.Empty(), metadata=md, timeout=10)
        assert json.loads(health.health)["status"] == "Healthy"
        for row, expected in zip(ROWS, plain):
            request = stubs.inference_pb2.PredictionsRequest(
                model_name=MODEL_NAME, input={"data": json.dumps({"features": row}).encode()}
            )
            answer = stub.Predictions(request, metadata=md, timeout=10)
            assert_same([json.loads(answer.prediction)], [expected])
        v1 = stub.Predictions(
            stubs.inference_pb2.PredictionsRequest(
                model_name=MODEL_NAME, input={"data": json.dumps({"instances": ROWS}).encode()}
            ),
            metadata=md,
            timeout=10,
        )
        assert_same(json.loads(v1.prediction)["predictions"], plain)
        bad = stub.Predictions(
            stubs.inference_pb2.PredictionsRequest(model_name=MODEL_NAME, input={"data": b'{"features": [1, 2]}'}),
            metadata=md,
            timeout=10,
        )
        # TorchServe's gRPC frontend drops a per-request status: the error is in the body.
        assert json.loads(bad.prediction) == {
            "error": "'features' must have exactly 32 numbers, got 2",
            "field": "features",
        }


def test_grpc_needs_the_token(server, keys, stubs):
    port = server.props["grpc_inference_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel)
        request = stubs.inference_pb2.PredictionsRequest(
            model_name=MODEL_NAME, input={"data": json.dumps({"features": ROWS[0]}).encode()}
        )
        with pytest.raises(grpc.RpcError) as err:
            stub.Predictions(request, metadata=(("authorization", "Bearer wrong"),), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "Token Authorization failed" in err.value.details()


def test_grpc_management_describes_the_model(server, keys, stubs):
    port = server.props["grpc_management_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = stubs.management_pb2_grpc.ManagementAPIsServiceStub(channel)
        md = (("authorization", f"Bearer {keys['management']}"),)
        answer = stub.DescribeModel(
            stubs.management_pb2.DescribeModelRequest(model_name=MODEL_NAME), metadata=md, timeout=10
        )
        described = json.loads(answer.msg)
        assert described[0]["modelName"] == MODEL_NAME
        assert described[0]["modelVersion"] == "1.0"


def test_grpc_open_inference_protocol_infer(server, keys, stubs, plain):
    """The Open Inference Protocol's gRPC service (``ts_open_inference_protocol=true``)."""
    oip, oip_grpc = stubs.open_inference_grpc_pb2, stubs.open_inference_grpc_pb2_grpc
    port = server.props["grpc_inference_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = oip_grpc.GRPCInferenceServiceStub(channel)
        md = (("authorization", f"Bearer {keys['inference']}"),)
        assert stub.ServerLive(oip.ServerLiveRequest(), metadata=md, timeout=10).live
        assert stub.ModelReady(oip.ModelReadyRequest(name=MODEL_NAME), metadata=md, timeout=10).ready
        tensor = oip.ModelInferRequest.InferInputTensor(
            name="features",
            datatype="FP32",
            shape=[len(ROWS), 32],
            contents=oip.InferTensorContents(fp32_contents=[v for r in ROWS for v in r]),
        )
        answer = stub.ModelInfer(
            oip.ModelInferRequest(model_name=MODEL_NAME, id="g-1", inputs=[tensor]), metadata=md, timeout=10
        )
        assert answer.id == "g-1" and answer.model_version == "1.0"
        outputs = {o.name: o for o in answer.outputs}
        assert list(outputs["class"].contents.int64_contents) == [p["prediction"] for p in plain]
        assert list(outputs["probabilities"].shape) == [len(ROWS), 3]
        np.testing.assert_allclose(
            list(outputs["probabilities"].contents.fp32_contents),
            [v for p in plain for v in p["probabilities"]],
            atol=1e-6,
        )


def test_grpc_open_inference_protocol_bad_request_is_answered_alone(server, keys, stubs, plain):
    """A bad ``ModelInfer`` gets its error as an ``error`` BYTES output (TorchServe's gRPC
    frontend drops per-request statuses, and an ``{"error"}`` body would fail the whole batch),
    and the worker keeps serving: its next prediction is answered normally."""
    oip, oip_grpc = stubs.open_inference_grpc_pb2, stubs.open_inference_grpc_pb2_grpc
    port = server.props["grpc_inference_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = oip_grpc.GRPCInferenceServiceStub(channel)
        md = (("authorization", f"Bearer {keys['inference']}"),)
        tensor = oip.ModelInferRequest.InferInputTensor(
            name="features", datatype="FP32", shape=[1, 31], contents=oip.InferTensorContents(fp32_contents=[0.0] * 31)
        )
        answer = stub.ModelInfer(
            oip.ModelInferRequest(model_name=MODEL_NAME, id="g-2", inputs=[tensor]), metadata=md, timeout=10
        )
    assert answer.id == "g-2"
    assert [o.name for o in answer.outputs] == ["error"]
    message = json.loads(answer.outputs[0].contents.bytes_contents[0])
    assert message == ("inputs[0].shape must be [N, 32] with N in [1, 64] (handler.max_instances), got [1, 31]")
    assert server.worker_deaths() == 0
    assert_same([server.client().predict(MODEL_NAME, {"features": ROWS[0]})], plain[:1])


def test_grpc_example_script_runs(server, plain, tmp_path):
    """examples/grpc_client.py, as the README shows it, against this server."""
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "grpc_client.py"),
            "--port",
            server.props["grpc_inference_port"],
            "--key-file",
            str(server.key_file),
            "--stubs",
            str(tmp_path / "stubs"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    plain_answer, v1_answer = (json.loads(line) for line in out)
    expected = server.client().predict(MODEL_NAME, json.loads((REPO / "examples" / "request.json").read_text()))
    assert_same([plain_answer], [expected])
    assert_same(v1_answer["predictions"], [expected])


def test_oip_example_script_runs(server):
    """examples/oip_client.py, as docs/interoperability.md shows it, against this server."""
    import subprocess
    import sys

    from tests.conftest import REPO

    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "oip_client.py"),
            "--url",
            server.props["inference_address"].removeprefix("http://"),
            "--key-file",
            str(server.key_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()
    lines = dict(line.split(": ", 1) for line in out)
    assert lines["model ready"] == "True"
    assert json.loads(lines["metadata"])["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, 32]}]
    assert json.loads(lines["answer"])["outputs"][0]["parameters"] == {"binary_data_size": 8}
    expected = server.client().predict(MODEL_NAME, json.loads((REPO / "examples" / "request.json").read_text()))
    assert json.loads(lines["class"]) == [expected["prediction"]]
    np.testing.assert_allclose(json.loads(lines["probabilities"]), [expected["probabilities"]], rtol=0, atol=1e-6)


# -- records ---------------------------------------------------------------------------------
def test_every_route_keeps_a_record_of_each_request(server, keys, stubs, triton_client):
    """One request on each route, each with features of its own: each has exactly one record,
    naming its route, its status and what it sent; a REST request's record is found by the
    ``x-request-id`` its client got, and holds the answer the client got."""
    base, auth = server.props["inference_address"], bearer(keys["inference"])
    sent: dict[str, tuple[float, object]] = {}

    def post(route: str, path: str, body: dict, value: float) -> None:
        resp = requests.post(f"{base}{path}", json=body, headers=auth, timeout=10)
        sent[route] = (value, resp)

    post("predictions", f"/predictions/{MODEL_NAME}", {"features": features(value=7.25)}, 7.25)
    post("explanations", f"/explanations/{MODEL_NAME}", {"features": features(value=7.5)}, 7.5)
    post("kserve-v1", f"/v1/models/{MODEL_NAME}:predict", {"instances": [features(value=7.75)] * 2}, 7.75)
    post(
        "oip-v2",
        f"/v2/models/{MODEL_NAME}/infer",
        {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": features(value=8.0)}]},
        8.0,
    )
    post("rejected", f"/predictions/{MODEL_NAME}", {"features": [8.25] * 3}, 8.25)
    port = server.props["grpc_inference_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        md = (("authorization", f"Bearer {keys['inference']}"),)
        stubs.inference_pb2_grpc.InferenceAPIsServiceStub(channel).Predictions(
            stubs.inference_pb2.PredictionsRequest(
                model_name=MODEL_NAME, input={"data": json.dumps({"features": features(value=8.5)}).encode()}
            ),
            metadata=md,
            timeout=10,
        )
        oip = stubs.open_inference_grpc_pb2
        stubs.open_inference_grpc_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(
            oip.ModelInferRequest(
                model_name=MODEL_NAME,
                id="rec-1",
                inputs=[
                    oip.ModelInferRequest.InferInputTensor(
                        name="features",
                        datatype="FP32",
                        shape=[1, 32],
                        contents=oip.InferTensorContents(fp32_contents=features(value=8.75)),
                    )
                ],
            ),
            metadata=md,
            timeout=10,
        )
    grpc_values = {"grpc": 8.5, "oip-v2-grpc": 8.75}

    def first_value(record: dict) -> float | None:
        given = record.get("inputs")
        if isinstance(given, dict):  # a rejected request keeps what it sent
            given = given.get("features")
        while isinstance(given, list) and given and isinstance(given[0], list):
            given = given[0]
        return given[0] if isinstance(given, list) and given else None

    by_value: dict[float, list[dict]] = {}
    for record in records(server.files.records):
        by_value.setdefault(first_value(record), []).append(record)
    for route, (value, resp) in sent.items():
        [record] = by_value[value]
        assert record["request_id"] == resp.headers["x-request-id"]
        assert record["status"] == resp.status_code and record["answer"] == resp.json()
        assert record["route"] == ("predictions" if route == "rejected" else route), record
    assert sent["rejected"][1].status_code == 400 and by_value[8.25][0]["reason"] == "wrong_length"
    assert by_value[7.75][0]["inputs"] == [features(value=7.75)] * 2
    assert by_value[7.5][0]["event"] == "explanation"
    for route, value in grpc_values.items():
        [record] = by_value[value]
        assert record["route"] == route and record["status"] == 200 and len(record["request_id"]) == 36
