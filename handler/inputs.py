"""Named inputs (``rtserve-model/2``): a request's named tensors checked and flattened into one row.

The exported program of a model with named inputs takes one float32 row ``[N, width]`` per request, every
input flattened in signature order (:func:`rtserve.model.package.export` wraps the user's model so, and the
wrapper restores each input's shape and dtype). This module is the other half: it turns a body
``{name: nested array, ...}`` (an image input may also be ``{"b64": PNG or JPEG}``, or a one-input image
model's raw PNG or JPEG bytes) into that row, naming the input and the index at fault. No torch import.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from handler.errors import ConfigError, InvalidInput

FLOAT32, INT64, BOOL = "float32", "int64", "bool"
DTYPES = (FLOAT32, INT64, BOOL)
#: The Open Inference Protocol's name of each dtype.
OIP_DATATYPES = {FLOAT32: "FP32", INT64: "INT64", BOOL: "BOOL"}
#: Ids travel in the float32 row: every integer up to 2**24 is exact there.
MAX_VOCABULARY = 2**24
#: A sequence's length in its shape: it varies per request (``max_length`` bounds it).
DYNAMIC = -1
#: The fewest positions a batch of sequences is cut to (the exported program's shortest length).
MIN_BATCH_LENGTH = 2
#: Most instances in one KServe v1 or v2 request unless ``handler.max_instances`` says otherwise.
DEFAULT_MAX_INSTANCES = 64
#: The most bytes one number takes in a JSON body (``-1.2345678901234567e+300``, then ``, ``).
JSON_NUMBER_BYTES = 26
#: Room in a body beyond its numbers: names, brackets, an ``id``, a ``target``.
BODY_SLACK = 4096
#: The leading bytes of the image formats a request may carry.
PNG_MAGIC, JPEG_MAGIC = b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff"
#: The Pillow mode of an image of 1 or 3 channels.
_MODES = {1: "L", 3: "RGB"}
#: The Pillow modes a grayscale input accepts (converted to 8-bit "L").
_GRAY_MODES = frozenset(("1", "L", "LA", "I", "I;16", "P"))


@dataclass(frozen=True)
class InputSpec:
    """One named input: dtype, shape without the batch dimension, and its encoding.

    Attributes:
        name: the key of the request body.
        dtype: one of :data:`DTYPES`.
        shape: the sizes of one row's dimensions (the batch dimension excluded); a sequence's first
            is :data:`DYNAMIC`, its length, from 1 to ``max_length``.
        vocabulary: int64 only: ids are in ``[0, vocabulary)``; a list gives one vocabulary per
            column of the last dimension (several categorical features in one input).
        max_length: a sequence only: the longest it may be (its row is padded to this).
        padding: a sequence only: the value its row is padded with (per request, and per batch to the
            batch's longest, at least 2 positions).
        image: float32 ``[channels, height, width]`` of 1 or 3 channels only, ``{"scale", "offset"}``:
            a decoded PNG or JPEG pixel ``p`` in ``[0, 255]`` becomes ``p * scale + offset``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    vocabulary: int | tuple[int, ...] | None = None
    image: dict | None = None
    max_length: int | None = None
    padding: float | None = None

    @property
    def sequence(self) -> bool:
        """Whether the first dimension is a length that varies per request."""
        return self.shape[0] == DYNAMIC

    @property
    def inner(self) -> int:
        """How many numbers one position of a sequence holds (the whole row otherwise)."""
        return math.prod(self.shape[1:]) if self.sequence else math.prod(self.shape)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """The shape of one row as it travels: a sequence at ``max_length``."""
        return (self.max_length, *self.shape[1:]) if self.sequence else self.shape

    @property
    def width(self) -> int:
        """How many numbers one row of this input holds (a sequence padded to ``max_length``)."""
        return math.prod(self.padded_shape)

    def element_names(self) -> list[str]:
        """One name per number, in row-major order: ``name[i]``, ``name[c,h,w]``."""
        if len(self.shape) == 1:
            return [f"{self.name}[{i}]" for i in range(self.width)]
        names = [""]
        for size in self.padded_shape:
            names = [f"{prefix},{i}" if prefix else str(i) for prefix in names for i in range(size)]
        return [f"{self.name}[{n}]" for n in names]

    def document(self) -> dict:
        """Its entry in ``meta.json``'s ``inputs``."""
        out: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.vocabulary is not None:
            out["vocabulary"] = list(self.vocabulary) if isinstance(self.vocabulary, (list, tuple)) else self.vocabulary
        if self.image is not None:
            out["image"] = dict(self.image)
        if self.sequence:
            out.update(max_length=self.max_length, padding=self.padding)
        return out


def specs_from_meta(raw: Any) -> tuple[InputSpec, ...]:
    """The input specs ``meta.json`` declares, checked.

    Raises:
        ConfigError: not a list of inputs with unique names, known dtypes, positive shapes, a
            vocabulary on int64 inputs only (in ``[1, 2**24]``), an image encoding on float32
            ``[1 or 3, height, width]`` inputs only.
    """
    if not isinstance(raw, list) or not raw:
        raise ConfigError("meta.json: inputs must be a non-empty list")
    specs, seen = [], set()
    for i, entry in enumerate(raw):
        where = f"meta.json: inputs[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise ConfigError(f"{where} must be an object with a non-empty name")
        name = entry["name"]
        if name in seen or name in ("features", "id", "target"):
            raise ConfigError(f"{where}: the name {name!r} is {'repeated' if name in seen else 'reserved'}")
        seen.add(name)
        dtype, shape = entry.get("dtype"), entry.get("shape")
        if dtype not in DTYPES:
            raise ConfigError(f"{where}.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        if (
            not isinstance(shape, list)
            or not shape
            or not all(type(s) is int and (s > 0 or (s == DYNAMIC and i == 0)) for i, s in enumerate(shape))
        ):
            raise ConfigError(
                f"{where}.shape must be a list of positive sizes (the first may be {DYNAMIC}: a sequence), "
                f"got {shape!r}"
            )
        max_length, padding, vocabulary = entry.get("max_length"), entry.get("padding"), entry.get("vocabulary")
        if shape[0] == DYNAMIC:
            if type(max_length) is not int or max_length < MIN_BATCH_LENGTH:
                raise ConfigError(f"{where}.max_length must be an integer of at least {MIN_BATCH_LENGTH} (a sequence)")
            if not isinstance(padding, (int, float)) or isinstance(padding, bool) or not math.isfinite(padding):
                raise ConfigError(f"{where}.padding must be a number (a sequence's padding value)")
            if any(spec.sequence for spec in specs):
                raise ConfigError(f"{where}: one sequence input per model is supported")
            if dtype == INT64 and not (float(padding).is_integer() and 0 <= padding < (vocabulary or MAX_VOCABULARY)):
                raise ConfigError(f"{where}.padding must be an id of the vocabulary (an int64 sequence)")
            if dtype == BOOL and padding not in (0, 1):
                raise ConfigError(f"{where}.padding must be 0 or 1 (a bool sequence)")
        elif max_length is not None or padding is not None:
            raise ConfigError(f"{where}: max_length and padding are for a sequence (shape [{DYNAMIC}, ...])")
        image = entry.get("image")
        sizes = vocabulary if isinstance(vocabulary, list) and shape[0] != DYNAMIC else [vocabulary]
        if vocabulary is not None and (
            dtype != INT64
            or not all(type(v) is int and 0 < v <= MAX_VOCABULARY for v in sizes)
            or (isinstance(vocabulary, list) and len(vocabulary) != shape[-1])
        ):
            raise ConfigError(
                f"{where}.vocabulary must be an integer in [1, {MAX_VOCABULARY}] on an int64 input, or a list "
                "of such integers, one per column of its last dimension"
            )
        if image is not None:
            if dtype != FLOAT32 or len(shape) != 3 or shape[0] not in _MODES:
                raise ConfigError(f"{where}.image needs a float32 input of shape [1 or 3, height, width]")
            if not isinstance(image, dict) or not all(
                isinstance(image.get(k), (int, float)) and math.isfinite(image[k]) for k in ("scale", "offset")
            ):
                raise ConfigError(f"{where}.image must be {{'scale': number, 'offset': number}}")
        vocabulary = tuple(vocabulary) if isinstance(vocabulary, list) else vocabulary
        specs.append(InputSpec(name, dtype, tuple(shape), vocabulary, image, max_length, padding))
    if any(spec.sequence for spec in specs[:-1]):
        raise ConfigError("meta.json: the sequence input must be the last of inputs (its row is cut per batch)")
    return tuple(specs)


def largest_body(width: int, max_instances: int) -> int:
    """The most bytes a valid request of a model of ``width`` numbers per row can take.

    A KServe v1 or v2 request of ``max_instances`` rows, every number as long as JSON writes it (an
    image's base64 PNG, a sequence or binary tensor data are smaller than their rows as JSON numbers).
    """
    return width * JSON_NUMBER_BYTES * max_instances + BODY_SLACK


class _RawImage:
    """A one-input image model's raw request body (PNG or JPEG bytes), before decoding."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class NamedInputs:
    """A model's named inputs: parses one request into its row of ``width`` numbers.

    A body is ``{name: value, ...}`` with every input (other keys, such as ``id`` or ``target``, are
    left to their readers), or the flat form ``{"features": [width numbers]}`` (every input flattened
    in signature order, as the golden set and the gate send it), or raw PNG/JPEG bytes for a model
    whose one input is an image.
    """

    def __init__(self, specs: Sequence[InputSpec]) -> None:
        self.specs = tuple(specs)
        self.width = sum(s.width for s in self.specs)
        self.names = [s.name for s in self.specs]
        self.image = self.specs[0] if len(self.specs) == 1 and self.specs[0].image is not None else None
        last = self.specs[-1]
        #: A sequence input's (first column, numbers per position, padding value), else None: the
        #: handler cuts a batch's rows after the longest sequence (:class:`handler.model.CutPadding`).
        self.sequence = (self.width - last.width, last.inner, last.padding) if last.sequence else None
        #: (column, spec, index in the input) per column checked in the flat form: ids and booleans.
        self._discrete: list[tuple[int, InputSpec, int]] = []
        start = 0
        for spec in self.specs:
            if spec.dtype != FLOAT32:
                self._discrete += [(start + i, spec, i) for i in range(spec.width)]
            start += spec.width

    def body(self, row: Any) -> Any:
        """One TorchServe request row's body: raw image bytes kept for :meth:`row`, else decoded JSON."""
        from handler.schema import request_body  # schema imports nothing from here

        raw = row.get("data") if isinstance(row, dict) else None
        if raw is None and isinstance(row, dict):
            raw = row.get("body")
        if self.image is not None and isinstance(raw, (bytes, bytearray)) and _is_image(raw):
            return _RawImage(bytes(raw))
        return request_body(row)

    def row(self, body: Any, limit: float) -> list[float]:
        """The request's row: each input checked and flattened in signature order.

        Raises:
            InvalidInput: naming the input and the index or value at fault.
        """
        from handler.schema import json_type, parse_features

        if isinstance(body, _RawImage):
            return decode_image(body.data, self.image)
        if not isinstance(body, dict):
            raise InvalidInput(
                f"request body must be a JSON object with the model's inputs ({', '.join(self.names)}), "
                f"got {json_type(body)}",
                reason="not_an_object",
            )
        if "features" in body and not any(name in body for name in self.names):
            values = parse_features(body, self.width, limit)
            self._check_flat(values)
            return values
        out: list[float] = []
        for spec in self.specs:
            if spec.name not in body:
                raise InvalidInput(
                    f"missing required input {spec.name!r} (the model takes {', '.join(map(repr, self.names))})",
                    field=spec.name,
                    reason="missing_field",
                )
            value = body[spec.name]
            if spec.image is not None and isinstance(value, dict):
                out += _b64_image(value, spec)
            else:
                out += flatten(value, spec, limit)
        return out

    def _check_flat(self, values: list) -> None:
        for column, spec, index in self._discrete:
            _check_element(values[column], spec, f"features[{column}]", math.inf, flat=True, index=index)


def flatten(value: Any, spec: InputSpec, limit: float) -> list:
    """One input's value (nested lists of ``spec.shape``) flattened, each element checked.

    Raises:
        InvalidInput: a level of the wrong length (naming it), or an element of the wrong type,
            not finite, beyond ``limit``, or outside the vocabulary.
    """
    from handler.schema import json_type

    shape = spec.shape
    if spec.sequence:
        length = len(value) if type(value) is list else 0
        if not 1 <= length <= spec.max_length:
            too_long = length > spec.max_length
            raise InvalidInput(
                f"{spec.name} must be a sequence of 1 to {spec.max_length} positions (input {spec.name!r}), got "
                f"{f'{length} positions' if type(value) is list else json_type(value)}",
                field=spec.name,
                reason="too_long" if too_long else "wrong_shape",
                expected=spec.max_length if too_long else None,
            )
        shape = (length, *shape[1:])
    level: list[tuple[str, Any]] = [(spec.name, value)]
    for size in shape:
        nested: list[tuple[str, Any]] = []
        for where, item in level:
            if type(item) is not list or len(item) != size:
                got = f"{len(item)} entries" if type(item) is list else json_type(item)
                raise InvalidInput(
                    f"{where} must be an array of {size} {'entry' if size == 1 else 'entries'} "
                    f"(input {spec.name!r} has shape {list(shape)}), got {got}",
                    field=where,
                    reason="wrong_shape",
                    expected=size,
                )
            nested += [(f"{where}[{i}]", v) for i, v in enumerate(item)]
        level = nested
    out = [v for _, v in level]
    if not (_plain(out, spec) and _in_range(out, spec, limit)):  # find the bad element and name it
        for index, (where, element) in enumerate(level):
            _check_element(element, spec, where, limit, index=index)
    if spec.sequence:
        out += [spec.padding] * (spec.width - len(out))
    return out


def check_values(values: list, spec: InputSpec, where: str, limit: float) -> None:
    """Check a flat list of one input's numbers (``where[i]`` names a bad one).

    Raises:
        InvalidInput: an element of the wrong type, not finite, beyond ``limit``, or outside the vocabulary.
    """
    if not (_plain(values, spec) and _in_range(values, spec, limit)):
        for i, element in enumerate(values):
            _check_element(element, spec, f"{where}[{i}]", limit, index=i)


def _plain(values: list, spec: InputSpec) -> bool:
    """Whether every element has the dtype's JSON type (checked in C)."""
    kinds = set(map(type, values))
    if spec.dtype == BOOL:
        return kinds <= {bool}
    if spec.dtype == INT64:
        return kinds <= {int}
    return kinds <= {int, float}


def _in_range(values: list, spec: InputSpec, limit: float) -> bool:
    if spec.dtype == BOOL:
        return True
    if spec.dtype == INT64:
        if isinstance(spec.vocabulary, (list, tuple)):
            tops = spec.vocabulary
            return all(0 <= v < tops[i % len(tops)] for i, v in enumerate(values))
        return not values or (min(values) >= 0 and max(values) < _top(spec))
    return all(-limit <= v <= limit for v in values)  # NaN compares False


def _top(spec: InputSpec, index: int = 0) -> int:
    """The vocabulary of element ``index`` of the input's row (row-major)."""
    if isinstance(spec.vocabulary, (list, tuple)):
        return spec.vocabulary[index % len(spec.vocabulary)]
    return spec.vocabulary if spec.vocabulary is not None else MAX_VOCABULARY


def _check_element(value: Any, spec: InputSpec, where: str, limit: float, flat: bool = False, index: int = 0) -> None:
    """Refuse one element that does not fit its input (the flat form's ids and booleans may be floats)."""
    from handler.schema import json_type, short

    if spec.dtype == BOOL:
        if type(value) is bool or (flat and value in (0, 1)):
            return
        raise InvalidInput(
            f"{where} must be true or false (input {spec.name!r} is bool), got "
            f"{short(value) if flat else json_type(value)}",
            field=where,
            reason="not_a_boolean",
        )
    if spec.dtype == INT64:
        if not (type(value) is int or (flat and type(value) is float and value.is_integer())):
            raise InvalidInput(
                f"{where} must be an integer id (input {spec.name!r} is int64), got "
                f"{short(value) if type(value) is float else json_type(value)}",
                field=where,
                reason="not_an_integer",
            )
        top = _top(spec, index)
        if not 0 <= value < top:
            raise InvalidInput(
                f"{where} must be an id in [0, {top - 1}] (the vocabulary of input {spec.name!r}), got {short(value)}",
                field=where,
                reason="out_of_vocabulary",
            )
        return
    if type(value) is not float and type(value) is not int:
        raise InvalidInput(f"{where} must be a number, got {json_type(value)}", field=where, reason="not_a_number")
    if not -limit <= value <= limit:
        finite = type(value) is int or math.isfinite(value)  # an integer beyond float64 is finite
        raise InvalidInput(
            f"{where} must be {'in range' if finite else 'a finite number'} within [-{limit:g}, {limit:g}], "
            f"got {short(value)}",
            field=where,
            reason="out_of_range" if finite else "non_finite",
        )


def _is_image(data: bytes | bytearray) -> bool:
    return data[:8] == PNG_MAGIC or data[:3] == JPEG_MAGIC


def _b64_image(value: dict, spec: InputSpec) -> list[float]:
    where = f"{spec.name}.b64"
    encoded = value.get("b64")
    if set(value) != {"b64"} or not isinstance(encoded, str):
        raise InvalidInput(
            f'input {spec.name!r} must be an array of shape {list(spec.shape)} or {{"b64": "<PNG or JPEG, base64>"}}',
            field=spec.name,
            reason="wrong_shape",
        )
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"{where} is not valid base64: {exc}", field=where, reason="not_base64") from exc
    return decode_image(data, spec, where)


def decode_image(data: bytes, spec: InputSpec, where: str | None = None) -> list[float]:
    """A PNG or JPEG image as the input's row: channels first, each pixel ``p * scale + offset``.

    The image must already have the input's size and channels (1: grayscale, 3: RGB); nothing is
    resized. Its header is read before its pixels, so a huge image is refused without decoding it.

    Raises:
        InvalidInput: not a PNG or JPEG, undecodable, or of another size or channel count.
    """
    from PIL import Image, UnidentifiedImageError

    where = where or spec.name
    channels, height, width = spec.shape
    if not _is_image(data):
        raise InvalidInput(f"{where} is not a PNG or JPEG image", field=where, reason="not_an_image")
    try:
        with Image.open(io.BytesIO(data), formats=("PNG", "JPEG")) as image:
            if image.size != (width, height):
                raise InvalidInput(
                    f"{where} is a {image.size[0]}x{image.size[1]} image; input {spec.name!r} takes "
                    f"{width}x{height} (width x height), resize it before sending",
                    field=where,
                    reason="wrong_size",
                )
            if channels == 1 and image.mode not in _GRAY_MODES:
                raise InvalidInput(
                    f"{where} is a {image.mode} image; input {spec.name!r} takes grayscale (1 channel)",
                    field=where,
                    reason="wrong_channels",
                )
            pixels = image.convert(_MODES[channels]).tobytes()
    except InvalidInput:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidInput(f"{where} cannot be decoded as PNG or JPEG: {exc}", field=where, reason="bad_image") from exc
    scale, offset = spec.image["scale"], spec.image["offset"]
    plane = height * width
    if channels == 1:
        return [p * scale + offset for p in pixels]
    return [pixels[i * channels + c] * scale + offset for c in range(channels) for i in range(plane)]
