"""The promotion gate's decision: pure functions over measured answers, no server and no torch.

:mod:`rtserve.promotion.measure` gets the answers and times a burst; this turns them into a :class:`GateReport`:
each version's accuracy on labelled rows, their agreement on the rest, p50/p99 over the burst, and the
outcome against :class:`GateConfig`'s thresholds (``config/gate.yaml``, the one place they live).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import yaml

from rtserve.errors import ArchiveError, GateError
from rtserve.model.archive import golden_mismatches, read_archive  # noqa: F401 - re-exported
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


def _check_keys(path: Path, where: str, raw: object, names: Iterable[str]) -> dict:
    """``raw`` as a mapping holding exactly ``names``.

    Raises:
        GateError: ``raw`` is not a mapping, or a key is missing or unknown (both named).
    """
    names = set(names)
    got = set(raw) if isinstance(raw, dict) else set()
    if not isinstance(raw, dict) or got != names:
        raise GateError(
            f"{path}: {where}expected the keys {sorted(names)}; missing "
            f"{sorted(names - got)}, unknown {sorted(got - names)}"
        )
    return raw


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

    @classmethod
    def load(cls, path: str | Path | None = None) -> GateConfig:
        """Read and check a thresholds file (default ``config/gate.yaml``).

        Raises:
            GateError: the file is missing, a key is missing or unknown, or a value is out of range.
        """
        path = Path(path or DEFAULT_CONFIG)
        try:
            raw = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise GateError(f"cannot read the gate thresholds {path}: {exc}") from exc
        names = {f.name: f.type for f in fields(cls) if f.name != "live"}
        _check_keys(path, "", raw, [*names, "live"])
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
        return cls(**values, live=LiveConfig.from_raw(path, raw["live"]))

    def thresholds(self) -> dict:
        """The figures the decision uses (what a report records)."""
        return {
            "max_accuracy_drop": self.max_accuracy_drop,
            "min_agreement": self.min_agreement,
            "max_latency_ratio": self.max_latency_ratio,
        }


@dataclass
class ArchiveMeta:
    """What the gate needs from an archive's ``meta.json``."""

    version: str
    labels: list[str]
    n_features: int
    golden: dict
    #: The output signature (``rtserve-model/2``); None for ``rtserve-model/1``, a classifier.
    output: dict | None = None

    @property
    def kind(self) -> str:
        """The output's kind (``handler.model.KINDS``)."""
        return self.output["kind"] if self.output else "classification"

    @classmethod
    def from_mar(cls, mar: str | Path) -> ArchiveMeta:
        """What the gate needs of a model archive, without loading the model.

        Read through :func:`rtserve.model.archive.read_archive`.

        Raises:
            ArchiveError: the file is missing, not an archive, or has no golden set.
        """
        archive = read_archive(mar)
        if not archive.golden.get("features"):
            raise ArchiveError(f"{mar} has no golden set: package it with rtserve.model.package.export")
        outputs = archive.meta.get("outputs") or [None]
        return cls(archive.meta_version, archive.labels, archive.n_features, archive.golden, outputs[0])

    def golden_labels(self) -> list[str | None]:
        """The golden rows' true labels by name (None per row when the set is unlabelled)."""
        truth = self.golden.get("labels")
        if truth is None:
            return [None] * len(self.golden["features"])
        return [self.labels[i] for i in truth]


@dataclass
class Row:
    """One row both versions answer: features, the true label (None: unlabelled), its origin."""

    features: list[float]
    label: str | None
    source: str


def gate_rows(default: ArchiveMeta, candidate: ArchiveMeta, requests: Sequence[list[float]] = ()) -> list[Row]:
    """The rows of a gate: the default's golden set, the candidate's, then the request rows.

    Raises:
        GateError: either version is not a classifier (the gate compares classifiers only today).
    """
    for meta in (default, candidate):
        if meta.kind != "classification":
            raise GateError(
                f"version {meta.version} is a {meta.kind} model: the gate compares classifiers only "
                "today (accuracy and class agreement); a per-kind metric comes with issue 37. Nothing changed"
            )
    rows = []
    for meta in (default, candidate):
        rows += [Row(x, y, f"golden {meta.version}") for x, y in zip(meta.golden["features"], meta.golden_labels())]
    return rows + [Row(list(x), None, "requests") for x in requests]


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
    """One version's answers to the gate's rows (labels by name) and its burst latencies (ms)."""

    version: str
    predicted: list[str]
    latencies_ms: list[float]


@dataclass
class GateReport:
    """The figures, thresholds and outcome of one gate decision (one JSON line when recorded)."""

    model: str
    default: str
    candidate: str
    accuracy: dict
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

    def event(self) -> dict:
        """The record written to the rollout history and the audit log."""
        return {"event": "gate", "action": "gate", **asdict(self)}

    def text(self) -> str:
        """The report a person reads."""
        acc, agr, lat = self.accuracy, self.agreement, self.latency_ms
        d, c = self.default, self.candidate

        def pct(value):
            return "n/a" if value is None else f"{100 * value:.2f}%"

        lines = [
            f"gate {self.model}: candidate {c} against default {d}",
            f"  rows: {', '.join(f'{n} {k}' for k, n in self.rows.items())}",
            f"  accuracy ({acc['rows']} labelled rows): default {pct(acc['default'])}, candidate "
            f"{pct(acc['candidate'])}, drop {pct(acc['drop'])} (max {pct(self.thresholds['max_accuracy_drop'])})",
            f"  agreement ({agr['rows']} {agr['on']}): {pct(agr['value'])} "
            f"(min {pct(self.thresholds['min_agreement'])})",
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


def _accuracy(predicted: Sequence[str], rows: Sequence[Row]) -> float | None:
    labelled = [(p, r.label) for p, r in zip(predicted, rows) if r.label is not None]
    return sum(p == y for p, y in labelled) / len(labelled) if labelled else None


def decide(config: GateConfig, model: str, rows: Sequence[Row], default: Measured, candidate: Measured) -> GateReport:
    """Compare the candidate with the default on the same rows and bursts.

    It passes when the candidate loses at most ``max_accuracy_drop`` on the labelled rows, agrees
    with the default on at least ``min_agreement`` of the unlabelled rows (of all rows when none
    is unlabelled), and its p99 is at most ``max_latency_ratio`` times the default's.
    """
    if not (len(rows) == len(default.predicted) == len(candidate.predicted)):
        raise GateError("each version must answer every row of the gate")
    if not default.latencies_ms or not candidate.latencies_ms:
        raise GateError("each version needs at least one timed request")
    failures = []
    acc_d, acc_c = _accuracy(default.predicted, rows), _accuracy(candidate.predicted, rows)
    drop = None if acc_d is None else acc_d - acc_c
    if drop is not None and drop > config.max_accuracy_drop + 1e-12:
        failures.append(
            f"accuracy: the candidate's {acc_c:.4f} is {drop:.4f} below the default's "
            f"{acc_d:.4f} (at most {config.max_accuracy_drop} allowed)"
        )
    unlabelled = [i for i, r in enumerate(rows) if r.label is None]
    on = "unlabelled rows" if unlabelled else "rows (none unlabelled: all rows)"
    chosen = unlabelled or list(range(len(rows)))
    agreement = sum(default.predicted[i] == candidate.predicted[i] for i in chosen) / len(chosen) if chosen else None
    if agreement is not None and agreement < config.min_agreement:
        failures.append(
            f"agreement: the candidate gives the default's class on {agreement:.4f} of "
            f"the {on} (at least {config.min_agreement} required)"
        )
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

    def rounded(x):
        return None if x is None else round(x, 6)

    return GateReport(
        model=model,
        default=default.version,
        candidate=candidate.version,
        accuracy={
            "default": rounded(acc_d),
            "candidate": rounded(acc_c),
            "drop": rounded(drop),
            "rows": len(rows) - len(unlabelled),
        },
        agreement={"value": rounded(agreement), "rows": len(chosen), "on": on},
        latency_ms={
            "default": {k: round(v, 3) for k, v in lat[default.version].items()},
            "candidate": {k: round(v, 3) for k, v in lat[candidate.version].items()},
            "ratio": round(ratio, 3),
            "requests": len(candidate.latencies_ms),
        },
        thresholds=config.thresholds(),
        failures=failures,
        passed=not failures,
        rows=sources,
    )
