"""Shared test helpers: a faithful TorchServe context, payloads, and the reference model."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import torch
import ts
from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from handler.model import ModelMetadata, load_model
from handler.schema import Normalizer

TS_METRICS_YAML = Path(ts.__file__).parent / "configs" / "metrics.yaml"


def make_context(model_dir: Path, model_yaml: dict, version: str = "1.0") -> Context:
    """A real ``ts.context.Context`` as the worker builds it (metrics cache included)."""
    metrics = MetricsCacheYamlImpl(config_file_path=str(TS_METRICS_YAML))
    metrics.initialize_cache()
    manifest = {"model": {"modelName": "realtime-classifier", "modelVersion": version,
                          "serializedFile": "weights.pt", "handler": "rtserve_handler.py"}}
    return Context("realtime-classifier", str(model_dir), manifest, 32, None, "0.12.0",
                   metrics=metrics, model_yaml_config=model_yaml)


def start_batch(context: Context, size: int) -> None:
    """Set up per-request state the way ``ts.service.Service.predict`` does for a batch."""
    context.request_ids = {i: f"req-{i}" for i in range(size)}
    context.request_processor = [RequestProcessor({}) for _ in range(size)]
    context.metrics.request_ids = context.request_ids


def json_row(body) -> dict:
    """A request row as TorchServe hands it over for an application/json body (decoded)."""
    return {"body": body}


def raw_row(data: bytes) -> dict:
    """A request row whose body TorchServe did not decode (other content types)."""
    return {"body": data}


def features(n: int = 32, value: float = 0.5) -> list[float]:
    """A valid feature vector."""
    return [value + i for i in range(n)]


class Reference:
    """The model run directly (outside TorchServe) from weights and metadata."""

    def __init__(self, weights, meta: ModelMetadata) -> None:
        self.meta = meta
        self.model = load_model(weights, meta)
        self.normalize = Normalizer(meta.mean, meta.std)

    @classmethod
    def from_mar(cls, mar: Path) -> "Reference":
        """Load the weights and metadata packed inside a ``.mar`` archive."""
        with zipfile.ZipFile(mar) as zf:
            manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
            weights = io.BytesIO(zf.read(manifest["model"]["serializedFile"]))
            raw = json.loads(zf.read("meta.json"))
        return cls(weights, ModelMetadata(**{k: raw[k] for k in ModelMetadata.__dataclass_fields__ if k in raw}))

    def probabilities(self, rows: list[list[float]]) -> torch.Tensor:
        """Softmax outputs for raw feature rows."""
        with torch.inference_mode():
            x = self.normalize(torch.tensor(rows, dtype=torch.float32))
            return torch.softmax(self.model(x), dim=1)
