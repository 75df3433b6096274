"""The model definition and the metadata that travels with its weights (no TorchServe import)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from handler.errors import ConfigError


class RealTimeClassifier(nn.Module):
    """The seed's classifier: Linear -> ReLU -> Linear (32 inputs, 64 hidden, 3 classes by default)."""

    def __init__(self, n_features: int = 32, hidden: int = 64, n_classes: int = 3) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return logits of shape ``[batch, n_classes]``."""
        return self.net(x)


@dataclass
class ModelMetadata:
    """What the handler needs beside the weights, written by training into ``meta.json``."""

    feature_names: list[str]
    labels: list[str]
    mean: list[float]
    std: list[float]
    hidden: int
    version: str = ""
    accuracy: float | None = None
    training: dict = field(default_factory=dict)
    #: Training distribution for drift scoring: see :func:`handler.drift.fit_reference`.
    drift_reference: dict = field(default_factory=dict)

    @property
    def n_features(self) -> int:
        """Number of input features."""
        return len(self.feature_names)

    def validate(self) -> None:
        """Check internal consistency.

        Raises:
            ConfigError: a field is missing, of the wrong length, or not finite.
        """
        n = len(self.feature_names)
        if n == 0 or len(set(self.feature_names)) != n:
            raise ConfigError("meta.json: feature_names must be non-empty and unique")
        if len(self.labels) < 2:
            raise ConfigError("meta.json: labels must name at least two classes")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) != n or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
                raise ConfigError(f"meta.json: {name} must hold {n} finite numbers")
        if any(v <= 0 for v in self.std):
            raise ConfigError("meta.json: std values must be positive")
        if not isinstance(self.hidden, int) or self.hidden <= 0:
            raise ConfigError("meta.json: hidden must be a positive integer")

    @classmethod
    def load(cls, path: str | Path) -> "ModelMetadata":
        """Read and validate ``meta.json``.

        Raises:
            ConfigError: the file is missing, not JSON, or inconsistent.
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"model metadata not found: {path}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model metadata is not valid JSON: {path}: {exc}") from exc
        known = set(cls.__dataclass_fields__)
        try:
            meta = cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as exc:
            raise ConfigError(f"model metadata is incomplete: {path}: {exc}") from exc
        meta.validate()
        return meta

    def save(self, path: str | Path) -> None:
        """Write ``meta.json`` (sorted keys, so identical training gives identical bytes)."""
        Path(path).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    def build_model(self) -> RealTimeClassifier:
        """An untrained model with this metadata's shape."""
        return RealTimeClassifier(self.n_features, self.hidden, len(self.labels))


def load_model(weights: str | Path, meta: ModelMetadata) -> RealTimeClassifier:
    """Build the model and load its weights safely (``weights_only=True``), in eval mode.

    Raises:
        ConfigError: the weights are missing or do not fit the metadata's shape.
    """
    model = meta.build_model()
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    except FileNotFoundError as exc:
        raise ConfigError(f"model weights not found: {weights}") from exc
    except Exception as exc:  # corrupt file, unpickling refused, wrong shapes: all a bad archive
        raise ConfigError(f"model weights cannot be loaded from {weights}: {exc}") from exc
    model.eval()
    return model


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with its Linear layers dynamically quantized to int8 (CPU).

    ``torch.ao.quantization`` warns that it is deprecated in favour of torchao (not a dependency
    here); the warning is silenced for this one call.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
