"""Package any tabular classifier as an rtserve model artifact (the contract in handler/model.py).

    from rtserve.model.package import export
    export(model, train_features, feature_names=[...], labels=[...], version="1.0",
           out_dir="artifacts/my-model/1.0", holdout=(x_test, y_test))

writes ``model.pt2`` (a ``torch.export`` program with a dynamic batch dimension) and
``meta.json``. ``make archive MODEL_NAME=my-model MODEL_VERSION=1.0 ARTIFACTS=<dir>`` packs the
directory into a TorchServe archive. The command-line form packages a model that a function in
your own module builds:

    python -m rtserve model export my_module:packaging --version 1.0 --out artifacts/my-model/1.0
    python -m rtserve model check artifacts/my-model/1.0 --version 1.0

``my_module.packaging()`` returns a dict with ``model``, ``train_features``, ``feature_names``,
``labels`` and optionally ``holdout``. See docs/bring-your-own-model.md.
"""

from __future__ import annotations

import datetime
import importlib
import logging
import platform
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import torch
import yaml
from torch import nn

import rtserve
from handler.config import HandlerConfig
from handler.drift import fit_reference
from handler.errors import ConfigError
from handler.model import (FORMAT, METADATA_FILE, PROGRAM_FILE, ModelMetadata,
                           load_program)
from rtserve.errors import PackagingError
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
    """``(x - mean) / std`` with the statistics as buffers: put it first in a model so the
    exported program takes raw features (``Standardize.fit(train_features)``)."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32).clone())
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).clone())

    @classmethod
    def fit(cls, train_features: torch.Tensor) -> "Standardize":
        """Per-column mean and standard deviation of ``train_features`` (a zero std becomes 1)."""
        x = torch.as_tensor(train_features, dtype=torch.float32)
        std = x.std(dim=0)
        return cls(x.mean(dim=0), torch.where(std > 0, std, torch.ones_like(std)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Standardize ``[N, F]`` raw features."""
        return (x - self.mean) / self.std


def export(
    model: nn.Module,
    train_features: Any,
    *,
    feature_names: Sequence[str],
    labels: Sequence[str],
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
            statistics (explanation baseline, drift reference) come from them.
        feature_names: ``F`` unique names, the keys of explanations and drift metrics.
        labels: ``C`` unique class labels, in output column order.
        version: the model version (letters, digits, ``.``, ``_``, ``-``).
        out_dir: the artifact directory (created; ``model.pt2`` and ``meta.json`` replaced).
        holdout: ``(features, labels)`` held out from training: the golden set and its accuracy.
            Without it the golden set is a sample of ``train_features`` and no accuracy is kept.
        model_config: the model config the archive will carry (``make archive MODEL_CONFIG=``):
            the exported program is checked on the batch sizes it lets TorchServe form
            (default :data:`MODEL_CONFIG`, the demo's).

    Returns:
        The metadata written to ``meta.json``.

    Raises:
        PackagingError: bad names, labels that do not match the output width, non-finite
            statistics, a model that cannot be exported, or an exported program that differs
            from the eager model by more than :data:`TOLERANCE`.
    """
    if not isinstance(model, nn.Module):
        raise PackagingError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise PackagingError(f"version must be 1-64 letters, digits, '.', '_' or '-' "
                             f"starting with a letter or digit, got {version!r}")
    x = _matrix(train_features, "train_features")
    feature_names = _names(feature_names, "feature_names")
    labels = _names(labels, "labels")
    if len(feature_names) != x.shape[1]:
        raise PackagingError(f"feature_names has {len(feature_names)} names but train_features "
                             f"has {x.shape[1]} columns: give one name per column")
    if len(labels) < 2:
        raise PackagingError("labels must name at least two classes")
    stats = _stats(x, feature_names)
    model = model.eval()
    sample = x[:SAMPLE_ROWS]
    with torch.inference_mode():
        _logits(model, sample, len(labels))  # a clear error for a wrong output, before export
    holdout_x, holdout_y = _holdout(holdout, x.shape[1], len(labels))

    program = _export(model, x[:8].clone())  # the sample inputs saved with it: keep them small
    sizes = _check_sizes(Path(model_config or MODEL_CONFIG))
    g = torch.Generator().manual_seed(0)
    checks = {"sample": sample}
    for size in sizes:
        checks[f"batch of {size}"] = x[torch.randint(len(x), (size,), generator=g)]
    module = program.module()
    for what, rows in checks.items():
        _compare(model, module, rows, what)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(out / PROGRAM_FILE))
    forward = load_program(out / PROGRAM_FILE)  # what the handler will run, through its loader
    _compare(model, forward, sample, "the saved and reloaded program")

    if holdout_x is not None:
        golden_x, golden_y = holdout_x[:GOLDEN_ROWS], holdout_y[:GOLDEN_ROWS]
    else:
        golden_x = x[torch.randperm(len(x), generator=g)[:GOLDEN_ROWS]]
        golden_y = None
    with torch.inference_mode():
        golden_p = torch.softmax(forward(golden_x), dim=1)
        predicted = forward(x).argmax(dim=1)
    accuracy = (None if golden_y is None
                else round(float((golden_p.argmax(dim=1) == golden_y).float().mean()), 6))
    meta = ModelMetadata(
        name=str(getattr(model, "model_name", "") or _kebab(type(model).__name__)),
        version=version,
        feature_names=feature_names,
        labels=labels,
        stats=stats,
        drift_reference=fit_reference(x, predicted, len(labels)),
        golden={"features": golden_x.tolist(),
                "labels": None if golden_y is None else golden_y.tolist(),
                "probabilities": golden_p.tolist()},
        accuracy=accuracy,
        provenance={
            "torch": torch.__version__,
            "python": platform.python_version(),
            "rtserve": rtserve.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "packed_by": "rtserve.model.package.export",
            "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
            "train_rows": len(x),
            "checked_batch_sizes": sizes,
            "tolerance": TOLERANCE,
        },
        format=FORMAT,
    )
    meta.validate()
    meta.save(out / METADATA_FILE)
    logger.info("exported %s %s (%d features, %d classes%s) -> %s", meta.name, version,
                len(feature_names), len(labels),
                "" if accuracy is None else f", golden-set accuracy {accuracy:.4f}", out)
    return meta


def check(artifact_dir: str | Path, version: str | None = None) -> ModelMetadata:
    """Validate an artifact directory as the handler will load it, and replay its golden set.

    Raises:
        PackagingError: a file is missing or refused, ``version`` differs from ``meta.json``'s,
            or the program's answers on the golden set differ from the recorded ones.
    """
    directory = Path(artifact_dir)
    try:
        meta = ModelMetadata.load(directory / METADATA_FILE)
        forward = load_program(directory / PROGRAM_FILE)
    except ConfigError as exc:
        raise PackagingError(str(exc)) from exc
    if version is not None and version != meta.version:
        raise PackagingError(f"{directory}/{METADATA_FILE} is version {meta.version!r}, not "
                             f"{version!r}: set MODEL_VERSION={meta.version} or export again")
    golden = meta.golden or {}
    rows = golden.get("features") or []
    if rows:
        with torch.inference_mode():
            got = torch.softmax(forward(torch.tensor(rows, dtype=torch.float32)), dim=1)
        want = torch.tensor(golden["probabilities"], dtype=torch.float32)
        bad = (~torch.isclose(got, want, rtol=TOLERANCE, atol=TOLERANCE)).any(dim=1)
        if got.shape != want.shape or bool(bad.any()):
            raise PackagingError(f"{directory}: the program's answers differ from the golden set "
                                 f"recorded at packaging time (rows {bad.nonzero().flatten().tolist()[:10]})")
    return meta


# --------------------------------------------------------------------------- checks


def _matrix(values: Any, what: str) -> torch.Tensor:
    try:
        x = torch.as_tensor(values).to(torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PackagingError(f"{what} must be a 2-D array of numbers: {exc}") from exc
    if x.dim() != 2 or x.shape[0] < 2 or x.shape[1] < 1:
        raise PackagingError(f"{what} must be a 2-D array [rows, features] with at least two "
                             f"rows, got shape {list(x.shape)}")
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
        raise PackagingError(f"{what} must be unique: {', '.join(map(repr, repeated))} "
                             "appear more than once")
    return names


def _stats(x: torch.Tensor, names: list[str]) -> dict:
    x64 = x.double()
    stats = {"mean": x64.mean(dim=0), "std": x64.std(dim=0),
             "min": x64.min(dim=0).values, "max": x64.max(dim=0).values}
    finite = torch.stack([v.isfinite() & (v.abs() < torch.finfo(torch.float32).max)
                          for v in stats.values()]).all(dim=0)
    if not bool(finite.all()):
        bad = [names[i] for i in (~finite).nonzero().flatten().tolist()]
        raise PackagingError(
            f"training statistics are not finite for feature(s) {', '.join(map(repr, bad[:5]))}"
            f"{' ...' if len(bad) > 5 else ''}: train_features holds NaN or infinite values (or "
            "values beyond float32); drop or impute those rows before packaging")
    return {k: v.tolist() for k, v in stats.items()}


def _logits(model: nn.Module | Any, x: torch.Tensor, n_classes: int) -> torch.Tensor:
    try:
        out = model(x)
    except Exception as exc:
        raise PackagingError(f"the model fails on train_features rows of shape "
                             f"{list(x.shape)}: {exc}") from exc
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != len(x):
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise PackagingError(f"the model must return one tensor of logits [N, C], got {shape}")
    if out.shape[1] != n_classes:
        raise PackagingError(f"labels has {n_classes} entries but the model returns "
                             f"{out.shape[1]} logits per row: give one label per output column")
    if not bool(torch.isfinite(out).all()):
        raise PackagingError("the model returns non-finite logits on training rows")
    return out


def _holdout(holdout: Any, n_features: int, n_classes: int) -> tuple:
    if holdout is None:
        return None, None
    if not isinstance(holdout, (tuple, list)) or len(holdout) != 2:
        raise PackagingError("holdout must be a pair (features, labels)")
    hx = _matrix(holdout[0], "holdout features")
    try:
        hy = torch.as_tensor(holdout[1]).long().flatten()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PackagingError(f"holdout labels must be class indices: {exc}") from exc
    if hx.shape[1] != n_features or len(hy) != len(hx):
        raise PackagingError(f"holdout must hold [rows, {n_features}] features and one label per "
                             f"row, got {list(hx.shape)} and {len(hy)} labels")
    if len(hy) and not (0 <= int(hy.min()) and int(hy.max()) < n_classes):
        raise PackagingError(f"holdout labels must be class indices in [0, {n_classes - 1}]")
    return hx, hy


def _export(model: nn.Module, sample: torch.Tensor) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1)
    try:
        return torch.export.export(model, (sample,), dynamic_shapes=({0: batch},), strict=False)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PackagingError(
            f"the model cannot be exported with torch.export ({type(exc).__name__}: {first}). "
            "The forward pass must take one [N, F] float tensor and return one [N, C] tensor, "
            "with no Python control flow that depends on tensor values or on N; see "
            "https://pytorch.org/docs/stable/export.html") from exc


def _check_sizes(model_config: Path) -> list[int]:
    """Batch sizes the exported program is checked on: 1, the server's batchSize, and the most
    rows one batch can hold (batchSize requests of ``handler.max_instances`` instances), from
    ``model_config``. A config the handler refuses is the archive's problem, not the export's
    (the worker refuses it at load, naming the setting): the demo's sizes are checked instead.

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
        logger.warning("%s: %s: checking the demo's batch sizes instead (the handler will refuse "
                       "this model config when the archive loads)", model_config, exc)
        return _check_sizes(MODEL_CONFIG)
    return sorted({1, batch, rows})


def _compare(model: nn.Module, forward: Any, x: torch.Tensor, what: str) -> None:
    with torch.inference_mode():
        want = model(x)
        got = forward(x)
    if got.shape != want.shape or not torch.allclose(got, want, rtol=TOLERANCE, atol=TOLERANCE):
        diff = (got - want).abs().max().item() if got.shape == want.shape else "shape"
        raise PackagingError(f"the exported program differs from the eager model on {what} "
                             f"(max |difference| {diff}, tolerance {TOLERANCE}): make the forward "
                             "pass deterministic and independent of the batch size")


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
