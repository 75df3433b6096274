"""The handler's typed configuration, built once from the model-config YAML ``handler:`` section."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from handler.errors import ConfigError
from handler.schema import DEFAULT_FEATURE_LIMIT


@dataclass(frozen=True)
class HandlerConfig:
    """Settings of :class:`RealTimeHandler`; every field has a production default.

    Attributes:
        torchscript: run a TorchScript-compiled copy of the model instead of eager mode.
        quantize: dynamic int8 quantization of the Linear layers (weights int8, activations
            quantized on the fly); changes the answers slightly (see README, Performance).
        num_threads: torch intra-op threads per worker.
        warmup_batches: forward passes run at initialize so the first request is not slow.
        feature_limit: largest accepted magnitude of a feature value.
        log_batches: log one line per batch with its size (shows that batching happens).
    """

    torchscript: bool = False
    quantize: bool = False
    num_threads: int = 1
    warmup_batches: int = 3
    feature_limit: float = DEFAULT_FEATURE_LIMIT
    log_batches: bool = True

    @classmethod
    def from_model_yaml(cls, model_yaml: Mapping[str, Any] | None) -> "HandlerConfig":
        """Build from the whole model-config YAML (TorchServe's ``context.model_yaml_config``).

        Raises:
            ConfigError: ``handler`` is not a mapping, has an unknown key, or a value of the wrong
                type or range.
        """
        section = (model_yaml or {}).get("handler") or {}
        if not isinstance(section, Mapping):
            raise ConfigError("model config: 'handler' must be a mapping")
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(section) - set(known))
        if unknown:
            raise ConfigError(f"model config: unknown handler setting(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, value in section.items():
            expected = type(getattr(cls, name))
            if expected is float and type(value) is int:
                value = float(value)
            if type(value) is not expected:
                raise ConfigError(
                    f"model config: handler.{name} must be {expected.__name__}, got {value!r}"
                )
            values[name] = value
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Check ranges.

        Raises:
            ConfigError: a value is out of range.
        """
        if not 1 <= self.num_threads <= 64:
            raise ConfigError("model config: handler.num_threads must be in [1, 64]")
        if not 0 <= self.warmup_batches <= 100:
            raise ConfigError("model config: handler.warmup_batches must be in [0, 100]")
        if not (math.isfinite(self.feature_limit) and self.feature_limit > 0):
            raise ConfigError("model config: handler.feature_limit must be a positive number")
