"""Drain a running TorchServe before it is stopped, so that no accepted request is lost (0.12 does not drain).

:func:`drain` writes ``RUN_DIR/draining`` (:data:`rtserve.settings.DRAIN_FILE`; readiness fails from then on), then
waits until nothing arrived, queued or ran for ``quiet`` seconds (at least ``min_wait``, at most ``timeout``); the stop
that follows closes the listeners first. In-flight batches come from ``logs/ts_log.log`` and arrivals from
``logs/ts_metrics.log`` (TorchServe 0.12.0's log configuration); docs/reliability-and-security.md explains why.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from rtserve.client.rest import Client, TorchServeError
from rtserve.runtime.logs import LogFollower
from rtserve.settings import ACCESS_LOG, TS_LOG, TS_METRICS_LOG, RunDir

logger = logging.getLogger(__name__)

#: ts_log.log lines written by a worker thread when it sends a batch / after it answered it.
BATCH_START = "Looping backend response at:"
BATCH_DONE = "Backend response time:"
#: ts_metrics.log line written by the frontend for every accepted inference request.
ARRIVAL = "ts_inference_requests_total"
#: access_log.log markers of inference requests (not /ping, not management calls).
INFERENCE_PATHS = ('"POST /predictions/', '"POST /explanations/', '"POST /v1/models/', '"POST /v2/models/')
#: How much of ts_log.log to read back at the start to learn each worker's current state.
TAIL_BYTES = 4 << 20


@dataclass
class DrainReport:
    """What one drain saw.

    Attributes:
        drained: idle for ``quiet`` seconds before ``timeout`` (False: gave up).
        seconds: time from writing the marker to the end of the wait.
        quiet_after: seconds after the marker at which the final quiet window began.
        arrivals: inference requests that arrived while draining.
        peak_pending: most requests seen waiting in the job queues at one poll.
        peak_busy: most workers seen holding a batch at one poll.
        polls: how many times the state was read.
        busy_at_end: pending requests + busy workers at the last poll (0 when drained).
    """

    drained: bool
    seconds: float
    quiet_after: float
    arrivals: int
    peak_pending: int
    peak_busy: int
    polls: int
    busy_at_end: int

    def as_dict(self) -> dict:
        """The report as plain JSON-able values."""
        return asdict(self)


class Activity:
    """Which worker threads hold a batch, and how many inference requests arrived, from the logs."""

    def __init__(self, log_dir: Path) -> None:
        self._workers = LogFollower(log_dir / TS_LOG, from_end=True, tail_bytes=TAIL_BYTES)
        self._arrivals = LogFollower(log_dir / TS_METRICS_LOG, from_end=True)
        self._answers = LogFollower(log_dir / ACCESS_LOG, from_end=True)
        self.busy: dict[str, bool] = {}  # worker id (its port) -> holds a batch
        self.arrivals = 0

    def poll(self) -> int:
        """Read new log lines; returns how many inference requests were seen since the last poll.

        A request is seen when it arrives (``ts_metrics.log``, written in TorchServe's default
        ``log`` metrics mode) or when it is answered (``access_log.log``, written in every mode:
        with ``metrics_mode=prometheus`` it is the only signal).
        """
        for line in self._workers.lines():
            if BATCH_START in line:
                self._set(line, True)
            elif BATCH_DONE in line:
                self._set(line, False)
        new = sum(1 for line in self._arrivals.lines() if line.split(" - ", 1)[-1].startswith(ARRIVAL))
        new += sum(1 for line in self._answers.lines() if any(p in line for p in INFERENCE_PATHS))
        self.arrivals += new
        return new

    def _set(self, line: str, busy: bool) -> None:
        # "<date> <time> [INFO ] W-9000-realtime-classifier_1.0 org.pytorch.serve.wlm.WorkerThread - ..."
        for token in line.split():
            if token.startswith("W-"):
                self.busy[token.split("-")[1]] = busy
                return

    def busy_workers(self, live: set[str]) -> int:
        """Busy workers among ``live`` (a dead worker's unfinished batch was answered with an error)."""
        return sum(1 for worker, busy in self.busy.items() if busy and worker in live)


def queue_state(client: Client) -> tuple[int, set[str]]:
    """Pending requests over every version of every model, and the ids of their workers."""
    pending, workers = 0, set()
    for model in client.list_models():
        for desc in client.describe(model["modelName"], "all"):
            pending += int(desc.get("jobQueueStatus", {}).get("pendingRequests", 0))
            workers |= {str(w.get("id")) for w in desc.get("workers", [])}
    return pending, workers


def without_batch_lines(text: str) -> str:
    """``text`` (ts_log.log's) less the worker threads' two lines per batch."""
    return "".join(
        line for line in text.splitlines(keepends=True) if BATCH_START not in line and BATCH_DONE not in line
    )


def mark_draining(run_dir: Path, pid: int | None) -> Path:
    """Write the drain marker (readiness goes false); returns its path."""
    path = RunDir(Path(run_dir)).drain_marker
    path.write_text(json.dumps({"since": datetime.now(UTC).isoformat(), "pid": pid}) + "\n")
    return path


def wait_idle(
    client: Client,
    log_dir: Path,
    timeout: float = 30.0,
    quiet: float = 1.0,
    min_wait: float = 0.0,
    poll: float = 0.05,
    activity: Activity | None = None,
) -> DrainReport:
    """Wait until no request arrived, none is queued and no worker holds a batch for ``quiet`` s.

    Args:
        client: the instance's client (management key needed for describe).
        log_dir: the instance's TorchServe log directory.
        timeout: give up after this many seconds (the report then says ``drained=False``).
        quiet: how long the idle state must hold; longer than the batch delay and the gaps
            between requests while the routing layer still sends.
        min_wait: never finish earlier (time for readiness to propagate to the routing layer).
        poll: seconds between reads.
        activity: a log reader created earlier (so that arrivals since then count).
    """
    activity = activity or Activity(log_dir)
    started = time.monotonic()
    quiet_since = started
    peak_pending = peak_busy = polls = 0
    busy_now = 0
    while True:
        now = time.monotonic()
        arrived = activity.poll()
        try:
            pending, live = queue_state(client)
        except TorchServeError as exc:  # the management API must answer: count it as busy
            logger.warning("drain: describe failed (%s); still waiting", exc)
            pending, live = 1, set()
        busy = activity.busy_workers(live)
        polls += 1
        peak_pending, peak_busy = max(peak_pending, pending), max(peak_busy, busy)
        busy_now = pending + busy
        if arrived or busy_now:
            quiet_since = now
        elapsed = now - started
        if now - quiet_since >= quiet and elapsed >= min_wait:
            return DrainReport(
                True,
                round(elapsed, 3),
                round(quiet_since - started, 3),
                activity.arrivals,
                peak_pending,
                peak_busy,
                polls,
                0,
            )
        if elapsed >= timeout:
            logger.warning(
                "drain: still busy after %.0fs (%d queued, %d workers busy); giving up", timeout, pending, busy
            )
            return DrainReport(
                False,
                round(elapsed, 3),
                round(quiet_since - started, 3),
                activity.arrivals,
                peak_pending,
                peak_busy,
                polls,
                busy_now,
            )
        time.sleep(poll)


def drain(
    client: Client,
    run_dir: Path,
    log_dir: Path,
    pid: int | None,
    timeout: float = 30.0,
    quiet: float = 1.0,
    min_wait: float = 0.0,
) -> DrainReport:
    """Mark the instance draining, then :func:`wait_idle`. The marker stays until the next start."""
    activity = Activity(log_dir)  # start reading before readiness flips: no arrival is missed
    mark_draining(run_dir, pid)
    report = wait_idle(client, log_dir, timeout, quiet, min_wait, activity=activity)
    logger.info(
        "drain: %s after %.2fs (%d requests arrived while draining, peak %d queued, peak %d workers busy)",
        "idle" if report.drained else "NOT idle",
        report.seconds,
        report.arrivals,
        report.peak_pending,
        report.peak_busy,
    )
    return report


def is_draining(run_dir: Path) -> bool:
    """Whether the instance in ``run_dir`` is draining (readiness must be false)."""
    return RunDir(Path(run_dir)).drain_marker.exists()


def clear(run_dir: Path) -> None:
    """Remove the drain marker (a fresh start is not draining)."""
    RunDir(Path(run_dir)).drain_marker.unlink(missing_ok=True)
