"""Kubernetes probes and the pre-stop drain for a TorchServe started by ``rtserve server run``.

Token authorization stays on, so the probes read the key and effective config from the run directory (``--run-dir``
or ``$RTSERVE_RUN_DIR``) and call the server on loopback: ``ready`` (warmed up, ``/ping`` healthy, a real prediction
answered), ``live`` (any HTTP answer), ``drain`` (:func:`rtserve.server.drain.drain`). The pod's main process answers
the kubelet's HTTP probes with them (:func:`serve`); ``python -m rtserve probe`` runs each once (exit 0 or 1), so
this module imports nothing heavier than http.client until :func:`serve` is called.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rtserve.client.light import Session
from rtserve.client.rest import Client, TorchServeError
from rtserve.server.drain import drain as drain_instance
from rtserve.server.drain import is_draining
from rtserve.server.properties import read_properties
from rtserve.server.readiness import probe_prediction
from rtserve.settings import RunDir

logger = logging.getLogger(__name__)


@dataclass
class Result:
    """A probe's verdict and the one line that explains it."""

    ok: bool
    message: str


def loopback(address: str) -> str:
    """``http://0.0.0.0:8080`` (a listener bound to every interface) -> ``http://127.0.0.1:8080``."""
    parts = urlsplit(address)
    host = parts.hostname or "127.0.0.1"
    if host in ("0.0.0.0", "::", "localhost"):
        host = "127.0.0.1"
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme or "http", netloc, "", "", ""))


def local_client(run_dir: Path, timeout: float, session: Session | None = None) -> Client:
    """A client for the server in ``run_dir``, from its effective config and key file.

    Its ``session``: see :class:`Client`.

    Raises:
        FileNotFoundError: the server has not written its config yet.
    """
    files = RunDir(run_dir)
    props = read_properties(files.config)
    return Client(
        loopback(props["inference_address"]),
        loopback(props["management_address"]),
        key_file=files.key_file,
        timeout=timeout,
        retries=0,
        session=session,
    )


def ready(run_dir: Path, model: str, timeout: float = 3.0) -> Result:
    """Ready when not draining, warmed up, ``/ping`` is healthy and ``model`` answers a prediction.

    Warmed up: ``rtserve.server run`` writes ``RUN_DIR/warm`` after its warm-up (:mod:`rtserve.server.warmup`).
    """
    if is_draining(run_dir):
        return Result(False, "draining: not accepting new requests")
    if not RunDir(run_dir).key_file.exists():
        return Result(False, "TorchServe has not written key_file.json yet")
    if not RunDir(run_dir).warm.exists():
        return Result(False, "warming up: the server has not finished its start-up warm-up")
    try:
        client = local_client(run_dir, timeout, Session())
        if not client.ping():
            return Result(False, "/ping: a model is not healthy yet")
        answer = probe_prediction(client, model)
    except (OSError, KeyError, TorchServeError) as exc:
        return Result(False, f"not ready: {exc}")
    if not isinstance(answer, dict) or "prediction" not in answer:
        return Result(False, f"{model} answered without a prediction: {answer!r:.200}")
    return Result(True, f"ready: {model} {answer.get('model_version', '?')} answers")


def live(run_dir: Path, timeout: float = 3.0) -> Result:
    """Live when the frontend answers ``/ping`` with any HTTP status (models may be loading)."""
    try:
        client = local_client(run_dir, timeout, Session())
        healthy = client.ping()
    except (OSError, KeyError) as exc:
        return Result(False, f"no config yet: {exc}")
    except TorchServeError as exc:
        if exc.status:
            return Result(True, f"live: frontend answered {exc.status}")
        return Result(False, f"frontend does not answer: {exc}")
    return Result(True, f"live: /ping {'200' if healthy else '500'}")


def drain(run_dir: Path, propagation: float, timeout: float, quiet: float = 2.0, log_dir: Path | None = None) -> Result:
    """Readiness false, then wait for traffic to move away and in-flight work to finish.

    Args:
        run_dir: the server's run directory (the ``draining`` marker is written there).
        propagation: the least seconds to wait after readiness turns false (endpoint updates).
        timeout: the most seconds to wait for idleness after ``propagation``.
        quiet: idle means nothing arrived, queued or running for this long.
        log_dir: TorchServe's log directory (``LOG_LOCATION``; default ``RUN_DIR/logs``).
    """
    client = local_client(run_dir, timeout=3.0)
    log_dir = Path(log_dir or RunDir(run_dir).logs)
    report = drain_instance(
        client, run_dir, log_dir, None, timeout=propagation + timeout, quiet=quiet, min_wait=propagation
    )
    verdict = "drained" if report.drained else "drain timed out; stopping anyway"
    return Result(
        report.drained, f"{verdict} after {report.seconds:.1f}s ({report.arrivals} requests seen while draining)"
    )


def serve(listen: str, run_dir: Path, model: str, timeout: float = 3.0):
    """Answer the kubelet's HTTP probes on ``listen`` (``HOST:PORT``) from this process, in a daemon thread.

    ``GET /ready`` runs :func:`ready` for ``model``, ``GET /live`` runs :func:`live`: 200 when it passes, 503 when
    not, each with the verdict's line as the body; any other path is a 404. A probe costs a loopback call or two,
    where an exec probe costs a Python start-up. The kubelet's events keep only the status, so each change of a
    probe's verdict is logged with its line (the container's log). Returns the ``ThreadingHTTPServer``
    (``shutdown()`` stops it).
    """
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    host, _, port = listen.rpartition(":")
    checks = {"/ready": lambda: ready(run_dir, model, timeout), "/live": lambda: live(run_dir, timeout)}
    last: dict[str, str] = {}
    lock = threading.Lock()

    class Probe(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            check = checks.get(path)
            if check is None:
                self._answer(404, f"no probe at {path}: /ready or /live")
                return
            try:
                result = check()
            except Exception as exc:  # noqa: BLE001 - a probe fails, it never stops the pod's process
                result = Result(False, f"{path[1:]} probe failed: {type(exc).__name__}: {exc}")
            with lock:
                if last.get(path) != result.message:
                    last[path] = result.message
                    logger.info("probe %s: %s", path, result.message)
            self._answer(200 if result.ok else 503, result.message)

        def _answer(self, status: int, message: str) -> None:
            body = (message + "\n").encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's name
            """No access log line per probe (one every few seconds); verdict changes are logged above."""

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Probe)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="rtserve-probes", daemon=True).start()
    return server
