"""Handler time per request: the handler run in-process through a real TorchServe context.

Times what TorchServe's worker times as ``HandlerTime``: ``handle()`` (preprocess, inference,
postprocess and TorchServe's own bookkeeping) on a full batch of valid requests, as the
frontend hands them over (``application/json`` bodies already decoded by the worker's
protocol code, each request with the headers the frontend passes on for ``wrk``'s POST to
``/predictions``). Each stage is also timed on its own, and all of it again for a batch of one
(a lone request: every fixed cost of a batch paid by one request). Also times the raw forward pass (the
floor) at batch 1 and 32. Each for every way to run the model: the previous eager ``nn.Module``,
the exported program as the handler runs it (direct forward), the exported module's own
``forward``, the exported module with its input-constraint hook, and the AOTInductor-compiled
program (``--compiled``). One torch thread, as in a worker. And the worker's parse of an
inference batch from its socket, TorchServe's parser against the lean worker's (``batch_parse``).

    .venv/bin/python -m bench.handler_micro --model-dir artifacts/1.0 --compiled build/compiled/1.0.pt2
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_CONFIG = REPO / "model" / "model-config.yaml"
DEFAULT_REQUEST = REPO / "examples" / "request.json"
#: A request's headers as the worker gets them for ``wrk``'s POST to ``/predictions/{model}``
#: (bench/wrk_post.lua): the client's, then the frontend's ``url_path`` and ``explain``, and the
#: body parameter's content type (``ts.service.Service.retrieve_data_for_inference``).
REQUEST_HEADERS = {
    "body": {"content-type": "application/json"},
    "Host": "127.0.0.1:8080",
    "Content-Type": "application/json",
    "Authorization": "Bearer 0123456789abcdef",
    "Content-Length": "700",
    "url_path": "",
    "explain": "False",
}


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


def parse_time(body: dict, batches: tuple[int, ...] = (1, 20)) -> dict[str, float]:
    """Microseconds to parse an inference batch of ``n`` requests (each with
    :data:`REQUEST_HEADERS`' client and frontend headers and ``body``) from a socket, by
    TorchServe's ``_retrieve_inference_msg`` over rtserve's buffered reads and by the lean
    worker's ``BufferedReader.inference_msg``; the frame is sent again before each parse."""
    import socket
    import struct

    from ts.protocol import otf_message_handler as otf

    from handler.worker_io import BufferedReader

    def field(data: bytes) -> bytes:
        return struct.pack("!i", len(data)) + data

    end = struct.pack("!i", -1)
    headers = [(k, v) for k, v in REQUEST_HEADERS.items() if isinstance(v, str)]
    one = b"".join(field(k.encode()) + field(v.encode()) for k, v in headers) + end
    one += field(b"body") + field(b"application/json") + field(json.dumps(body).encode()) + end
    reader, stock = BufferedReader(), otf._retrieve_buffer
    # TorchServe's own parser, also where a handler started in this process put the lean one
    theirs_parse = getattr(otf._retrieve_inference_msg, "original", otf._retrieve_inference_msg)
    out = {}
    otf._retrieve_buffer = reader  # TorchServe's parser reads through it, as in a worker
    try:
        for n in batches:
            frame = b"".join(field(f"{i:08x}-0000-4000-8000-000000000000".encode()) + one for i in range(n)) + end
            for name, parse in (("torchserve", theirs_parse), ("lean", reader.inference_msg)):
                ours, theirs = socket.socketpair()
                with ours, theirs:
                    out[f"{name}_us_batch_of_{n}"] = round(
                        best_us(lambda: (theirs.sendall(frame), parse(ours)), number=100), 1
                    )
    finally:
        otf._retrieve_buffer = stock
    return out


def variants(model_dir: Path, compiled: Path | None) -> dict[str, Callable]:
    """The ways to run the model: the previous eager ``nn.Module`` (the demo retrained in this
    process: same weights, deterministic), the exported program as the handler runs it (its
    direct forward, ``handler.direct_forward``), the exported module's ``forward`` (the
    handler's path with ``direct_forward: false``), the exported module called with its
    input-constraint hook, and, when given, the AOTInductor-compiled package of the same
    program."""
    from handler.model import ModelMetadata, load_program
    from rtserve.model.train import train

    meta = ModelMetadata.load(model_dir / "meta.json")
    training = meta.provenance.get("model_class", "")
    out: dict[str, Callable] = {}
    if training.endswith("RealTimeClassifier"):
        hidden = int(torch.export.load(str(model_dir / "model.pt2")).state_dict["net.0.weight"].shape[0])
        epochs = {64: 1, 128: 6}.get(hidden, 1)
        out["previous_eager"] = train(meta.version, epochs=epochs, hidden=hidden)
    out["exported"] = load_program(model_dir / "model.pt2", direct=True)
    out["exported_module"] = load_program(model_dir / "model.pt2")
    out["exported_with_hook"] = torch.export.load(str(model_dir / "model.pt2")).module()
    if compiled is not None:
        out["compiled_aoti"] = torch._inductor.aoti_load_package(str(compiled))
    return out


def forward_floor(models: dict[str, Callable], n_features: int) -> dict:
    """Microseconds of the bare forward pass of each variant at batch 1 and 32."""
    out: dict[str, float] = {}
    with torch.inference_mode():
        for name, model in models.items():
            for batch in (1, 32):
                x = torch.randn(batch, n_features)
                out[f"{name}_batch{batch}_us"] = round(best_us(lambda: model(x)), 2)
    return out


def compile_aoti(model_dir: Path, out: Path) -> Path:
    """AOTInductor-compile ``model.pt2`` into ``out`` (a .pt2 package; about a minute on 2 cores)."""
    program = torch.export.load(str(model_dir / "model.pt2"))
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(out)))


@contextlib.contextmanager
def worker_env():
    """What rtserve.server gives a worker: a metrics directory in prometheus_client's
    multiprocess mode (values in memory-mapped files, as in a worker), a log directory and the
    records spool, all in one temporary directory removed afterwards (a spool left behind would
    fill up over runs, and a full spool writes nothing: the records would look free)."""
    from prometheus_client import values

    from handler.records import SPOOL_DIR_ENV

    saved = {k: os.environ.get(k) for k in ("PROMETHEUS_MULTIPROC_DIR", "LOG_LOCATION", SPOOL_DIR_ENV)}
    value_class = values.ValueClass
    with tempfile.TemporaryDirectory(prefix="bench-worker-") as root:
        os.makedirs(os.path.join(root, "metrics"))
        os.environ.update(
            PROMETHEUS_MULTIPROC_DIR=os.path.join(root, "metrics"),
            LOG_LOCATION=root,
            **{SPOOL_DIR_ENV: os.path.join(root, "records")},
        )
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
    """Microseconds per call of the handler's telemetry (metrics, drift, the records' lines and
    their write) for ``rows``."""
    from rtserve.testing.worker import start_batch

    start_batch(context, len(rows))
    batch = handler.preprocess(rows)
    answers = handler.postprocess(handler.inference(batch))  # the classes and answers, as recorded
    ids = [f"{i:08d}-1111-2222-3333-444444444444" for i in range(len(rows))]

    def once() -> None:
        handler.telemetry.record(batch, batch.classes, (1e-4, 1e-4, 1e-4))
        if handler.recorder is not None:
            handler.recorder.write(handler.recorder.lines(batch, rows, answers, ids, batch.routes, 3e-4))

    return best_us(once)


def handler_time(model_dir: Path, model_yaml: dict, body: dict, batch: int = 32, model: Callable | None = None) -> dict:
    """Microseconds per request of ``handle()`` and of each stage, on a batch of ``batch``
    (with ``model`` in place of the archive's program when given), and of the telemetry alone
    on that batch and on a batch of one (light traffic)."""
    with worker_env():
        return _handler_time(model_dir, model_yaml, body, batch, model)


def _handler_time(model_dir: Path, model_yaml: dict, body: dict, batch: int, model: Callable | None) -> dict:
    from handler.rtserve_handler import RealTimeHandler
    from rtserve.testing.worker import make_context

    context = make_context(model_dir, model_yaml)
    handler = RealTimeHandler()
    handler.initialize(context)
    if model is not None:
        handler.model = model
    rows = [{"body": json.loads(json.dumps(body))} for _ in range(batch)]
    full = _stage_times(handler, context, rows, number=100)
    lone = _stage_times(handler, context, rows[:1], number=400)
    telemetry = {}
    if handler.telemetry is not None:
        telemetry = {
            "telemetry_us_per_request": round(telemetry_time(handler, rows, context) / batch, 2),
            "telemetry_us_batch_of_1": round(telemetry_time(handler, rows[:1], context), 2),
        }
    return {
        "batch": batch,
        **{f"{stage}_us_per_request": round(us / batch, 2) for stage, us in full.items()},
        "handle_us_per_batch": round(full["handle"], 1),
        **{f"{stage}_us_batch_of_1": round(us, 2) for stage, us in lone.items()},
        **telemetry,
    }


def _stage_times(handler: Any, context: Any, rows: list, number: int) -> dict[str, float]:
    """Microseconds per call of ``handle()`` and of each stage on the batch ``rows`` (each
    request with :data:`REQUEST_HEADERS`), after checking that every request is answered."""
    from rtserve.testing.worker import start_batch

    start_batch(context, len(rows), [REQUEST_HEADERS] * len(rows))
    outputs = handler.handle(rows, context)
    if len(outputs) != len(rows) or any("prediction" not in json.loads(o) for o in outputs):
        raise RuntimeError(f"the handler did not answer every request: {outputs[:2]}")
    parsed = handler.preprocess(rows)
    inferred = handler.inference(parsed)
    return {
        "handle": best_us(lambda: handler.handle(rows, context), number=number),
        "preprocess": best_us(lambda: handler.preprocess(rows), number=number),
        "inference": best_us(lambda: handler.inference(parsed), number=number),
        "postprocess": best_us(lambda: handler.postprocess(inferred), number=number),
    }


def _set(model_yaml: dict, assignment: str) -> None:
    key, _, raw = assignment.partition("=")
    model_yaml.setdefault("handler", {})[key] = yaml.safe_load(raw)


def main(argv: list[str] | None = None) -> int:
    """Print (and optionally save) the forward floor and the handler time per request."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, default=REPO / "artifacts" / "1.0")
    parser.add_argument("--model-config", type=Path, default=DEFAULT_MODEL_CONFIG)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a handler: setting, e.g. explain_steps=20",
    )
    parser.add_argument(
        "--compiled", type=Path, help="an AOTInductor package of the same program (compiled when missing)"
    )
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
    if args.compiled is not None and not args.compiled.exists():
        compile_aoti(args.model_dir, args.compiled)
    models = variants(args.model_dir, args.compiled)
    n_features = len(json.loads((args.model_dir / "meta.json").read_text())["feature_names"])
    body = {"features": json.loads(DEFAULT_REQUEST.read_text())["features"][:n_features]}
    report = {
        "forward": forward_floor(models, n_features),
        "handler": {
            name: handler_time(args.model_dir, model_yaml, body, args.batch, model) for name, model in models.items()
        },
        "handler_settings": model_yaml.get("handler", {}),
        "batch_parse": parse_time(body),
    }
    sys.stdout.write(json.dumps(report, indent=2) + "\n")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
