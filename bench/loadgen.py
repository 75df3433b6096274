"""A bounded, rate-limited, closed-loop HTTP load generator for loopback tests and benchmarks.

:class:`SteadyLoad` keeps ``concurrency`` threads sending predictions at a total target
``rate`` until stopped (or ``max_requests`` / ``max_seconds`` are reached), recording every
request: start time, latency, status, and the ``model_version`` answered. ``mark(label)``
opens a new phase; each request belongs to the phase in which it *started*.

A refused connection is recorded with ``refused=True``: the server never saw that request (its
listener was closed), unlike a reset or a timeout on a connection it had accepted. ``gate``
models a router that honours readiness: while it returns False, no request is sent.

Like rtserve's client, a request whose worker went away before answering (TorchServe's
``Worker died.`` / ``Worker scaled down.``, :func:`rtserve.client.worker_lost`) is sent once
more (``resend_worker_lost``). What a user's own client sees first is what counts, so every
record keeps its first answer apart from the one it ended with, and every report counts:

* ``sent``: requests started;
* ``failed_first``: requests whose first try was not a 200, by status
  (``failed_first_by_status``; ``no answer`` for a reset, timeout or refused connect);
* ``resent``: requests sent once more (their first try said the worker was lost);
* ``failed_after_resend``: requests that still had no 200 at the end.

A long run passes a ``sink``: each record goes to it instead of into ``records`` (a soak's
million requests are aggregated as they come, never kept).
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields

import requests
from urllib3.exceptions import NewConnectionError

from rtserve.client.rest import worker_lost

#: ``failed_first_by_status`` key of a first try that got no HTTP answer at all.
NO_ANSWER = "no answer"


@dataclass
class Record:
    """One request's outcome: its first answer, and the one it ended with (the same unless it
    was resent). ``latency`` covers both tries; ``status`` 0 means no HTTP answer."""

    start: float
    latency: float
    status: int
    version: str | None
    phase: str
    error: str = ""
    refused: bool = False
    first_status: int = 0
    first_error: str = ""
    resent: bool = False
    #: The ``x-request-id`` of the answer it ended with ("" without an answer): its record's key.
    request_id: str = ""
    #: It was one of the load's bad requests (answered 400 when all is well).
    bad: bool = False
    #: Which of the load's payloads it sent (their order in ``payloads``; 0 with one payload).
    payload: int = 0

    @property
    def expected(self) -> int:
        """The status a healthy server answers it: 200, or 400 for one of the load's bad requests."""
        return 400 if self.bad else 200

    @property
    def failed_first(self) -> bool:
        """The first try was not answered as expected (200; 400 for a bad request)."""
        return self.first_status != self.expected

    @property
    def answered(self) -> bool:
        """It ended with the expected answer (and so with a record of it on the server)."""
        return self.status == self.expected


def status_key(status: int) -> str:
    """How :class:`Counts` names a status: the number, or :data:`NO_ANSWER`."""
    return str(status) if status else NO_ANSWER


@dataclass
class Counts:
    """First-try counts of some records (see the module docstring)."""

    sent: int = 0
    failed_first: int = 0
    failed_first_by_status: dict[str, int] = field(default_factory=dict)
    resent: int = 0
    failed_after_resend: int = 0

    @classmethod
    def of(cls, records: list[Record]) -> Counts:
        by_status = Counter(status_key(r.first_status) for r in records if r.failed_first)
        return cls(
            sent=len(records),
            failed_first=sum(by_status.values()),
            failed_first_by_status=dict(sorted(by_status.items())),
            resent=sum(1 for r in records if r.resent),
            failed_after_resend=sum(1 for r in records if not r.answered),
        )

    @classmethod
    def read(cls, report: dict) -> Counts:
        """The counts a JSON report holds among its other keys."""
        return cls(**{f.name: report[f.name] for f in fields(cls)})

    def text(self) -> str:
        """``failed on the first try: 3 (507: 3), resent: 3, failed after resending: 0``."""
        by = ", ".join(f"{k}: {n}" for k, n in self.failed_first_by_status.items())
        return (
            f"failed on the first try: {self.failed_first}{f' ({by})' if by else ''}, "
            f"resent: {self.resent}, failed after resending: {self.failed_after_resend}"
        )


@dataclass
class PhaseReport(Counts):
    """Summary of the requests that started in one phase: :class:`Counts`, versions answered,
    latency, and up to five distinct errors (first tries and final answers)."""

    phase: str = ""
    versions: dict[str, int] = field(default_factory=dict)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    errors: list[str] = field(default_factory=list)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile of ``values`` (0.0 when empty)."""
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class SteadyLoad:
    """Steady prediction traffic against ``url`` with a bearer token from ``token()``."""

    def __init__(
        self,
        url: str,
        payload: dict,
        token: Callable[[], str | None],
        rate: float = 100.0,
        concurrency: int = 4,
        max_seconds: float = 600.0,
        max_requests: int = 200_000,
        timeout: float = 30.0,
        keep_alive: bool = True,
        gate: Callable[[], bool] | None = None,
        resend_worker_lost: bool = True,
        bad_every: int = 0,
        bad_payload: dict | None = None,
        sink: Callable[[Record], None] | None = None,
        payloads: Sequence[dict] | None = None,
    ) -> None:
        self.url = url
        #: The good requests' bodies: ``payloads`` in turn across the senders, else ``payload``.
        self.bodies = [json.dumps(p).encode() for p in (payloads or [payload])]
        #: Every ``bad_every``-th request of a thread sends ``bad_payload`` (0: none).
        self.bad_every = bad_every
        self.bad_body = json.dumps(bad_payload if bad_payload is not None else {"features": [1.0]}).encode()
        self.token = token
        self.interval = concurrency / rate
        self.concurrency = concurrency
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.timeout = timeout
        self.keep_alive = keep_alive
        self.gate = gate
        self.resend_worker_lost = resend_worker_lost
        self.records: list[Record] = []
        #: Takes each record instead of ``records`` (called under the load's lock: one at a time).
        self.sink = sink
        #: Requests recorded so far (in ``records`` or given to ``sink``).
        self.done = 0
        self.phase = "start"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t0 = 0.0
        self._turns = itertools.count()  # whose payload is next (next() on it is atomic)

    def start(self, phase: str = "baseline") -> SteadyLoad:
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
        """Stop sending, wait for in-flight requests, and return every record (none with a
        ``sink``)."""
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)
        return self.records

    def _post(self, session: requests.Session, bad: bool = False, payload: int = 0) -> requests.Response:
        key = self.token()
        data = self.bad_body if bad else self.bodies[payload]
        return session.post(
            self.url,
            data=data,
            timeout=self.timeout,
            headers={
                "Content-Type": "application/json",
                **({} if self.keep_alive else {"Connection": "close"}),
                **({"Authorization": f"Bearer {key}"} if key else {}),
            },
        )

    def _run(self, index: int) -> None:
        session = requests.Session()
        next_at = time.monotonic() + index * self.interval / self.concurrency
        sent = 0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - self._t0 > self.max_seconds or self.done >= self.max_requests:
                return
            if next_at > now:
                time.sleep(next_at - now)
            next_at = max(next_at + self.interval, time.monotonic() - self.interval)
            if self.gate is not None and not self.gate():
                continue
            phase, start = self.phase, time.monotonic()
            sent += 1
            bad = bool(self.bad_every) and sent % self.bad_every == 0
            payload = 0 if bad or len(self.bodies) == 1 else next(self._turns) % len(self.bodies)
            first = self._attempt(session, bad, payload)
            status, version, error, refused, lost, request_id = first
            resent = self.resend_worker_lost and lost
            if resent:  # rtserve's client policy: resend once
                status, version, error, refused, _, request_id = self._attempt(session, bad, payload)
            record = Record(
                start - self._t0,
                time.monotonic() - start,
                status,
                version,
                phase,
                error,
                refused,
                first_status=first[0],
                first_error=first[2],
                resent=resent,
                request_id=request_id,
                bad=bad,
                payload=payload,
            )
            with self._lock:
                self.done += 1
                (self.records.append if self.sink is None else self.sink)(record)

    def _attempt(
        self, session: requests.Session, bad: bool = False, payload: int = 0
    ) -> tuple[int, str | None, str, bool, bool, str]:
        """One try: (status, version answered, error text, refused at connect, worker lost,
        the answer's x-request-id)."""
        try:
            resp = self._post(session, bad, payload)
        except requests.RequestException as exc:
            return 0, None, f"{type(exc).__name__}: {exc}"[:200], connection_refused(exc), False, ""
        request_id = resp.headers.get("x-request-id", "")
        if resp.status_code == 200:
            return 200, resp.json().get("model_version"), "", False, False, request_id
        return (
            resp.status_code,
            None,
            f"{resp.status_code}: {resp.text[:200]}",
            False,
            worker_lost(resp.status_code, resp.text),
            request_id,
        )


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
        todo += [
            e.__cause__,
            e.__context__,
            getattr(e, "reason", None),
            *(a for a in getattr(e, "args", ()) if isinstance(a, BaseException)),
        ]
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
        errors = {r.first_error for r in rs if r.failed_first} | {r.error for r in rs if not r.answered}
        out.append(
            PhaseReport(
                **vars(Counts.of(rs)),
                phase=phase,
                versions=dict(Counter(r.version for r in rs if r.version)),
                p50_ms=round(statistics.median(lat), 2) if lat else 0.0,
                p99_ms=round(percentile(lat, 0.99), 2),
                errors=sorted(errors)[:5],
            )
        )
    return out
