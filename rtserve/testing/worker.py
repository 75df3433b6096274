"""The handler run in this process as TorchServe's worker runs it, for unit tests and micro-benchmarks.

A real ``ts.context.Context`` with its metrics cache, and each batch's per-request state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ts.context import Context, RequestProcessor
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl

from rtserve.settings import PACKAGE_HOME

#: The metrics config the server is started with (config.properties ``metrics_config``); the
#: worker's metrics cache is built from it, so undeclared metrics fail here as they would there.
METRICS_YAML = PACKAGE_HOME / "config" / "metrics.yaml"


def make_context(model_dir: Path, model_yaml: dict, version: str = "1.0", gpu: int | None = None) -> Context:
    """A real ``ts.context.Context`` as the worker builds it (metrics cache included).

    ``gpu`` is the worker's ``gpu_id`` (TorchServe passes None where it found no GPU).
    """
    metrics = MetricsCacheYamlImpl(config_file_path=str(METRICS_YAML))
    metrics.initialize_cache()
    manifest = {
        "model": {
            "modelName": "realtime-classifier",
            "modelVersion": version,
            "serializedFile": "model.pt2",
            "handler": "rtserve_handler.py",
        }
    }
    return Context(
        "realtime-classifier",
        str(model_dir),
        manifest,
        32,
        gpu,
        "0.12.0",
        metrics=metrics,
        model_yaml_config=model_yaml,
    )


def start_batch(context: Context, size: int, headers: Sequence[dict] | None = None) -> None:
    """Set up per-request state the way ``ts.service.Service.predict`` does for a batch.

    ``headers[i]`` are request ``i``'s headers as ``Service.retrieve_data_for_inference`` hands
    them to ``RequestProcessor`` (see :func:`route_headers`); none by default.
    """
    headers = list(headers) if headers is not None else [{} for _ in range(size)]
    assert len(headers) == size
    context.request_ids = {i: f"req-{i}" for i in range(size)}
    context.request_processor = [RequestProcessor(dict(h)) for h in headers]
    context.metrics.request_ids = context.request_ids
