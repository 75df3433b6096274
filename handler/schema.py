"""Request parsing and validation: pure functions, no TorchServe import.

A request body is ``{"features": [n numbers]}``; an explanation request may add ``"target"``: a
class index, or a label's or a regression target's index or name. Each request of a batch is parsed
on its own; a bad one becomes an :class:`InvalidInput` for that request alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from handler.inputs import NamedInputs

from handler.errors import HandlerError, InvalidInput

#: Default largest magnitude accepted for a feature. Far beyond any training value, small enough
#: that the network's activations stay finite in float32.
DEFAULT_FEATURE_LIMIT = 1.0e6


def request_body(row: Any) -> Any:
    """Return the payload of one TorchServe request row (``data`` or ``body``), decoded if JSON.

    TorchServe decodes ``application/json`` bodies itself; other content types (or bodies it
    failed to decode) arrive as bytes or text and are decoded here.

    Raises:
        InvalidInput: the body is empty, not UTF-8, or not valid JSON.
    """
    body = row.get("data") if isinstance(row, dict) else None
    if body is None and isinstance(row, dict):
        body = row.get("body")
    if body is None:
        raise InvalidInput(
            'request body is empty or not JSON: send a JSON object like {"features": [...]} '
            "with Content-Type: application/json",
            reason="empty_body",
        )
    if isinstance(body, (bytes, bytearray)):
        try:
            body = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput("request body is not valid UTF-8 JSON", reason="not_json") from exc
    if isinstance(body, str):
        if not body.strip():
            raise InvalidInput(
                'request body is empty: send a JSON object like {"features": [...]}', reason="empty_body"
            )
        try:
            body = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise InvalidInput("request body is not valid JSON", reason="not_json") from exc
    return body


def parse_features(body: Any, n_features: int, limit: float = DEFAULT_FEATURE_LIMIT) -> list[float]:
    """Validate a decoded body and return its feature vector.

    Raises:
        InvalidInput: naming the field: ``features`` missing, not a list, wrong length, or an
            element that is not a finite number within ``[-limit, limit]``.
    """
    if not isinstance(body, dict):
        raise InvalidInput(
            f"request body must be a JSON object with a 'features' field, got {json_type(body)}",
            field="features",
            reason="not_an_object",
        )
    if "features" not in body:
        raise InvalidInput("missing required field 'features'", field="features", reason="missing_field")
    features = body["features"]
    if not isinstance(features, list):
        raise InvalidInput(
            f"'features' must be a list of {n_features} numbers, got {json_type(features)}",
            field="features",
            reason="not_a_list",
        )
    if len(features) != n_features:
        raise InvalidInput(
            f"'features' must have exactly {n_features} numbers, got {len(features)}",
            field="features",
            reason="wrong_length",
            expected=n_features,
        )
    check_numbers(features, limit, "features")
    return features


def check_numbers(values: Sequence[Any], limit: float, name: str, with_field: bool = True) -> None:
    """Check that every element of ``values`` is a finite number within ``[-limit, limit]``.

    Args:
        values: the numbers to check.
        limit: the largest magnitude allowed.
        name: the field the values came from, used as ``name[i]`` in messages.
        with_field: set the error's ``field`` (the plain route's error form has one).

    Raises:
        InvalidInput: naming the first bad element.
    """
    for i, value in enumerate(values):
        kind = type(value)
        if (kind is float or kind is int) and -limit <= value <= limit:  # (the common case: no other work)
            continue
        where = f"{name}[{i}]"
        if kind is not float and kind is not int:  # bool is a subclass of int: excluded here
            raise InvalidInput(
                f"{where} must be a number, got {json_type(value)}",
                field=where if with_field else None,
                reason="not_a_number",
            )
        if not -limit <= value <= limit:  # also false for NaN
            what = "a finite number" if kind is float and not math.isfinite(value) else "in range"
            raise InvalidInput(
                f"{where} must be {what} within [-{limit:g}, {limit:g}], got {short(value)}",
                field=where if with_field else None,
                reason="non_finite" if what == "a finite number" else "out_of_range",
            )


def parse_target(body: dict, n_classes: int, names: Sequence[str] = (), noun: str = "class") -> int | None:
    """The optional ``target`` of an explanation request (None when absent), as an output column index.

    Args:
        body: the decoded request body.
        n_classes: how many columns ``target`` may index.
        names: the columns' names a ``target`` may give instead of its index (a classifier's
            class takes its index only).
        noun: what a column is, for the message (``class``, ``label``, ``target``).

    Raises:
        InvalidInput: ``target`` is present but neither an integer in ``[0, n_classes)`` nor one
            of ``names``.
    """
    if "target" not in body:
        return None
    target = body["target"]
    if type(target) is int and 0 <= target < n_classes:  # bool excluded
        return target
    if names and type(target) is str and target in names:
        return names.index(target)
    what = f"a {noun} index, an integer in [0, {n_classes - 1}]"
    if names:
        listed = ", ".join(map(repr, names))
        what += f", or a {noun} name ({listed if len(listed) <= 80 else listed[:77] + '...'})"
    shown = short(target) if type(target) is int or (names and type(target) is str) else json_type(target)
    raise InvalidInput(f"'target' must be {what}, got {shown}", field="target", reason="bad_target")


@dataclass
class ParsedBatch:
    """A batch after parsing: the valid rows as one tensor, and an error per invalid request.

    Attributes:
        rows: the request index of each row of ``inputs``; a KServe v1/v2 request with several
            instances owns several consecutive rows.
        targets: the valid explanation requests, request index -> requested target class
            (None: explain the predicted class).
        explanations: request index -> explanation document, filled in by inference.
        protocols: request index -> its parsed KServe v1/v2 request
            (:class:`handler.protocols.ProtocolRequest`); absent for ``{"features": ...}``.
    """

    size: int
    rows: list[int] = field(default_factory=list)
    inputs: torch.Tensor | None = None
    errors: dict[int, HandlerError] = field(default_factory=dict)
    targets: dict[int, int | None] = field(default_factory=dict)
    explanations: dict[int, dict] = field(default_factory=dict)
    protocols: dict[int, Any] = field(default_factory=dict)
    #: Open Inference Protocol requests that came over gRPC: request index -> their ``id``.
    oip_grpc: dict[int, str] = field(default_factory=dict)
    #: The predicted class of each row of ``inputs``, set when the answers are made.
    classes: list[int] | None = None
    #: What the answers carry for each row of ``inputs`` (``[rows, width]``) of a model that is not a
    #: classifier, set when the answers are made (the predictions' drift).
    outputs: torch.Tensor | None = None
    #: The route each request came through (its record's ``route``), set by the handler.
    routes: list[str] = field(default_factory=list)


#: Parses a decoded body of another protocol; returns None for a ``{"features": ...}`` body.
OtherProtocol = Callable[[Any], Any]


#: The Python types of JSON numbers as TorchServe's JSON decoding produces them.
_NUMBER_TYPES = frozenset((float, int))


def _plain_features(row: Any, n_features: int) -> list | None:
    """The common case, checked cheaply: a decoded ``{"features": [n ints or floats]}`` body.

    Returns the list, or None when anything is unusual (then :func:`parse_features` decides and
    words the error). The values' range is not checked here.
    """
    if type(row) is not dict:
        return None
    body = row.get("data")
    if body is None:
        body = row.get("body")
    if type(body) is not dict:
        return None
    features = body.get("features")
    if type(features) is not list or len(features) != n_features:
        return None
    if not set(map(type, features)) <= _NUMBER_TYPES:  # excludes bool, str, None, lists
        return None
    return features


def parse_batch(
    data: Sequence[Any],
    n_features: int,
    limit: float = DEFAULT_FEATURE_LIMIT,
    explain: Collection[int] = (),
    n_classes: int = 0,
    other: OtherProtocol | None = None,
    plain_only: Collection[int] = (),
    target_names: Sequence[str] = (),
    target_noun: str = "class",
    named: NamedInputs | None = None,
) -> ParsedBatch:
    """Parse every request of a batch; valid ones become rows of one float32 tensor.

    Requests whose index is in ``explain`` also get their optional ``target`` checked against
    ``n_classes`` and ``target_names`` (:func:`parse_target`). Bodies of requests not in
    ``plain_only`` are first offered to ``other`` (KServe v1/v2, see
    :func:`handler.protocols.parse_request`); its answer, an object with ``vectors``, is kept in
    ``protocols``. Explanations take only ``{"features": ...}``.

    The common case costs little per request: a ``{"features": [...]}`` body TorchServe already
    decoded is checked for shape and element types in C-level calls, and the range of all such
    values (NaN and infinity fail it) at once on a float64 array; anything unusual goes through
    :func:`parse_features`, which decides exactly as the fast checks do and names the field.

    A model with ``named`` inputs (:class:`handler.inputs.NamedInputs`) parses every body through
    them: named arrays, images, or the flat ``{"features": [...]}`` form.
    """
    batch = ParsedBatch(size=len(data))
    vectors: list[list] = []
    fast_rows: list[int] = []
    fast: list[list] = []
    for idx, row in enumerate(data):
        if named is None and idx not in explain:
            features = _plain_features(row, n_features)
            if features is not None:
                fast_rows.append(idx)
                fast.append(features)
                continue
        try:
            body = request_body(row) if named is None else named.body(row)
            parsed = other(body) if other is not None and idx not in plain_only else None
            if parsed is not None:
                if idx in explain:
                    raise InvalidInput('explanations take a {"features": [...]} body, not a KServe v1/v2 request')
                batch.protocols[idx] = parsed
                vectors += parsed.vectors
                batch.rows += [idx] * len(parsed.vectors)
                continue
            vector = parse_features(body, n_features, limit) if named is None else named.row(body, limit)
            if explain and idx in explain:
                batch.targets[idx] = parse_target(body, n_classes, target_names, target_noun)
            vectors.append(vector)
            batch.rows.append(idx)
        except InvalidInput as exc:
            batch.errors[idx] = exc
    if fast:
        values = _as_array(fast)
        if values is None or not (np.abs(values) <= limit).all():  # NaN compares False too
            fast_rows, fast = _check_each(fast_rows, fast, n_features, limit, batch.errors)
        vectors += fast
        batch.rows += fast_rows
    if vectors:
        import torch  # here, not above: the stream consumer parses events with this module, without torch

        batch.inputs = torch.from_numpy(np.array(vectors, dtype=np.float32))
    return batch


def prediction_document(cls: int, probabilities: Sequence[float], labels: Sequence[str], model_version: str) -> dict:
    """The answer to one ``{"features": [...]}`` request (also one KServe v1 prediction)."""
    return {
        "prediction": cls,
        "label": labels[cls],
        "probabilities": list(probabilities),
        "model_version": model_version,
    }


def _as_array(vectors: list[list]) -> np.ndarray | None:
    """``vectors`` as a float64 array, or None if an integer is beyond float64's range."""
    try:
        return np.array(vectors, dtype=np.float64)
    except OverflowError:
        return None


def _check_each(
    rows: list[int],
    vectors: list[list],
    n_features: int,
    limit: float,
    errors: dict[int, HandlerError],
) -> tuple[list[int], list[list]]:
    """The slow path: validate each vector, recording an error for each bad one."""
    kept_rows, kept = [], []
    for idx, features in zip(rows, vectors):
        try:
            kept.append(parse_features({"features": features}, n_features, limit))
            kept_rows.append(idx)
        except InvalidInput as exc:
            errors[idx] = exc
    return kept_rows, kept


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def short(value: Any) -> str:
    """A bounded rendering of a value for error messages."""
    text = repr(value)
    return text if len(text) <= 32 else text[:29] + "..."
