"""KServe v1 and Open Inference Protocol (KServe v2) bodies: pure functions, no TorchServe import.

TorchServe hands every protocol's route to the one handler without naming it, so the body says: ``instances``
is KServe v1, ``inputs`` OIP (JSON or binary tensor data), anything else rtserve's own (:mod:`handler.schema`).
Errors are :class:`InvalidInput` without a ``field``; the message names it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from handler.errors import InvalidInput
from handler.inputs import BOOL, FLOAT32, INT64, OIP_DATATYPES, NamedInputs, check_values
from handler.schema import check_numbers, json_type, prediction_document, short
from handler.signature import (
    CLASS_DATATYPE,
    CLASS_OUTPUT,
    INPUT_DATATYPE,
    INPUT_NAME,
    OUTPUT_NAMES,
    PROBABILITIES_DATATYPE,
    PROBABILITIES_OUTPUT,
)

KSERVE_V1 = "v1"
OIP_V2 = "v2"
#: The output tensor of an error answer to a gRPC ``ModelInfer`` (see :func:`grpc_error`).
ERROR_OUTPUT = "error"
#: The binary tensor data extension's HTTP header: the length in bytes of the JSON header at the
#: start of the body (request and response); the raw tensor bytes follow it.
BINARY_HEADER = "Inference-Header-Content-Length"
#: The content type of an answer that carries binary tensor data.
BINARY_CONTENT_TYPE = "application/octet-stream"
#: Raw tensor bytes per datatype, as the extension sends them: little-endian, row-major.
BINARY_DTYPES = {"FP32": np.dtype("<f4"), "INT64": np.dtype("<i8")}
_DECIMAL = re.compile(r"[0-9]{1,12}")


@dataclass
class ProtocolRequest:
    """One KServe v1 or v2 request: its instances, and what its answer must echo.

    Attributes:
        protocol: :data:`KSERVE_V1` or :data:`OIP_V2`.
        vectors: one feature vector per instance.
        id: the v2 request's ``id`` (echoed in the answer), None when absent.
        outputs: the v2 output tensors to return, in the order the request asked for them.
        binary: those of ``outputs`` to answer as binary tensor data (:func:`encode_binary`).
    """

    protocol: str
    vectors: list[list[float]]
    id: str | None = None
    outputs: tuple[str, ...] = OUTPUT_NAMES
    binary: frozenset[str] = frozenset()


def detect(body: Any) -> str | None:
    """The protocol of a decoded body: :data:`KSERVE_V1`, :data:`OIP_V2`, or None.

    None means rtserve's own ``{"features": ...}``, also for bodies that are none of these: the
    plain parser names what is missing.
    """
    if not isinstance(body, dict) or "features" in body:
        return None
    if "instances" in body:
        return KSERVE_V1
    if "inputs" in body:
        return OIP_V2
    return None


@dataclass(frozen=True)
class BinaryBody:
    """A request body sent with the binary tensor data extension, as the handler finds it.

    The raw body and its ``Inference-Header-Content-Length`` header; :func:`parse_request` splits it.

    Attributes:
        raw: the body as TorchServe hands it over: bytes, or text for a ``text/*`` content type.
        header_length: the request's ``Inference-Header-Content-Length`` value, unchecked.
    """

    raw: Any
    header_length: str


def parse_request(
    body: Any,
    n_features: int,
    limit: float,
    max_instances: int,
    output_names: tuple[str, ...] = OUTPUT_NAMES,
) -> ProtocolRequest | None:
    """Parse a KServe v1 or v2 body, or a :class:`BinaryBody`; None for rtserve's own form.

    ``output_names`` are the model's OIP outputs (a classifier's ``class`` and ``probabilities``,
    else its one output's name): what a v2 request may ask for.

    Raises:
        InvalidInput: the body is a v1 or v2 request but not a valid one for this model (more
            than ``max_instances`` instances, a wrong shape, datatype or name, a value that is
            not a finite number within ``[-limit, limit]``), or a binary body that is not a
            valid v2 request (:func:`split_binary`).
    """
    body, binary = unwrap_binary(body)
    protocol = detect(body)
    if protocol == KSERVE_V1:
        return ProtocolRequest(KSERVE_V1, parse_v1(body, n_features, limit, max_instances))
    if protocol == OIP_V2:
        return parse_v2(body, n_features, limit, max_instances, binary, output_names)
    return None


def unwrap_binary(body: Any) -> tuple[Any, bytes | None]:
    """A :class:`BinaryBody` as its JSON header and the bytes after it; any other body as it is, None.

    Raises:
        InvalidInput: the header is not JSON or not an OIP v2 request (:func:`split_binary`).
    """
    if not isinstance(body, BinaryBody):
        return body, None
    header, binary = split_binary(body.raw, body.header_length)
    if detect(header) != OIP_V2:
        raise InvalidInput(
            f"{BINARY_HEADER} (binary tensor data) is for Open Inference "
            "Protocol requests only: the JSON header has no 'inputs'"
        )
    return header, binary


def parse_named_request(
    body: Any,
    named: NamedInputs,
    limit: float,
    max_instances: int,
    output_names: tuple[str, ...] = OUTPUT_NAMES,
) -> ProtocolRequest | None:
    """:func:`parse_request` for a model with named inputs: each instance's row, inputs flattened in order.

    KServe v1 instances are ``{name: value}`` objects (or flat rows); an OIP v2 request holds one
    tensor per input, by name, shaped ``[N, *shape]``, of the input's datatype, as JSON ``data``
    (flat or nested) or binary tensor data (one ``binary_data_size`` per tensor, in order).

    Raises:
        InvalidInput: naming the field, as :func:`parse_request`.
    """
    body, binary = unwrap_binary(body)
    protocol = detect(body)
    if protocol == KSERVE_V1:
        instances = _instances(body, max_instances, f"an object with the inputs {', '.join(named.names)}")
        rows = []
        for i, instance in enumerate(instances):
            try:
                rows.append(named.row({"features": instance} if isinstance(instance, list) else instance, limit))
            except InvalidInput as exc:
                raise InvalidInput(f"instances[{i}]: {exc.message}", reason=exc.reason) from exc
        return ProtocolRequest(KSERVE_V1, rows)
    if protocol != OIP_V2:
        return None
    request_id = body.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"'id' must be a string, got {json_type(request_id)}")
    tensors = body["inputs"]
    wanted = ", ".join(repr(n) for n in named.names)
    if not isinstance(tensors, list) or len(tensors) != len(named.specs):
        got = f"{len(tensors)} tensors" if isinstance(tensors, list) else json_type(tensors)
        raise InvalidInput(f"'inputs' must be a list of one tensor per input ({wanted}), got {got}")
    by_name = {t.get("name"): (i, t) for i, t in enumerate(tensors) if isinstance(t, dict)}
    n_rows, offset, columns = None, 0, []
    for spec in named.specs:
        if spec.name not in by_name:
            raise InvalidInput(f"'inputs' must hold a tensor named {spec.name!r} (the model takes {wanted})")
        i, tensor = by_name[spec.name]
        where = f"inputs[{i}]"
        datatype = OIP_DATATYPES[spec.dtype]
        if tensor.get("datatype") != datatype:
            raise InvalidInput(
                f"{where}.datatype must be {datatype!r} (input {spec.name!r}), got {_show(tensor.get('datatype'))}"
            )
        shape = tensor.get("shape")
        n = shape[0] if isinstance(shape, list) and shape and type(shape[0]) is int else None
        length = shape[1] if spec.sequence and isinstance(shape, list) and len(shape) > 1 else None
        row_shape = [length, *spec.shape[1:]] if spec.sequence else list(spec.shape)
        fits = type(length) is int and 1 <= length <= spec.max_length if spec.sequence else True
        if not fits or shape != [n, *row_shape] or not 1 <= n <= max_instances or n_rows not in (None, n):
            dims = ", ".join(["L", *map(str, spec.shape[1:])] if spec.sequence else map(str, spec.shape))
            lengths = f", L in [1, {spec.max_length}] (rows padded with {spec.padding})" if spec.sequence else ""
            raise InvalidInput(
                f"{where}.shape must be [N, {dims}] with N in [1, {max_instances}] (handler.max_instances), "
                f"the same N for every input{lengths}, got {short(shape)}"
            )
        n_rows = n
        row_width = spec.width if not spec.sequence else length * spec.inner
        parameters = tensor.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidInput(f"{where}.parameters must be an object, got {json_type(parameters)}")
        count = n * row_width
        if "binary_data_size" in parameters:
            size, dtype = parameters["binary_data_size"], _NAMED_BINARY[spec.dtype]
            if binary is None or "data" in tensor or type(size) is not int or size != count * dtype.itemsize:
                raise InvalidInput(
                    f"{where}.parameters.binary_data_size must be {count * dtype.itemsize} ({count} {datatype} "
                    f"values) with the bytes after the JSON header ({BINARY_HEADER}) and no 'data'"
                )
            if offset + size > len(binary):
                raise InvalidInput(f"{where}: the binary tensor data ends before this tensor's {size} bytes")
            values = np.frombuffer(binary, dtype=dtype, count=count, offset=offset).tolist()
            offset += size
        else:
            values = _flat_data(tensor.get("data"), count, f"{where}.data")
        check_values(values, spec, f"{where}.data", limit)
        pad = [spec.padding] * (spec.width - row_width)  # a sequence's rows to max_length
        columns.append([values[r * row_width : (r + 1) * row_width] + pad for r in range(n)])
    if binary is not None and offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes after the JSON header belong to no tensor")
    rows = [[v for column in columns for v in column[r]] for r in range(n_rows)]
    outputs, binary_outputs = _requested_outputs(
        body.get("outputs"), _binary_data_output(body.get("parameters")), output_names
    )
    return ProtocolRequest(OIP_V2, rows, request_id, outputs, binary_outputs)


#: Raw tensor bytes per named input's dtype (little-endian; BOOL one byte each).
_NAMED_BINARY = {FLOAT32: np.dtype("<f4"), INT64: np.dtype("<i8"), BOOL: np.dtype("?")}


def _flat_data(data: Any, count: int, where: str) -> list:
    """A tensor's JSON ``data``, flat or nested, as a flat row-major list of ``count`` values."""
    flat = data if isinstance(data, list) else None
    while flat and any(isinstance(v, list) for v in flat):
        if not all(isinstance(v, list) for v in flat):
            flat = None
            break
        flat = [v for item in flat for v in item]
    if flat is None or len(flat) != count:
        raise InvalidInput(f"{where} must hold {count} values for its shape, flat or nested by its shape")
    return flat


def split_binary(raw: Any, header_length: str) -> tuple[dict, bytes]:
    """A binary tensor data body split into its JSON header (decoded) and the raw bytes after it.

    Args:
        raw: the request body as TorchServe hands it over: bytes, or text when the client sent
            a ``text/*`` content type (encoded back to the same bytes).
        header_length: the request's ``Inference-Header-Content-Length`` value.

    Raises:
        InvalidInput: naming the header: not a decimal length within the body, or a JSON header
            that is not a UTF-8 JSON object.
    """
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    if not isinstance(raw, (bytes, bytearray)):
        raise InvalidInput(
            f"{BINARY_HEADER} is set but the body is not raw bytes: send the JSON header followed by the tensor bytes"
        )
    value = header_length.strip()
    if not _DECIMAL.fullmatch(value) or not 0 < int(value) <= len(raw):
        raise InvalidInput(
            f"{BINARY_HEADER} must be the length in bytes of the JSON header at "
            f"the start of the body, an integer in [1, {len(raw)}], "
            f"got {short(header_length)}"
        )
    length = int(value)
    try:
        header = json.loads(bytes(raw[:length]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidInput(
            f"the first {length} bytes of the body ({BINARY_HEADER}) are not a valid UTF-8 JSON inference header"
        ) from exc
    if not isinstance(header, dict):
        raise InvalidInput(
            f"the first {length} bytes of the body ({BINARY_HEADER}) must be a JSON object, got {json_type(header)}"
        )
    return header, bytes(raw[length:])


def _instances(body: dict, max_instances: int, each: str) -> list:
    """A KServe v1 body's ``instances``: a list of 1 to ``max_instances`` (``each`` says what one is).

    Raises:
        InvalidInput: not a list, or too few or too many.
    """
    instances = body["instances"]
    if not isinstance(instances, list) or not 1 <= len(instances) <= max_instances:
        got = f"{len(instances)} instances" if isinstance(instances, list) else json_type(instances)
        raise InvalidInput(
            f"'instances' must be a list of 1 to {max_instances} instances (handler.max_instances), each {each}, "
            f"got {got}",
            reason="not_a_list",
        )
    return instances


def parse_v1(body: dict, n_features: int, limit: float, max_instances: int) -> list[list[float]]:
    """The instances of a KServe v1 ``{"instances": [[n numbers], ...]}`` body.

    Raises:
        InvalidInput: naming the field.
    """
    instances = _instances(body, max_instances, f"a list of {n_features} numbers")
    for i, instance in enumerate(instances):
        if not isinstance(instance, list) or len(instance) != n_features:
            got = f"{len(instance)} numbers" if isinstance(instance, list) else json_type(instance)
            raise InvalidInput(f"instances[{i}] must be a list of {n_features} numbers, got {got}", reason="not_a_list")
        check_numbers(instance, limit, f"instances[{i}]", with_field=False)
    return instances


def parse_v2(
    body: dict,
    n_features: int,
    limit: float,
    max_instances: int,
    binary: bytes | None = None,
    output_names: tuple[str, ...] = OUTPUT_NAMES,
) -> ProtocolRequest:
    """An Open Inference Protocol request holding one ``features`` FP32 tensor ``[N, n_features]``.

    ``data`` is flat (row-major, as the protocol sends it) or nested by rows, or, with
    ``parameters.binary_data_size``, the ``binary`` bytes after the JSON header.

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
            f"'inputs' must be a list of one tensor named '{INPUT_NAME}', got {got}", reason="not_a_list"
        )
    tensor = inputs[0]
    if not isinstance(tensor, dict):
        raise InvalidInput(f"inputs[0] must be a tensor object, got {json_type(tensor)}")
    name = tensor.get("name")
    if name != INPUT_NAME:
        raise InvalidInput(f"inputs[0].name must be '{INPUT_NAME}', got {_show(name)}")
    datatype = tensor.get("datatype")
    if datatype != INPUT_DATATYPE:
        raise InvalidInput(f"inputs[0].datatype must be '{INPUT_DATATYPE}', got {_show(datatype)}")
    parameters = tensor.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput(f"inputs[0].parameters must be an object, got {json_type(parameters)}")
    shape = tensor.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or any(type(d) is not int for d in shape)
        or not 1 <= shape[0] <= max_instances
        or shape[1] != n_features
    ):
        raise InvalidInput(
            f"inputs[0].shape must be [N, {n_features}] with N in [1, {max_instances}] "
            f"(handler.max_instances), got {short(shape)}"
        )
    if "binary_data_size" in parameters:
        rows = _binary_rows(tensor, parameters["binary_data_size"], binary, shape, limit)
    else:
        if binary:
            raise InvalidInput(
                f"{len(binary)} bytes follow the JSON header ({BINARY_HEADER}) "
                "but inputs[0] has no parameters.binary_data_size"
            )
        data = tensor.get("data")
        rows = _rows(data, shape[0], n_features)
        if rows is data:  # nested: name the row
            for i, row in enumerate(rows):
                check_numbers(row, limit, f"inputs[0].data[{i}]", with_field=False)
        else:
            check_numbers(data, limit, "inputs[0].data", with_field=False)
    outputs, binary_outputs = _requested_outputs(
        body.get("outputs"), _binary_data_output(body.get("parameters")), output_names
    )
    return ProtocolRequest(OIP_V2, rows, request_id, outputs, binary_outputs)


def _binary_rows(tensor: dict, size: Any, binary: bytes | None, shape: list[int], limit: float) -> list[list[float]]:
    """The rows of an FP32 input sent as binary tensor data (``size`` bytes of ``binary``).

    Raises:
        InvalidInput: no binary data came with the request, the size is not the tensor's
            (``shape`` of FP32, 4 bytes each) or not what follows the JSON header, the tensor
            also has ``data``, or a value is not a finite number within ``[-limit, limit]``.
    """
    if binary is None:
        raise InvalidInput(
            f"inputs[0].parameters.binary_data_size needs the binary tensor data "
            f"extension: send the JSON header's length in the {BINARY_HEADER} "
            "header, or send the tensor as JSON 'data' (Triton's clients: "
            "binary_data=False)"
        )
    dtype = BINARY_DTYPES[INPUT_DATATYPE]
    expected = shape[0] * shape[1] * dtype.itemsize
    if type(size) is not int or size != expected:
        raise InvalidInput(
            f"inputs[0].parameters.binary_data_size must be {expected} (shape "
            f"{shape} of {INPUT_DATATYPE}, {dtype.itemsize} bytes each), got "
            f"{short(size) if type(size) is int else json_type(size)}"
        )
    if "data" in tensor:
        raise InvalidInput("inputs[0] has both 'data' and parameters.binary_data_size: send one")
    if len(binary) != size:
        raise InvalidInput(
            f"inputs[0].parameters.binary_data_size is {size} but {len(binary)} "
            f"bytes follow the JSON header ({BINARY_HEADER})"
        )
    values = np.frombuffer(binary, dtype=dtype)
    if not (np.abs(values) <= limit).all():  # NaN compares False too
        check_numbers(values.tolist(), limit, "inputs[0] binary data", with_field=False)
    return values.reshape(shape).tolist()


def _binary_data_output(parameters: Any) -> bool:
    """The request's ``parameters.binary_data_output`` (all outputs binary), false when absent.

    Raises:
        InvalidInput: ``parameters`` is not an object, or the flag is not a boolean.
    """
    if parameters is None:
        return False
    if not isinstance(parameters, dict):
        raise InvalidInput(f"'parameters' must be an object, got {json_type(parameters)}")
    flag = parameters.get("binary_data_output", False)
    if type(flag) is not bool:
        raise InvalidInput(f"parameters.binary_data_output must be true or false, got {json_type(flag)}")
    return flag


def _rows(data: Any, n_rows: int, n_features: int) -> list[list[Any]]:
    """Split ``data`` (flat row-major, or a list of rows) into ``n_rows`` rows.

    Raises:
        InvalidInput: the data does not hold ``n_rows * n_features`` elements in either layout.
    """
    if not isinstance(data, list):
        raise InvalidInput(f"inputs[0].data must be a list of numbers, got {json_type(data)}", reason="not_a_list")
    if len(data) == n_rows and all(isinstance(row, list) for row in data):
        if all(len(row) == n_features for row in data):
            return data
    elif len(data) == n_rows * n_features and not any(isinstance(v, list) for v in data):
        return [data[i * n_features : (i + 1) * n_features] for i in range(n_rows)]
    raise InvalidInput(
        f"inputs[0].data must hold {n_rows * n_features} numbers for shape "
        f"[{n_rows}, {n_features}], flat or as {n_rows} rows of {n_features}"
    )


#: Output parameters of the protocol's extensions this model does not offer.
_UNSUPPORTED_OUTPUT_PARAMETERS = ("classification", "shared_memory_region")


def _requested_outputs(
    outputs: Any,
    binary_default: bool,
    known: tuple[str, ...] = OUTPUT_NAMES,
) -> tuple[tuple[str, ...], frozenset[str]]:
    """The output names a v2 request asks for, and those of them to answer as binary tensor data.

    All outputs when it names none; binary per output's ``parameters.binary_data``, else
    ``binary_default`` (the request's ``binary_data_output``).

    Raises:
        InvalidInput: ``outputs`` is not a list of ``{"name": ...}`` objects naming known outputs,
            or an output's parameters are not an object with a boolean ``binary_data``.
    """
    if outputs is None:
        return known, frozenset(known) if binary_default else frozenset()
    if not isinstance(outputs, list) or not outputs:
        raise InvalidInput(f"'outputs' must be a non-empty list of {{\"name\": ...}} objects, got {json_type(outputs)}")
    names, binary = [], set()
    for i, out in enumerate(outputs):
        name = out.get("name") if isinstance(out, dict) else None
        if name not in known:
            raise InvalidInput(
                f"outputs[{i}].name must be one of {', '.join(repr(n) for n in known)}, got {_show(name)}"
            )
        parameters = out.get("parameters", {})
        if not isinstance(parameters, dict):
            raise InvalidInput(f"outputs[{i}].parameters must be an object, got {json_type(parameters)}")
        for key in _UNSUPPORTED_OUTPUT_PARAMETERS:
            if key in parameters:
                raise InvalidInput(f"outputs[{i}].parameters.{key} is not supported here")
        flag = parameters.get("binary_data", binary_default)
        if type(flag) is not bool:
            raise InvalidInput(f"outputs[{i}].parameters.binary_data must be true or false, got {json_type(flag)}")
        names.append(name)
        if flag:
            binary.add(name)
    return tuple(names), frozenset(binary)


def answer(
    request: ProtocolRequest,
    classes: Sequence[int],
    probabilities: Sequence[Sequence[float]],
    labels: Sequence[str],
    model_name: str,
    model_version: str,
) -> dict:
    """The protocol's answer for one request, given each instance's class and probabilities."""
    if request.protocol == KSERVE_V1:
        return {
            "predictions": [prediction_document(c, p, labels, model_version) for c, p in zip(classes, probabilities)]
        }
    n = len(classes)
    tensors = {
        CLASS_OUTPUT: {"name": CLASS_OUTPUT, "datatype": CLASS_DATATYPE, "shape": [n], "data": list(classes)},
        PROBABILITIES_OUTPUT: {
            "name": PROBABILITIES_OUTPUT,
            "datatype": PROBABILITIES_DATATYPE,
            "shape": [n, len(labels)],
            "data": [v for row in probabilities for v in row],
        },
    }
    out: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        out["id"] = request.id
    out["outputs"] = [tensors[name] for name in request.outputs]
    return out


def output_document(output: dict, values: Sequence[float], model_version: str) -> dict:
    """The answer to one row for one output of ``output``'s kind.

    ``values`` is what :func:`handler.model.answer_columns` gives for the row's output columns:
    softmax probabilities (classification: the first highest is the ``prediction``), sigmoid
    probabilities (multi-label: ``labels`` are those at or over the threshold), the regression's
    values (a number for one, a list for several, in ``targets`` order) or the embedding.
    """
    kind = output["kind"]
    if kind == "classification":
        values = list(values)
        return prediction_document(values.index(max(values)), values, output["labels"], model_version)
    if kind == "multi_label":
        threshold = output["threshold"]
        labels = output["labels"]
        return {
            "labels": [label for label, p in zip(labels, values) if p >= threshold],
            "probabilities": dict(zip(labels, values)),
            "model_version": model_version,
        }
    if kind == "regression":
        return {"prediction": values[0] if len(values) == 1 else list(values), "model_version": model_version}
    return {"embedding": list(values), "model_version": model_version}


def outputs_document(outputs: Sequence[dict], values: Sequence[float], model_version: str) -> dict:
    """The answer to one row of a model that is not ``rtserve-model/1``'s classifier (``outputs``: its signature).

    One output: its :func:`output_document`. Several: ``{"outputs": {name: document}, "model_version"}``,
    each output's document (without ``model_version``) from its own columns of ``values``, in order.
    """
    if len(outputs) == 1:
        return output_document(outputs[0], values, model_version)
    documents, start = {}, 0
    for output in outputs:
        document = output_document(output, values[start : start + output["width"]], model_version)
        del document["model_version"]
        documents[output["name"]] = document
        start += output["width"]
    return {"outputs": documents, "model_version": model_version}


def output_answer(
    request: ProtocolRequest, output: dict, values: Sequence[Sequence[float]], model_name: str, model_version: str
) -> dict:
    """:func:`answer` for a model whose output is not a classification (``values``: one row per instance).

    KServe v1 answers each instance's :func:`output_document`; OIP v2 the output tensor by its
    name, FP32, shape ``[instances, width]``.
    """
    return outputs_answer(request, [output], values, model_name, model_version)


def outputs_answer(
    request: ProtocolRequest,
    outputs: Sequence[dict],
    values: Sequence[Sequence[float]],
    model_name: str,
    model_version: str,
) -> dict:
    """:func:`answer` for the signature ``outputs`` (one output that is not a classification, or several).

    KServe v1 answers each instance's :func:`outputs_document`. OIP v2 answers one FP32 tensor
    ``[instances, width]`` per output, by its name, holding what its documents carry (a
    classification's probabilities): with several outputs, those the request named, in its order.
    """
    if request.protocol == KSERVE_V1:
        return {"predictions": [outputs_document(outputs, row, model_version) for row in values]}
    out: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request.id is not None:
        out["id"] = request.id
    tensors, start = {}, 0
    for output in outputs:
        stop = start + output["width"]
        tensors[output["name"]] = {
            "name": output["name"],
            "datatype": "FP32",
            "shape": [len(values), output["width"]],
            "data": [v for row in values for v in row[start:stop]],
        }
        start = stop
    out["outputs"] = list(tensors.values()) if len(outputs) == 1 else [tensors[name] for name in request.outputs]
    return out


def encode_binary(document: dict, binary: Collection[str]) -> tuple[bytes, int]:
    """An Open Inference Protocol answer with the outputs named in ``binary`` as binary tensor data.

    Each such output's ``data`` becomes ``parameters.binary_data_size`` and its raw little-endian
    bytes follow the JSON header, in the order of ``outputs``.

    Returns:
        The body, and the length of its JSON header (the answer's ``Inference-Header-Content-Length``).
    """
    tail: list[bytes] = []
    outputs = []
    for tensor in document["outputs"]:
        if tensor["name"] in binary:
            raw = np.asarray(tensor["data"], dtype=BINARY_DTYPES[tensor["datatype"]]).tobytes()
            tensor = {k: v for k, v in tensor.items() if k != "data"}
            tensor["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        outputs.append(tensor)
    header = json.dumps({**document, "outputs": outputs}).encode()
    return header + b"".join(tail), len(header)


def grpc_error(message: str, request_id: str, model_name: str, model_version: str) -> dict:
    """An Open Inference Protocol error as TorchServe's gRPC ``ModelInfer`` can carry it.

    TorchServe 0.12's frontend ignores a per-request status on gRPC and reads every gRPC
    ``ModelInfer`` answer as an inference response (``id``, ``model_name``, ``model_version``,
    ``outputs``); ``{"error": ...}`` makes it fail and the worker's whole batch with it. So the
    error travels as the answer's only output: a BYTES tensor named ``error``.
    """
    return {
        "model_name": model_name,
        "model_version": model_version,
        "id": request_id,
        "outputs": [{"name": ERROR_OUTPUT, "datatype": "BYTES", "shape": [1], "data": [message]}],
    }


def _show(value: Any) -> str:
    """A value for an error message: quoted strings, else its JSON type."""
    return short(value) if isinstance(value, str) else json_type(value)
