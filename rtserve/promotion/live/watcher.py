"""The canary watcher: a process that judges the canary's last window and aborts it on a breach.

It reads what the live log and the records gain (:func:`~.evidence.canary_check`); an abort sets the share
to 0 and is recorded in the rollout history and the audit log. Its PID file counts only while the process
holds :data:`rtserve.settings.CANARY_WATCHER_MARKS`, so a reused PID is never taken for it.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from handler.audit import append_event
from rtserve.errors import LiveError
from rtserve.promotion.gate import CanaryThresholds
from rtserve.promotion.history import History
from rtserve.promotion.kinds import Compare
from rtserve.promotion.live.evidence import (
    Answer,
    CanaryDecision,
    LiveLine,
    answers_follower,
    canary_check,
    live_line_parser,
    parse_answer_line,
    parse_lines,
)
from rtserve.promotion.live.routes import Routes, canary_route, read_routes, update_routes
from rtserve.runtime.logs import LogFollower
from rtserve.runtime.process import PidFile, exit_on_sigterm, recorded_pid, remove_own_pid_file, spawn, stop_recorded
from rtserve.settings import CANARY_WATCHER_MARKS, RunDir

#: How often the canary watcher reads the live log (seconds).
POLL_S = 0.5
#: Seconds a stop waits for the canary watcher to end after SIGTERM (then SIGKILL).
STOP_WAIT_S = 5.0


@dataclass
class Watch:
    """What the canary watcher needs: where the files are, the thresholds, who it watches.

    ``records`` are the default's (its spool, or a file); an abort's event goes to ``audit_log``.
    In a cluster (``make k8s-canary``) the files are the watcher's own copies: ``pull`` appends
    what the pods' live logs and records gained to them before each look, and ``publish`` takes
    the routes an abort wrote to the pods (:mod:`rtserve.promotion.live.cluster`). ``compare``
    says how the answers of the candidate's output kind agree (from its archive; default a classifier's).
    """

    model: str
    version: str
    routes: Path
    live_log: Path
    records: Path
    audit_log: Path
    history: History
    thresholds: CanaryThresholds
    pull: Callable[[], object] | None = None
    publish: Callable[[Routes], object] | None = None
    #: The audit log's cap (:func:`rtserve.server.disk.audit_cap`); None: no rotation.
    audit_bytes: int | None = None
    compare: Compare = field(default_factory=Compare)


def abort(watch: Watch, decision: CanaryDecision) -> dict:
    """Set the canary's share to 0 and record why (rollout history, audit log); returns the event."""
    percent = {}

    def to_zero(routes: Routes | None) -> Routes:
        if routes is None or routes.canary is None:
            raise LiveError(f"{watch.routes}: the canary route is gone")
        percent["was"] = routes.canary.percent
        return replace(routes, canary=replace(routes.canary, percent=0.0))

    routes = update_routes(watch.routes, to_zero)
    if watch.publish is not None:
        watch.publish(routes)
    event = {
        "event": "canary-abort",
        "action": "canary-abort",
        "model": watch.model,
        "version": watch.version,
        "percent": percent["was"],
        "failures": decision.breaches,
        "figures": {k: v for k, v in asdict(decision).items() if k != "breaches"},
        "thresholds": asdict(watch.thresholds),
        "at": datetime.now(UTC).isoformat(),
    }
    watch.history.append(event)
    append_event(watch.audit_log, event, watch.audit_bytes)
    return event


def watch(
    w: Watch,
    out: Callable[[str], None] = print,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.time,
    status_every_s: float = 10.0,
) -> dict | None:
    """The canary watcher: every ``poll_s``, judge the last window and abort on a breach.

    Reads what the live log and the records gained (:func:`canary_check`); on a breach returns
    :func:`abort`'s event. Returns None when the canary was stopped or changed by someone else.
    """
    started_ms = clock() * 1000.0
    live, records = LogFollower(w.live_log), answers_follower(w.records)
    window: deque[LiveLine] = deque()
    answers: dict[str, Answer] = {}
    seen: deque[tuple[float, str]] = deque()
    parse_live_line = live_line_parser(w.compare.kind)
    last_status = 0.0
    out(f"watching canary {w.model} {w.version}: {asdict(w.thresholds)}")
    while True:
        if canary_route(read_routes(w.routes), w.version) is None:
            out(f"canary {w.version} stopped (its share is 0 or its route is gone)")
            return None
        if w.pull is not None:
            w.pull()
        now = clock()
        keep_ms = now * 1000.0 - w.thresholds.window_s * 1000.0
        new, _ = parse_lines(live.lines(), parse_live_line)
        window.extend(line for line in new if line.version == w.version and line.at >= started_ms)
        while window and window[0].at < keep_ms:
            window.popleft()
        for answer in parse_lines(records.lines(), parse_answer_line)[0]:
            answers[answer.request_id] = answer
            seen.append((now, answer.request_id))
        while seen and seen[0][0] < now - w.thresholds.window_s - 10:  # a margin for late lines
            answers.pop(seen.popleft()[1], None)
        decision = canary_check(w.thresholds, window, answers, w.version, now * 1000.0, w.compare)
        if decision.breaches:
            event = abort(w, decision)
            out(f"ABORTED {decision.text()}")
            for breach in decision.breaches:
                out(f"  FAILED {breach}")
            out(f"  share {event['percent']:g}% -> 0 (routes file); recorded in the rollout history and the audit log")
            return event
        if now - last_status >= status_every_s:
            out(decision.text())
            last_status = now
        time.sleep(poll_s)


@dataclass(frozen=True)
class CanaryStarted:
    """What a canary's start did (:meth:`.local.ServerLive.canary`, :func:`.cluster.canary`).

    The watcher's PID, whether it was started now (else it ran already, and only the share changed),
    and the window its thresholds judge (s).
    """

    pid: int
    started: bool
    window_s: float


def start_watcher(argv: Sequence[str], run: RunDir) -> int:
    """Start the canary watcher ``argv`` detached and record its PID in ``run.canary_pid``; returns the PID.

    Its own session, output appended to ``run.canary_log`` (:func:`~rtserve.runtime.process.spawn`).

    Raises:
        ProcessError: it cannot be started.
    """
    run.canary_log.parent.mkdir(parents=True, exist_ok=True)
    return spawn(argv, run.canary_log, PidFile(run.canary_pid)).pid


def watcher_pid(pid_file: str | Path) -> int | None:
    """The PID of the canary watcher recorded in ``pid_file``, when that process still runs it."""
    return recorded_pid(pid_file, CANARY_WATCHER_MARKS)


def stop_watcher(pid_file: str | Path, timeout: float = STOP_WAIT_S) -> int | None:
    """Stop the canary watcher that ``pid_file`` records and remove the file.

    Returns the PID it stopped, if one ran (:func:`~rtserve.runtime.process.stop_recorded`).
    """
    return stop_recorded(pid_file, CANARY_WATCHER_MARKS, timeout)


def run_watcher(w: Watch, pid_file: Path, poll_s: float | None = None) -> dict | None:
    """Run the canary watcher ``w`` (:func:`watch`) until it aborts the canary, sees it stopped, or gets SIGTERM.

    Its lines are timed on stdout; then ``pid_file`` is removed if it still names this process. Returns the
    abort's event, if it aborted.
    """

    def say(line: str) -> None:
        sys.stdout.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        sys.stdout.flush()

    exit_on_sigterm()  # `canary-stop`: end through finally
    try:
        return watch(w, say, poll_s=poll_s or POLL_S)
    finally:
        remove_own_pid_file(pid_file, CANARY_WATCHER_MARKS)
