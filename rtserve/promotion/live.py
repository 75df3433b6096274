"""Live traffic for a candidate version: shadow it, canary it, and judge it on its answers.

The split and the mirror live in TorchServe's frontend (rtserve's Java agent): it re-reads the
routes file (:attr:`rtserve.settings.RunDir.live_routes`, written here, atomically) and appends one
JSON line per request it mirrored to the candidate (``shadow``) or forwarded to it (``canary``) to
the live log::

    {"kind": "shadow", "of": "<caller's request id>", "id": "<candidate's request id>",
     "version": "2.0", "status": 200, "ms": 12.34, "at": <epoch ms>, "body": "<answer body>"}

(``status`` 0: no answer, with an ``error``; -1: the mirror was dropped.) For a shadow line the
default's answer to the same request is its record (:mod:`handler.records`) whose
``request_id`` is ``of``: in the server's records spool, or a file of records copied from pods.

This module is pure but for the small file helpers at the end: :func:`shadow_report` and
:func:`canary_check` are functions of parsed lines, so the tests drive them with synthetic logs;
:func:`watch` is the canary watcher's loop over the files.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections import Counter, deque
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from handler.audit import append_event
from rtserve.errors import LiveError
from rtserve.promotion.gate import CanaryThresholds, ShadowThresholds, percentile
from rtserve.promotion.history import History
from handler.records import SEGMENT_SUFFIX
from rtserve.runtime.logs import LogFollower, SegmentsFollower
from rtserve.runtime.process import recorded_pid, stop_recorded
from rtserve.settings import CANARY_WATCHER_MARKS

#: The header whose value makes the canary share sticky (one client key, one version).
KEY_HEADER = "x-rtserve-key"


def sticky_bucket(key: str) -> float:
    """The agent's place in [0, 100) of a sticky key (agent/src/rtserve/agent/Routes.java): a
    request whose key's bucket is below the canary's percent goes to the candidate."""
    return (int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 11) / 2**53 * 100


#: How often the canary watcher reads the live log (seconds).
POLL_S = 0.5
#: Seconds a stop waits for the canary watcher to end after SIGTERM (then SIGKILL).
STOP_WAIT_S = 5.0
#: Disagreements a shadow report lists.
TOP_DISAGREEMENTS = 10
#: What each version's latency in a shadow report is.
LATENCY_SOURCES = {
    "default": "handler_ms: the worker's time for the request's batch (its record)",
    "candidate": "ms: the frontend's round trip to the candidate (live log)",
}


# -- the routes file --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    """One live route: ``percent`` of the requests go to ``url`` (the candidate ``version``)."""

    version: str
    percent: float
    url: str
    key_header: str | None = None

    def json(self) -> dict:
        out = {"version": self.version, "percent": self.percent, "url": self.url}
        return out if self.key_header is None else {**out, "key_header": self.key_header}


@dataclass(frozen=True)
class Routes:
    """The routes file: the model, its shadow and canary (None: off), the live log's path.

    ``revision`` (0: none, and not written) orders the routes a cluster publishes (epoch ms,
    :mod:`rtserve.cli.k8s`): a pod's :class:`RoutesSync` never replaces newer routes with older
    ones that the kubelet brings late. The agent ignores it."""

    model: str
    log: str
    shadow: Route | None = None
    canary: Route | None = None
    token_file: str | None = None
    revision: int = 0

    def json(self) -> dict:
        out = {"model": self.model, "shadow": self.shadow and self.shadow.json(),
               "canary": self.canary and self.canary.json(), "log": self.log,
               "token_file": self.token_file}
        return {**out, "revision": self.revision} if self.revision else out

    @classmethod
    def parse(cls, raw: object, where: str) -> "Routes":
        """Routes from the file's JSON.

        Raises:
            LiveError: a key is missing or has the wrong type (``where`` names the file).
        """
        try:
            routes = {}
            for kind in ("shadow", "canary"):
                entry = raw.get(kind)
                routes[kind] = None if entry is None else Route(
                    str(entry["version"]), _share(entry["percent"]), str(entry["url"]),
                    entry.get("key_header"))
            revision = raw.get("revision", 0)
            if isinstance(revision, bool) or not isinstance(revision, int):
                raise ValueError(f"revision must be an integer, got {revision!r}")
            return cls(str(raw["model"]), str(raw["log"]), token_file=raw.get("token_file"),
                       revision=revision, **routes)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise LiveError(f"{where}: not a routes file ({type(exc).__name__}: {exc}); move it "
                            "away to start again") from exc


def _share(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise ValueError(f"percent must be a number in [0, 100], got {value!r}")
    return float(value)


def read_routes(path: str | Path) -> Routes | None:
    """The routes file at ``path`` (None when there is none).

    Raises:
        LiveError: it is not a routes file.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise LiveError(f"{path}: not JSON ({exc}); move it away to start again") from exc
    return Routes.parse(raw, str(path))


def write_routes(path: str | Path, routes: Routes) -> None:
    """Replace the routes file at once (a temporary file renamed over it): the agent never reads
    half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(routes.json(), out, indent=2)
            out.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_routes(path: str | Path, change: Callable[[Routes | None], Routes]) -> Routes:
    """Read, change and write the routes file under a lock (``make shadow`` and the canary
    watcher may change it at the same moment); returns what was written."""
    lock = Path(path).with_name(Path(path).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        routes = change(read_routes(path))
        write_routes(path, routes)
    return routes


def set_route(path: str | Path, model: str, log: str | Path, kind: str,
              route: Route | None) -> Routes:
    """Set (or, with None, turn off) the ``shadow`` or ``canary`` route, keeping the other."""
    def change(routes: Routes | None) -> Routes:
        routes = routes or Routes(model, str(log))
        return replace(routes, model=model, log=str(log), **{kind: route})

    return update_routes(path, change)


def drop_version(path: str | Path, version: str) -> list[str]:
    """Turn off the routes to ``version`` (it became the default); returns which ones."""
    if not Path(path).exists():
        return []
    dropped: list[str] = []

    def change(routes: Routes | None) -> Routes:
        for kind in ("shadow", "canary"):
            route = getattr(routes, kind)
            if route is not None and route.version == version:
                dropped.append(kind)
                routes = replace(routes, **{kind: None})
        return routes

    update_routes(path, change)
    return dropped


class RoutesSync:
    """Keeps a server's routes file equal to a mounted one (a pod's ConfigMap
    ``rtserve-live-routes``: ``$RTSERVE_LIVE_ROUTES``), copying it only when the mounted content
    changes, and never over routes of a higher ``revision``: routes written straight into the
    pod (each change in a cluster, which does not wait for the kubelet to bring the ConfigMap's
    update, up to a minute later) stay until the ConfigMap brings newer ones. A mounted file that
    goes away removes the copy (no routes); an invalid one is not copied (the agent keeps the
    routes it has) and said once.

    Args:
        source: the mounted file.
        target: the routes file the frontend's agent follows (:attr:`RunDir.live_routes`).
    """

    def __init__(self, source: Path, target: Path, log: Callable[[str], None] = print) -> None:
        self.source, self.target, self.log = source, target, log
        self.seen: str | None = None

    def sync(self) -> bool:
        """Copy the mounted file if its content changed since the last look; whether it did."""
        try:
            text = self.source.read_text()
        except (FileNotFoundError, NotADirectoryError):
            text = None
        if text == self.seen:
            return False
        self.seen = text
        if text is None:
            self.target.unlink(missing_ok=True)
            self.log(f"live routes: {self.source} is gone: {self.target} removed (no routes)")
            return True
        try:
            routes = Routes.parse(json.loads(text), str(self.source))
        except (ValueError, LiveError) as exc:
            self.log(f"live routes: {self.source} not copied: {exc}")
            return False
        try:
            current = read_routes(self.target)
        except LiveError:
            current = None
        if current is not None and current.revision > routes.revision:
            self.log(f"live routes: {self.source} not copied: revision {routes.revision} is older "
                     f"than {self.target}'s {current.revision}")
            return False
        write_routes(self.target, routes)
        self.log(f"live routes: {self.source} copied to {self.target}")
        return True


# -- the live log and the records ------------------------------------------------------------------
@dataclass(frozen=True)
class LiveLine:
    """One line of the live log, with the candidate's answer decoded (label and probabilities
    when ``body`` is a prediction)."""

    kind: str
    of: str
    id: str | None
    version: str
    status: int
    ms: float
    at: float
    label: str | None = None
    probabilities: tuple[float, ...] | None = None
    error: str | None = None

    @property
    def failed(self) -> bool:
        """An error of the candidate: a 5xx or no answer (a dropped mirror is not one)."""
        return self.status == 0 or self.status >= 500

    @property
    def answered(self) -> bool:
        """The candidate answered (any status; not dropped, not unanswered)."""
        return self.status > 0


def parse_live_line(text: str) -> LiveLine | None:
    """A live-log line, or None when it is not one (a torn or foreign line)."""
    try:
        raw = json.loads(text)
        kind, status = raw["kind"], raw["status"]
        if kind not in ("shadow", "canary") or not isinstance(status, int):
            return None
        label = probabilities = None
        if status == 200 and isinstance(raw.get("body"), str):
            label, probabilities = _answer(raw["body"])
        return LiveLine(kind, str(raw["of"]), raw.get("id"), str(raw["version"]), status,
                        float(raw.get("ms") or 0.0), float(raw["at"]), label, probabilities,
                        raw.get("error"))
    except (ValueError, KeyError, TypeError):
        return None


def _answer(body: str) -> tuple[str | None, tuple[float, ...] | None]:
    """The label and probabilities of a prediction's body (None, None: another body)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(answer, dict) or not isinstance(answer.get("label"), str):
        return None, None
    probs = answer.get("probabilities")
    ok = isinstance(probs, list) and all(isinstance(p, (int, float)) for p in probs)
    return answer["label"], tuple(float(p) for p in probs) if ok else None


@dataclass(frozen=True)
class Answer:
    """The default's record of one request: who answered, with what (None: rejected)."""

    request_id: str
    version: str
    label: str | None
    handler_ms: float

    @property
    def rejected(self) -> bool:
        return self.label is None


def parse_answer_line(text: str) -> Answer | None:
    """A one-row prediction or a rejection among the records (None: any other line)."""
    if '"request_id"' not in text:
        return None
    try:
        raw = json.loads(text)
        if raw["event"] == "rejected":
            label = None
        elif raw["event"] == "prediction" and isinstance(raw.get("label"), str):
            label = raw["label"]
        else:
            return None
        return Answer(str(raw["request_id"]), str(raw["model_version"]), label,
                           float(raw["handler_ms"]))
    except (ValueError, KeyError, TypeError):
        return None


def parse_lines(texts: Iterable[str], parse: Callable[[str], object]) -> tuple[list, int]:
    """Parse each non-empty line; returns (parsed, how many were not such a line)."""
    parsed, skipped = [], 0
    for text in texts:
        if text.strip():
            value = parse(text)
            if value is None:
                skipped += 1
            else:
                parsed.append(value)
    return parsed, skipped


# -- the shadow report -------------------------------------------------------------------------------
@dataclass
class ShadowReport:
    """What the mirrored requests so far say about the candidate (one JSON object when saved)."""

    model: str
    candidate: str
    default: list[str]
    mirrored: int
    dropped: int
    compared: int
    unmatched: int
    agreement: float | None
    classes: dict
    latency_ms: dict
    errors: dict
    disagreements: list[dict]
    ranked_by: str
    skipped_lines: int = 0

    def json(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """The report a person reads."""
        pct = _pct
        default = ", ".join(self.default) or "none seen"
        lat, err = self.latency_ms, self.errors
        lines = [
            f"shadow {self.model}: candidate {self.candidate} against the default ({default})",
            f"  mirrored: {self.mirrored} requests ({self.dropped} dropped by the frontend, "
            f"{self.unmatched} without the default's record)",
            f"  agreement: {pct(self.agreement)} of {self.compared} requests both versions "
            "answered gave the same class",
        ]
        for who in ("default", "candidate"):
            counts = self.classes[who]
            total = sum(counts.values())
            shares = ", ".join(f"{k} {v} ({pct(v / total)})" for k, v in sorted(counts.items()))
            lines.append(f"  classes, {who}: {shares or 'none'}")
        for who in ("default", "candidate"):
            figures, e = lat[who], err[who]
            timing = ("n/a" if figures["p50"] is None else
                      f"p50 {figures['p50']:.2f} ms, p99 {figures['p99']:.2f} ms")
            lines.append(f"  {who}: {timing} ({LATENCY_SOURCES[who]}); errors {e['errors']} of "
                         f"{e['requests']} ({pct(e['rate'])}: {e['what']})")
        if self.disagreements:
            lines.append(f"  largest disagreements ({self.ranked_by}; the ids are the records' "
                         "request_id: python -m rtserve records find ID):")
            for d in self.disagreements:
                gap = "" if d["gap"] is None else f" gap {d['gap']:.3f}"
                lines.append(f"    {d['of']}: default {d['default']}, candidate {d['candidate']}"
                             f"{gap} (candidate's id {d['id']})")
        if self.skipped_lines:
            lines.append(f"  ({self.skipped_lines} lines of the live log were not live-log lines)")
        return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _latency(values: Sequence[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "requests": 0}
    return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3),
            "requests": len(values)}


def _gap(line: LiveLine, default_label: str, labels: Sequence[str] | None) -> float | None:
    """How much more the candidate believed its class than the default's (its own probabilities;
    None when its labels or probabilities are unknown)."""
    if line.probabilities is None or not labels or len(labels) != len(line.probabilities):
        return None
    try:
        mine, theirs = labels.index(line.label), labels.index(default_label)
    except ValueError:
        return None
    return round(line.probabilities[mine] - line.probabilities[theirs], 6)


def pairs(lines: Iterable[LiveLine], answers: Mapping[str, Answer], candidate: str,
          default: str | None = None) -> list[tuple[LiveLine, Answer | None]]:
    """The candidate's shadow lines, each with the default's answer to the same request (None:
    without the default's record; with ``default``, only that version's answers count)."""
    out = []
    for line in lines:
        if line.kind != "shadow" or line.version != candidate:
            continue
        answer = answers.get(line.of)
        if answer is not None and (answer.version == candidate
                                   or (default is not None and answer.version != default)):
            answer = None
        out.append((line, answer))
    return out


def agreement_of(matched: Sequence[tuple[LiveLine, Answer | None]]) -> tuple[float | None, list]:
    """The agreement over the pairs both versions answered with a class, and those pairs."""
    both = [(line, answer) for line, answer in matched
            if answer is not None and not answer.rejected and line.label is not None]
    if not both:
        return None, both
    return sum(line.label == answer.label for line, answer in both) / len(both), both


def shadow_report(model: str, lines: Iterable[LiveLine], answers: Mapping[str, Answer],
                  candidate: str, default: str | None = None,
                  candidate_labels: Sequence[str] | None = None,
                  top: int = TOP_DISAGREEMENTS, skipped_lines: int = 0) -> ShadowReport:
    """The shadow report of ``candidate`` over the live log's shadow lines.

    The default's answer to each mirrored request is its record (``request_id`` = the line's
    ``of``); with ``default`` only that version's lines count (the others are ``unmatched``).
    The candidate's class is its answer body's ``label``; labels are compared by name. The
    largest disagreements are ranked by the candidate's probability of its class minus its
    probability of the default's class when its answers carry probabilities and
    ``candidate_labels`` (its archive's label order) is known, else listed in log order.
    """
    matched = pairs(lines, answers, candidate, default)
    live = [(line, answer) for line, answer in matched if line.status != -1]
    agreement, both = agreement_of(live)
    disagree = [(line, answer) for line, answer in both if line.label != answer.label]
    ranked = [(_gap(line, answer.label, candidate_labels), line, answer) for line, answer in disagree]
    by_gap = bool(ranked) and all(gap is not None for gap, _, _ in ranked)
    if by_gap:
        ranked.sort(key=lambda item: -item[0])
    answered = [line for line, _ in live if line.answered]
    defaults = [answer for _, answer in live if answer is not None]
    cand_errors = sum(line.failed for line, _ in live)
    def_errors = sum(a.rejected for a in defaults)
    return ShadowReport(
        model=model, candidate=candidate,
        default=sorted({a.version for a in defaults}),
        mirrored=len(matched), dropped=len(matched) - len(live),
        compared=len(both), unmatched=sum(answer is None for _, answer in live),
        agreement=None if agreement is None else round(agreement, 6),
        classes={"default": dict(Counter(a.label for a in defaults if not a.rejected)),
                 "candidate": dict(Counter(line.label for line in answered if line.label))},
        latency_ms={"default": {**_latency([a.handler_ms for a in defaults]),
                                "what": LATENCY_SOURCES["default"]},
                    "candidate": {**_latency([line.ms for line in answered]),
                                  "what": LATENCY_SOURCES["candidate"]}},
        errors={"candidate": {"errors": cand_errors, "requests": len(live),
                              "rate": round(cand_errors / len(live), 6) if live else None,
                              "what": "5xx answers and no answer (status 0)"},
                "default": {"errors": def_errors, "requests": len(defaults),
                            "rate": round(def_errors / len(defaults), 6) if defaults else None,
                            "what": "rejected requests (400) in the records"}},
        disagreements=[{"of": line.of, "id": line.id, "default": answer.label,
                        "candidate": line.label, "gap": gap} for gap, line, answer in ranked[:top]],
        ranked_by="by the candidate's probability gap" if by_gap else "in log order",
        skipped_lines=skipped_lines)


def promote_evidence(thresholds: ShadowThresholds, report: ShadowReport | None) -> tuple[dict, list[str]]:
    """What ``make promote`` records of the live evidence, and its failures (each names the live
    figure): at least ``min_requests`` compared requests, agreement at least ``min_agreement``."""
    figures = {"requests": report.compared if report else 0,
               "agreement": report.agreement if report else None,
               "min_requests": thresholds.min_requests, "min_agreement": thresholds.min_agreement,
               "default": report.default if report else []}
    failures = []
    if figures["requests"] < thresholds.min_requests:
        failures.append(f"live requests: the shadow report has {figures['requests']} mirrored "
                        f"requests both versions answered (at least {thresholds.min_requests} "
                        "required: `make shadow` first, under traffic)")
    elif figures["agreement"] < thresholds.min_agreement:
        failures.append(f"live agreement: the candidate gave the default's class on "
                        f"{figures['agreement']:.4f} of {figures['requests']} mirrored requests "
                        f"(at least {thresholds.min_agreement} required)")
    return figures, failures


# -- the canary's decision -----------------------------------------------------------------------
@dataclass
class CanaryDecision:
    """The candidate's figures over the window and what breached (empty: carry on)."""

    version: str
    window_s: float
    requests: int
    errors: int
    error_rate: float | None
    p99_ms: float | None
    shadow_pairs: int
    agreement: float | None
    breaches: list[str] = field(default_factory=list)

    def text(self) -> str:
        p99 = "n/a" if self.p99_ms is None else f"{self.p99_ms:.2f} ms"
        return (f"canary {self.version}, last {self.window_s:g} s: {self.requests} answers, "
                f"errors {self.errors} ({_pct(self.error_rate)}), p99 {p99}, agreement "
                f"{_pct(self.agreement)} over {self.shadow_pairs} shadow pairs")


def canary_check(thresholds: CanaryThresholds, lines: Iterable[LiveLine],
                 answers: Mapping[str, Answer], candidate: str, now_ms: float) -> CanaryDecision:
    """Judge the candidate's canary over the last ``window_s`` before ``now_ms`` (epoch ms).

    The error rate (5xx and unanswered canary requests) and the p99 of the canary round trips
    count once at least ``min_requests`` canary lines are in the window; the agreement, once
    ``min_requests`` shadow lines of the candidate in the window have the default's answer.
    """
    since = now_ms - thresholds.window_s * 1000.0
    recent = [line for line in lines if line.version == candidate and line.at >= since]
    canary = [line for line in recent if line.kind == "canary" and line.status != -1]
    errors = sum(line.failed for line in canary)
    times = [line.ms for line in canary if line.answered]
    agreement, both = agreement_of(pairs(recent, answers, candidate))
    decision = CanaryDecision(
        candidate, thresholds.window_s, len(canary), errors,
        round(errors / len(canary), 6) if canary else None,
        round(percentile(times, 99), 3) if times else None, len(both),
        None if agreement is None else round(agreement, 6))
    if len(canary) >= thresholds.min_requests:
        if decision.error_rate > thresholds.max_error_rate:
            decision.breaches.append(
                f"error rate: {errors} of {len(canary)} canary requests failed "
                f"({_pct(decision.error_rate)}, at most {_pct(thresholds.max_error_rate)})")
        if decision.p99_ms is not None and decision.p99_ms > thresholds.max_p99_ms:
            decision.breaches.append(f"p99: {decision.p99_ms:.2f} ms over {len(times)} canary "
                                     f"answers (at most {thresholds.max_p99_ms:g} ms)")
    if len(both) >= thresholds.min_requests and agreement < thresholds.min_agreement:
        decision.breaches.append(
            f"agreement: the default's class on {_pct(agreement)} of {len(both)} shadow requests "
            f"(at least {_pct(thresholds.min_agreement)})")
    return decision


# -- files: reading logs, the watcher ----------------------------------------------------------------
def answers_follower(records: str | Path, from_end: bool = True) -> LogFollower | SegmentsFollower:
    """What reads the default's records as they come: a records spool (a directory, the server's
    ``RUN_DIR/records``) segment by segment, or a file of records copied from pods."""
    records = Path(records)
    if records.is_dir():
        return SegmentsFollower(records, SEGMENT_SUFFIX, from_end=from_end)
    return LogFollower(records, from_end=from_end)


def read_answers(records: str | Path, ids: set[str] | None = None) -> dict[str, Answer]:
    """The default's answers by request id (only ``ids`` when given), from its records."""
    out = {}
    for line in answers_follower(records, from_end=False).lines():
        answer = parse_answer_line(line)
        if answer is not None and (ids is None or answer.request_id in ids):
            out[answer.request_id] = answer
    return out


def shadow_report_from_files(model: str, live_log: str | Path, records: str | Path,
                             candidate: str, default: str | None = None,
                             candidate_labels: Sequence[str] | None = None) -> ShadowReport:
    """:func:`shadow_report` over the live log and the default's records as they are now."""
    lines, skipped = parse_lines(LogFollower(live_log, from_end=False).lines(), parse_live_line)
    ids = {line.of for line in lines if line.kind == "shadow" and line.version == candidate}
    return shadow_report(model, lines, read_answers(records, ids), candidate, default,
                         candidate_labels, skipped_lines=skipped)


def latest_shadow_version(live_log: str | Path) -> str | None:
    """The version of the live log's last shadow line."""
    lines, _ = parse_lines(LogFollower(live_log, from_end=False).lines(), parse_live_line)
    shadows = [line.version for line in lines if line.kind == "shadow"]
    return shadows[-1] if shadows else None


def watcher_pid(pid_file: str | Path) -> int | None:
    """The PID of the canary watcher recorded in ``pid_file``, when that process still runs it."""
    return recorded_pid(pid_file, CANARY_WATCHER_MARKS)


def stop_watcher(pid_file: str | Path, timeout: float = STOP_WAIT_S) -> int | None:
    """Stop the canary watcher that ``pid_file`` records and remove the file
    (:func:`~rtserve.runtime.process.stop_recorded`). Returns the PID it stopped, if one ran."""
    return stop_recorded(pid_file, CANARY_WATCHER_MARKS, timeout)


@dataclass
class Watch:
    """What the canary watcher needs: where the files are, the thresholds, who it watches.

    ``records`` are the default's (its spool, or a file); an abort's event goes to ``audit_log``.
    In a cluster (``make k8s-canary``) the files are the watcher's own copies: ``pull`` appends
    what the pods' live logs and records gained to them before each look, and ``publish`` takes
    the routes an abort wrote to the pods (:mod:`rtserve.k8s.live`)."""

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


def canary_route(routes: Routes | None, version: str) -> Route | None:
    """The canary route of ``version`` while its share is above 0."""
    route = routes.canary if routes else None
    return route if route and route.version == version and route.percent > 0 else None


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
    event = {"event": "canary-abort", "action": "canary-abort", "model": watch.model,
             "version": watch.version, "percent": percent["was"], "failures": decision.breaches,
             "figures": {k: v for k, v in asdict(decision).items() if k != "breaches"},
             "thresholds": asdict(watch.thresholds), "at": datetime.now(timezone.utc).isoformat()}
    watch.history.append(event)
    append_event(watch.audit_log, event, watch.audit_bytes)
    return event


def watch(w: Watch, out: Callable[[str], None] = print, poll_s: float = POLL_S,
          clock: Callable[[], float] = time.time, status_every_s: float = 10.0) -> dict | None:
    """The canary watcher: every ``poll_s`` read what the live log and the records gained,
    judge the last window (:func:`canary_check`), and abort on a breach (:func:`abort`; returns
    its event). Returns None when the canary was stopped or changed by someone else."""
    started_ms = clock() * 1000.0
    live, records = LogFollower(w.live_log), answers_follower(w.records)
    window: deque[LiveLine] = deque()
    answers: dict[str, Answer] = {}
    seen: deque[tuple[float, str]] = deque()
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
        decision = canary_check(w.thresholds, window, answers, w.version, now * 1000.0)
        if decision.breaches:
            event = abort(w, decision)
            out(f"ABORTED {decision.text()}")
            for breach in decision.breaches:
                out(f"  FAILED {breach}")
            out(f"  share {event['percent']:g}% -> 0 (routes file); recorded in the rollout "
                "history and the audit log")
            return event
        if now - last_status >= status_every_s:
            out(decision.text())
            last_status = now
        time.sleep(poll_s)
