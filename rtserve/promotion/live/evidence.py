"""The evidence on a candidate: the shadow report and the canary's decision, from the live log and the records.

The live log is the agent's (LiveLog.java; its lines are described in docs/versions-and-promotion.md).
A shadow line's default answer is the record (:mod:`handler.records`) whose ``request_id`` is its ``of``.
Answers are compared per output kind (:class:`~rtserve.promotion.kinds.Compare`, from the candidate's
archive: :func:`archive_compare`); a classifier's by class, as before the other kinds.
:func:`shadow_report` and :func:`canary_check` are pure functions of parsed lines; the file readers come last.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from handler.records import SEGMENT_SUFFIX
from handler.signature import CLASSIFICATION, EMBEDDING, MULTI_LABEL, REGRESSION, first_answer, first_golden
from rtserve.errors import ArchiveError
from rtserve.model.archive import read_archive
from rtserve.promotion.gate import CanaryThresholds, ShadowThresholds, percentile
from rtserve.promotion.kinds import Compare, KindThresholds, answer_value
from rtserve.runtime.logs import LogFollower, SegmentsFollower

logger = logging.getLogger(__name__)

#: Disagreements a shadow report lists.
TOP_DISAGREEMENTS = 10
#: How a shadow report ranks the disagreements of each kind but a classifier (by probability gap).
RANKED_BY = {
    REGRESSION: "by the largest absolute difference, in target standard deviations",
    MULTI_LABEL: "by the number of labels decided differently",
    EMBEDDING: "by the lowest cosine similarity (gap: 1 - cosine)",
}
#: What each version's latency in a shadow report is.
LATENCY_SOURCES = {
    "default": "handler_ms: the worker's time for the request's batch (its record)",
    "candidate": "ms: the frontend's round trip to the candidate (live log)",
}


# -- the live log and the records ------------------------------------------------------------------
@dataclass(frozen=True)
class LiveLine:
    """One line of the live log, with the candidate's answer decoded.

    The label and probabilities are set when ``body`` is a classifier's prediction; ``output`` when
    it is an answer of another kind (:func:`~rtserve.promotion.kinds.answer_value`).
    """

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
    truncated: bool = False
    output: Any = None

    @property
    def value(self) -> Any:
        """The answer as compared: the label, or another kind's value (None: no answer of the kind)."""
        return self.label if self.output is None else self.output

    @property
    def failed(self) -> bool:
        """An error of the candidate: a 5xx or no answer (a dropped mirror is not one)."""
        return self.status == 0 or self.status >= 500

    @property
    def answered(self) -> bool:
        """The candidate answered (any status; not dropped, not unanswered)."""
        return self.status > 0


def parse_live_line(text: str, kind: str = CLASSIFICATION) -> LiveLine | None:
    """A live-log line, its body read as an answer of output ``kind``; None when it is not one (a torn or foreign line).

    A classifier's body gives ``label`` and ``probabilities``, another kind's ``output``.
    """
    try:
        raw = json.loads(text)
        route, status = raw["kind"], raw["status"]
        if route not in ("shadow", "canary") or not isinstance(status, int):
            return None
        label = probabilities = output = None
        if status == 200 and isinstance(raw.get("body"), str):
            if kind == CLASSIFICATION:
                label, probabilities = _answer(raw["body"])
            else:
                output = _output(raw["body"], kind)
        return LiveLine(
            route,
            str(raw["of"]),
            raw.get("id"),
            str(raw["version"]),
            status,
            float(raw.get("ms") or 0.0),
            float(raw["at"]),
            label,
            probabilities,
            raw.get("error"),
            raw.get("truncated") is True,
            output,
        )
    except (ValueError, KeyError, TypeError):
        return None


def live_line_parser(kind: str) -> Callable[[str], LiveLine | None]:
    """:func:`parse_live_line` for answers of output ``kind``."""
    return parse_live_line if kind == CLASSIFICATION else partial(parse_live_line, kind=kind)


def _answer(body: str) -> tuple[str | None, tuple[float, ...] | None]:
    """The label and probabilities of a prediction's body (None, None: another body; several outputs: the first's)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return None, None
    answer = first_answer(answer) if isinstance(answer, dict) else answer
    if not isinstance(answer, dict) or not isinstance(answer.get("label"), str):
        return None, None
    probs = answer.get("probabilities")
    ok = isinstance(probs, list) and all(isinstance(p, (int, float)) for p in probs)
    return answer["label"], tuple(float(p) for p in probs) if ok else None


def _output(body: str | dict, kind: str) -> Any:
    """The value of an answer of ``kind`` (a body as text, or parsed); None: another body."""
    try:
        answer = json.loads(body) if isinstance(body, str) else body
        if isinstance(answer, dict) and isinstance(answer.get("predictions"), list) and len(answer["predictions"]) == 1:
            answer = answer["predictions"][0]  # KServe v1, one instance
        return answer_value(kind, answer) if isinstance(answer, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Answer:
    """The default's record of one request: who answered, with what (None: rejected).

    A classifier's record names its ``label``; another kind's names its ``kind`` and carries its
    answer, whose value is ``output`` (:func:`~rtserve.promotion.kinds.answer_value`).
    """

    request_id: str
    version: str
    label: str | None
    handler_ms: float
    kind: str = CLASSIFICATION
    output: Any = None

    @property
    def value(self) -> Any:
        """The answer as compared: the label, or another kind's value."""
        return self.label if self.kind == CLASSIFICATION else self.output

    @property
    def rejected(self) -> bool:
        return self.value is None


def parse_answer_line(text: str) -> Answer | None:
    """A one-row prediction or a rejection among the records (None: any other line)."""
    if '"request_id"' not in text:
        return None
    try:
        raw = json.loads(text)
        kind, label, output = raw.get("kind", CLASSIFICATION), None, None
        if raw["event"] == "prediction" and kind != CLASSIFICATION:
            output = _output(raw.get("answer"), kind)  # one row's answer; None for several
            if output is None:
                return None
        elif raw["event"] == "prediction" and isinstance(raw.get("label"), str):
            label = raw["label"]
        elif raw["event"] != "rejected":
            return None
        return Answer(str(raw["request_id"]), str(raw["model_version"]), label, float(raw["handler_ms"]), kind, output)
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
    truncated: int = 0
    #: The output kind; another kind's ``comparison`` says what agreeing is and its figures (a
    #: regression's tolerance and mean difference, an embedding's mean cosine). A classifier's
    #: report has neither key (as before the other kinds).
    kind: str = CLASSIFICATION
    comparison: dict | None = None

    def json(self) -> dict:
        report = asdict(self)
        if self.kind == CLASSIFICATION:
            del report["kind"], report["comparison"]
        return report

    def text(self) -> str:
        """The report a person reads."""
        pct = _pct
        default = ", ".join(self.default) or "none seen"
        lat, err = self.latency_ms, self.errors
        classifier = self.kind == CLASSIFICATION
        lines = [
            f"shadow {self.model}: candidate {self.candidate} against the default ({default})"
            + ("" if classifier else f" ({self.kind})"),
            f"  mirrored: {self.mirrored} requests ({self.dropped} dropped by the frontend, "
            f"{self.unmatched} without the default's record)",
            f"  agreement: {pct(self.agreement)} of {self.compared} requests both versions "
            + ("answered gave the same class" if classifier else f"answered: {self.comparison['agreeing']}"),
        ]
        if not classifier:
            lines.append(f"  {self.comparison['said']}")
        for who in ("default", "candidate") if classifier or self.kind == MULTI_LABEL else ():
            counts = self.classes[who]
            total = sum(counts.values())
            shares = ", ".join(f"{k} {v} ({pct(v / total)})" for k, v in sorted(counts.items()))
            lines.append(f"  {'classes' if classifier else 'labels on'}, {who}: {shares or 'none'}")
        for who in ("default", "candidate"):
            figures, e = lat[who], err[who]
            timing = "n/a" if figures["p50"] is None else f"p50 {figures['p50']:.2f} ms, p99 {figures['p99']:.2f} ms"
            lines.append(
                f"  {who}: {timing} ({LATENCY_SOURCES[who]}); errors {e['errors']} of "
                f"{e['requests']} ({pct(e['rate'])}: {e['what']})"
            )
        if self.disagreements:
            lines.append(
                f"  largest disagreements ({self.ranked_by}; the ids are the records' "
                "request_id: python -m rtserve records find ID):"
            )
            for d in self.disagreements:
                gap = "" if d["gap"] is None else f" gap {d['gap']:.3f}"
                answers = (
                    f"cosine {1 - d['gap']:.4f}"
                    if self.kind == EMBEDDING
                    else f"default {d['default']}, candidate {d['candidate']}{gap}"
                )
                lines.append(f"    {d['of']}: {answers} (candidate's id {d['id']})")
        if self.truncated:
            lines.append(
                f"  ({self.truncated} of the candidate's answers were too long for the live "
                "log to keep whole: not compared)"
            )
        if self.skipped_lines:
            lines.append(f"  ({self.skipped_lines} lines of the live log were not live-log lines)")
        return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _latency(values: Sequence[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "requests": 0}
    return {"p50": round(percentile(values, 50), 3), "p99": round(percentile(values, 99), 3), "requests": len(values)}


def _gap(line: LiveLine, default_label: str, labels: Sequence[str] | None) -> float | None:
    """How much more the candidate believed its class than the default's, by its own probabilities.

    None when its labels or probabilities are unknown.
    """
    if line.probabilities is None or not labels or len(labels) != len(line.probabilities):
        return None
    try:
        mine, theirs = labels.index(line.label), labels.index(default_label)
    except ValueError:
        return None
    return round(line.probabilities[mine] - line.probabilities[theirs], 6)


def pairs(
    lines: Iterable[LiveLine],
    answers: Mapping[str, Answer],
    candidate: str,
    default: str | None = None,
    kind: str = CLASSIFICATION,
) -> list[tuple[LiveLine, Answer | None]]:
    """The candidate's shadow lines, each with the default's answer to the same request.

    The answer is None without the default's record; with ``default``, only that version's answers
    count; an answer of another output kind than ``kind`` is never compared (None too).
    """
    out = []
    for line in lines:
        if line.kind != "shadow" or line.version != candidate:
            continue
        answer = answers.get(line.of)
        if answer is not None and (
            answer.version == candidate
            or (default is not None and answer.version != default)
            or (not answer.rejected and answer.kind != kind)
        ):
            answer = None
        out.append((line, answer))
    return out


def agreement_of(
    matched: Sequence[tuple[LiveLine, Answer | None]], compare: Compare | None = None
) -> tuple[float | None, list]:
    """The agreement over the pairs both versions answered (per ``compare``, default by class), and those pairs."""
    compare = compare or Compare()
    both = [
        (line, answer)
        for line, answer in matched
        if answer is not None and not answer.rejected and line.value is not None
    ]
    if not both:
        return None, both
    return sum(compare.agreement(answer.value, line.value) for line, answer in both) / len(both), both


def shadow_report(
    model: str,
    lines: Iterable[LiveLine],
    answers: Mapping[str, Answer],
    candidate: str,
    default: str | None = None,
    candidate_labels: Sequence[str] | None = None,
    top: int = TOP_DISAGREEMENTS,
    skipped_lines: int = 0,
    compare: Compare | None = None,
) -> ShadowReport:
    """The shadow report of ``candidate`` over the live log's shadow lines.

    The default's answer to each mirrored request is its record (``request_id`` = the line's
    ``of``); with ``default`` only that version's lines count (the others are ``unmatched``).
    Answers are compared per ``compare`` (default: a classifier's); an answer the live log could
    not keep whole counts in ``truncated``, not compared.

    A classifier's class is its answer body's ``label``, compared by name; its largest
    disagreements are ranked by the candidate's probability of its class minus its probability of
    the default's class when its answers carry probabilities and ``candidate_labels`` (its
    archive's label order) is known, else listed in log order. Another kind's disagreements (pairs
    that do not fully agree) are ranked by :meth:`Compare.distance` (:data:`RANKED_BY`).
    """
    compare = compare or Compare()
    classifier = compare.kind == CLASSIFICATION
    matched = pairs(lines, answers, candidate, default, compare.kind)
    live = [(line, answer) for line, answer in matched if line.status != -1]
    agreement, both = agreement_of(live, compare)
    if classifier:
        disagree = [(line, answer) for line, answer in both if line.label != answer.label]
        ranked = [(_gap(line, answer.label, candidate_labels), line, answer) for line, answer in disagree]
        by_gap = bool(ranked) and all(gap is not None for gap, _, _ in ranked)
        ranked_by = "by the candidate's probability gap" if by_gap else "in log order"
    else:
        ranked = [
            (round(compare.distance(answer.value, line.value), 6), line, answer)
            for line, answer in both
            if compare.agreement(answer.value, line.value) < 1
        ]
        by_gap, ranked_by = True, RANKED_BY[compare.kind]
    if by_gap:
        ranked.sort(key=lambda item: -item[0])
    answered = [line for line, _ in live if line.answered]
    defaults = [answer for _, answer in live if answer is not None]
    cand_errors = sum(line.failed for line, _ in live)
    def_errors = sum(a.rejected for a in defaults)
    return ShadowReport(
        model=model,
        candidate=candidate,
        default=sorted({a.version for a in defaults}),
        mirrored=len(matched),
        dropped=len(matched) - len(live),
        compared=len(both),
        unmatched=sum(answer is None for _, answer in live),
        agreement=None if agreement is None else round(agreement, 6),
        classes=_classes(compare, defaults, answered),
        latency_ms={
            "default": {**_latency([a.handler_ms for a in defaults]), "what": LATENCY_SOURCES["default"]},
            "candidate": {**_latency([line.ms for line in answered]), "what": LATENCY_SOURCES["candidate"]},
        },
        errors={
            "candidate": {
                "errors": cand_errors,
                "requests": len(live),
                "rate": round(cand_errors / len(live), 6) if live else None,
                "what": "5xx answers and no answer (status 0)",
            },
            "default": {
                "errors": def_errors,
                "requests": len(defaults),
                "rate": round(def_errors / len(defaults), 6) if defaults else None,
                "what": "rejected requests (400) in the records",
            },
        },
        disagreements=[
            {
                "of": line.of,
                "id": line.id,
                "default": compare.show(answer.value),
                "candidate": compare.show(line.value),
                "gap": gap,
            }
            for gap, line, answer in ranked[:top]
        ],
        ranked_by=ranked_by,
        skipped_lines=skipped_lines,
        truncated=sum(line.truncated for line, _ in live),
        kind=compare.kind,
        comparison=None if classifier else _comparison(compare, both),
    )


def _classes(compare: Compare, defaults: Sequence[Answer], answered: Sequence[LiveLine]) -> dict:
    """How often each class was answered (a classifier) or each label on (multi-label); empty for other kinds."""
    if compare.kind == CLASSIFICATION:
        return {
            "default": dict(Counter(a.label for a in defaults if not a.rejected)),
            "candidate": dict(Counter(line.label for line in answered if line.label)),
        }
    if compare.kind == MULTI_LABEL:
        return {
            "default": dict(Counter(x for a in defaults if not a.rejected for x in a.value)),
            "candidate": dict(Counter(x for line in answered if line.value is not None for x in line.value)),
        }
    return {"default": {}, "candidate": {}}


def _comparison(compare: Compare, both: Sequence[tuple[LiveLine, Answer]]) -> dict:
    """What agreeing is for a kind other than a classifier's, and its figures over the compared pairs."""
    found: dict[str, Any] = {"agreeing": compare.agreeing()}
    if compare.kind == REGRESSION:
        tolerance = [round(t, 6) for t in compare.tolerance()]
        widths = {len(a.value) for _, a in both} | {len(line.value) for line, _ in both}
        mean = None
        if both and len(widths) == 1:
            mean = [
                round(sum(abs(a.value[j] - line.value[j]) for line, a in both) / len(both), 6)
                for j in range(widths.pop())
            ]
        found.update(tolerance=tolerance, mean_abs_difference=mean)
        found["said"] = (
            f"a pair agrees when each value is within {compare.thresholds.agreement_tolerance:g} target "
            f"standard deviations ({', '.join(f'{t:.4g}' for t in tolerance) or 'n/a'} in target units) "
            f"of the other's; mean |difference| {'n/a' if mean is None else ', '.join(f'{m:.4g}' for m in mean)}"
        )
    elif compare.kind == MULTI_LABEL:
        found.update(labels=list(compare.labels), decisions=len(both) * len(compare.labels))
        found["said"] = (
            f"a pair's agreement is the share of its {len(compare.labels)} label decisions that are "
            f"equal (Hamming); {found['decisions']} decisions compared"
        )
    else:
        cosines = [1.0 - compare.distance(a.value, line.value) for line, a in both]
        mean = round(sum(cosines) / len(cosines), 6) if cosines else None
        found.update(min_cosine=compare.thresholds.min_cosine, mean_cosine=mean)
        found["said"] = (
            f"a pair agrees at cosine similarity {compare.thresholds.min_cosine:g} or more; mean cosine "
            f"{'n/a' if mean is None else f'{mean:.4f}'}"
        )
    return found


def promote_evidence(thresholds: ShadowThresholds, report: ShadowReport | None) -> tuple[dict, list[str]]:
    """What ``make promote`` records of the live evidence, and its failures (each names the live figure).

    It passes with at least ``min_requests`` compared requests and agreement at least ``min_agreement``
    (what agreeing is depends on the report's output kind).
    """
    agreeing = report.comparison["agreeing"] if report and report.comparison else Compare().agreeing()
    figures = {
        "requests": report.compared if report else 0,
        "agreement": report.agreement if report else None,
        "min_requests": thresholds.min_requests,
        "min_agreement": thresholds.min_agreement,
        "default": report.default if report else [],
    }
    failures = []
    if figures["requests"] < thresholds.min_requests:
        failures.append(
            f"live requests: the shadow report has {figures['requests']} mirrored "
            f"requests both versions answered (at least {thresholds.min_requests} "
            "required: `make shadow` first, under traffic)"
        )
    elif figures["agreement"] < thresholds.min_agreement:
        failures.append(
            f"live agreement: the candidate gave {agreeing} on "
            f"{figures['agreement']:.4f} of {figures['requests']} mirrored requests "
            f"(at least {thresholds.min_agreement} required)"
        )
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
        return (
            f"canary {self.version}, last {self.window_s:g} s: {self.requests} answers, "
            f"errors {self.errors} ({_pct(self.error_rate)}), p99 {p99}, agreement "
            f"{_pct(self.agreement)} over {self.shadow_pairs} shadow pairs"
        )


def canary_check(
    thresholds: CanaryThresholds,
    lines: Iterable[LiveLine],
    answers: Mapping[str, Answer],
    candidate: str,
    now_ms: float,
    compare: Compare | None = None,
) -> CanaryDecision:
    """Judge the candidate's canary over the last ``window_s`` before ``now_ms`` (epoch ms).

    The error rate (5xx and unanswered canary requests) and the p99 of the canary round trips
    count once at least ``min_requests`` canary lines are in the window; the agreement (per
    ``compare``, default a classifier's), once ``min_requests`` shadow lines of the candidate in
    the window have the default's answer.
    """
    compare = compare or Compare()
    since = now_ms - thresholds.window_s * 1000.0
    recent = [line for line in lines if line.version == candidate and line.at >= since]
    canary = [line for line in recent if line.kind == "canary" and line.status != -1]
    errors = sum(line.failed for line in canary)
    times = [line.ms for line in canary if line.answered]
    agreement, both = agreement_of(pairs(recent, answers, candidate, kind=compare.kind), compare)
    decision = CanaryDecision(
        candidate,
        thresholds.window_s,
        len(canary),
        errors,
        round(errors / len(canary), 6) if canary else None,
        round(percentile(times, 99), 3) if times else None,
        len(both),
        None if agreement is None else round(agreement, 6),
    )
    if len(canary) >= thresholds.min_requests:
        if decision.error_rate > thresholds.max_error_rate:
            decision.breaches.append(
                f"error rate: {errors} of {len(canary)} canary requests failed "
                f"({_pct(decision.error_rate)}, at most {_pct(thresholds.max_error_rate)})"
            )
        if decision.p99_ms is not None and decision.p99_ms > thresholds.max_p99_ms:
            decision.breaches.append(
                f"p99: {decision.p99_ms:.2f} ms over {len(times)} canary answers (at most {thresholds.max_p99_ms:g} ms)"
            )
    if len(both) >= thresholds.min_requests and agreement < thresholds.min_agreement:
        decision.breaches.append(
            f"agreement: {compare.agreeing()} on {_pct(agreement)} of {len(both)} shadow requests "
            f"(at least {_pct(thresholds.min_agreement)})"
        )
    return decision


# -- files: the live log and the records on disk ------------------------------------------------------
def answers_follower(records: str | Path, from_end: bool = True) -> LogFollower | SegmentsFollower:
    """What reads the default's records as they come.

    A records spool (a directory, the server's ``RUN_DIR/records``) segment by segment, or a file of
    records copied from pods.
    """
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


def shadow_report_from_files(
    model: str,
    live_log: str | Path,
    records: str | Path,
    candidate: str,
    default: str | None = None,
    candidate_labels: Sequence[str] | None = None,
    compare: Compare | None = None,
) -> ShadowReport:
    """:func:`shadow_report` over the live log and the default's records as they are now."""
    compare = compare or Compare()
    lines, skipped = parse_lines(LogFollower(live_log, from_end=False).lines(), live_line_parser(compare.kind))
    ids = {line.of for line in lines if line.kind == "shadow" and line.version == candidate}
    return shadow_report(
        model,
        lines,
        read_answers(records, ids),
        candidate,
        default,
        candidate_labels,
        skipped_lines=skipped,
        compare=compare,
    )


def latest_shadow_version(live_log: str | Path) -> str | None:
    """The version of the live log's last shadow line."""
    lines, _ = parse_lines(LogFollower(live_log, from_end=False).lines(), parse_live_line)
    shadows = [line.version for line in lines if line.kind == "shadow"]
    return shadows[-1] if shadows else None


def archive_compare(archive: Path, thresholds: KindThresholds | None = None) -> tuple[Compare, list[str]]:
    """How the live evidence compares answers of the candidate's ``archive``, and its label order.

    Its (first) output's kind (a regression's scale from its golden set,
    :func:`~rtserve.promotion.kinds.regression_scale`) with the gate's per-kind ``thresholds``.

    Raises:
        ArchiveError: the archive cannot be read.
    """
    found = read_archive(archive)
    outputs = found.meta.get("outputs") or None
    first = outputs[0] if outputs else None
    return Compare.of(first, first_golden(found.golden, outputs), thresholds), found.labels


def compare_for(archive: Path, thresholds: KindThresholds | None = None) -> Compare:
    """:func:`archive_compare`'s comparison, or a classifier's when the archive cannot be read (logged)."""
    try:
        return archive_compare(archive, thresholds)[0]
    except ArchiveError as exc:
        logger.warning("(answers compared as a classifier's: %s)", exc)
        return Compare(thresholds=thresholds or KindThresholds())


def save_shadow_report(
    model: str,
    version: str,
    live_log: Path,
    records: Path,
    archive: Path,
    save_to: Path,
    thresholds: KindThresholds | None = None,
) -> ShadowReport:
    """The shadow report of ``version`` over the live log and the default's records, saved as JSON to ``save_to``.

    The records are a spool or a file copied from pods. The candidate's ``archive`` gives its output
    kind (:func:`archive_compare`, with the gate's per-kind ``thresholds``) and its label order, which
    ranks a classifier's disagreements; without it the answers are compared as a classifier's, unranked.
    """
    try:
        compare, labels = archive_compare(archive, thresholds)
    except ArchiveError as exc:  # the kind and the gaps need the candidate's archive; the rest does not
        logger.warning("(compared as a classifier's answers, disagreements unranked: %s)", exc)
        compare, labels = None, None
    found = shadow_report_from_files(model, live_log, records, version, candidate_labels=labels, compare=compare)
    save_to.parent.mkdir(parents=True, exist_ok=True)
    save_to.write_text(json.dumps(found.json(), indent=2) + "\n")
    return found
