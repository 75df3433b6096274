"""The seed-style FastAPI server the benchmark compares TorchServe with (benchmark only).

What the seed documents write, kept as plain as they write it: one ``@app.post("/predict")``
that runs the model under ``torch.no_grad()``, loading the same weights and ``meta.json`` as
the archive (``artifacts/<version>``) and normalizing the same way. Its best configuration on
2 cores is given by the benchmark (``bench.perf``): 1 or 2 uvicorn worker processes, uvloop and
httptools (``uvicorn[standard]``), no access log, one torch thread per process, and TCP_NODELAY
on every accepted connection.

The model runs in one of three forms (``--forward``), the same weights in each (:func:`check_forms`
compares their answers): ``eager``, the ``nn.Module`` a user trained (the demo's
``RealTimeClassifier``, its weights loaded from the exported program); ``program``, the exported
program's module; ``direct``, rtserve's ``handler.model.direct_forward`` of that program. A user
who hand-rolls FastAPI serves the first; the benchmark measures all three and compares rtserve
with the fastest.

Any other artifact directory (named inputs, an image input, an output that is not a
classification: the example models ``make bench-kinds`` runs) is served in its program forms
(``program``, ``direct``) by :func:`signature_app`: it takes the bodies rtserve's ``/predictions``
takes for that model (named arrays, ``{"b64": PNG}``, raw PNG bytes, or the flat
``{"features": [...]}``), parsed and checked by the handler's own pure parsers
(:class:`handler.inputs.NamedInputs`, :func:`handler.schema.parse_features`), and answers the same
JSON.

TCP_NODELAY: asyncio sets it only on sockets whose ``proto`` is ``IPPROTO_TCP``. Uvicorn's
multi-worker mode (``--workers 2``) binds its listening socket with ``socket.socket(AF_INET)``,
whose ``proto`` is 0, so with the asyncio loop accepted connections keep Nagle's algorithm and a
keep-alive client waits for the peer's delayed ACK on every response written in two segments:
``--loop asyncio --workers 2 --nagle`` answers in 44 ms at p50 (0.6 ms without ``--nagle``).
uvloop sets the option itself. :class:`NoDelayHttpToolsProtocol` sets it on every connection,
whatever the loop or the socket's ``proto``; it is passed to uvicorn as its ``http`` class.

    .venv/bin/python -m bench.fastapi_seed --port 8000 --workers 2 --model-dir artifacts/1.0 \
        --async-endpoint --forward direct
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint's annotations at runtime.
import argparse
import json
import os
import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR_ENV = "RTSERVE_BENCH_MODEL_DIR"
ASYNC_ENV = "RTSERVE_BENCH_ASYNC"
FORWARD_ENV = "RTSERVE_BENCH_FORWARD"
#: The forms the model can be served in (see the module's docstring); the first is the default.
FORMS = ("eager", "program", "direct")
#: Largest difference between two forms' logits that :func:`check_forms` accepts.
FORM_TOLERANCE = 1e-5

try:  # the benchmark's own dependencies (requirements-bench.txt), absent from the runtime venv
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - only `make bench` installs uvicorn
    HttpToolsProtocol = object  # type: ignore[misc,assignment]


class NoDelayHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
    """Uvicorn's httptools protocol with TCP_NODELAY forced on each accepted connection."""

    def connection_made(self, transport) -> None:  # noqa: ANN001 - asyncio's transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)


def load_form(model_dir: str | Path, form: str):
    """The model of ``model_dir`` as a callable of raw features ``[N, F]`` -> logits, in ``form``
    (one of :data:`FORMS`). The eager form is the demo's ``RealTimeClassifier`` with the program's
    weights (``load_state_dict(strict=True)``: a program of another architecture is refused)."""
    import torch

    from handler.model import load_program

    path = Path(model_dir) / "model.pt2"
    if form == "program":
        return load_program(path)
    if form == "direct":
        return load_program(path, direct=True)
    if form != "eager":
        raise ValueError(f"unknown form {form!r}: one of {', '.join(FORMS)}")
    from rtserve.model.package import Standardize
    from rtserve.model.train import RealTimeClassifier

    state = torch.export.load(str(path)).state_dict
    model = RealTimeClassifier(
        Standardize(state["norm.mean"], state["norm.std"]),
        hidden=state["net.0.weight"].shape[0],
        n_classes=state["net.2.weight"].shape[0],
    )
    model.load_state_dict(state, strict=True)
    return model.eval()


def check_forms(model_dir: str | Path, forms: tuple[str, ...] = FORMS) -> dict[str, float]:
    """Every form's outputs on the golden set's rows against the first form's (the eager module's
    by default): the largest absolute difference per form. Raises ValueError when one differs by
    more than :data:`FORM_TOLERANCE` (the forms would not be the same model)."""
    import torch

    from handler.model import ModelMetadata

    meta = ModelMetadata.load(Path(model_dir) / "meta.json")
    x = torch.tensor(meta.golden["features"], dtype=torch.float32)
    with torch.no_grad():
        reference = load_form(model_dir, forms[0])(x)
        diffs = {form: float((load_form(model_dir, form)(x) - reference).abs().max()) for form in forms}
    wrong = {form: d for form, d in diffs.items() if not d <= FORM_TOLERANCE}
    if wrong:
        raise ValueError(
            f"forms answer differently from the {forms[0]} form on {len(x)} golden "
            f"rows: {wrong} (tolerance {FORM_TOLERANCE})"
        )
    return diffs


def is_demo_kind(meta) -> bool:  # noqa: ANN001 - handler.model.ModelMetadata, imported late
    """Whether :func:`create_app`'s own endpoint serves the model: a classifier of one ``features`` input."""
    from handler.signature import CLASSIFICATION

    return meta.inputs is None and meta.kind == CLASSIFICATION


def signature_app(model_dir: str | Path, form: str = "direct"):
    """The tuned FastAPI app for any model: its body parsed as rtserve's handler parses it.

    An ``async def`` endpoint on the event loop, the body read raw (no pydantic model: the
    handler's parsers check shapes, types, ranges and images), one row per request, and the JSON
    ``/predictions`` answers for the model's output kind, already encoded. A bad body gets the
    handler's 400 and ``{"error": ...}``.

    Raises:
        ValueError: ``form`` is ``eager`` (only the demo has a module to rebuild).
    """
    import torch
    from fastapi import FastAPI, Request, Response

    from handler.errors import InvalidInput
    from handler.inputs import NamedInputs
    from handler.model import ModelMetadata
    from handler.protocols import output_document
    from handler.schema import DEFAULT_FEATURE_LIMIT, parse_features, prediction_document, request_body
    from handler.signature import CLASSIFICATION
    from rtserve.model.package import answer_tensor

    if form == "eager":
        raise ValueError(f"{model_dir}: only the demo's module can be served eager; forms here: program, direct")
    torch.set_num_threads(1)
    meta = ModelMetadata.load(Path(model_dir) / "meta.json")
    model = load_form(model_dir, form)
    named = NamedInputs(meta.input_specs) if meta.inputs else None
    kind, output, labels, version = meta.kind, meta.output, meta.labels, meta.version
    encode = json.JSONEncoder(separators=(",", ":")).encode

    def row_of(data: bytes) -> list:
        if named is None:
            return parse_features(request_body({"body": data}), meta.n_features, DEFAULT_FEATURE_LIMIT)
        return named.row(named.body({"body": data}), DEFAULT_FEATURE_LIMIT)

    def document(values: list) -> dict:
        if kind == CLASSIFICATION:
            return prediction_document(values.index(max(values)), values, labels, version)
        return output_document(output, values, version)

    app = FastAPI()

    @app.post("/predict", response_class=Response)
    async def predict(request: Request) -> Response:
        try:
            row = row_of(await request.body())
        except InvalidInput as exc:
            return Response(encode(exc.body()), status_code=exc.status, media_type="application/json")
        with torch.inference_mode():
            values = answer_tensor(kind, model(torch.tensor([row], dtype=torch.float32)))[0].tolist()
        return Response(encode(document(values)), media_type="application/json")

    return app


def create_app(model_dir: str | Path, async_endpoint: bool = False, form: str = FORMS[0]):
    """The seed's FastAPI app serving the model in ``model_dir`` (model.pt2 + meta.json).

    ``async_endpoint``: the tuned configuration: the endpoint is ``async def`` and runs on the
    event loop (the forward pass takes tens of microseconds, so a thread-pool hop per request
    costs more than it saves), and it returns its JSON already encoded, as a ``Response``
    (FastAPI otherwise validates a returned ``dict`` against its annotation and walks it through
    ``jsonable_encoder`` before encoding it). Otherwise a plain ``def`` returning the ``dict``,
    as the seed writes it. ``form``: the model's form (:func:`load_form`).

    A model that is not a classifier of one ``features`` input is served by :func:`signature_app`
    (tuned only).

    Raises:
        ValueError: such a model without ``async_endpoint``, or in the eager form.
    """
    import torch
    from fastapi import FastAPI, Response
    from pydantic import BaseModel

    from handler.model import ModelMetadata

    meta = ModelMetadata.load(Path(model_dir) / "meta.json")
    if not is_demo_kind(meta):
        if not async_endpoint:
            raise ValueError(f"{model_dir}: a model with named inputs or another output kind is served tuned only")
        return signature_app(model_dir, form)
    torch.set_num_threads(1)
    model = load_form(model_dir, form)  # normalizes inside

    class PredictRequest(BaseModel):
        features: list[float]

    app = FastAPI()

    def predict(request: PredictRequest) -> dict:
        with torch.no_grad():
            x = torch.tensor([request.features])
            probabilities = torch.softmax(model(x), dim=1)[0]
        cls = int(probabilities.argmax())
        return {
            "prediction": cls,
            "label": meta.labels[cls],
            "probabilities": probabilities.tolist(),
            "model_version": meta.version,
        }

    if async_endpoint:
        encode = json.JSONEncoder(separators=(",", ":")).encode

        @app.post("/predict", response_class=Response)
        async def predict_async(request: PredictRequest) -> Response:
            return Response(encode(predict(request)), media_type="application/json")
    else:
        app.post("/predict")(predict)
    return app


def app_factory():
    """Uvicorn factory (``--factory``): each worker process builds its own app and model."""
    return create_app(
        os.environ.get(MODEL_DIR_ENV, REPO / "artifacts" / "1.0"),
        async_endpoint=os.environ.get(ASYNC_ENV) == "1",
        form=os.environ.get(FORWARD_ENV, FORMS[0]),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the seed server with uvicorn (1 or more worker processes, TCP_NODELAY forced)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--model-dir", type=Path, default=REPO / "artifacts" / "1.0")
    parser.add_argument(
        "--async-endpoint", action="store_true", help="an async def endpoint, run on the event loop (the tuned setup)"
    )
    parser.add_argument(
        "--forward", choices=FORMS, default=FORMS[0], help="the model's form (default: the eager module a user trained)"
    )
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--nagle",
        action="store_true",
        help="keep uvicorn's own protocol class (with --loop asyncio --workers 2: the Nagle delay)",
    )
    args = parser.parse_args(argv)
    os.environ[MODEL_DIR_ENV] = str(args.model_dir.resolve())
    os.environ[ASYNC_ENV] = "1" if args.async_endpoint else "0"
    os.environ[FORWARD_ENV] = args.forward
    sys.path.insert(0, str(REPO))
    uvicorn.run(
        "bench.fastapi_seed:app_factory",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop=args.loop,
        access_log=False,
        log_level="warning",
        http="httptools" if args.nagle else "bench.fastapi_seed:NoDelayHttpToolsProtocol",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
