"""The Open Inference Protocol's model-level REST routes that TorchServe 0.12 lacks: metadata and readiness.

``GET /v2/models/{name}[/versions/{version}]`` and ``GET /v2/models/{name}[/versions/{version}]/ready``, served on a
free loopback port beside the frontend (:class:`rtserve.server.torchserve.TorchServe`); the Java agent forwards them
here after its token check. Ready is ``200``, not ready ``400`` (the protocol's "4xx means false"); an unknown model
or version ``404``, another method ``405``; errors are ``{"error": ...}``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from handler.inputs import OIP_DATATYPES
from handler.signature import (
    CLASS_DATATYPE,
    CLASS_OUTPUT,
    INPUT_DATATYPE,
    INPUT_NAME,
    PROBABILITIES_DATATYPE,
    PROBABILITIES_OUTPUT,
)
from rtserve.client.rest import TorchServeError
from rtserve.errors import ArchiveError
from rtserve.model.archive import read_archive as read_mar
from rtserve.server.drain import is_draining
from rtserve.server.probe import local_client
from rtserve.server.readiness import workers_ready

logger = logging.getLogger(__name__)

#: ``/v2/models/{name}``, ``/v2/models/{name}/versions/{version}``, either with ``/ready``.
ROUTE = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<ready>/ready)?$")
#: The OIP ``platform`` of a TorchServe-served eager PyTorch model.
PLATFORM = "pytorch_torchserve"


@dataclass(frozen=True)
class ModelInfo:
    """What one archive says about its model: enough for the OIP metadata answer."""

    name: str
    version: str
    n_features: int
    n_classes: int
    #: The output signature of a model that is not one classifier (``rtserve-model/2``: one output of
    #: another kind, or several), else empty.
    outputs: tuple[dict, ...] = ()
    #: The named inputs ``meta.json`` declares (``rtserve-model/2``); empty: one ``features`` tensor.
    inputs: tuple[dict, ...] = ()

    def metadata(self) -> dict:
        """The OIP model metadata response."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": PLATFORM,
            "inputs": [
                {"name": spec["name"], "datatype": OIP_DATATYPES[spec["dtype"]], "shape": [-1, *spec["shape"]]}
                for spec in self.inputs
            ]
            or [{"name": INPUT_NAME, "datatype": INPUT_DATATYPE, "shape": [-1, self.n_features]}],
            "outputs": (
                [{"name": out["name"], "datatype": "FP32", "shape": [-1, out["width"]]} for out in self.outputs]
                if self.outputs
                else [
                    {"name": CLASS_OUTPUT, "datatype": CLASS_DATATYPE, "shape": [-1]},
                    {"name": PROBABILITIES_OUTPUT, "datatype": PROBABILITIES_DATATYPE, "shape": [-1, self.n_classes]},
                ]
            ),
        }


def read_archive(mar: Path) -> ModelInfo:
    """The :class:`ModelInfo` of a ``.mar`` archive.

    Raises:
        ArchiveError: the archive cannot be read or lacks what is needed.
    """
    archive = read_mar(mar)
    outputs = archive.meta.get("outputs") or []
    lone_classifier = len(outputs) == 1 and outputs[0].get("kind") == "classification"
    inputs = tuple(archive.meta.get("inputs") or ())
    outputs = () if lone_classifier else tuple(outputs)
    return ModelInfo(archive.name, archive.version, archive.n_features, len(archive.labels), outputs, inputs)


def read_models(model_store: Path, models: list[str]) -> dict[str, ModelInfo]:
    """Name -> :class:`ModelInfo` for each ``NAME=FILE.mar`` the server loads.

    An archive that cannot be read is left out (logged): its model's routes answer 404.
    """
    found = {}
    for spec in models:
        name, _, file = spec.partition("=")
        try:
            found[name] = read_archive(Path(model_store) / file)
        except ArchiveError as exc:
            logger.error("OIP model routes: %s is left out: %s", name, exc)
    return found


class ModelRoutes:
    """The routes, served by a :class:`ThreadingHTTPServer`.

    Args:
        models: what the archives say, by model name.
        is_ready: ``is_ready(name)`` -> (ready, reason); asked on every readiness request.
        address: where to listen (loopback).
    """

    def __init__(
        self, models: dict[str, ModelInfo], is_ready: Callable[[str], tuple[bool, str]], address: tuple[str, int]
    ) -> None:
        self.models = models
        self.is_ready = is_ready
        routes = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "rtserve-oip"
            sys_version = ""

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._answer(*routes.answer(unquote(self.path.split("?", 1)[0])))

            def _not_allowed(self) -> None:
                self._answer(405, {"error": f"{self.command} not allowed: GET only"})

            do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _not_allowed  # noqa: N815

            def _answer(self, status: int, body: dict) -> None:
                data = (json.dumps(body) + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def log_message(self, fmt: str, *args) -> None:
                logger.debug("oip: " + fmt, *args)

        self.httpd = ThreadingHTTPServer(address, Handler)
        self.httpd.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, path: str) -> tuple[int, dict]:
        """(status, body) for a GET of ``path``."""
        match = ROUTE.match(path)
        if not match:
            return 404, {"error": f"not found: {path}"}
        name, version = match["name"], match["version"]
        info = self.models.get(name)
        if info is None:
            return 404, {"error": f"model {name!r} is not served here (have: {sorted(self.models)})"}
        if version is not None and version != info.version:
            return 404, {"error": f"model {name!r} has no version {version!r} here (have: {info.version})"}
        if not match["ready"]:
            return 200, info.metadata()
        ready, reason = self.is_ready(name)
        body = {"name": name, "ready": ready}
        if not ready:
            body["reason"] = reason
        return (200 if ready else 400), body


def server_readiness(run_dir: Path) -> Callable[[str], tuple[bool, str]]:
    """``is_ready(name)`` for the server in ``run_dir``.

    Not draining, and the model's default version has its minimum of workers READY (TorchServe's management API,
    with its key).
    """

    def is_ready(name: str) -> tuple[bool, str]:
        if is_draining(run_dir):
            return False, "draining"
        try:
            if workers_ready(local_client(run_dir, timeout=3.0), name):
                return True, "workers ready"
            return False, "workers not ready"
        except (OSError, KeyError, ValueError, IndexError, TorchServeError) as exc:
            return False, f"TorchServe does not answer yet: {exc}"

    return is_ready


def serve(listen: str, run_dir: Path, model_store: Path, models: list[str]) -> int:
    """Serve the routes on ``listen`` (``http://127.0.0.1:PORT``) in the foreground until SIGTERM.

    The server starts this as its sidecar, ``python -m rtserve server oip``.
    """
    address = urlsplit(listen)
    routes = ModelRoutes(read_models(model_store, models), server_readiness(run_dir), (address.hostname, address.port))
    logger.info(
        "OIP model metadata and readiness for %s on %s", ", ".join(sorted(routes.models)) or "no model", routes.url
    )
    routes.httpd.serve_forever()
    return 0
