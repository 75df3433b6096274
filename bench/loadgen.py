"""A bounded, rate-limited, closed-loop HTTP load generator for loopback tests and benchmarks.

:class:`SteadyLoad` keeps ``concurrency`` threads sending predictions at a total target
``rate`` until stopped (or ``max_requests`` / ``max_seconds`` are reached), recording every
request: start time, latency, status, and the ``model_version`` answered. ``mark(label)``
opens a new phase; each request belongs to the phase in which it *started*.

A refused connection is recorded with ``refused=True``: the server never saw that request (its
listener was closed), unlike a reset or a timeout on a connection it had accepted. ``gate``
models a router that honours readiness: while it returns False, no request is sent.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import requests
from urllib3.exceptions import NewConnectionError

from rtserve.client.rest import worker_lost


@dataclass
class Record:
    """One request's outcome."""

    start: float
    latency: float
    status: int
    version: str | None
    phase: str
    error: str = ""
    refused: bool = False
    retried: bool = False


@dataclass
class PhaseReport:
    """Summary of the requests that started in one phase."""

    phase: str
    sent: int
    failed: int
    versions: dict[str, int]
    p50_ms: float
    p99_ms: float
    errors: list[str] = field(default_factory=list)
    retried: int = 0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class SteadyLoad:
    """Steady prediction traffic against ``url`` with a bearer token from ``token()``."""

    def __init__(
        self, url: str, payload: dict, token: Callable[[], str | None], rate: float = 100.0,
        concurrency: int = 4, max_seconds: float = 600.0, max_requests: int = 200_000,
        timeout: float = 30.0, keep_alive: bool = True, gate: Callable[[], bool] | None = None,
        retry_worker_lost: bool = True,
    ) -> None:
        self.url = url
        self.body = json.dumps(payload).encode()
        self.token = token
        self.interval = concurrency / rate
        self.concurrency = concurrency
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.timeout = timeout
        self.keep_alive = keep_alive
        self.gate = gate
        self.retry_worker_lost = retry_worker_lost
        self.records: list[Record] = []
        self.phase = "start"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0

    def start(self, phase: str = "baseline") -> "SteadyLoad":
        """Start the sender threads."""
        self.phase = phase
        self._t0 = time.monotonic()
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def now(self) -> float:
        """Seconds since :meth:`start`: the time base of ``Record.start``."""
        return time.monotonic() - self._t0

    def mark(self, phase: str) -> None:
        """Requests started from now on belong to ``phase``."""
        self.phase = phase

    def stop(self) -> list[Record]:
        """Stop sending, wait for in-flight requests, and return every record."""
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)
        return self.records

    def _post(self, session: requests.Session) -> requests.Response:
        key = self.token()
        return session.post(self.url, data=self.body, timeout=self.timeout, headers={
            "Content-Type": "application/json",
            **({} if self.keep_alive else {"Connection": "close"}),
            **({"Authorization": f"Bearer {key}"} if key else {})})

    def _run(self, index: int) -> None:
        session = requests.Session()
        next_at = time.monotonic() + index * self.interval / self.concurrency
        while not self._stop.is_set():
            now = time.monotonic()
            if now - self._t0 > self.max_seconds or len(self.records) >= self.max_requests:
                return
            if next_at > now:
                time.sleep(next_at - now)
            next_at = max(next_at + self.interval, time.monotonic() - self.interval)
            if self.gate is not None and not self.gate():
                continue
            phase, start = self.phase, time.monotonic()
            status, version, error, refused, retried = 0, None, "", False, False
            try:
                resp = self._post(session)
                if self.retry_worker_lost and worker_lost(resp.status_code, resp.text):
                    retried = True  # rtserve's client policy: resend once
                    resp = self._post(session)
                status = resp.status_code
                if status == 200:
                    version = resp.json().get("model_version")
                else:
                    error = f"{status}: {resp.text[:200]}"
            except requests.RequestException as exc:
                refused = connection_refused(exc)
                error = f"{type(exc).__name__}: {exc}"[:200]
            record = Record(start - self._t0, time.monotonic() - start, status, version, phase,
                            error, refused, retried)
            with self._lock:
                self.records.append(record)


def connection_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (from requests) is a refused TCP connect: nothing reached the server."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError):
            return True
        if isinstance(e, NewConnectionError) and "Connection refused" in str(e):
            return True
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None),
                 *(a for a in getattr(e, "args", ()) if isinstance(a, BaseException))]
    return False


def summarize(records: list[Record]) -> list[PhaseReport]:
    """One report per phase, in the order phases first appeared."""
    order: list[str] = []
    by_phase: dict[str, list[Record]] = {}
    for r in sorted(records, key=lambda r: r.start):
        if r.phase not in by_phase:
            order.append(r.phase)
            by_phase[r.phase] = []
        by_phase[r.phase].append(r)
    out = []
    for phase in order:
        rs = by_phase[phase]
        lat = [r.latency * 1000 for r in rs]
        failed = [r for r in rs if r.status != 200]
        out.append(PhaseReport(
            phase=phase, sent=len(rs), failed=len(failed),
            versions=dict(Counter(r.version for r in rs if r.version)),
            p50_ms=round(statistics.median(lat), 2) if lat else 0.0,
            p99_ms=round(_percentile(lat, 0.99), 2),
            errors=sorted({r.error for r in failed})[:5],
            retried=sum(1 for r in rs if r.retried),
        ))
    return out
