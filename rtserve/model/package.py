"""Package any tabular model as an rtserve model artifact (the contract in handler/model.py).

:func:`export` writes ``model.pt2`` (a ``torch.export`` program, dynamic batch) and ``meta.json``;
``python -m rtserve model export my_module:packaging`` does it for a function returning ``model``,
``train_features``, ``feature_names``, ``labels`` or ``outputs``, and optionally ``holdout``
(docs/bring-your-own-model.md). ``labels`` means one classification output (``rtserve-model/1``);
``outputs`` names one output or several, of any kind (``rtserve-model/2``; several behind
:class:`FlatOutputs`).
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import logging
import platform
import re
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

import rtserve
from handler.config import HandlerConfig
from handler.drift import fit_reference
from handler.errors import ConfigError
from handler.inputs import BOOL, FLOAT32, INT64, MIN_BATCH_LENGTH, InputSpec, specs_from_meta
from handler.model import (
    CLASSIFICATION,
    EMBEDDING,
    FORMAT,
    FORMAT_V2,
    KINDS,
    METADATA_FILE,
    MULTI_LABEL,
    PROGRAM_FILE,
    REGRESSION,
    CutPadding,
    ModelMetadata,
    answer_columns,
    load_program,
)
from handler.signature import golden_values
from rtserve.errors import PackagingError
from rtserve.model.archive import golden_label_problem
from rtserve.settings import PACKAGE_HOME

logger = logging.getLogger(__name__)

#: The demo's model config (``model/model-config.yaml``), used when :func:`export` is given none:
#: its ``batchSize`` is the largest batch of requests TorchServe forms.
MODEL_CONFIG = PACKAGE_HOME / "model" / "model-config.yaml"
#: Exported and eager logits must agree to this (absolute and relative).
TOLERANCE = 1e-5
#: Most rows in the golden set (the first rows of the holdout, or a sample of training rows).
GOLDEN_ROWS = 256
#: Rows of the training sample the exported program is compared on.
SAMPLE_ROWS = 256
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Standardize(nn.Module):
    """``(x - mean) / std`` with the statistics as buffers (``Standardize.fit(train_features)``).

    Put it first in a model so the exported program takes raw features.
    """

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32).clone())
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).clone())

    @classmethod
    def fit(cls, train_features: torch.Tensor) -> Standardize:
        """Per-column mean and standard deviation of ``train_features`` (a zero std becomes 1)."""
        x = torch.as_tensor(train_features, dtype=torch.float32)
        std = x.std(dim=0)
        return cls(x.mean(dim=0), torch.where(std > 0, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Standardize ``[N, F]`` raw features."""
        return (x - self.mean) / self.std


def export(
    model: nn.Module,
    train_features: Any = None,
    *,
    inputs: dict | None = None,
    feature_names: Sequence[str] | None = None,
    labels: Sequence[str] | None = None,
    outputs: dict | None = None,
    version: str,
    out_dir: str | Path,
    holdout: tuple[Any, Any] | None = None,
    model_config: str | Path | None = None,
) -> ModelMetadata:
    """Export ``model`` and write an artifact directory (``model.pt2`` + ``meta.json``).

    Args:
        model: an ``nn.Module`` taking raw float32 features ``[N, F]`` (any preprocessing inside)
            and returning logits ``[N, C]``; put in eval mode here. Its name in ``meta.json`` is
            its ``model_name`` attribute, else its class name in kebab case.
        train_features: the training rows ``[rows, F]`` (tensor, array or nested lists): the
            statistics (explanation baseline, drift reference) come from them. Or a dict of named
            inputs, as ``inputs``.
        inputs: named inputs instead of ``train_features`` (format ``rtserve-model/2``): ``{name:
            training rows}`` in the order of the model's inputs, each a tensor ``[rows, ...]`` whose
            dtype (float, integer ids, bool) and shape are the input's, or ``{"rows": tensor,
            "vocabulary": n}`` (ids in ``[0, n)``; default the training rows' largest id + 1) or
            ``{"rows": tensor, "image": {"scale": s, "offset": o}}`` (a float ``[1 or 3, H, W]``
            image: a request's PNG or JPEG pixel ``p`` becomes ``p * s + o``). ``model.forward``
            takes them by name. The program takes one float32 row, the inputs flattened in order
            (:class:`FlatInputs`); the holdout's features are such a dict too.
        feature_names: ``F`` unique names, the keys of explanations and drift metrics (one tensor
            of features only: named inputs name their numbers ``name[i]``, ``name[c,h,w]``).
        labels: ``C`` unique class labels, in output column order: one classification output
            (``meta.json`` format ``rtserve-model/1``). Give this or ``outputs``.
        outputs: ``{name: {"kind": ...}}``, one output or several, each of kind
            ``{"kind": "classification", "labels": [...]}``, ``{"kind": "multi_label", "labels":
            [...], "threshold": 0.5}``, ``{"kind": "regression"}`` (optionally ``"targets":
            [names]``, one per column) or ``{"kind": "embedding"}`` (format ``rtserve-model/2``).
            With several, the model returns a tuple of ``[N, width]`` tensors in this order or a
            dict of them by name; the program returns them side by side (:class:`FlatOutputs`),
            and the holdout's truth, the accuracy and the drift reference are the first output's.
        version: the model version (letters, digits, ``.``, ``_``, ``-``).
        out_dir: the artifact directory (created; ``model.pt2`` and ``meta.json`` replaced).
        holdout: ``(features, truth)`` held out from training: the golden set, its truth kept as
            ``golden["labels"]`` per kind (class indices and their accuracy; a regression's targets,
            one number per row or ``width`` per row; a multi-label's 0/1 rows of ``width``; an
            embedding keeps the features only). Without it the golden set is a sample of
            ``train_features``, unlabelled, and no accuracy is kept.
        model_config: the model config the archive will carry (``make archive MODEL_CONFIG=``):
            the exported program is checked on the batch sizes it lets TorchServe form
            (default :data:`MODEL_CONFIG`, the demo's).

    Returns:
        The metadata written to ``meta.json``.

    Raises:
        PackagingError: bad names, labels (or targets) that do not match the output width, a bad
            output kind or threshold, a model that returns another number of outputs or other
            names than ``outputs`` gives, a holdout whose truth does not fit the (first)
            output (the field named), non-finite outputs or statistics, a model
            that cannot be exported, or an exported program that differs
            from the eager model by more than :data:`TOLERANCE`.
    """
    if not isinstance(model, nn.Module):
        raise PackagingError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise PackagingError(
            f"version must be 1-64 letters, digits, '.', '_' or '-' starting with a letter or digit, got {version!r}"
        )
    if isinstance(train_features, dict):
        train_features, inputs = None, train_features
    if (train_features is None) == (inputs is None):
        raise PackagingError("give the training rows once: train_features (one tensor) or inputs ({name: rows})")
    user_model, specs = model, ()
    if inputs is not None:
        if feature_names is not None:
            raise PackagingError("feature_names names one tensor's columns: named inputs name their own numbers")
        specs, parts, lengths = _input_specs(inputs)
        _check_forward(model, specs, lengths)
        model = FlatInputs(model, specs, lengths)
        train_features = _flat(parts)
        feature_names = [name for spec in specs for name in spec.element_names()]
    elif feature_names is None:
        raise PackagingError("feature_names is required with train_features: one name per column")
    x = _matrix(train_features, "train_features")
    feature_names = _names(feature_names, "feature_names")
    signatures = _output_signatures(labels, outputs)
    signature = signatures[0]  # the first output: the holdout's truth, accuracy and drift
    kind = signature["kind"]
    labels = signature.get("labels", [])
    if len(feature_names) != x.shape[1]:
        raise PackagingError(
            f"feature_names has {len(feature_names)} names but train_features "
            f"has {x.shape[1]} columns: give one name per column"
        )
    stats = _stats(x, feature_names)
    model = model.eval()
    sample = x[:SAMPLE_ROWS]
    with torch.inference_mode():  # a clear error for a wrong output, before export
        _output_widths(model, sample, signatures)
    if len(signatures) > 1:
        model = FlatOutputs(model, [s["name"] for s in signatures])
    if specs and isinstance(holdout, (tuple, list)) and len(holdout) == 2:
        holdout = (_flat(_named_rows(holdout[0], specs, "holdout features")), holdout[1])
    holdout_x, holdout_y = _holdout(holdout, x.shape[1], signature)

    sequence = specs[-1] if specs and specs[-1].sequence else None
    program = _export(model, x[:8].clone(), sequence and (x.shape[1] - sequence.width, sequence))  # keep it small
    sizes = _check_sizes(Path(model_config or MODEL_CONFIG))
    g = torch.Generator().manual_seed(0)
    checks = {"sample": sample}
    for size in sizes:
        checks[f"batch of {size}"] = x[torch.randint(len(x), (size,), generator=g)]
    module = program.module()
    for what, rows in checks.items():
        _compare(model, module, rows, what)
    if sequence is not None:  # as the handler runs it: each batch cut after its longest sequence
        cut = CutPadding(module, x.shape[1] - sequence.width, sequence.inner, sequence.padding)
        shortest = torch.argsort((x[:, -sequence.width :] != sequence.padding).sum(dim=1))
        for what, rows in {**checks, "the shortest row alone": x[shortest[:1]], "short rows": x[shortest[:8]]}.items():
            _compare(model, cut, rows, f"{what}, cut after its longest {sequence.name!r}")

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(out / PROGRAM_FILE))
    forward = load_program(out / PROGRAM_FILE)  # what the handler will run, through its loader
    _compare(model, forward, sample, "the saved and reloaded program")

    if holdout_x is not None:
        golden_x = holdout_x[:GOLDEN_ROWS]
        golden_y = None if holdout_y is None else holdout_y[:GOLDEN_ROWS]
    else:
        golden_x = x[torch.randperm(len(x), generator=g)[:GOLDEN_ROWS]]
        golden_y = None
    first = slice(0, signature["width"])  # the first output's columns
    with torch.inference_mode():
        golden_p = answer_columns(signatures, forward(golden_x))
        trained = forward(x)[:, first]
        predicted = trained.argmax(dim=1) if kind == CLASSIFICATION else None
        trained = None if kind == CLASSIFICATION else answer_columns([signature], trained)  # the predictions' drift
    what = kind if len(signatures) == 1 else "several"
    if not bool(torch.isfinite(golden_p).all()):
        raise PackagingError(f"the model's {what} outputs are not finite on the golden rows")
    if trained is not None and not bool(torch.isfinite(trained).all()):
        raise PackagingError(f"the model's {kind} outputs are not finite on every training row (the drift reference)")
    accuracy = None
    if golden_y is not None and kind == CLASSIFICATION:
        accuracy = round(float((golden_p[:, first].argmax(dim=1) == golden_y).float().mean()), 6)
    golden = {"features": golden_x.tolist(), "labels": None if golden_y is None else golden_y.tolist()}
    golden["probabilities" if kind == CLASSIFICATION and len(signatures) == 1 else "outputs"] = golden_p.tolist()
    meta = ModelMetadata(
        name=str(getattr(user_model, "model_name", "") or _kebab(type(user_model).__name__)),
        version=version,
        feature_names=feature_names,
        labels=labels,
        stats=stats,
        drift_reference=fit_reference(x, predicted, len(labels), output=signature, values=trained, specs=specs),
        golden=golden,
        accuracy=accuracy,
        provenance={
            "torch": torch.__version__,
            "python": platform.python_version(),
            "rtserve": rtserve.__version__,
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "packed_by": "rtserve.model.package.export",
            "model_class": f"{type(user_model).__module__}.{type(user_model).__qualname__}",
            "train_rows": len(x),
            "checked_batch_sizes": sizes,
            "tolerance": TOLERANCE,
        },
        format=FORMAT if outputs is None and not specs else FORMAT_V2,
        outputs=None if outputs is None and not specs else signatures,
        inputs=[spec.document() for spec in specs] or None,
    )
    meta.validate()
    meta.save(out / METADATA_FILE)
    logger.info(
        "exported %s %s (%d features, %s%s) -> %s",
        meta.name,
        version,
        len(feature_names),
        describe_outputs(signatures),
        "" if accuracy is None else f", golden-set accuracy {accuracy:.4f}",
        out,
    )
    return meta


def check(artifact_dir: str | Path, version: str | None = None) -> ModelMetadata:
    """Validate an artifact directory as the handler will load it, and replay its golden set.

    Raises:
        PackagingError: a file is missing or refused, ``version`` differs from ``meta.json``'s,
            the golden set's labels do not fit the output (the field named), or the program's
            answers on the golden set differ from the recorded ones.
    """
    directory = Path(artifact_dir)
    try:
        meta = ModelMetadata.load(directory / METADATA_FILE)
        forward = load_program(directory / PROGRAM_FILE)
    except ConfigError as exc:
        raise PackagingError(str(exc)) from exc
    if version is not None and version != meta.version:
        raise PackagingError(
            f"{directory}/{METADATA_FILE} is version {meta.version!r}, not "
            f"{version!r}: set MODEL_VERSION={meta.version} or export again"
        )
    golden = meta.golden or {}
    problem = golden_label_problem(meta.kind, meta.output["width"], golden)
    if problem:
        raise PackagingError(f"{directory}/{METADATA_FILE}: {problem}")
    rows = golden.get("features") or []
    if rows:
        with torch.inference_mode():
            got = answer_columns(meta.signature, forward(torch.tensor(rows, dtype=torch.float32)))
        want = torch.tensor(golden_values(golden), dtype=torch.float32)
        bad = (~torch.isclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)).any(dim=1)
        if got.shape != want.shape or bool(bad.any()):
            raise PackagingError(
                f"{directory}: the program's answers differ from the golden set "
                f"recorded at packaging time (rows {bad.nonzero().flatten().tolist()[:10]})"
            )
    return meta


def answer_tensor(kind: str, raw: torch.Tensor) -> torch.Tensor:
    """What an answer of ``kind`` carries for one output's raw columns ``[N, width]``.

    Softmax probabilities (classification), sigmoid probabilities (multi-label), the values
    themselves (regression, embedding): :func:`handler.model.answer_columns` for one output.
    """
    return answer_columns([{"kind": kind}], raw)


def describe_outputs(signatures: Sequence[dict]) -> str:
    """The outputs in a few words: ``regression output of width 1``, or ``2 outputs (digit: ..., ...)``."""
    if len(signatures) == 1:
        return f"{signatures[0]['kind']} output of width {signatures[0]['width']}"
    each = ", ".join(f"{s['name']}: {s['kind']} of width {s['width']}" for s in signatures)
    return f"{len(signatures)} outputs ({each})"


# --------------------------------------------------------------------------- checks

#: The keys each output kind takes in ``outputs=`` (``kind`` included).
_OUTPUT_KEYS = {
    CLASSIFICATION: {"kind", "labels"},
    MULTI_LABEL: {"kind", "labels", "threshold"},
    REGRESSION: {"kind", "targets"},
    EMBEDDING: {"kind"},
}


def _output_signatures(labels: Any, outputs: Any) -> list[dict]:
    """Each output's signature (without its width) from ``labels=`` or ``outputs=``, in column order.

    Raises:
        PackagingError: neither or both given, no output, a bad name, an unknown kind or key, bad
            labels, targets or threshold (the field named).
    """
    if (labels is None) == (outputs is None):
        raise PackagingError(
            'give either labels (one classification output) or outputs ({name: {"kind": ...}}), not both or neither'
        )
    if outputs is None:
        labels = _names(labels, "labels")
        if len(labels) < 2:
            raise PackagingError("labels must name at least two classes")
        return [{"name": "probabilities", "kind": CLASSIFICATION, "labels": labels}]
    if not isinstance(outputs, dict) or not outputs:
        raise PackagingError('outputs must be a dict {name: {"kind": ...}} naming one output or several')
    return [_one_output(name, spec) for name, spec in outputs.items()]


def _one_output(name: Any, spec: Any) -> dict:
    """One output's signature (without its width) from its ``outputs=`` entry.

    Raises:
        PackagingError: as :func:`_output_signatures`.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", name):
        raise PackagingError(
            f"outputs: the output's name must be 1-64 letters, digits, '_', '.' or '-' "
            f"starting with a letter or '_', got {name!r}"
        )
    where = f"outputs[{name!r}]"
    if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
        got = spec.get("kind") if isinstance(spec, dict) else spec
        raise PackagingError(f"{where}.kind must be one of {', '.join(KINDS)}, got {got!r}")
    kind = spec["kind"]
    unknown = sorted(set(spec) - _OUTPUT_KEYS[kind])
    if unknown:
        raise PackagingError(
            f"{where}: {', '.join(map(repr, unknown))} is not a key of a {kind} output "
            f"(it takes {', '.join(sorted(_OUTPUT_KEYS[kind]))})"
        )
    signature = {"name": name, "kind": kind}
    if kind in (CLASSIFICATION, MULTI_LABEL):
        if "labels" not in spec:
            raise PackagingError(f"{where}.labels is required for a {kind} output")
        signature["labels"] = _names(spec["labels"], f"{where}.labels")
        if kind == CLASSIFICATION and len(signature["labels"]) < 2:
            raise PackagingError(f"{where}.labels must name at least two classes")
    if kind == MULTI_LABEL:
        threshold = spec.get("threshold", 0.5)
        if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0 < threshold < 1:
            raise PackagingError(f"{where}.threshold must be a number in (0, 1), got {threshold!r}")
        signature["threshold"] = float(threshold)
    if kind == REGRESSION and spec.get("targets") is not None:
        signature["targets"] = _names(spec["targets"], f"{where}.targets")
    return signature


def _matrix(values: Any, what: str) -> torch.Tensor:
    try:
        x = torch.as_tensor(values).to(torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PackagingError(f"{what} must be a 2-D array of numbers: {exc}") from exc
    if x.dim() != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise PackagingError(
            f"{what} must be a 2-D array [rows, features] with at least two rows, got shape {list(x.shape)}"
        )
    return x.contiguous()


def _names(values: Any, what: str) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise PackagingError(f"{what} must be a list of strings")
    names = list(values)
    bad = [v for v in names if not isinstance(v, str) or not v.strip()]
    if bad:
        raise PackagingError(f"{what} must be non-empty strings, got {bad[0]!r}")
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise PackagingError(f"{what} must be unique: {', '.join(map(repr, repeated))} appear more than once")
    return names


def _stats(x: torch.Tensor, names: list[str]) -> dict:
    x64 = x.double()
    stats = {"mean": x64.mean(dim=0), "std": x64.std(dim=0), "min": x64.min(dim=0).values, "max": x64.max(dim=0).values}
    finite = torch.stack([v.isfinite() & (v.abs() < torch.finfo(torch.float32).max) for v in stats.values()]).all(dim=0)
    if not bool(finite.all()):
        bad = [names[i] for i in (~finite).nonzero().flatten().tolist()]
        raise PackagingError(
            f"training statistics are not finite for feature(s) {', '.join(map(repr, bad[:5]))}"
            f"{' ...' if len(bad) > 5 else ''}: train_features holds NaN or infinite values (or "
            "values beyond float32); drop or impute those rows before packaging"
        )
    return {k: v.tolist() for k, v in stats.items()}


def _output_widths(model: nn.Module | Any, x: torch.Tensor, signatures: list[dict]) -> None:
    """Run the model on ``x``, check its output(s) against ``signatures`` and set each one's ``width``.

    One output: one tensor ``[N, width]``. Several: a tuple (or list) of such tensors in the
    signatures' order, or a dict of them by name.

    Raises:
        PackagingError: the model fails, or returns another number of tensors or other names than
            the signatures give, or a tensor that does not fit its output (the output named).
    """
    try:
        out = model(x)
    except Exception as exc:
        raise PackagingError(f"the model fails on train_features rows of shape {list(x.shape)}: {exc}") from exc
    if len(signatures) == 1:
        signatures[0]["width"] = _checked(out, len(x), signatures[0]).shape[1]
        return
    names = [s["name"] for s in signatures]
    listed = f"outputs names {len(names)} ({', '.join(map(repr, names))})"
    if isinstance(out, dict):
        if set(out) != set(names):
            raise PackagingError(
                f"the model returns a dict of {', '.join(map(repr, out)) or 'nothing'} but {listed}: "
                "return one tensor per output, keyed by its name"
            )
        parts = [out[name] for name in names]
    elif isinstance(out, (tuple, list)):
        if len(out) != len(names):
            raise PackagingError(
                f"the model returns {len(out)} tensors but {listed}: return one tensor per output, in that order"
            )
        parts = list(out)
    else:
        got = f"one tensor {list(out.shape)}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise PackagingError(
            f"the model returns {got} but {listed}: return a tuple of tensors in that order, or a dict by name"
        )
    for signature, part in zip(signatures, parts):
        signature["width"] = _checked(part, len(x), signature, several=True).shape[1]


def _checked(out: Any, rows: int, signature: dict, several: bool = False) -> torch.Tensor:
    """One output's tensor, checked against its ``signature`` (``several``: name the output in errors)."""
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != rows:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        if several:
            raise PackagingError(f"the model's output {signature['name']!r} must be one tensor [N, width], got {shape}")
        raise PackagingError(f"the model must return one tensor [N, C], got {shape}")
    for key in ("labels", "targets"):
        names = signature.get(key)
        if names is not None and out.shape[1] != len(names):
            v1 = signature["name"] == "probabilities" and key == "labels" and not several  # labels=, as before
            where = "labels" if v1 else f"outputs[{signature['name']!r}].{key}"
            raise PackagingError(
                f"{where} has {len(names)} entries but the model returns {out.shape[1]} "
                f"{'logits' if v1 else 'values'} per row: give one {'label' if v1 else 'name'} per output column"
            )
    if not bool(torch.isfinite(out).all()):
        raise PackagingError(f"the model returns non-finite outputs on training rows (output {signature['name']!r})")
    return out


def _holdout(holdout: Any, n_features: int, signature: dict) -> tuple:
    """The holdout's rows, and their truth per kind (None for an embedding).

    Class indices (classification, a long tensor); targets as float64 ``[rows]`` for one
    target or ``[rows, width]`` (regression); 0/1 ``[rows, width]`` (multi-label).

    Raises:
        PackagingError: the holdout is not a pair of features and truth of the output's shape
            (the field named: ``holdout features``, ``holdout labels``, ``holdout targets``).
    """
    if holdout is None:
        return None, None
    if not isinstance(holdout, (tuple, list)) or len(holdout) != 2:
        raise PackagingError("holdout must be a pair (features, labels)")
    hx = _matrix(holdout[0], "holdout features")
    kind, width = signature["kind"], signature["width"]
    if kind == EMBEDDING and holdout[1] is None:  # an embedding has no truth to keep
        return hx, None
    if kind != CLASSIFICATION:
        try:
            count = len(holdout[1])
        except TypeError as exc:
            raise PackagingError(f"holdout {_TRUTH[kind]} must be one entry per row: {exc}") from exc
        if hx.shape[1] != n_features or count != len(hx):
            raise PackagingError(
                f"holdout must hold [rows, {n_features}] features and one target per "
                f"row, got {list(hx.shape)} and {count} targets"
            )
        return hx, None if kind == EMBEDDING else _truth(holdout[1], len(hx), kind, width)
    try:
        hy = torch.as_tensor(holdout[1]).long().flatten()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PackagingError(f"holdout labels must be class indices: {exc}") from exc
    if hx.shape[1] != n_features or len(hy) != len(hx):
        raise PackagingError(
            f"holdout must hold [rows, {n_features}] features and one label per "
            f"row, got {list(hx.shape)} and {len(hy)} labels"
        )
    if len(hy) and not (0 <= int(hy.min()) and int(hy.max()) < width):
        raise PackagingError(f"holdout labels must be class indices in [0, {width - 1}]")
    return hx, hy


#: What a holdout's truth is called per kind, in errors.
_TRUTH = {REGRESSION: "targets", MULTI_LABEL: "labels", EMBEDDING: "targets"}


def _truth(values: Any, rows: int, kind: str, width: int) -> torch.Tensor:
    """A regression's targets or a multi-label's 0/1 rows, checked against the output's ``width``."""
    what = f"holdout {_TRUTH[kind]}"
    try:
        y = torch.as_tensor(values).to(torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PackagingError(f"{what} must be numbers, one row per holdout row: {exc}") from exc
    if y.dim() == 1 and width == 1 and kind == REGRESSION:
        y = y.unsqueeze(1)
    if y.dim() != 2 or list(y.shape) != [rows, width]:
        per = "per row (one per output column)"
        raise PackagingError(f"{what} must be {width} numbers {per}, got shape {list(y.shape)}")
    if kind == REGRESSION:
        bad = (~torch.isfinite(y)).any(dim=1).nonzero().flatten().tolist()
        if bad:
            raise PackagingError(f"{what} must be finite numbers: row {bad[0]} is not")
        return y.squeeze(1) if width == 1 else y
    bad = ((y != 0) & (y != 1)).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise PackagingError(f"{what} must be 0 or 1 per label: row {bad[0]} is not")
    return y.long()


class FlatInputs(nn.Module):
    """A model with named inputs behind one float32 row per request (what the handler sends).

    Splits the row in signature order, restores each input's shape and dtype (ids and booleans
    travel as exact floats) and calls ``model(**inputs)``. A sequence, the last input, takes the
    rest of the row, whatever its length (the handler cuts a batch after its longest sequence);
    with ``lengths`` the model also gets ``{name}_lengths``, int64 ``[N]``: each row's positions up
    to its last that is not all padding.
    """

    def __init__(self, model: nn.Module, specs: Sequence[InputSpec], lengths: bool = False) -> None:
        super().__init__()
        self.model = model
        self.lengths = lengths
        self.layout, start = [], 0
        for spec in specs:
            stop = None if spec.sequence else start + spec.width
            shape = (-1, *spec.shape[1:]) if spec.sequence else spec.shape
            self.layout.append((spec.name, start, stop, shape, spec.dtype, spec.padding if spec.sequence else None))
            start += spec.width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output for rows ``[N, width]`` (a sequence cut to any length of at least 2)."""
        named = {}
        for name, start, stop, shape, dtype, padding in self.layout:
            part = x[:, start:stop].unflatten(1, shape)
            if padding is not None and self.lengths:
                used = (part != padding).flatten(2).any(dim=2) if part.dim() > 2 else part != padding
                positions = torch.arange(1, part.shape[1] + 1, device=x.device)
                named[f"{name}_lengths"] = (used * positions).amax(dim=1)
            named[name] = part.to(torch.int64) if dtype == INT64 else part != 0 if dtype == BOOL else part
        return self.model(**named)


class FlatOutputs(nn.Module):
    """A model with several outputs behind one tensor ``[N, sum of widths]`` (what the program returns).

    ``model`` returns a tuple (or list) of ``[N, width]`` tensors, one per output in ``names``'
    order, or a dict of them by name; they are concatenated side by side in that order. The
    handler splits the columns again by ``meta.json``'s ``outputs`` widths.
    """

    def __init__(self, model: nn.Module, names: Sequence[str]) -> None:
        super().__init__()
        self.model = model
        self.names = list(names)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Every output's columns side by side, for rows ``[N, F]``."""
        out = self.model(x)
        parts = [out[name] for name in self.names] if isinstance(out, dict) else list(out)
        return torch.cat(parts, dim=1)


#: The keys a named input's dict takes besides ``rows``.
_INPUT_KEYS = {"rows", "vocabulary", "image", "padding", "max_length", "lengths"}
_INPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _input_specs(inputs: Any) -> tuple[tuple[InputSpec, ...], list[torch.Tensor], bool]:
    """The named inputs' specs (a sequence last), training rows, and whether the model takes its lengths.

    Raises:
        PackagingError: not a dict of tensors or ``{"rows": ...}`` dicts with one row count, a bad
            name, dtype or encoding (the input named).
    """
    if not isinstance(inputs, dict) or not inputs:
        raise PackagingError("inputs must be a dict {name: training rows} naming at least one input")
    documents, parts = [], []
    for name, value in inputs.items():
        where = f"inputs[{name!r}]"
        if not isinstance(name, str) or not _INPUT_NAME.fullmatch(name):
            raise PackagingError(f"{where}: an input's name must be a Python identifier (model.forward takes it)")
        options = dict(value) if isinstance(value, dict) else {"rows": value}
        unknown = sorted(set(options) - _INPUT_KEYS)
        if unknown or "rows" not in options:
            raise PackagingError(f"{where} must be a tensor or a dict with 'rows' (and 'vocabulary' or 'image')")
        try:
            rows = torch.as_tensor(options["rows"])
        except (TypeError, ValueError, RuntimeError) as exc:
            raise PackagingError(f"{where}: rows must be an array: {exc}") from exc
        if rows.dim() < 2 or len(rows) < 2:
            raise PackagingError(f"{where}: rows must be [rows, ...] with at least two rows, got {list(rows.shape)}")
        dtype = BOOL if rows.dtype == torch.bool else FLOAT32 if rows.is_floating_point() else INT64
        document = {"name": name, "dtype": dtype, "shape": list(rows.shape[1:])}
        if dtype == INT64:
            if int(rows.min()) < 0:
                raise PackagingError(f"{where}: ids must be at least 0, got {int(rows.min())}")
            vocabulary = options.get("vocabulary") or int(rows.max()) + 1
            document["vocabulary"] = (
                [int(v) for v in vocabulary] if isinstance(vocabulary, (list, tuple)) else int(vocabulary)
            )
        elif "vocabulary" in options:
            raise PackagingError(f"{where}: a vocabulary is for integer ids, the rows are {rows.dtype}")
        if "image" in options:
            image = options["image"] if isinstance(options["image"], dict) else {}
            document["image"] = {"scale": float(image.get("scale", 1 / 255)), "offset": float(image.get("offset", 0.0))}
        if "padding" in options:  # a sequence: its rows padded to their longest, or to max_length
            document.update(shape=[-1, *rows.shape[2:]], padding=options["padding"])
            document["max_length"] = options.get("max_length") or rows.shape[1]
            if document["max_length"] < rows.shape[1]:
                raise PackagingError(
                    f"{where}: rows are {rows.shape[1]} long, beyond max_length {document['max_length']}"
                )
            if rows.shape[1] < document["max_length"]:
                pad = torch.full(
                    (len(rows), document["max_length"] - rows.shape[1], *rows.shape[2:]), options["padding"]
                )
                rows = torch.cat([rows, pad.to(rows.dtype)], dim=1)
        elif "max_length" in options or "lengths" in options:
            raise PackagingError(f"{where}: max_length and lengths are for a sequence: give its padding value")
        documents.append(document)
        parts.append(rows)
    if len({len(p) for p in parts}) != 1:
        raise PackagingError(f"inputs must hold the same number of rows, got {[len(p) for p in parts]}")
    order = sorted(range(len(documents)), key=lambda i: "padding" in documents[i])  # a sequence last
    documents, parts = [documents[i] for i in order], [parts[i] for i in order]
    try:
        specs = specs_from_meta(documents)
    except ConfigError as exc:
        raise PackagingError(str(exc).replace("meta.json: ", "")) from exc
    for spec, rows in zip(specs, parts):
        if spec.vocabulary is None:
            continue
        tops = torch.tensor(spec.vocabulary if isinstance(spec.vocabulary, tuple) else [spec.vocabulary])
        highest = rows.reshape(-1, len(tops)).amax(dim=0) if len(tops) > 1 else rows.max().reshape(1)
        if bool((highest >= tops).any()):
            column = int((highest >= tops).nonzero()[0])
            raise PackagingError(
                f"inputs[{spec.name!r}]: an id {int(highest[column])} is beyond the vocabulary "
                f"{int(tops[column])}{f' of column {column}' if len(tops) > 1 else ''}"
            )
    lengths = any(isinstance(v, dict) and v.get("lengths") for v in inputs.values())
    return specs, parts, lengths


def _named_rows(value: Any, specs: Sequence[InputSpec], what: str) -> list[torch.Tensor]:
    """A holdout's named inputs as tensors of each spec's shape, in signature order."""
    if not isinstance(value, dict) or set(value) != {s.name for s in specs}:
        raise PackagingError(f"{what} must be a dict with the inputs {', '.join(s.name for s in specs)}")
    parts = []
    for spec in specs:
        rows = torch.as_tensor(value[spec.name])
        if spec.sequence and rows.dim() >= 2 and 0 < rows.shape[1] <= spec.max_length:
            missing = (len(rows), spec.max_length - rows.shape[1], *rows.shape[2:])
            rows = torch.cat([rows, torch.full(missing, spec.padding).to(rows.dtype)], dim=1)
        if list(rows.shape[1:]) != list(spec.padded_shape):
            shape = ", ".join(map(str, spec.padded_shape))
            raise PackagingError(f"{what}[{spec.name!r}] must be [rows, {shape}], got {list(rows.shape)}")
        parts.append(rows)
    return parts


def _flat(parts: list[torch.Tensor]) -> torch.Tensor:
    """Named inputs' rows as one float32 matrix, each flattened, in order."""
    return torch.cat([p.reshape(len(p), -1).to(torch.float32) for p in parts], dim=1)


def _check_forward(model: nn.Module, specs: Sequence[InputSpec], lengths: bool) -> None:
    """Refuse a model whose ``forward`` cannot take the named inputs (and lengths) as keyword arguments."""
    names = [spec.name for spec in specs] + [f"{spec.name}_lengths" for spec in specs if spec.sequence and lengths]
    try:
        inspect.signature(model.forward).bind(**dict.fromkeys(names))
    except TypeError as exc:
        raise PackagingError(f"model.forward must take the inputs by name ({', '.join(names)}): {exc}") from exc
    except ValueError:  # no signature to read (a builtin): the export says what fails
        pass


def _export(
    model: nn.Module, sample: torch.Tensor, sequence: tuple[int, InputSpec] | None = None
) -> torch.export.ExportedProgram:
    """``torch.export`` with a dynamic batch, and with ``sequence`` ``(first column, spec)`` a dynamic width."""
    batch = torch.export.Dim("batch", min=1)
    dims = {0: batch}
    if sequence is not None:
        start, spec = sequence
        length = torch.export.Dim("length", min=MIN_BATCH_LENGTH, max=spec.max_length)
        width = length if spec.inner == 1 else length * spec.inner
        dims[1] = width + start if start else width
    try:
        return torch.export.export(model, (sample,), dynamic_shapes=(dims,), strict=False)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PackagingError(
            f"the model cannot be exported with torch.export ({type(exc).__name__}: {first}). "
            "The forward pass must take one [N, F] float tensor and return one [N, C] tensor, "
            "with no Python control flow that depends on tensor values or on N; see "
            "https://pytorch.org/docs/stable/export.html"
        ) from exc


def _check_sizes(model_config: Path) -> list[int]:
    """Batch sizes the exported program is checked on, from ``model_config``.

    1, the server's batchSize, and the most rows one batch can hold (batchSize requests of
    ``handler.max_instances`` instances). A config the handler refuses is the archive's problem,
    not the export's (the worker refuses it at load): the demo's sizes are checked instead.

    Raises:
        PackagingError: the model config cannot be read.
    """
    try:
        model_yaml = yaml.safe_load(model_config.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PackagingError(f"cannot read the model config {model_config}: {exc}") from exc
    try:
        batch = int(model_yaml.get("batchSize", 1))
        rows = batch * HandlerConfig.from_model_yaml(model_yaml).max_instances
    except (ConfigError, AttributeError, TypeError, ValueError) as exc:
        if Path(model_config).resolve() == MODEL_CONFIG.resolve():
            raise
        logger.warning(
            "%s: %s: checking the demo's batch sizes instead (the handler will refuse "
            "this model config when the archive loads)",
            model_config,
            exc,
        )
        return _check_sizes(MODEL_CONFIG)
    return sorted({1, batch, rows})


def _compare(model: nn.Module, forward: Any, x: torch.Tensor, what: str) -> None:
    with torch.inference_mode():
        want = model(x)
        got = forward(x)
    if got.shape != want.shape or not torch.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
        diff = (got - want).abs().max().item() if got.shape == want.shape else "shape"
        raise PackagingError(
            f"the exported program differs from the eager model on {what} "
            f"(max |difference| {diff}, tolerance {TOLERANCE}): make the forward "
            "pass deterministic and independent of the batch size"
        )


def _kebab(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", name).lower()


# --------------------------------------------------------------------------- command line


def load_entry(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise PackagingError(f"expected MODULE:FUNCTION, got {spec!r}")
    sys.path.insert(0, str(Path.cwd()))
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PackagingError(f"cannot import {spec}: {exc}") from exc
