"""Warm a started TorchServe's whole request path before it is reported ready.

:func:`warm_up` sends the archive's golden rows through the inference port, one at a time (a new connection every
:data:`NEW_CONNECTION_EVERY` requests), then ``concurrency`` at once, and checks every answer. Bounded per model by
:class:`WarmupConfig` (its keys are defined and defaulted here only; 0 requests turns it off). The requests carry
:data:`handler.warmup.HEADER` and :data:`handler.warmup.QUERY_PARAMETER`, so metrics, drift and audit leave them out.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

from handler.signature import CLASSIFICATION, answer_numbers
from handler.warmup import HEADER, QUERY_PARAMETER
from rtserve.client.rest import Client
from rtserve.errors import ArchiveError, WarmupError, WrongAnswers
from rtserve.model.archive import golden_mismatches, read_meta

logger = logging.getLogger(__name__)

#: config.properties keys (with their defaults in :class:`WarmupConfig`).
REQUESTS_KEY = "rtserve_warmup_requests"
SECONDS_KEY = "rtserve_warmup_seconds"
CONCURRENCY_KEY = "rtserve_warmup_concurrency"
#: One request at a time, a new connection every this many requests.
NEW_CONNECTION_EVERY = 2
#: The share of the requests sent ``concurrency`` at once (after the one-at-a-time part).
CONCURRENT_SHARE = 1 / 3
#: Largest |difference| of a probability from the golden set (as the gate's golden_tolerance).
TOLERANCE = 1e-5
#: Seconds per request before the warm-up gives up on the server.
REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class WarmupConfig:
    """How much warm-up a start gets, per model.

    Attributes:
        requests: most requests (0: no warm-up).
        seconds: most seconds; the warm-up stops early when they are spent.
        concurrency: requests at once in the concurrent part (1: none).
    """

    requests: int = 300
    seconds: float = 2.0
    concurrency: int = 4

    @classmethod
    def from_props(cls, props: Mapping[str, str]) -> WarmupConfig:
        """Read the ``rtserve_warmup_*`` keys of an effective ``config.properties``.

        Raises:
            WarmupError: a value is not a number or out of range.
        """
        try:
            config = cls(
                int(props.get(REQUESTS_KEY, cls.requests)),
                float(props.get(SECONDS_KEY, cls.seconds)),
                int(props.get(CONCURRENCY_KEY, cls.concurrency)),
            )
        except ValueError as exc:
            raise WarmupError(
                f"{REQUESTS_KEY} and {CONCURRENCY_KEY} must be whole numbers, {SECONDS_KEY} a number: {exc}"
            ) from exc
        if not 0 <= config.requests <= 10_000:
            raise WarmupError(f"{REQUESTS_KEY} must be in [0, 10000], got {config.requests}")
        if not (math.isfinite(config.seconds) and 0.1 <= config.seconds <= 60):
            raise WarmupError(f"{SECONDS_KEY} must be in [0.1, 60], got {config.seconds}")
        if not 1 <= config.concurrency <= 64:
            raise WarmupError(f"{CONCURRENCY_KEY} must be in [1, 64], got {config.concurrency}")
        return config


def new_key() -> str:
    """A fresh warm-up key (32 random bytes, URL-safe base64)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Rows:
    """What the warm-up sends: feature rows and, when the archive has a golden set, the probabilities each must get.

    None: only the answer's form is checked.
    """

    features: list[list[float]]
    probabilities: list[list[float]] | None
    #: The output signature of a model that is not one classifier (``rtserve-model/2``: one output of
    #: another kind, or several): then ``probabilities`` holds the golden outputs its answers carry
    #: (every output's side by side: ``handler.signature.answer_numbers``).
    signature: list[dict] | None = None

    @classmethod
    def from_mar(cls, mar: Path) -> Rows:
        """The golden set of an archive's ``meta.json``; all-zero rows of its width without one.

        Raises:
            WarmupError: the archive or its ``meta.json`` cannot be read.
        """
        try:
            meta = read_meta(mar)
        except ArchiveError as exc:
            raise WarmupError(str(exc)) from exc
        golden = meta.get("golden") or {}
        width = len(meta["feature_names"])
        outputs = meta.get("outputs") or []
        if len(outputs) > 1 or (outputs and outputs[0].get("kind") != CLASSIFICATION):
            return cls(
                [list(map(float, r)) for r in golden.get("features") or [[0.0] * width]],
                golden.get("outputs") or None,
                outputs,
            )
        if golden.get("features") and golden.get("probabilities"):
            return cls(
                [list(map(float, r)) for r in golden["features"]],
                [list(map(float, p)) for p in golden["probabilities"]],
            )
        return cls([[0.0] * width], None)


@dataclass
class WarmupReport:
    """What one model's warm-up did."""

    model: str
    requests: int
    seconds: float
    connections: int


class _Sender:
    """Sends warm-up predictions and checks each answer (shared by the sending threads)."""

    def __init__(self, client: Client, model: str, key: str, rows: Rows, deadline: float) -> None:
        url = urlsplit(client.inference_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.path = f"/predictions/{quote(model, safe='')}?{QUERY_PARAMETER}=1"
        self.client, self.model, self.key, self.rows = client, model, key, rows
        self.bodies = [json.dumps({"features": r}).encode() for r in rows.features]
        self.deadline = deadline
        self.connections = 0
        self._lock = threading.Lock()

    def run(self, indices: Sequence[int], new_connection_every: int = 0) -> int:
        """Send the rows at ``indices`` one after the other on this thread.

        Returns how many were answered before the deadline.
        """
        conn: http.client.HTTPConnection | None = None
        sent = 0
        try:
            for n, i in enumerate(indices):
                if time.monotonic() >= self.deadline:
                    break
                if conn is None or (new_connection_every and n % new_connection_every == 0):
                    if conn is not None:
                        conn.close()
                    conn = self._connect()
                status, body = self._post(conn, i)
                self._check(i, status, body)
                sent += 1
        finally:
            if conn is not None:
                conn.close()
        return sent

    def _connect(self) -> http.client.HTTPConnection:
        with self._lock:
            self.connections += 1
        conn = http.client.HTTPConnection(self.host, self.port, timeout=REQUEST_TIMEOUT)
        conn.connect()
        return conn

    def _post(self, conn: http.client.HTTPConnection, i: int) -> tuple[int, bytes]:
        """One request (sent again once after a renewed key or a connection the server closed)."""
        for attempt in (1, 2):
            headers = {"Content-Type": "application/json", HEADER: self.key}
            token = self.client.keys.get("inference")
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                conn.request("POST", self.path, body=self.bodies[i], headers=headers)
                resp = conn.getresponse()
                status, body = resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError) as exc:
                if attempt == 2:
                    raise WarmupError(f"warm-up request to {self.model} failed: {exc}") from exc
                conn.close()
                conn.connect()
                continue
            if status in (400, 401) and attempt == 1 and self._renew_key():
                continue
            return status, body
        raise AssertionError("unreachable")

    def _renew_key(self) -> bool:
        """Renew the inference key if it expired (as :class:`Client` does); whether it did."""
        with self._lock:
            if not self.client.keys.expired("inference"):
                return False
            self.client.refresh_key("inference")
            return True

    def _check(self, i: int, status: int, body: bytes) -> None:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        signature = self.rows.signature
        if status != 200 or not isinstance(answer, dict) or (signature is None and "prediction" not in answer):
            raise WarmupError(f"warm-up request to {self.model} answered {status}: {body[:300]!r}")
        expected = self.rows.probabilities
        if signature is not None:
            self._check_output(i, answer, signature, expected)
            return
        if expected is None:
            return
        want = expected[i]
        got = answer.get("probabilities")
        if (
            answer["prediction"] != max(range(len(want)), key=want.__getitem__)
            or not isinstance(got, list)
            or golden_mismatches([want], [got], TOLERANCE)
        ):
            raise WrongAnswers(
                f"{self.model} answered golden row {i} of its archive with {answer!r:.300}, "
                f"expected probabilities {want}: the served model is not the one packaged"
            )

    def _check_output(self, i: int, answer: dict, signature: list[dict], expected: list | None) -> None:
        """:meth:`_check` for a model that is not one classifier: every output's values, to the tolerance."""
        try:
            got = answer_numbers(signature, answer)
        except (KeyError, TypeError) as exc:
            what = f"a {signature[0]['kind']}" if len(signature) == 1 else f"a {len(signature)}-output"
            raise WarmupError(f"warm-up request to {self.model} answered {answer!r:.300}, not {what} answer") from exc
        if expected is not None and golden_mismatches([expected[i]], [got], TOLERANCE):
            raise WrongAnswers(
                f"{self.model} answered golden row {i} of its archive with {answer!r:.300}, "
                f"expected {expected[i]}: the served model is not the one packaged"
            )


def warm_up(client: Client, model: str, key: str, rows: Rows, config: WarmupConfig) -> WarmupReport:
    """Send ``model`` up to ``config.requests`` warm-up predictions within ``config.seconds``.

    Raises:
        WarmupError: an answer was not a 200 with the golden row's prediction.
    """
    started = time.monotonic()
    sender = _Sender(client, model, key, rows, started + config.seconds)
    n_rows = len(rows.features)
    together = int(config.requests * CONCURRENT_SHARE) if config.concurrency > 1 else 0
    alone = config.requests - together
    sent = sender.run([i % n_rows for i in range(alone)], NEW_CONNECTION_EVERY)
    if together:
        shares = [
            [(alone + i) % n_rows for i in range(t, together, config.concurrency)] for t in range(config.concurrency)
        ]
        counts = [0] * len(shares)
        errors: list[BaseException] = []

        def one(t: int) -> None:
            try:
                counts[t] = sender.run(shares[t])
            except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(t,), daemon=True) for t in range(len(shares))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        sent += sum(counts)
    return WarmupReport(model, sent, round(time.monotonic() - started, 3), sender.connections)
