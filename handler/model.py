"""The model contract: an exported program plus ``meta.json`` (no TorchServe import).

``model.pt2`` is a ``torch.export`` program from raw float32 features ``[N, F]`` (preprocessing inside, ``N``
dynamic) to logits ``[N, C]`` (several outputs: their columns side by side, :func:`answer_columns`);
``meta.json`` (:class:`ModelMetadata`) holds names, labels, the output signature, training statistics, the
golden set and provenance. :func:`load_program` never executes code carried by the file.
"""

from __future__ import annotations

import io
import json
import math
import operator
import re
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

from handler.drift import check_reference
from handler.errors import ConfigError
from handler.inputs import FLOAT32, MIN_BATCH_LENGTH, InputSpec, specs_from_meta
from handler.signature import (
    CLASSIFICATION,
    EMBEDDING,
    KINDS,
    MULTI_LABEL,
    REGRESSION,
)

#: Files of an artifact directory.
PROGRAM_FILE = "model.pt2"
METADATA_FILE = "meta.json"
#: The contract's version, written into every classifier's ``meta.json`` exported with ``labels=``.
FORMAT = "rtserve-model/1"
#: The contract with an output signature (``outputs``), written for every model exported with ``outputs=``.
FORMAT_V2 = "rtserve-model/2"
#: Statistics recorded per feature.
STAT_NAMES = ("mean", "std", "min", "max")


@dataclass
class ModelMetadata:
    """``meta.json``: everything the handler needs beside the program.

    Attributes:
        name: the model's name (the archive's name is given at ``make archive``).
        version: the model's version.
        feature_names: one unique name per input column, in order.
        labels: one unique label per output column (class index order).
        stats: per-feature training statistics, ``{"mean": [...], "std": [...], "min": [...],
            "max": [...]}`` in raw units; ``mean`` is the explanation baseline.
        drift_reference: decile edges and shares per feature of the training rows (raw units), and
            the predictions' reference: class shares (``class_expected``) of a classifier, the kind's
            ``prediction`` of other kinds (:func:`handler.drift.fit_prediction`); checked by
            :func:`handler.drift.check_reference`. Empty: no drift is scored.
        golden: ``{"features": [[...]], "labels": [int] | None, "probabilities": [[...]]}``:
            rows and the model's own softmax outputs at packaging time.
        accuracy: accuracy on the golden rows (``None`` when they carry no labels).
        provenance: torch version, creation time and what packed it.
        format: the contract version, :data:`FORMAT` or :data:`FORMAT_V2`.
        outputs: ``rtserve-model/2`` only: the output signature, one ``{"name", "kind", "width"}``
            per output (with ``labels``; ``threshold`` for multi-label; ``targets`` for regression),
            in the program's column order; None in ``rtserve-model/1``, which is one
            classification output. ``labels`` holds the first output's labels (empty for a
            regression or embedding). With one output that is not a classification, or with
            several, the golden set holds ``outputs`` (what the answers carry, every output's
            columns side by side: :func:`answer_columns`) for ``probabilities``; the golden
            ``labels`` (truth), ``accuracy`` and the drift reference are the first output's.
        inputs: ``rtserve-model/2`` only: named inputs (:class:`handler.inputs.InputSpec` documents);
            None: one float32 input ``features`` of ``len(feature_names)`` columns. With named
            inputs the program still takes one float32 row, every input flattened in this order,
            and ``feature_names`` names each number (``image[0,3,4]``).
    """

    name: str
    version: str
    feature_names: list[str]
    labels: list[str]
    stats: dict
    drift_reference: dict = field(default_factory=dict)
    golden: dict = field(default_factory=dict)
    accuracy: float | None = None
    provenance: dict = field(default_factory=dict)
    format: str = FORMAT
    outputs: list[dict] | None = None
    inputs: list[dict] | None = None

    @property
    def input_specs(self) -> tuple[InputSpec, ...]:
        """The named inputs (empty for one ``features`` input)."""
        return specs_from_meta(self.inputs) if self.inputs is not None else ()

    @property
    def float_inputs(self) -> bool:
        """Whether every input is float32 (what Integrated Gradients can vary)."""
        return all(spec.dtype == FLOAT32 for spec in self.input_specs)

    @property
    def output(self) -> dict:
        """The first (or only) output's signature (``rtserve-model/1``: the classification it implies)."""
        if self.outputs:
            return self.outputs[0]
        return {"name": "probabilities", "kind": CLASSIFICATION, "labels": self.labels, "width": len(self.labels)}

    @property
    def signature(self) -> list[dict]:
        """Every output's signature, in column order (one for ``rtserve-model/1``)."""
        return self.outputs if self.outputs else [self.output]

    @property
    def kind(self) -> str:
        """The first (or only) output's kind, one of :data:`KINDS`."""
        return self.outputs[0]["kind"] if self.outputs else CLASSIFICATION

    @property
    def n_features(self) -> int:
        """Number of input features."""
        return len(self.feature_names)

    @property
    def mean(self) -> list[float]:
        """Training mean per feature (raw units): the explanation baseline."""
        return self.stats["mean"]

    def validate(self) -> None:
        """Check internal consistency.

        Raises:
            ConfigError: a field is missing, of the wrong length, or not finite.
        """
        if self.format not in (FORMAT, FORMAT_V2):
            raise ConfigError(f"meta.json: format must be {FORMAT!r} or {FORMAT_V2!r}, got {self.format!r}")
        if (self.outputs is None) != (self.format == FORMAT):
            raise ConfigError(f"meta.json: outputs is required in {FORMAT_V2!r} and absent in {FORMAT!r}")
        for key in ("name", "version"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ConfigError(f"meta.json: {key} must be a non-empty string")
        if self.outputs is not None:
            check_outputs(self.outputs, self.labels)
        if self.inputs is not None:
            if self.format != FORMAT_V2:
                raise ConfigError(f"meta.json: inputs are declared in {FORMAT_V2!r} only")
            width = sum(spec.width for spec in self.input_specs)
            if width != len(self.feature_names):
                raise ConfigError(
                    f"meta.json: the inputs hold {width} numbers per row but feature_names "
                    f"names {len(self.feature_names)}"
                )
        least_labels = {CLASSIFICATION: 2, MULTI_LABEL: 1}.get(self.kind, 0)
        for key, least in (("feature_names", 1), ("labels", least_labels)):
            values = getattr(self, key)
            if (
                not isinstance(values, list)
                or len(values) < least
                or not all(isinstance(v, str) and v for v in values)
                or len(set(values)) != len(values)
            ):
                raise ConfigError(f"meta.json: {key} must be at least {least} unique non-empty strings")
        n = self.n_features
        if not isinstance(self.stats, dict):
            raise ConfigError("meta.json: stats must be an object")
        for name in STAT_NAMES:
            values = self.stats.get(name)
            if not isinstance(values, list) or len(values) != n or not all(_finite(v) for v in values):
                raise ConfigError(f"meta.json: stats.{name} must hold {n} finite numbers")
        if self.accuracy is not None and not (_finite(self.accuracy) and 0 <= self.accuracy <= 1):
            raise ConfigError("meta.json: accuracy must be a number in [0, 1] or null")
        check_reference(self.drift_reference, n, self.output)

    @classmethod
    def load(cls, path: str | Path) -> ModelMetadata:
        """Read and validate ``meta.json``.

        Raises:
            ConfigError: the file is missing, not JSON, or inconsistent.
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"model metadata not found: {path}") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"model metadata is not valid JSON: {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"model metadata must be a JSON object: {path}")
        known = set(cls.__dataclass_fields__)
        try:
            meta = cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as exc:
            raise ConfigError(f"model metadata is incomplete: {path}: {exc}") from exc
        meta.validate()
        return meta

    def save(self, path: str | Path) -> None:
        """Write ``meta.json`` (sorted keys; no ``outputs`` in ``rtserve-model/1``, no ``inputs`` for ``features``)."""
        raw = asdict(self)
        for key in ("outputs", "inputs"):
            if raw[key] is None:
                del raw[key]
        Path(path).write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")


def check_outputs(outputs: Any, labels: list[str]) -> None:
    """Check ``meta.json``'s output signature: one output or several, each of a known kind with consistent fields.

    Names are unique; ``labels`` (the top-level field) is the first output's.

    Raises:
        ConfigError: naming the field at fault (``outputs[1].width``).
    """
    if not isinstance(outputs, list) or not outputs or not all(isinstance(out, dict) for out in outputs):
        raise ConfigError("meta.json: outputs must be a non-empty list of output objects")
    seen: dict[str, int] = {}
    for i, out in enumerate(outputs):
        _check_output(out, f"meta.json: outputs[{i}]", labels if i == 0 else None)
        if out["name"] in seen:
            raise ConfigError(
                f"meta.json: outputs[{i}].name {out['name']!r} repeats outputs[{seen[out['name']]}].name: "
                "each output needs a name of its own"
            )
        seen[out["name"]] = i
    kind = outputs[0]["kind"]
    if kind in (REGRESSION, EMBEDDING) and labels:
        raise ConfigError(f"meta.json: labels must be empty for a {kind} output")


def _check_output(out: dict, where: str, labels: list[str] | None) -> None:
    """Check one output's signature (``labels``: the top-level labels it must equal; None past the first)."""
    kind, width = out.get("kind"), out.get("width")
    if not isinstance(out.get("name"), str) or not out["name"]:
        raise ConfigError(f"{where}.name must be a non-empty string")
    if kind not in KINDS:
        raise ConfigError(f"{where}.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if type(width) is not int or width < 1:
        raise ConfigError(f"{where}.width must be a positive integer")
    if kind in (CLASSIFICATION, MULTI_LABEL):
        own = out.get("labels")
        if labels is not None and own != labels:
            raise ConfigError(f"{where}.labels must equal labels")
        least = 2 if kind == CLASSIFICATION else 1
        if (
            not isinstance(own, list)
            or len(own) < least
            or not all(isinstance(v, str) and v for v in own)
            or len(set(own)) != len(own)
        ):
            raise ConfigError(f"{where}.labels must be at least {least} unique non-empty strings")
        if len(own) != width:
            raise ConfigError(f"{where}.width must be the number of labels")
    if kind == MULTI_LABEL and not (_finite(out.get("threshold")) and 0 < out["threshold"] < 1):
        raise ConfigError(f"{where}.threshold must be a number in (0, 1)")
    targets = out.get("targets")
    if (
        kind == REGRESSION
        and targets is not None
        and (
            not isinstance(targets, list) or len(targets) != width or not all(isinstance(t, str) and t for t in targets)
        )
    ):
        raise ConfigError(f"{where}.targets must name each of the width's columns")


#: What an answer carries for an output's raw columns, per kind (:func:`answer_columns`).
_ANSWERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    CLASSIFICATION: lambda raw: torch.softmax(raw, dim=1),
    MULTI_LABEL: torch.sigmoid,
    REGRESSION: lambda raw: raw,
    EMBEDDING: lambda raw: raw,
}


def answer_columns(outputs: Sequence[dict], raw: torch.Tensor) -> torch.Tensor:
    """What the answers carry for the program's output ``raw`` ``[N, sum of widths]``, column for column.

    Per output's columns (``outputs``: the signature, in column order): softmax probabilities
    (classification), sigmoid probabilities (multi-label), the values themselves (regression,
    embedding). One output is transformed whole.
    """
    if len(outputs) == 1:
        return _ANSWERS[outputs[0]["kind"]](raw)
    parts, start = [], 0
    for out in outputs:
        parts.append(_ANSWERS[out["kind"]](raw[:, start : start + out["width"]]))
        start += out["width"]
    return torch.cat(parts, dim=1)


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --------------------------------------------------------------------------- safe loading

#: Every file a ``torch.export.save`` archive of a plain tensor program may hold, relative to its
#: top folder. Anything else (compiled code under ``data/aotinductor/``, legacy pickled weight
#: files, custom or opaque objects, extra files) is refused before torch reads the archive.
_ALLOWED = re.compile(
    r"(archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
    r"|models/(?P<model>[\w.-]+)\.json"
    r"|data/weights/[\w.-]+_weights_config\.json|data/weights/weight_\d+"
    r"|data/constants/[\w.-]+_constants_config\.json|data/constants/tensor_\d+"
    r"|data/sample_inputs/[\w.-]+\.pt)"
)
_PAYLOAD_CONFIGS = (
    ("data/weights/", "_weights_config.json", r"weight_\d+"),
    ("data/constants/", "_constants_config.json", r"tensor_\d+"),
)


def check_program_file(path: str | Path) -> None:
    """Refuse a program file that could make ``torch.export.load`` run code, without running it.

    ``torch.export.load`` unpickles with ``weights_only=False`` in several places: weights or
    constants marked ``use_pickle``, custom and opaque objects, and sample inputs that fail a
    ``weights_only`` load (it falls back); it also loads compiled AOTInductor libraries found in
    the archive. This check reads the zip's directory and JSON configs only, and loads the sample
    inputs with ``torch.load(weights_only=True)`` (which refuses any global outside the tensor
    allow-list before calling it): every file must be one a plain exported tensor program has,
    and no payload may be pickled.

    Raises:
        ConfigError: saying what in the file is refused.
    """
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"model program not found: {path}") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise ConfigError(f"model program {path} is not a torch.export archive: {exc}") from exc
    with zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        roots = {n.split("/", 1)[0] for n in names}
        if len(roots) != 1 or any("/" not in n for n in names):
            raise ConfigError(f"model program {path} is not a torch.export archive (one top folder expected)")
        root = roots.pop() + "/"
        models = []
        for name in names:
            match = _ALLOWED.fullmatch(name[len(root) :])
            if match is None:
                raise ConfigError(
                    f"model program {path} holds {name!r}, which a plain exported program "
                    "never has (compiled code, pickled objects or extra files are refused)"
                )
            if match.group("model"):
                models.append(match.group("model"))
        if _read(zf, root + "archive_format") != b"pt2" or len(models) != 1:
            raise ConfigError(
                f"model program {path} is not a torch.export archive "
                "(archive_format pt2 with exactly one program expected)"
            )
        for folder, suffix, payload in _PAYLOAD_CONFIGS:
            config_name = f"{root}{folder}{models[0]}{suffix}"
            try:
                config = json.loads(_read(zf, config_name))["config"]
            except (KeyError, ValueError, TypeError) as exc:
                raise ConfigError(
                    f"model program {path}: {config_name} is missing or not a payload config: {exc}"
                ) from exc
            for key, entry in config.items():
                if (
                    not isinstance(entry, dict)
                    or entry.get("use_pickle") is not False
                    or not re.fullmatch(payload, str(entry.get("path_name")))
                ):
                    raise ConfigError(
                        f"model program {path}: {folder}{key} is stored pickled or under an "
                        "unexpected name: refused (only raw tensor payloads are accepted)"
                    )
        sample = f"{root}data/sample_inputs/{models[0]}.pt"
        if sample in names:
            try:
                torch.load(io.BytesIO(_read(zf, sample)), weights_only=True)
            except Exception as exc:  # an UnpicklingError names the refused global
                raise ConfigError(
                    f"model program {path}: its sample inputs are not plain tensors and are refused: {exc}"
                ) from exc


def _read(zf: zipfile.ZipFile, name: str) -> bytes:
    try:
        return zf.read(name)
    except KeyError:
        return b""


def load_program(
    path: str | Path,
    device: torch.device | str = "cpu",
    direct: bool = False,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """Load ``model.pt2`` after :func:`check_program_file`; return its forward function.

    The returned callable is the exported module's ``forward``, called directly: the module's
    input-constraint pre-hook (about 0.1 ms per call, more than the forward pass of a small
    network) is skipped because the handler has already checked every row's width and type.
    The module is in inference form: batch norm uses its running statistics, dropout is off.

    ``torch.export.load`` gives a program on the device it was saved from (the CPU); for another
    ``device`` the program goes through ``torch.export.passes.move_to_device_pass``, which moves
    its weights, buffers and constants and rewrites the devices its graph names (a module's
    ``.to()`` would leave the latter behind). The forward function then takes and returns
    tensors on ``device``.

    With ``direct``, the forward function is :func:`direct_forward`'s when the program allows it
    (the same operators on the same tensors, without the module's per-call Python layers); the
    returned callable's ``forward_path`` attribute names the path taken, and why.

    Raises:
        ConfigError: the file is refused or cannot be deserialized.
    """
    check_program_file(path)
    try:
        program = torch.export.load(str(path))
        if torch.device(device).type != "cpu":
            from torch.export.passes import move_to_device_pass  # a submodule, not imported

            program = move_to_device_pass(program, torch.device(device))
        module = program.module()
    except Exception as exc:  # a corrupt or incompatible archive: a bad model, not a crash
        raise ConfigError(f"model program cannot be loaded from {path}: {exc}") from exc
    if direct:
        forward, why = direct_forward(program)
        if forward is not None:
            return forward
        return _named(module.forward, f"exported module (direct forward does not apply: {why})")
    return _named(module.forward, "exported module (handler.direct_forward off)")


class CutPadding:
    """A forward function fed each batch cut after its longest sequence (a model with a sequence input).

    A sequence input is the last of a row, padded to ``max_length``; the batch is cut after the
    last position where any row holds something other than ``padding`` (at least
    :data:`handler.inputs.MIN_BATCH_LENGTH` positions, the exported program's shortest), so a batch of
    short sequences costs what short sequences cost. Export checks the answers do not change.
    """

    __slots__ = ("forward", "start", "inner", "padding", "forward_path")

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], start: int, inner: int, padding: float) -> None:
        self.forward, self.start, self.inner, self.padding = forward, start, inner, padding
        path = getattr(forward, "forward_path", "")
        self.forward_path = f"{path}{'; ' if path else ''}each batch cut after its longest sequence"

    def cut(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` without the positions every row pads."""
        used = (x[:, self.start :] != self.padding).unflatten(1, (-1, self.inner)).any(dim=2).any(dim=0)
        positions = used.nonzero()
        length = max(MIN_BATCH_LENGTH, int(positions[-1]) + 1 if len(positions) else 0)
        return x[:, : self.start + length * self.inner]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(self.cut(x))


class _Named:
    """A forward function with a ``forward_path`` line for the worker's log."""

    __slots__ = ("forward", "forward_path")

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], path: str) -> None:
        self.forward, self.forward_path = forward, path

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)


def _named(forward: Callable, path: str) -> Callable[[torch.Tensor], torch.Tensor]:
    return _Named(forward, path)


# --------------------------------------------------------------------------- direct forward

#: Node targets :func:`direct_forward` runs besides ATen operator overloads: ``getitem``, and the
#: integer arithmetic of dynamic sizes (a sequence's width, an embedding bag's offsets).
_PLAIN_TARGETS = (operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv)


class DirectForward:
    """An exported program's graph run as a flat list of operator calls.

    The module's ``forward`` spends more Python per call (input checks, ``__getattr__`` per weight,
    pytree) than a small network's arithmetic. This runs the same ``OpOverload`` calls on the same
    weight tensors in the graph's order, arguments resolved once at load, so its answers are the
    module's. No code is generated and nothing from the archive is executed.
    """

    __slots__ = ("steps", "n_slots", "result", "forward_path")

    def __init__(self, steps: list, n_slots: int, result: int) -> None:
        self.steps, self.n_slots, self.result = steps, n_slots, result
        self.forward_path = f"direct forward ({len(steps)} operators)"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        env = [None] * self.n_slots
        env[0] = x
        for op, args, fills, kwargs, out in self.steps:
            if fills:
                args = list(args)
                for pos, slot in fills:
                    args[pos] = env[slot] if type(slot) is int else [v if i is None else env[i] for v, i in slot]
            env[out] = op(*args, **kwargs)
        return env[self.result]


def direct_forward(program: Any) -> tuple[DirectForward | None, str]:
    """A :class:`DirectForward` for ``program`` (a ``torch.export.ExportedProgram``), or None and why.

    None when the graph has anything beyond one tensor input, one tensor output, weights, buffers
    and constant tensors, and calls of ATen operator overloads (and ``getitem``) whose arguments
    are graph values, tensors or plain constants.
    """
    signature = program.graph_signature
    tensors = {**program.state_dict, **program.constants}
    slots: dict[str, int] = {}
    constants: dict[str, Any] = {}
    users = [spec for spec in signature.input_specs if spec.kind == InputKind.USER_INPUT]
    if len(users) != 1:
        return None, f"{len(users)} user inputs, one expected"
    slots[users[0].arg.name] = 0
    for spec in signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            return None, f"an input of kind {spec.kind.name}"
        if spec.target not in tensors:
            return None, f"no tensor for {spec.target!r}"
        constants[spec.arg.name] = tensors[spec.target].detach()
    outputs = signature.output_specs
    if len(outputs) != 1 or outputs[0].kind != OutputKind.USER_OUTPUT:
        return None, "outputs other than one user output"
    steps, result = [], None
    for node in program.graph.nodes:
        if node.op == "placeholder":
            if node.name not in slots and node.name not in constants:
                return None, f"an unknown input {node.name!r}"
        elif node.op == "call_function":
            if not (isinstance(node.target, torch._ops.OpOverload) or node.target in _PLAIN_TARGETS):
                return None, f"a call of {node.target!r}"
            args, fills = [], []
            for pos, arg in enumerate(node.args):
                value, slot = _argument(arg, slots, constants)
                if value is _REFUSED:
                    return None, f"an argument of {node.target!r} it cannot resolve"
                args.append(value)
                if slot is not None:
                    fills.append((pos, slot))
            kwargs = {}
            for key, arg in node.kwargs.items():
                value, slot = _argument(arg, slots, constants)
                if value is _REFUSED or slot is not None:
                    return None, f"a keyword argument of {node.target!r} it cannot resolve"
                kwargs[key] = value
            slots[node.name] = len(slots)
            steps.append((node.target, tuple(args), tuple(fills), kwargs, slots[node.name]))
        elif node.op == "output":
            (returned,) = node.args
            if not isinstance(returned, (tuple, list)) or len(returned) != 1:
                return None, "an output that is not one tensor"
            if not isinstance(returned[0], torch.fx.Node) or returned[0].name not in slots:
                return None, "an output that is not a computed tensor"
            result = slots[returned[0].name]
        else:
            return None, f"a {node.op} node"
    if result is None or not steps:
        return None, "no output"
    return DirectForward(steps, len(slots), result), ""


#: :func:`_argument`'s answer for an argument it does not take.
_REFUSED = object()
#: Plain constants an operator argument may be.
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _argument(arg: Any, slots: dict[str, int], constants: dict[str, Any]) -> tuple[Any, int | None]:
    """How :class:`DirectForward` passes one operator argument.

    Returns (value, None) for a constant, (None, slot) for a value computed in the graph or the
    user input, (None, ((value, slot), ...)) for a flat list holding such values, (_REFUSED, None)
    for anything else.
    """
    if isinstance(arg, torch.fx.Node):
        if arg.name in constants:
            return constants[arg.name], None
        if arg.name in slots:
            return None, slots[arg.name]
        return _REFUSED, None
    if isinstance(arg, _PLAIN):
        return arg, None
    if isinstance(arg, (tuple, list)) and all(isinstance(a, _PLAIN) for a in arg):
        return arg, None
    if isinstance(arg, (tuple, list)):  # a list of graph values (``cat``'s tensors): filled per call
        items = [_argument(a, slots, constants) for a in arg]
        if any(value is _REFUSED or isinstance(value, (tuple, list)) for value, _ in items):
            return _REFUSED, None
        return None, tuple(items)
    return _REFUSED, None
