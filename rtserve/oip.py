"""The Open Inference Protocol's model-level REST routes that TorchServe 0.12 lacks.

TorchServe 0.12 answers ``/v2``, ``/v2/health/*`` and ``/v2/models/{name}/infer`` but has no
route for model metadata or model readiness, which a generic OIP client asks before it infers.
``rtserve.server`` runs this module beside the frontend (wherever it starts one: ``make serve``,
the tests, the pod) on a free loopback port, and rtserve's Java agent (agent/) makes the
frontend send those routes here, after its own token check, on the inference port:

- ``GET /v2/models/{name}[/versions/{version}]``: the model's metadata, from its archive in the
  model store (``MAR-INF/MANIFEST.json`` and the ``meta.json`` training wrote) and the handler's
  tensor names (:mod:`handler.protocols`);
- ``GET /v2/models/{name}[/versions/{version}]/ready``: ``200`` when the model is ready (the
  server is not draining and the model's default version has its workers READY, asked from
  TorchServe's management API), else ``400`` (the protocol's "4xx means false");
- an unknown model or version: ``404``; any other method: ``405``. Errors are ``{"error": ...}``.

    python -m rtserve.oip --listen http://127.0.0.1:8093 --run-dir .run \
        --model-store model_store --models realtime-classifier=realtime-classifier_1.0.mar
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import zipfile
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable
from urllib.parse import unquote, urlsplit

from handler.signature import (CLASS_DATATYPE, CLASS_OUTPUT, INPUT_DATATYPE, INPUT_NAME,
                               PROBABILITIES_DATATYPE, PROBABILITIES_OUTPUT)

logger = logging.getLogger(__name__)

#: ``/v2/models/{name}``, ``/v2/models/{name}/versions/{version}``, either with ``/ready``.
ROUTE = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?(?P<ready>/ready)?$")
#: The OIP ``platform`` of a TorchServe-served eager PyTorch model.
PLATFORM = "pytorch_torchserve"


class ArchiveError(ValueError):
    """A model archive lacks its manifest or meta.json (the message names the file)."""


@dataclass(frozen=True)
class ModelInfo:
    """What one archive says about its model: enough for the OIP metadata answer."""

    name: str
    version: str
    n_features: int
    n_classes: int

    def metadata(self) -> dict:
        """The OIP model metadata response."""
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": PLATFORM,
            "inputs": [{"name": INPUT_NAME, "datatype": INPUT_DATATYPE,
                        "shape": [-1, self.n_features]}],
            "outputs": [{"name": CLASS_OUTPUT, "datatype": CLASS_DATATYPE, "shape": [-1]},
                        {"name": PROBABILITIES_OUTPUT, "datatype": PROBABILITIES_DATATYPE,
                         "shape": [-1, self.n_classes]}],
        }


def read_archive(mar: Path) -> ModelInfo:
    """The :class:`ModelInfo` of a ``.mar`` archive.

    Raises:
        ArchiveError: the archive cannot be read or lacks what is needed.
    """
    try:
        with zipfile.ZipFile(mar) as zf:
            manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))["model"]
            meta = json.loads(zf.read("meta.json"))
        return ModelInfo(manifest["modelName"], str(manifest["modelVersion"]),
                         len(meta["feature_names"]), len(meta["labels"]))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ArchiveError(f"{mar}: not a usable rtserve archive ({exc})") from exc


def read_models(model_store: Path, models: list[str]) -> dict[str, ModelInfo]:
    """name -> :class:`ModelInfo` for each ``NAME=FILE.mar`` the server loads; an archive that
    cannot be read is left out (logged): its model's routes answer 404."""
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

    def __init__(self, models: dict[str, ModelInfo], is_ready: Callable[[str], tuple[bool, str]],
                 address: tuple[str, int]) -> None:
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
            return 404, {"error": f"model {name!r} has no version {version!r} here "
                                  f"(have: {info.version})"}
        if not match["ready"]:
            return 200, info.metadata()
        ready, reason = self.is_ready(name)
        body = {"name": name, "ready": ready}
        if not ready:
            body["reason"] = reason
        return (200 if ready else 400), body


def server_readiness(run_dir: Path) -> Callable[[str], tuple[bool, str]]:
    """``is_ready(name)`` for the server in ``run_dir``: not draining, and the model's default
    version has its minimum of workers READY (TorchServe's management API, with its key)."""
    from rtserve.client import TorchServeError
    from rtserve.drain import is_draining
    from rtserve.probe import local_client
    from rtserve.server import workers_ready

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


def main(argv: list[str] | None = None) -> int:
    """Serve the routes in the foreground until SIGTERM (``rtserve.server`` starts this)."""
    parser = argparse.ArgumentParser(prog="python -m rtserve.oip", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", required=True, help="http://127.0.0.1:PORT")
    parser.add_argument("--run-dir", type=Path,
                        default=Path(os.environ.get("RTSERVE_RUN_DIR", ".run")))
    parser.add_argument("--model-store", type=Path,
                        default=Path(os.environ.get("RTSERVE_MODEL_STORE", "model_store")))
    parser.add_argument("--models", nargs="*", default=os.environ.get("RTSERVE_MODELS", "").split())
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    listen = urlsplit(args.listen)
    routes = ModelRoutes(read_models(args.model_store, args.models),
                         server_readiness(args.run_dir), (listen.hostname, listen.port))
    logger.info("OIP model metadata and readiness for %s on %s",
                ", ".join(sorted(routes.models)) or "no model", routes.url)
    routes.httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
