"""The handler's typed configuration, built once from the model-config YAML ``handler:`` section."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from handler.device import DEVICE_SETTINGS
from handler.errors import ConfigError
from handler.inputs import DEFAULT_MAX_INSTANCES
from handler.schema import DEFAULT_FEATURE_LIMIT

#: Baselines Integrated Gradients can start from (see handler/explain.py).
EXPLAIN_BASELINES = ("mean", "zero")
#: Hard ceilings on explanation work, whatever the model config says.
MAX_EXPLAIN_STEPS = 1000
MAX_EXPLAIN_PER_BATCH = 32
MAX_EXPLAIN_ROWS = 32768
#: Hard ceiling on the instances of one KServe v1/v2 request.
MAX_INSTANCES = 1024
#: Settings that existed before the model contract, and why they are gone.
RETIRED = {
    "torchscript": "TorchScript is deprecated in torch 2.13; the archive carries a torch.export "
    "program (docs/bring-your-own-model.md)",
    "quantize": "torch.ao dynamic quantization does not apply to a torch.export program; "
    "quantize the model before packaging it",
    "audit_log": "the per-request audit lines are the records now: the model config's "
    "'records:' section (enabled, inputs, required; docs/records.md)",
}


@dataclass(frozen=True)
class HandlerConfig:
    """Settings of :class:`RealTimeHandler`; every field has a production default.

    Attributes:
        num_threads: torch intra-op threads per worker.
        warmup_batches: forward passes run at initialize so the first request is not slow.
        feature_limit: largest accepted magnitude of a feature value.
        log_batches: log one line per batch with its size through the worker's stdout into
            model_log.log (debugging; off by default: the records' ``batch`` field and the
            ``rtserve_batch_size`` histogram show batching without a line per batch).
        explain_steps: Integrated Gradients steps per explanation (cost grows linearly).
        explain_baseline: the reference input: ``mean`` (the training mean, zeros after
            normalization) or ``zero`` (all raw features 0).
        explain_internal_batch_size: most interpolated rows Captum runs in one forward/backward
            pass (bounds memory); at least ``explain_max_per_batch``.
        explain_max_per_batch: ceiling on explanations computed in one batch; further explain
            requests of that batch get a 503 with ``Retry-After`` so predictions are not starved.
        metrics: export the handler's Prometheus metrics (``rtserve_*``, see
            :mod:`handler.telemetry`) and drift gauges.
        drift_window: recent rows scored for drift against the training distribution.
        drift_export_seconds: how often the drift gauges are refreshed.
        drift_flush_rows: rows buffered before they enter the drift window (one bulk update).
        buffered_reads: read the frontend's frames through a read-ahead buffer (one ``recv``
            per batch instead of one per field; see :mod:`handler.worker_io`).
        lean_worker: drop per-batch work of TorchServe's Python worker that rtserve does not
            need (a log record, the ``PredictionTime`` metric, the response frame's encoding
            call by call), each only over TorchServe 0.12.0's own code (see
            :func:`handler.worker_io.install_lean`).
        direct_forward: run the exported program's operators as a flat list of calls
            (:class:`handler.model.DirectForward`: the module's answers, without its per-call
            Python layers); off, or for a graph it does not take, the exported module's own
            ``forward``. The worker's log says which path runs.
        max_instances: most instances in one KServe v1 ``instances`` list or Open Inference
            Protocol tensor (its first dimension); more get a 400.
        device: ``auto`` runs the model on the GPU TorchServe assigns the worker when CUDA is
            available, else on the CPU; ``cpu`` always on the CPU (see :mod:`handler.device`).
    """

    num_threads: int = 1
    warmup_batches: int = 3
    feature_limit: float = DEFAULT_FEATURE_LIMIT
    log_batches: bool = False
    explain_steps: int = 50
    explain_baseline: str = "mean"
    explain_internal_batch_size: int = 512
    explain_max_per_batch: int = 4
    metrics: bool = True
    drift_window: int = 2000
    drift_export_seconds: float = 5.0
    drift_flush_rows: int = 256
    max_instances: int = DEFAULT_MAX_INSTANCES
    buffered_reads: bool = True
    lean_worker: bool = True
    direct_forward: bool = True
    device: str = "auto"

    @classmethod
    def from_model_yaml(cls, model_yaml: Mapping[str, Any] | None) -> HandlerConfig:
        """Build from the whole model-config YAML (TorchServe's ``context.model_yaml_config``).

        Raises:
            ConfigError: ``handler`` is not a mapping, has an unknown key, or a value of the wrong
                type or range.
        """
        section = (model_yaml or {}).get("handler") or {}
        if not isinstance(section, Mapping):
            raise ConfigError("model config: 'handler' must be a mapping")
        known = {f.name: f for f in fields(cls)}
        retired = sorted(set(section) & set(RETIRED))
        if retired:
            raise ConfigError(
                "model config: retired handler setting(s): "
                + "; ".join(f"{name} ({RETIRED[name]})" for name in retired)
            )
        unknown = sorted(set(section) - set(known))
        if unknown:
            raise ConfigError(f"model config: unknown handler setting(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for name, value in section.items():
            expected = type(getattr(cls, name))
            if expected is float and type(value) is int:
                value = float(value)
            if type(value) is not expected:
                raise ConfigError(f"model config: handler.{name} must be {expected.__name__}, got {value!r}")
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
        if not 100 <= self.drift_window <= 1_000_000:
            raise ConfigError("model config: handler.drift_window must be in [100, 1000000]")
        if not 1 <= self.drift_flush_rows <= 100_000:
            raise ConfigError("model config: handler.drift_flush_rows must be in [1, 100000]")
        if not 0.1 <= self.drift_export_seconds <= 3600:
            raise ConfigError("model config: handler.drift_export_seconds must be in [0.1, 3600]")
        if not (math.isfinite(self.feature_limit) and self.feature_limit > 0):
            raise ConfigError("model config: handler.feature_limit must be a positive number")
        if not 2 <= self.explain_steps <= MAX_EXPLAIN_STEPS:
            raise ConfigError(f"model config: handler.explain_steps must be in [2, {MAX_EXPLAIN_STEPS}]")
        if self.explain_baseline not in EXPLAIN_BASELINES:
            raise ConfigError("model config: handler.explain_baseline must be one of: " + ", ".join(EXPLAIN_BASELINES))
        if not 1 <= self.explain_max_per_batch <= MAX_EXPLAIN_PER_BATCH:
            raise ConfigError(f"model config: handler.explain_max_per_batch must be in [1, {MAX_EXPLAIN_PER_BATCH}]")
        if not self.explain_max_per_batch <= self.explain_internal_batch_size <= MAX_EXPLAIN_ROWS:
            raise ConfigError(
                "model config: handler.explain_internal_batch_size must be in "
                f"[explain_max_per_batch, {MAX_EXPLAIN_ROWS}]"
            )
        if self.device not in DEVICE_SETTINGS:
            raise ConfigError("model config: handler.device must be one of: " + ", ".join(DEVICE_SETTINGS))
        if not 1 <= self.max_instances <= MAX_INSTANCES:
            raise ConfigError(f"model config: handler.max_instances must be in [1, {MAX_INSTANCES}]")
