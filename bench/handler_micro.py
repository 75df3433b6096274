"""Handler time per request: the handler run in-process through a real TorchServe context.

Times what TorchServe's worker times as ``HandlerTime``: ``handle()`` (preprocess, inference,
postprocess and TorchServe's own bookkeeping) on a full batch of valid requests, as the
frontend hands them over (``application/json`` bodies already decoded by the worker's
protocol code). Each stage is also timed on its own. Also times the raw forward pass of the
same weights (the floor), eager and TorchScript, at batch 1 and 32. One torch thread, as in a
worker.

    .venv/bin/python -m bench.handler_micro --model-dir artifacts/1.0
    .venv/bin/python -m bench.handler_micro --set torchscript=true --set quantize=true
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_CONFIG = REPO / "model" / "model-config.yaml"
DEFAULT_REQUEST = REPO / "examples" / "request.json"


def best_us(fn: Callable[[], Any], repeat: int = 7, number: int = 200) -> float:
    """Median over ``repeat`` rounds of the mean microseconds per call of ``fn``."""
    for _ in range(number // 4 + 1):  # warm-up
        fn()
    rounds = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        rounds.append((time.perf_counter() - start) / number * 1e6)
    return statistics.median(rounds)


def forward_floor(model_dir: Path) -> dict:
    """Microseconds of the bare forward pass (eager and TorchScript) at batch 1 and 32."""
    from handler.model import ModelMetadata, load_model, quantize_int8
    from handler.rtserve_handler import _script

    torch.set_num_threads(1)
    meta = ModelMetadata.load(model_dir / "meta.json")
    eager = load_model(model_dir / "weights.pt", meta)
    int8 = quantize_int8(eager)
    out: dict[str, float] = {}
    with torch.inference_mode():
        for name, model in (("eager", eager), ("torchscript", _script(eager)),
                            ("int8", int8), ("int8_torchscript", _script(int8))):
            for batch in (1, 32):
                x = torch.randn(batch, meta.n_features)
                out[f"{name}_batch{batch}_us"] = round(best_us(lambda: model(x)), 2)
    return out


def quantization_effect(model_dir: Path) -> dict:
    """Held-out accuracy of the float model and of its dynamic-int8 copy, and how they differ."""
    from handler.model import ModelMetadata, load_model, quantize_int8
    from handler.schema import Normalizer
    from rtserve.data import make_dataset

    meta = ModelMetadata.load(model_dir / "meta.json")
    model = load_model(model_dir / "weights.pt", meta)
    data = make_dataset()
    x = Normalizer(meta.mean, meta.std)(data.x_test)
    with torch.inference_mode():
        p_float = torch.softmax(model(x), dim=1)
        p_int8 = torch.softmax(quantize_int8(model)(x), dim=1)
    acc = lambda p: float((p.argmax(dim=1) == data.y_test).float().mean())  # noqa: E731
    return {
        "held_out_rows": len(data.y_test),
        "accuracy_float": round(acc(p_float), 4),
        "accuracy_int8": round(acc(p_int8), 4),
        "same_prediction": round(float((p_float.argmax(1) == p_int8.argmax(1)).float().mean()), 4),
        "max_probability_change": round(float((p_float - p_int8).abs().max()), 4),
    }


@contextlib.contextmanager
def worker_env():
    """What rtserve.server gives a worker: a metrics directory in prometheus_client's
    multiprocess mode (values in memory-mapped files, as in a worker) and a log directory for
    the audit trail; both removed afterwards."""
    from prometheus_client import values

    saved = {k: os.environ.get(k) for k in ("PROMETHEUS_MULTIPROC_DIR", "LOG_LOCATION")}
    value_class = values.ValueClass
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as root:
        os.makedirs(os.path.join(root, "metrics"))
        os.environ.update(PROMETHEUS_MULTIPROC_DIR=os.path.join(root, "metrics"), LOG_LOCATION=root)
        values.ValueClass = values.MultiProcessValue()
        try:
            yield root
        finally:
            values.ValueClass = value_class
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def telemetry_time(handler: Any, rows: list, context: Any) -> float:
    """Microseconds per call of the handler's telemetry (metrics, drift, audit) for ``rows``."""
    from tests.helpers import start_batch

    start_batch(context, len(rows))
    batch = handler.preprocess(rows)
    _, probabilities = handler.inference(batch)
    ids = [f"{i:08d}-1111-2222-3333-444444444444" for i in range(len(rows))]
    return best_us(lambda: handler.telemetry.record(batch, probabilities, (1e-4, 1e-4, 1e-4), ids))


def handler_time(model_dir: Path, model_yaml: dict, body: dict, batch: int = 32) -> dict:
    """Microseconds per request of ``handle()`` and of each stage, on a batch of ``batch``,
    and of the telemetry alone on that batch and on a batch of one (light traffic)."""
    with worker_env():
        return _handler_time(model_dir, model_yaml, body, batch)


def _handler_time(model_dir: Path, model_yaml: dict, body: dict, batch: int) -> dict:
    from handler.rtserve_handler import RealTimeHandler
    from tests.helpers import make_context, start_batch

    context = make_context(model_dir, model_yaml)
    handler = RealTimeHandler()
    handler.initialize(context)
    rows = [{"body": json.loads(json.dumps(body))} for _ in range(batch)]
    start_batch(context, batch)
    outputs = handler.handle(rows, context)
    if len(outputs) != batch or any("prediction" not in json.loads(o) for o in outputs):
        raise RuntimeError(f"the handler did not answer every request: {outputs[:2]}")
    parsed = handler.preprocess(rows)
    inferred = handler.inference(parsed)
    number = 100
    total = best_us(lambda: handler.handle(rows, context), number=number)
    pre = best_us(lambda: handler.preprocess(rows), number=number)
    inf = best_us(lambda: handler.inference(parsed), number=number)
    post = best_us(lambda: handler.postprocess(inferred), number=number)
    telemetry = {}
    if handler.telemetry is not None:
        telemetry = {
            "telemetry_us_per_request": round(telemetry_time(handler, rows, context) / batch, 2),
            "telemetry_us_batch_of_1": round(telemetry_time(handler, rows[:1], context), 2),
        }
    return {
        "batch": batch,
        "handle_us_per_request": round(total / batch, 2),
        "preprocess_us_per_request": round(pre / batch, 2),
        "inference_us_per_request": round(inf / batch, 2),
        "postprocess_us_per_request": round(post / batch, 2),
        "handle_us_per_batch": round(total, 1),
        **telemetry,
    }


def _set(model_yaml: dict, assignment: str) -> None:
    key, _, raw = assignment.partition("=")
    model_yaml.setdefault("handler", {})[key] = yaml.safe_load(raw)


def main(argv: list[str] | None = None) -> int:
    """Print (and optionally save) the forward floor and the handler time per request."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=REPO / "artifacts" / "1.0")
    parser.add_argument("--model-config", type=Path, default=DEFAULT_MODEL_CONFIG)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a handler: setting, e.g. torchscript=true")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    # As in a worker (ts/model_service_worker.py): INFO records formatted and written out
    # (here to /dev/null instead of the pipe the frontend reads).
    logging.basicConfig(stream=open(os.devnull, "w"), format="%(message)s", level=logging.INFO)
    model_yaml = yaml.safe_load(args.model_config.read_text())
    for assignment in args.set:
        _set(model_yaml, assignment)
    torch.set_num_threads(int(model_yaml.get("handler", {}).get("num_threads", 1)))
    body = json.loads(DEFAULT_REQUEST.read_text())
    report = {"forward": forward_floor(args.model_dir),
              "quantization": quantization_effect(args.model_dir),
              "handler": handler_time(args.model_dir, model_yaml, body, args.batch),
              "handler_settings": model_yaml.get("handler", {})}
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
