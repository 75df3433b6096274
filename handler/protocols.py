"""KServe v1 and Open Inference Protocol (KServe v2) bodies: pure functions, no TorchServe import.

TorchServe's frontend sends ``/v1/models/{m}:predict`` and ``/v2/models/{m}/infer`` (and gRPC
calls) to the same handler as ``/predictions/{m}``, with nothing that names the protocol. The
handler therefore reads it from each request's body, so one batch can mix protocols:

- ``{"instances": [[n numbers], ...]}``: KServe v1, answered ``{"predictions": [...]}``, one
  prediction per instance;
- ``{"inputs": [{"name": "features", "datatype": "FP32", "shape": [N, n], "data": [...]}]}``:
  Open Inference Protocol, answered with ``class`` (INT64, ``[N]``) and ``probabilities``
  (FP32, ``[N, classes]``) output tensors;
- anything else: rtserve's own ``{"features": [...]}`` (see :mod:`handler.schema`).

On ``/predictions`` and ``/explanations`` only rtserve's own body is accepted (the handler does
not call :func:`parse_request` there). Errors are :class:`InvalidInput` without a ``field``, so
their body is the protocols' ``{"error": "..."}``; the message names the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from handler.errors import InvalidInput
from handler.schema import check_numbers, json_type, prediction_document, short

KSERVE_V1 = "v1"
OIP_V2 = "v2"
#: The Open Inference Protocol tensor names and datatypes of this model.
INPUT_NAME = "features"
INPUT_DATATYPE = "FP32"
CLASS_OUTPUT = "class"
PROBABILITIES_OUTPUT = "probabilities"
OUTPUT_NAMES = (CLASS_OUTPUT, PROBABILITIES_OUTPUT)
#: The output tensor of an error answer to a gRPC ``ModelInfer`` (see :func:`grpc_error`).
ERROR_OUTPUT = "error"


@dataclass
class ProtocolRequest:
    """One KServe v1 or v2 request: its instances, and what its answer must echo.

    Attributes:
        protocol: :data:`KSERVE_V1` or :data:`OIP_V2`.
        vectors: one feature vector per instance.
        id: the v2 request's ``id`` (echoed in the answer), None when absent.
        outputs: the v2 output tensors to return, in the order the request asked for them.
    """

    protocol: str
    vectors: list[list[float]]
    id: str | None = None
    outputs: tuple[str, ...] = OUTPUT_NAMES


def detect(body: Any) -> str | None:
    """The protocol of a decoded body: :data:`KSERVE_V1`, :data:`OIP_V2`, or None (rtserve's own
    ``{"features": ...}``, also for bodies that are none of these: the plain parser names what
    is missing)."""
    if not isinstance(body, dict) or "features" in body:
        return None
    if "instances" in body:
        return KSERVE_V1
    if "inputs" in body:
        return OIP_V2
    return None


def parse_request(
    body: Any, n_features: int, limit: float, max_instances: int,
) -> ProtocolRequest | None:
    """Parse a KServe v1 or v2 body; None when the body is rtserve's own form.

    Raises:
        InvalidInput: the body is a v1 or v2 request but not a valid one for this model (more
            than ``max_instances`` instances, a wrong shape, datatype or name, a value that is
            not a finite number within ``[-limit, limit]``).
    """
    protocol = detect(body)
    if protocol == KSERVE_V1:
        return ProtocolRequest(KSERVE_V1, parse_v1(body, n_features, limit, max_instances))
    if protocol == OIP_V2:
        return parse_v2(body, n_features, limit, max_instances)
    return None


def parse_v1(body: dict, n_features: int, limit: float, max_instances: int) -> list[list[float]]:
    """The instances of a KServe v1 ``{"instances": [[n numbers], ...]}`` body.

    Raises:
        InvalidInput: naming the field.
    """
    instances = body["instances"]
    if not isinstance(instances, list) or not 1 <= len(instances) <= max_instances:
        got = f"{len(instances)} instances" if isinstance(instances, list) else json_type(instances)
        raise InvalidInput(
            f"'instances' must be a list of 1 to {max_instances} instances "
            f"(handler.max_instances), each a list of {n_features} numbers, got {got}",
            reason="not_a_list")
    for i, instance in enumerate(instances):
        if not isinstance(instance, list) or len(instance) != n_features:
            got = f"{len(instance)} numbers" if isinstance(instance, list) else json_type(instance)
            raise InvalidInput(f"instances[{i}] must be a list of {n_features} numbers, got {got}",
                               reason="not_a_list")
        check_numbers(instance, limit, f"instances[{i}]", with_field=False)
    return instances


def parse_v2(body: dict, n_features: int, limit: float, max_instances: int) -> ProtocolRequest:
    """An Open Inference Protocol inference request holding one ``features`` FP32 tensor of shape
    ``[N, n_features]``; ``data`` flat (row-major, as the protocol sends it) or nested by rows.

    Raises:
        InvalidInput: naming the field.
    """
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"'id' must be a string, got {json_type(request_id)}")
    inputs = body["inputs"]
    if not isinstance(inputs, list) or len(inputs) != 1:
        got = f"{len(inputs)} tensors" if isinstance(inputs, list) else json_type(inputs)
        raise InvalidInput(
            f"'inputs' must be a list of one tensor named '{INPUT_NAME}', got {got}",
            reason="not_a_list")
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise InvalidInput(f"inputs[0] must be a tensor object, got {json_type(tensor)}")
    name = tensor.get("name")
    if name != INPUT_NAME:
        raise InvalidInput(f"inputs[0].name must be '{INPUT_NAME}', got {_show(name)}")
    datatype = tensor.get("datatype")
    if datatype != INPUT_DATATYPE:
        raise InvalidInput(f"inputs[0].datatype must be '{INPUT_DATATYPE}', got {_show(datatype)}")
    parameters = tensor.get("parameters")
    if isinstance(parameters, dict) and "binary_data_size" in parameters:
        raise InvalidInput("inputs[0]: the binary tensor data extension is not supported: "
                           "send the tensor as JSON 'data'")
    shape = tensor.get("shape")
    if (not isinstance(shape, list) or len(shape) != 2
            or any(type(d) is not int for d in shape)
            or not 1 <= shape[0] <= max_instances or shape[1] != n_features):
        raise InvalidInput(
            f"inputs[0].shape must be [N, {n_features}] with N in [1, {max_instances}] "
            f"(handler.max_instances), got {short(shape)}")
    data = tensor.get("data")
    rows = _rows(data, shape[0], n_features)
    if rows is data:  # nested: name the row
        for i, row in enumerate(rows):
            check_numbers(row, limit, f"inputs[0].data[{i}]", with_field=False)
    else:
        check_numbers(data, limit, "inputs[0].data", with_field=False)
    return ProtocolRequest(OIP_V2, rows, request_id, _requested_outputs(body.get("outputs")))


def _rows(data: Any, n_rows: int, n_features: int) -> list[list[Any]]:
    """Split ``data`` (flat row-major, or a list of rows) into ``n_rows`` rows.

    Raises:
        InvalidInput: the data does not hold ``n_rows * n_features`` elements in either layout.
    """
    if not isinstance(data, list):
        raise InvalidInput(f"inputs[0].data must be a list of numbers, got {json_type(data)}",
                           reason="not_a_list")
    if len(data) == n_rows and all(isinstance(row, list) for row in data):
        if all(len(row) == n_features for row in data):
            return data
    elif len(data) == n_rows * n_features and not any(isinstance(v, list) for v in data):
        return [data[i * n_features:(i + 1) * n_features] for i in range(n_rows)]
    raise InvalidInput(
        f"inputs[0].data must hold {n_rows * n_features} numbers for shape "
        f"[{n_rows}, {n_features}], flat or as {n_rows} rows of {n_features}")


def _requested_outputs(outputs: Any) -> tuple[str, ...]:
    """The output names a v2 request asks for (all of them when it names none).

    Raises:
        InvalidInput: ``outputs`` is not a list of ``{"name": ...}`` objects naming known outputs.
    """
    if outputs is None:
        return OUTPUT_NAMES
    if not isinstance(outputs, list) or not outputs:
        raise InvalidInput(f"'outputs' must be a non-empty list of {{\"name\": ...}} objects, "
                           f"got {json_type(outputs)}")
    names = []
    for i, out in enumerate(outputs):
        name = out.get("name") if isinstance(out, dict) else None
        if name not in OUTPUT_NAMES:
            raise InvalidInput(f"outputs[{i}].name must be one of "
                               f"{', '.join(repr(n) for n in OUTPUT_NAMES)}, got {_show(name)}")
        names.append(name)
    return tuple(names)


def answer(
    request: ProtocolRequest, classes: Sequence[int], probabilities: Sequence[Sequence[float]],
    labels: Sequence[str], model_name: str, model_version: str,
) -> dict:
    """The protocol's answer for one request, given each instance's class and probabilities."""
    if request.protocol == KSERVE_V1:
        return {"predictions": [prediction_document(c, p, labels, model_version)
                                for c, p in zip(classes, probabilities)]}
    n = len(classes)
    tensors = {
        CLASS_OUTPUT: {"name": CLASS_OUTPUT, "datatype": "INT64", "shape": [n],
                       "data": list(classes)},
        PROBABILITIES_OUTPUT: {"name": PROBABILITIES_OUTPUT, "datatype": "FP32",
                               "shape": [n, len(labels)],
                               "data": [v for row in probabilities for v in row]},
    }
    out: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        out["id"] = request.id
    out["outputs"] = [tensors[name] for name in request.outputs]
    return out


def grpc_error(message: str, request_id: str, model_name: str, model_version: str) -> dict:
    """An Open Inference Protocol error as TorchServe's gRPC ``ModelInfer`` can carry it.

    TorchServe 0.12's frontend ignores a per-request status on gRPC and reads every gRPC
    ``ModelInfer`` answer as an inference response (``id``, ``model_name``, ``model_version``,
    ``outputs``); ``{"error": ...}`` makes it fail and the worker's whole batch with it. So the
    error travels as the answer's only output: a BYTES tensor named ``error``.
    """
    return {"model_name": model_name, "model_version": model_version, "id": request_id,
            "outputs": [{"name": ERROR_OUTPUT, "datatype": "BYTES", "shape": [1],
                         "data": [message]}]}


def _show(value: Any) -> str:
    """A value for an error message: quoted strings, else its JSON type."""
    return short(value) if isinstance(value, str) else json_type(value)
