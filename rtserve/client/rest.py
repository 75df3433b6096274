"""A small ``requests`` client for TorchServe's inference and management APIs.

It reads the tokens in ``key_file.json`` (renewing an expired one), times out every call, retries only
idempotent ones, and raises :class:`~rtserve.errors.TorchServeError` subclasses. ``requests`` is imported only
for a client made without a session (the probes pass :class:`rtserve.client.light.Session`).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from handler.errors import EXPECTED_HEADER, REASON_HEADER
from rtserve.errors import (  # noqa: F401 - the
    AuthError,
    Conflict,
    NotFound,
    Overloaded,
    Refused,  # client's errors, importable from here
    TorchServeError,
)

if TYPE_CHECKING:
    import requests

    from rtserve.client.light import Session

logger = logging.getLogger(__name__)

RETRY_STATUSES = {502, 503, 504}


QUEUE_FULL = "has no worker to serve inference request"
#: TorchServe's answers when the worker holding a request went away before answering it (a
#: scale-down or a crashed worker). A prediction has no side effect, so it is safe to resend.
WORKER_LOST = ("Worker scaled down.", "Worker died.")


def worker_lost(status: int, body: str) -> bool:
    """Whether an answer says the request's worker went away before answering it."""
    return status in (500, 507) and any(m in body for m in WORKER_LOST)


def retryable(status: int, body: str) -> bool:
    """Whether an idempotent call's error answer is worth sending again.

    A gateway or overload status, or TorchServe 0.12's ``500 ConcurrentModificationException``,
    which a management call such as a scale-down can meet when a worker's batch changes under it.
    """
    return status in RETRY_STATUSES or (status == 500 and '"ConcurrentModificationException"' in body)


#: The handler's 503 for an explanation past ``handler.explain_max_per_batch`` in its batch.
EXPLAIN_CEILING = "handler.explain_max_per_batch"


class Keys:
    """Token keys from TorchServe's ``key_file.json``; re-read whenever the file changes."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._mtime: float | None = None
        self._data: dict = {}

    def _load(self) -> dict:
        if self.path is None:
            return {}
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return {}
        if mtime != self._mtime:
            try:
                self._data = json.loads(self.path.read_text())
                self._mtime = mtime
            except (OSError, ValueError):
                return self._data  # being rewritten: keep the previous keys for now
        return self._data

    def get(self, kind: str) -> str | None:
        """The key for ``inference``, ``management`` or ``API``, or None when auth is off."""
        return (self._load().get(kind) or {}).get("key")

    def expired(self, kind: str) -> bool:
        """Whether the key's recorded expiration time has passed."""
        raw = (self._load().get(kind) or {}).get("expiration time")
        if not raw:
            return False
        try:
            when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            return False
        return when <= datetime.now(UTC)


class StaticKeys(Keys):
    """One fixed inference token (e.g. a gateway token from a mounted Secret), never renewed."""

    def __init__(self, token: str) -> None:
        super().__init__(None)
        self._data = {"inference": {"key": token}}

    def _load(self) -> dict:
        return self._data


class Client:
    """Calls TorchServe's inference and management APIs.

    Args:
        inference_url: e.g. ``http://127.0.0.1:8080``.
        management_url: e.g. ``http://127.0.0.1:8081``.
        key_file: TorchServe's ``key_file.json``; None when token authorization is off.
        metrics_url: e.g. ``http://127.0.0.1:8082`` (no token needed).
        timeout: seconds for connect and for read, on every call.
        retries: extra attempts for idempotent calls on connection errors, 502/503/504 and
                TorchServe's 500 ConcurrentModificationException (:func:`retryable`).
        token: a fixed inference token instead of ``key_file`` (a gateway's shared token).
        session: what sends the requests (``self.session``): default a new ``requests.Session``;
                a :class:`rtserve.client.light.Session` makes the same calls without importing
                ``requests`` (all but :meth:`metrics`).
    """

    def __init__(
        self,
        inference_url: str,
        management_url: str,
        key_file: str | Path | None = None,
        metrics_url: str | None = None,
        timeout: float = 10.0,
        retries: int = 2,
        token: str | None = None,
        session: requests.Session | Session | None = None,
    ) -> None:
        self.inference_url = inference_url.rstrip("/")
        self.management_url = management_url.rstrip("/")
        self.metrics_url = metrics_url.rstrip("/") if metrics_url else None
        self.keys = StaticKeys(token) if token else Keys(key_file)
        self.timeout = timeout
        self.retries = retries
        if session is None:
            import requests

            session = requests.Session()
        self.session = session

    # -- inference API -------------------------------------------------------------------
    def ping(self) -> bool:
        """True when TorchServe reports every model healthy (``/ping`` 200)."""
        try:
            self._call("GET", self.inference_url, "/ping", "inference", idempotent=True)
        except TorchServeError as exc:
            if exc.status == 500:
                return False
            raise
        return True

    def predict(self, model: str, payload: Any, version: str | None = None) -> Any:
        """POST one prediction request; returns the decoded JSON answer.

        Resent once, and only when TorchServe says the request's worker went away before
        answering (:func:`worker_lost`: a worker scaled down or crashed mid-batch). Other
        failures are not retried.
        """
        return self._predict(f"/predictions/{model}" + (f"/{version}" if version else ""), payload)

    def predict_instances(self, model: str, instances: list[list[float] | dict]) -> list[dict]:
        """POST several rows as one KServe v1 request; returns one answer per row.

        ``/v1/models/{model}:predict`` (served by rtserve's frontend agent) takes at most the
        model's ``handler.max_instances`` rows; each answer has :meth:`predict`'s fields, and the
        request is resent like it.
        """
        return self._predict(f"/v1/models/{model}:predict", {"instances": instances})["predictions"]

    def _predict(self, path: str, payload: Any) -> Any:
        try:
            return self._call("POST", self.inference_url, path, "inference", json_body=payload)
        except TorchServeError as exc:
            if not worker_lost(exc.status, json.dumps(exc.body)):
                raise
            logger.info("%s: worker lost before answering (%s); resending once", path, exc)
            return self._call("POST", self.inference_url, path, "inference", json_body=payload)

    def explain(self, model: str, payload: Any, version: str | None = None) -> Any:
        """POST one explanation request (``/explanations/{model}``).

        Retried like an idempotent call (an explanation changes nothing): a 503 from a batch
        that already held ``handler.explain_max_per_batch`` explanations is tried again after a
        short back-off.
        """
        path = f"/explanations/{model}" + (f"/{version}" if version else "")
        return self._call("POST", self.inference_url, path, "inference", json_body=payload, idempotent=True)

    # -- management API ------------------------------------------------------------------
    def list_models(self) -> list[dict]:
        """Registered model names with their default version's archive."""
        models: list[dict] = []
        token = None
        while True:
            query = {"limit": 100, **({"next_page_token": token} if token else {})}
            page = self._call("GET", self.management_url, "/models", "management", params=query, idempotent=True)
            models += page.get("models", [])
            token = page.get("nextPageToken")
            if not token:
                return models

    def describe(self, model: str, version: str | None = None) -> list[dict]:
        """Describe one version, or all versions with ``version="all"`` (default: the default)."""
        path = f"/models/{model}" + (f"/{version}" if version else "")
        return self._call("GET", self.management_url, path, "management", idempotent=True)

    def register(
        self,
        url: str,
        model_name: str | None = None,
        initial_workers: int = 1,
        synchronous: bool = True,
        timeout: float | None = None,
    ) -> dict:
        """Register an archive from the model store; with ``synchronous`` workers are up on return."""
        params: dict[str, Any] = {
            "url": url,
            "initial_workers": initial_workers,
            "synchronous": str(synchronous).lower(),
        }
        if model_name:
            params["model_name"] = model_name
        return self._call("POST", self.management_url, "/models", "management", params=params, timeout=timeout)

    def scale(
        self,
        model: str,
        min_worker: int,
        max_worker: int | None = None,
        version: str | None = None,
        synchronous: bool = True,
        timeout: float | None = None,
    ) -> dict:
        """Set the worker count of a model (or one version); idempotent, so retried."""
        path = f"/models/{model}" + (f"/{version}" if version else "")
        params = {
            "min_worker": min_worker,
            "max_worker": max_worker or min_worker,
            "synchronous": str(synchronous).lower(),
        }
        return self._call(
            "PUT", self.management_url, path, "management", params=params, idempotent=True, timeout=timeout
        )

    def set_default(self, model: str, version: str) -> dict:
        """Make ``version`` the default of ``model``."""
        return self._call(
            "PUT", self.management_url, f"/models/{model}/{version}/set-default", "management", idempotent=True
        )

    def unregister(self, model: str, version: str | None = None, timeout: float | None = None) -> dict:
        """Unregister a model version (TorchServe refuses the default while others remain)."""
        path = f"/models/{model}" + (f"/{version}" if version else "")
        return self._call("DELETE", self.management_url, path, "management", timeout=timeout)

    def metrics(self) -> str:
        """The metrics listener's text (Prometheus format when so configured)."""
        if not self.metrics_url:
            raise TorchServeError("no metrics URL configured")
        resp = self.session.get(self.metrics_url + "/metrics", timeout=self.timeout)
        resp.raise_for_status()
        return resp.text

    def refresh_key(self, kind: str) -> None:
        """Ask TorchServe for a new ``inference`` or ``management`` key (needs the API key)."""
        api_key = self.keys.get("API")
        if not api_key:
            raise AuthError("cannot renew the token: no API key in the key file")
        resp = self.session.get(
            self.management_url + "/token",
            params={"type": kind},
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=self.timeout,
        )
        if resp.status_code != 200:
            raise AuthError(f"renewing the {kind} token failed ({resp.status_code})", resp.status_code)

    # -- plumbing ------------------------------------------------------------------------
    def _call(
        self,
        method: str,
        base: str,
        path: str,
        key_kind: str,
        *,
        json_body: Any = None,
        params: dict | None = None,
        idempotent: bool = False,
        timeout: float | None = None,
    ) -> Any:
        attempts = 1 + (self.retries if idempotent else 0)
        renewed = False
        attempt = 0
        while True:
            attempt += 1
            headers = {}
            key = self.keys.get(key_kind)
            if key:
                headers["Authorization"] = f"Bearer {key}"
            try:
                resp = self.session.request(
                    method,
                    base + path,
                    json=json_body,
                    params=params,
                    headers=headers,
                    timeout=timeout or self.timeout,
                )
            except OSError as exc:  # no answer: requests.RequestException is an OSError too
                if attempt < attempts:
                    time.sleep(0.2 * 2 ** (attempt - 1))
                    continue
                raise TorchServeError(f"{method} {path}: no answer from {base}: {exc}") from exc
            if resp.status_code < 300:
                return _decode(resp)
            error = _error(method, path, resp)
            if isinstance(error, AuthError) and not renewed and self.keys.expired(key_kind):
                self.refresh_key(key_kind)
                renewed = True
                attempt -= 1
                continue
            if retryable(resp.status_code, resp.text) and attempt < attempts:
                time.sleep(0.2 * 2 ** (attempt - 1))
                continue
            raise error


def _decode(resp: requests.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text


def _error(method: str, path: str, resp: requests.Response) -> TorchServeError:
    """Turn an error answer into an exception with a clear message.

    The answer is TorchServe's ``{"code","type","message"}`` or the handler's ``{"error"}``, with its
    reason headers.
    """
    error = _classify(method, path, resp)
    error.reason = resp.headers.get(REASON_HEADER)
    expected = resp.headers.get(EXPECTED_HEADER, "")
    error.expected = int(expected) if expected.isdigit() else None
    return error


def _classify(method: str, path: str, resp: requests.Response) -> TorchServeError:
    body = _decode(resp)
    status = resp.status_code
    detail = body
    kind = ""
    if isinstance(body, dict):
        detail = body.get("message") or body.get("error") or body
        kind = body.get("type", "")
    message = f"{method} {path} -> {status}: {detail}"
    if kind == "InvalidKeyException" or status == 401:
        return AuthError(f"{message} (token missing, wrong or expired: check the key file)", status, body)
    if status == 405 and path.startswith("/models") and method in ("POST", "DELETE"):
        return Refused(
            f"{message} (the model API is disabled on this server: registering and unregistering "
            "need enable_model_api=true)",
            status,
            body,
        )
    if status in (403, 405):
        return Refused(message, status, body)
    if status == 503 and QUEUE_FULL in str(detail):
        return Overloaded(
            f"{method} {path} -> 503: the model's job queue is full (TorchServe says: {detail}); retry with backoff",
            status,
            body,
        )
    if status == 503 and EXPLAIN_CEILING in str(detail):
        return Overloaded(f"{message} (retry with backoff)", status, body)
    if status == 404:
        return NotFound(message, status, body)
    if status == 409:
        return Conflict(message, status, body)
    return TorchServeError(message, status, body)
