"""The promotion gate's decision: pure functions over measured answers, no server and no torch.

:mod:`rtserve.promotion.measure` gets the answers and times a burst; this turns them into a :class:`GateReport`:
each version's metric on labelled rows, their agreement on the rest, p50/p99 over the burst, and the
outcome against :class:`GateConfig`'s thresholds (``config/gate.yaml``, the one place they live). The
metric and what agreeing means depend on the output kind (:mod:`rtserve.promotion.kinds`): accuracy and the
same class for a classifier, mean absolute error and values within a tolerance for a regression, macro F1
and equal label decisions for a multi-label model, cosine similarity for an embedding.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from handler.signature import CLASSIFICATION, MULTI_LABEL, REGRESSION, first_golden
from rtserve.errors import ArchiveError, GateError
from rtserve.model.archive import golden_label_problem, golden_mismatches, read_archive  # noqa: F401 - re-exported
from rtserve.promotion.kinds import (
    KIND_KEYS,
    Compare,
    KindThresholds,
    accuracy,
    f1_per_label,
    mean_absolute_error,
)
from rtserve.settings import PACKAGE_HOME

#: The thresholds file used when none is given (``GATE_CONFIG=`` in the Makefile): the checkout's.
DEFAULT_CONFIG = PACKAGE_HOME / "config" / "gate.yaml"

#: What each kind of live threshold accepts (``config/gate.yaml``'s ``live:`` section).
_KINDS = {
    "count": ("an integer of at least 1", lambda v: isinstance(v, int) and v >= 1),
    "share": ("a number in [0, 1]", lambda v: isinstance(v, (int, float)) and 0 <= v <= 1),
    "positive": ("a finite number above 0", lambda v: isinstance(v, (int, float)) and math.isfinite(v) and v > 0),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
}
#: The ``live:`` section: sub-section -> key -> kind (see :data:`_KINDS`).
LIVE_KEYS = {
    "shadow": {"min_requests": "count", "min_agreement": "share"},
    "canary": {
        "window_s": "positive",
        "min_requests": "count",
        "max_error_rate": "share",
        "max_p99_ms": "positive",
        "min_agreement": "share",
    },
    "promote": {"require_shadow": "bool"},
}


def _check_keys(path: Path, where: str, raw: object, names: Iterable[str], optional: Iterable[str] = ()) -> dict:
    """``raw`` as a mapping holding exactly ``names``, and any of ``optional``.

    Raises:
        GateError: ``raw`` is not a mapping, or a key is missing or unknown (both named).
    """
    names, optional = set(names), set(optional)
    got = set(raw) if isinstance(raw, dict) else set()
    if not isinstance(raw, dict) or not names <= got or got - names - optional:
        raise GateError(
            f"{path}: {where}expected the keys {sorted(names)}"
            + (f" (and optionally {sorted(optional)})" if optional else "")
            + f"; missing {sorted(names - got)}, unknown {sorted(got - names - optional)}"
        )
    return raw


def kind_thresholds(path: Path, raw: dict) -> KindThresholds:
    """The per-kind thresholds of a thresholds file (its optional sections of :data:`KIND_KEYS`).

    Raises:
        GateError: a section is not a mapping, has an unknown key, or a value is not a number in
            its range (the key is named with its section).
    """
    values = {}
    for section, keys in KIND_KEYS.items():
        if section not in raw:
            continue
        if not isinstance(raw[section], dict):
            raise GateError(f"{path}: {section} must be a mapping of any of {sorted(keys)}, got {raw[section]!r}")
        found = _check_keys(path, f"{section}: ", raw[section], (), keys)
        for key, value in found.items():
            what, ok = keys[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not ok(value):
                raise GateError(f"{path}: {section}.{key} must be {what}, got {value!r}")
            values[key] = float(value)
    return KindThresholds(**values)


@dataclass(frozen=True)
class ShadowThresholds:
    """What ``make promote`` requires of a shadow report (with ``require_shadow``)."""

    min_requests: int
    min_agreement: float


@dataclass(frozen=True)
class CanaryThresholds:
    """When the canary watcher aborts.

    Over the last ``window_s`` seconds, with at least ``min_requests`` answers (shadow pairs for
    the agreement): the candidate's error rate above ``max_error_rate``, its p99 above
    ``max_p99_ms`` or its agreement below ``min_agreement``.
    """

    window_s: float
    min_requests: int
    max_error_rate: float
    max_p99_ms: float
    min_agreement: float


@dataclass(frozen=True)
class LiveConfig:
    """The ``live:`` section of ``config/gate.yaml``: shadow, canary and the promote rule."""

    shadow: ShadowThresholds
    canary: CanaryThresholds
    require_shadow: bool

    @classmethod
    def from_raw(cls, path: Path, raw: object) -> LiveConfig:
        """Check the ``live:`` section read from ``path``.

        Raises:
            GateError: a sub-section or key is missing or unknown, or a value has the wrong type
                or is out of range (the key is named with its section).
        """
        sections = _check_keys(path, "live: ", raw, LIVE_KEYS)
        values: dict[str, dict] = {}
        for section, keys in LIVE_KEYS.items():
            found = _check_keys(path, f"live.{section}: ", sections[section], keys)
            for key, kind in keys.items():
                value = found[key]
                what, ok = _KINDS[kind]
                if (isinstance(value, bool) and kind != "bool") or not ok(value):
                    raise GateError(f"{path}: live.{section}.{key} must be {what}, got {value!r}")
            values[section] = {k: float(v) if keys[k] in ("share", "positive") else v for k, v in found.items()}
        return cls(
            ShadowThresholds(**values["shadow"]),
            CanaryThresholds(**values["canary"]),
            values["promote"]["require_shadow"],
        )


@dataclass(frozen=True)
class GateConfig:
    """The gate's thresholds and measurement bounds; see ``config/gate.yaml`` for each one."""

    max_accuracy_drop: float
    min_agreement: float
    max_latency_ratio: float
    max_p99_ms: float
    golden_tolerance: float
    burst_requests: int
    warmup_requests: int
    latency_attempts: int
    concurrency: int
    max_rows: int
    live: LiveConfig
    #: The optional per-kind sections (``regression:``, ``multi_label:``, ``embedding:``).
    kinds: KindThresholds = field(default_factory=KindThresholds)

    @classmethod
    def load(cls, path: str | Path | None = None) -> GateConfig:
        """Read and check a thresholds file (default ``config/gate.yaml``).

        Raises:
            GateError: the file is missing, a key is missing or unknown, or a value is out of range
                (the key named).
        """
        path = Path(path or DEFAULT_CONFIG)
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise GateError(f"cannot read the gate thresholds {path}: {exc}") from exc
        names = {f.name: f.type for f in fields(cls) if f.name not in ("live", "kinds")}
        _check_keys(path, "", raw, [*names, "live"], KIND_KEYS)
        values: dict = {}
        for name, kind in names.items():
            value = raw[name]
            ok = isinstance(value, int) if kind == "int" else isinstance(value, (int, float))
            if not ok or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise GateError(f"{path}: {name} must be a non-negative {kind}, got {value!r}")
            values[name] = float(value) if kind == "float" else value
        if values["min_agreement"] > 1 or values["max_accuracy_drop"] > 1:
            raise GateError(f"{path}: min_agreement and max_accuracy_drop are shares in [0, 1]")
        if min(values["burst_requests"], values["concurrency"], values["max_rows"], values["latency_attempts"]) < 1:
            raise GateError(f"{path}: burst_requests, concurrency, max_rows and latency_attempts must be at least 1")
        return cls(**values, live=LiveConfig.from_raw(path, raw["live"]), kinds=kind_thresholds(path, raw))

    def thresholds(self, kind: str = CLASSIFICATION) -> dict:
        """The figures the decision of a model of output ``kind`` uses (what a report records)."""
        per_kind = {
            CLASSIFICATION: {"max_accuracy_drop": self.max_accuracy_drop},
            REGRESSION: {
                "max_mae_increase": self.kinds.max_mae_increase,
                "agreement_tolerance": self.kinds.agreement_tolerance,
            },
            MULTI_LABEL: {"max_f1_drop": self.kinds.max_f1_drop},
        }
        extra = per_kind.get(kind, {"min_cosine": self.kinds.min_cosine})
        return {**extra, "min_agreement": self.min_agreement, "max_latency_ratio": self.max_latency_ratio}


@dataclass
class ArchiveMeta:
    """What the gate needs from an archive's ``meta.json``."""

    version: str
    labels: list[str]
    n_features: int
    golden: dict
    #: The (first) output's signature (``rtserve-model/2``); None for ``rtserve-model/1``, a classifier.
    #: With several outputs the gate compares the first; the golden replay checks them all.
    output: dict | None = None
    #: Every output's signature (``rtserve-model/2``), in column order; None for ``rtserve-model/1``.
    outputs: list[dict] | None = None

    @property
    def kind(self) -> str:
        """The output's kind (``handler.model.KINDS``)."""
        return self.output["kind"] if self.output else CLASSIFICATION

    @property
    def width(self) -> int:
        """The output's width: values per answer (a classifier's: its classes)."""
        return self.output["width"] if self.output else len(self.labels)

    @property
    def output_golden(self) -> dict:
        """The golden set as the (first) output's: its recorded answers cut to that output's columns."""
        return first_golden(self.golden, self.outputs)

    @classmethod
    def from_mar(cls, mar: str | Path) -> ArchiveMeta:
        """What the gate needs of a model archive, without loading the model.

        Read through :func:`rtserve.model.archive.read_archive`.

        Raises:
            ArchiveError: the file is missing, not an archive, has no golden set, or golden
                labels that do not fit its output (the field named).
        """
        archive = read_archive(mar)
        if not archive.golden.get("features"):
            raise ArchiveError(f"{mar} has no golden set: package it with rtserve.model.package.export")
        outputs = archive.meta.get("outputs") or None
        first = outputs[0] if outputs else None
        meta = cls(archive.meta_version, archive.labels, archive.n_features, archive.golden, first, outputs)
        problem = golden_label_problem(meta.kind, meta.width, meta.golden)
        if problem:
            raise ArchiveError(f"{mar}: {problem}")
        return meta

    def golden_labels(self) -> list:
        """The golden rows' truth per kind (None per row when the set is unlabelled).

        A class label by name (classification), the targets as a list of floats (regression), the
        set of labels on (multi-label); an embedding has none.
        """
        truth = self.golden.get("labels")
        if truth is None:
            return [None] * len(self.golden["features"])
        if self.kind == REGRESSION:
            return [[float(v) for v in y] if isinstance(y, list) else [float(y)] for y in truth]
        if self.kind == MULTI_LABEL:
            return [frozenset(label for label, on in zip(self.labels, y) if on) for y in truth]
        return [self.labels[i] for i in truth]


@dataclass
class Row:
    """One row both versions answer: features, the truth (None: unlabelled), its origin.

    The truth is per kind, as :meth:`ArchiveMeta.golden_labels` gives it.
    """

    features: list[float]
    label: Any
    source: str


def comparable(default: ArchiveMeta, candidate: ArchiveMeta) -> None:
    """Check that two versions' answers can be compared: one output kind, and its width.

    Classifiers are compared by class name (a candidate may add or drop a class, as before); a
    multi-label output's labels and a regression's named targets must be the same.

    Raises:
        GateError: they differ (both named); nothing is measured.
    """

    def said(meta: ArchiveMeta) -> str:
        return f"{meta.version} a {meta.kind} model of width {meta.width}"

    if default.kind != candidate.kind or (default.kind != CLASSIFICATION and default.width != candidate.width):
        raise GateError(
            f"versions with different outputs cannot be compared: the default is {said(default)}, the "
            f"candidate {said(candidate)} (the gate compares answers of one output kind and width). "
            "Nothing changed"
        )
    for key in ("labels", "targets") if default.kind != CLASSIFICATION else ():
        mine, theirs = (m.output.get(key) for m in (default, candidate))
        if mine is not None and theirs is not None and mine != theirs:
            raise GateError(
                f"versions with different outputs cannot be compared: the default {default.version}'s "
                f"{key} are {mine}, the candidate {candidate.version}'s {theirs}. Nothing changed"
            )


def gate_rows(default: ArchiveMeta, candidate: ArchiveMeta, requests: Sequence[list[float]] = ()) -> list[Row]:
    """The rows of a gate: the default's golden set, the candidate's, then the request rows.

    Raises:
        GateError: the versions' outputs differ (:func:`comparable`).
    """
    comparable(default, candidate)
    rows = []
    for meta in (default, candidate):
        rows += [Row(x, y, f"golden {meta.version}") for x, y in zip(meta.golden["features"], meta.golden_labels())]
    return rows + [Row(list(x), None, "requests") for x in requests]


def comparison(default: ArchiveMeta, config: GateConfig) -> Compare:
    """How the gate compares answers of the default's output kind (a regression's scale from its golden set)."""
    return Compare.of(default.output, default.output_golden, config.kinds)


def read_requests(path: str | Path, n_features: int, max_rows: int) -> list[list[float]]:
    """Feature rows from a JSON-lines file of request bodies, at most ``max_rows``.

    A body is ``{"features": [...]}`` or KServe v1 ``{"instances": [[...], ...]}``.

    Raises:
        GateError: a line is not such a body, or a row does not have ``n_features`` numbers.
    """
    rows: list[list[float]] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise GateError(f"cannot read the requests file: {exc}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            body = json.loads(line)
            found = [body["features"]] if "features" in body else list(body["instances"])
        except (ValueError, TypeError, KeyError) as exc:
            raise GateError(f"{path}:{number}: not a request body with 'features' or 'instances': {exc}") from exc
        for x in found:
            if (
                not isinstance(x, list)
                or len(x) != n_features
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x)
            ):
                raise GateError(f"{path}:{number}: a row must be {n_features} numbers")
            rows.append([float(v) for v in x])
            if len(rows) >= max_rows:
                return rows
    return rows


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def p99_ratio(candidate_ms: Sequence[float], default_ms: Sequence[float]) -> float:
    """The candidate's p99 over the default's."""
    return percentile(candidate_ms, 99) / max(percentile(default_ms, 99), 1e-9)


@dataclass
class Measured:
    """One version's answers to the gate's rows and its burst latencies (ms).

    ``predicted`` holds each answer's value per kind (:func:`rtserve.promotion.kinds.answer_value`):
    class labels by name, regression values, the labels on, embeddings.
    """

    version: str
    predicted: list
    latencies_ms: list[float]


@dataclass
class GateReport:
    """The figures, thresholds and outcome of one gate decision (one JSON line when recorded).

    ``accuracy`` holds a classifier's figures on the labelled rows; another kind's are in ``quality``
    (its ``metric`` named: mean absolute error, macro F1; None for an embedding), and ``accuracy`` is
    None. A classifier's record has no ``kind`` nor ``quality`` (as before the other kinds).
    """

    model: str
    default: str
    candidate: str
    accuracy: dict | None
    agreement: dict
    latency_ms: dict
    thresholds: dict
    failures: list[str]
    passed: bool
    outcome: str = ""
    forced_by: str | None = None
    reason: str | None = None
    rows: dict = field(default_factory=dict)
    #: The live evidence (``live.promote.require_shadow``): the shadow report's figures.
    live: dict | None = None
    kind: str = CLASSIFICATION
    quality: dict | None = None

    def event(self) -> dict:
        """The record written to the rollout history and the audit log."""
        record = asdict(self)
        if self.kind == CLASSIFICATION:
            del record["kind"], record["quality"]
        return {"event": "gate", "action": "gate", **record}

    def text(self) -> str:
        """The report a person reads."""
        agr, lat = self.agreement, self.latency_ms
        d, c = self.default, self.candidate

        def pct(value):
            return "n/a" if value is None else f"{100 * value:.2f}%"

        lines = [
            f"gate {self.model}: candidate {c} against default {d}"
            + ("" if self.kind == CLASSIFICATION else f" ({self.kind})"),
            f"  rows: {', '.join(f'{n} {k}' for k, n in self.rows.items())}",
            self._labelled_text(pct),
            f"  agreement ({agr['rows']} {agr['on']}): {pct(agr['value'])} "
            f"(min {pct(self.thresholds['min_agreement'])})" + self._agreement_detail(),
            f"  latency over {lat['requests']} requests each: default p50 {lat['default']['p50']:.2f} ms "
            f"p99 {lat['default']['p99']:.2f} ms; candidate p50 {lat['candidate']['p50']:.2f} ms p99 "
            f"{lat['candidate']['p99']:.2f} ms; p99 ratio {lat['ratio']:.2f} (max "
            f"{self.thresholds['max_latency_ratio']:.2f})",
        ]
        if self.live is not None:
            lines.append(
                f"  live: agreement {pct(self.live['agreement'])} over {self.live['requests']} "
                f"mirrored requests (min {pct(self.live['min_agreement'])} over at least "
                f"{self.live['min_requests']})"
            )
        lines += [f"  FAILED {f}" for f in self.failures]
        lines.append(
            f"  outcome: {self.outcome or ('pass' if self.passed else 'refused')}"
            + (f" (forced by {self.forced_by}: {self.reason})" if self.forced_by else "")
        )
        return "\n".join(lines)

    def _labelled_text(self, pct) -> str:
        """The line of the labelled rows' metric."""
        if self.kind == CLASSIFICATION:
            acc = self.accuracy
            return (
                f"  accuracy ({acc['rows']} labelled rows): default {pct(acc['default'])}, candidate "
                f"{pct(acc['candidate'])}, drop {pct(acc['drop'])} (max {pct(self.thresholds['max_accuracy_drop'])})"
            )
        q = self.quality
        if q is None:
            return "  no labelled metric for an embedding: the agreement only"

        def num(value):
            return "n/a" if value is None else f"{value:.4f}"

        if self.kind == REGRESSION:
            mae = q["mae"]
            raw = (
                "none"
                if not mae["default"]
                else (
                    f"{', '.join(f'{v:.4g}' for v in mae['default'])} and "
                    f"{', '.join(f'{v:.4g}' for v in mae['candidate'])} in target units"
                )
            )
            return (
                f"  mean absolute error ({q['rows']} labelled rows), in target standard deviations: default "
                f"{num(q['default'])}, candidate {num(q['candidate'])} ({raw}), increase {num(q['increase'])} "
                f"(max {self.thresholds['max_mae_increase']:g})"
            )
        return (
            f"  macro F1 ({q['rows']} labelled rows): default {num(q['default'])}, candidate "
            f"{num(q['candidate'])}, drop {num(q['drop'])} (max {self.thresholds['max_f1_drop']:g})"
        )

    def _agreement_detail(self) -> str:
        """What agreeing means for a kind other than a classifier's."""
        agr = self.agreement
        if self.kind == REGRESSION:
            tol = ", ".join(f"{t:.4g}" for t in agr["tolerance"])
            return (
                f"; values within {self.thresholds['agreement_tolerance']:g} target standard deviations "
                f"({tol} in target units)"
            )
        if self.kind == MULTI_LABEL:
            return f"; share of the {agr['decisions']} label decisions equal"
        if self.kind != CLASSIFICATION:
            mean = "n/a" if agr["mean_cosine"] is None else f"{agr['mean_cosine']:.4f}"
            return f"; rows at cosine {self.thresholds['min_cosine']:g} or more (mean cosine {mean})"
        return ""


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _quality(
    config: GateConfig, compare: Compare, rows: Sequence[Row], default: Measured, candidate: Measured
) -> tuple[dict | None, list[str]]:
    """The labelled rows' figures of a kind other than a classifier's, and the failure (if any)."""
    labelled = [i for i, r in enumerate(rows) if r.label is not None]
    truths = [compare.truth(rows[i].label) for i in labelled]

    def of(measured: Measured) -> list:
        return [measured.predicted[i] for i in labelled]

    if compare.kind == REGRESSION:
        (mae_d, raw_d), (mae_c, raw_c) = (
            mean_absolute_error(of(m), truths, compare.scale) for m in (default, candidate)
        )
        increase = None if mae_d is None else mae_c - mae_d
        failures = []
        if increase is not None and increase > config.kinds.max_mae_increase + 1e-12:
            failures.append(
                f"mean absolute error: the candidate's {mae_c:.4f} target standard deviations is {increase:.4f} "
                f"above the default's {mae_d:.4f} (at most {config.kinds.max_mae_increase:g} allowed)"
            )
        return {
            "metric": "mean absolute error",
            "unit": "target standard deviations",
            "default": _rounded(mae_d),
            "candidate": _rounded(mae_c),
            "increase": _rounded(increase),
            "rows": len(labelled),
            "mae": {"default": [_rounded(v) for v in raw_d], "candidate": [_rounded(v) for v in raw_c]},
            "scale": [_rounded(v) for v in compare.scale],
        }, failures
    if compare.kind == MULTI_LABEL:
        (f1_d, per_d), (f1_c, per_c) = (f1_per_label(of(m), truths, compare.labels) for m in (default, candidate))
        drop = None if f1_d is None else f1_d - f1_c
        failures = []
        if drop is not None and drop > config.kinds.max_f1_drop + 1e-12:
            failures.append(
                f"macro F1: the candidate's {f1_c:.4f} is {drop:.4f} below the default's {f1_d:.4f} "
                f"(at most {config.kinds.max_f1_drop:g} allowed)"
            )
        return {
            "metric": "macro F1",
            "default": _rounded(f1_d),
            "candidate": _rounded(f1_c),
            "drop": _rounded(drop),
            "rows": len(labelled),
            "per_label": {k: {"default": _rounded(per_d[k]), "candidate": _rounded(per_c[k])} for k in per_d},
        }, failures
    return None, []


def decide(
    config: GateConfig,
    model: str,
    rows: Sequence[Row],
    default: Measured,
    candidate: Measured,
    compare: Compare | None = None,
) -> GateReport:
    """Compare the candidate with the default on the same rows and bursts.

    It passes when the candidate is at most a threshold worse on the labelled rows (per kind:
    ``max_accuracy_drop``, ``regression.max_mae_increase``, ``multi_label.max_f1_drop``; none for an
    embedding), agrees with the default on at least ``min_agreement`` of the unlabelled rows (of all
    rows when none is unlabelled; what agreeing is depends on the kind, see ``compare``, default a
    classifier's), and its p99 is at most ``max_latency_ratio`` times the default's.

    Raises:
        GateError: a version did not answer every row, or has no timed request.
    """
    compare = compare or Compare()
    if not (len(rows) == len(default.predicted) == len(candidate.predicted)):
        raise GateError("each version must answer every row of the gate")
    if not default.latencies_ms or not candidate.latencies_ms:
        raise GateError("each version needs at least one timed request")
    failures = []
    accuracy_figures = quality = None
    unlabelled = [i for i, r in enumerate(rows) if r.label is None]
    if compare.kind == CLASSIFICATION:
        truths = [(i, r.label) for i, r in enumerate(rows) if r.label is not None]
        acc_d, acc_c = (
            accuracy([m.predicted[i] for i, _ in truths], [y for _, y in truths]) for m in (default, candidate)
        )
        drop = None if acc_d is None else acc_d - acc_c
        if drop is not None and drop > config.max_accuracy_drop + 1e-12:
            failures.append(
                f"accuracy: the candidate's {acc_c:.4f} is {drop:.4f} below the default's "
                f"{acc_d:.4f} (at most {config.max_accuracy_drop} allowed)"
            )
        accuracy_figures = {
            "default": _rounded(acc_d),
            "candidate": _rounded(acc_c),
            "drop": _rounded(drop),
            "rows": len(rows) - len(unlabelled),
        }
    else:
        quality, failures = _quality(config, compare, rows, default, candidate)
    on = "unlabelled rows" if unlabelled else "rows (none unlabelled: all rows)"
    chosen = unlabelled or list(range(len(rows)))
    agreement = (
        sum(compare.agreement(default.predicted[i], candidate.predicted[i]) for i in chosen) / len(chosen)
        if chosen
        else None
    )
    if agreement is not None and agreement < config.min_agreement:
        failures.append(
            f"agreement: the candidate gives {compare.agreeing()} on {agreement:.4f} of "
            f"the {on} (at least {config.min_agreement} required)"
        )
    agreement_figures = {"value": _rounded(agreement), "rows": len(chosen), "on": on}
    if compare.kind == REGRESSION:
        agreement_figures["tolerance"] = [_rounded(t) for t in compare.tolerance()]
    elif compare.kind == MULTI_LABEL:
        agreement_figures["decisions"] = len(chosen) * len(compare.labels)
    elif compare.kind != CLASSIFICATION:
        cosines = [1.0 - compare.distance(default.predicted[i], candidate.predicted[i]) for i in chosen]
        agreement_figures["mean_cosine"] = _rounded(sum(cosines) / len(cosines)) if cosines else None
    lat = {
        v.version: {"p50": percentile(v.latencies_ms, 50), "p99": percentile(v.latencies_ms, 99)}
        for v in (default, candidate)
    }
    ratio = p99_ratio(candidate.latencies_ms, default.latencies_ms)
    if ratio > config.max_latency_ratio:
        failures.append(
            f"latency: the candidate's p99 {lat[candidate.version]['p99']:.2f} ms is "
            f"{ratio:.2f} times the default's {lat[default.version]['p99']:.2f} ms "
            f"(at most {config.max_latency_ratio} allowed)"
        )
    sources: dict[str, int] = {}
    for r in rows:
        sources[r.source] = sources.get(r.source, 0) + 1
    return GateReport(
        model=model,
        default=default.version,
        candidate=candidate.version,
        accuracy=accuracy_figures,
        agreement=agreement_figures,
        latency_ms={
            "default": {k: round(v, 3) for k, v in lat[default.version].items()},
            "candidate": {k: round(v, 3) for k, v in lat[candidate.version].items()},
            "ratio": round(ratio, 3),
            "requests": len(candidate.latencies_ms),
        },
        thresholds=config.thresholds(compare.kind),
        failures=failures,
        passed=not failures,
        rows=sources,
        kind=compare.kind,
        quality=quality,
    )
