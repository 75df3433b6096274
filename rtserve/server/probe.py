"""Kubernetes exec probes and the pre-stop drain for a TorchServe started by ``rtserve server run``.

Token authorization stays on, so the probes read the key and effective config from the run directory (``--run-dir``
or ``$RTSERVE_RUN_DIR``) and call the server on loopback: ``ready`` (warmed up, ``/ping`` healthy, a real prediction
answered), ``live`` (any HTTP answer), ``drain`` (:func:`rtserve.server.drain.drain`). Each prints one line and exits
0 or 1; a probe is a new process every few seconds, so this module imports nothing heavier than http.client.
"""

from __future__ import annotations

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
