"""Model versions on a running TorchServe: register, promote, roll back, retire, scale.

TorchServe keeps no record of the default before a ``set-default``, so
:class:`~rtserve.promotion.history.History` keeps one (gate decisions included) and ``rollback`` reads it.
Every operation checks its preconditions first and changes nothing when they fail.
"""

from __future__ import annotations

import getpass
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from handler.audit import append_event
from rtserve.client.rest import Client, NotFound, TorchServeError
from rtserve.errors import ArchiveError, GateError, GateRefused, RolloutError
from rtserve.promotion.gate import (
    ArchiveMeta,
    GateConfig,
    GateReport,
    Measured,
    comparison,
    decide,
    gate_rows,
    p99_ratio,
    read_requests,
)
from rtserve.promotion.history import HISTORY_FILE, History  # noqa: F401 - HISTORY_FILE re-exported
from rtserve.promotion.kinds import Compare
from rtserve.promotion.live.evidence import promote_evidence, shadow_report_from_files
from rtserve.promotion.live.routes import drop_version
from rtserve.promotion.measure import answer_values, check_golden, latency_burst
from rtserve.server.disk import audit_cap
from rtserve.settings import RunDir

logger = logging.getLogger(__name__)

VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass
class Verification:
    """Where the live checks find archives and record decisions (see :mod:`rtserve.promotion.gate`).

    Attributes:
        model_store: the server's model store (the archives' golden sets are read there).
        config: the gate's thresholds.
        audit_log: the audit trail file that gate decisions are appended to (None: not kept).
        run_dir: the server's run directory: its live routes and live log (None: no live
            evidence; with ``live.promote.require_shadow`` every promotion is then refused).
    """

    model_store: Path
    config: GateConfig
    audit_log: Path | None = None
    run_dir: Path | None = None

    def meta(self, model: str, version: str) -> ArchiveMeta:
        """The golden set and labels of ``<model>_<version>.mar``."""
        return ArchiveMeta.from_mar(self.model_store / archive_name(model, version))


def archive_name(model: str, version: str) -> str:
    """The model-store file name of a version: ``<model>_<version>.mar``.

    Raises:
        RolloutError: the model or version is not a plain name (no paths, no URLs).
    """
    for what, value in (("model", model), ("version", version)):
        if not VERSION_RE.match(value) or ".." in value:
            raise RolloutError(f"invalid {what} {value!r}: letters, digits, '.', '_' and '-' only")
    return f"{model}_{version}.mar"


@dataclass
class VersionStatus:
    """One registered version as ``make models`` shows it."""

    version: str
    default: bool
    workers_ready: int
    workers: int
    min_workers: int
    max_workers: int
    pending: int
    queue_capacity: int


class Rollout:
    """Version operations for one model name."""

    def __init__(self, client: Client, history: History, model: str, verification: Verification | None = None) -> None:
        self.client = client
        self.history = history
        self.model = model
        self.verification = verification

    def default_version(self) -> str:
        """The current default version (TorchServe's describe without a version)."""
        return self.client.describe(self.model)[0]["modelVersion"]

    def status(self) -> list[VersionStatus]:
        """Every registered version with its workers and queue."""
        default = self.default_version()
        out = []
        for desc in self.client.describe(self.model, "all"):
            workers = desc.get("workers", [])
            queue = desc.get("jobQueueStatus", {})
            out.append(
                VersionStatus(
                    version=desc["modelVersion"],
                    default=desc["modelVersion"] == default,
                    workers_ready=sum(1 for w in workers if w.get("status") == "READY"),
                    workers=len(workers),
                    min_workers=desc.get("minWorkers", 0),
                    max_workers=desc.get("maxWorkers", 0),
                    pending=queue.get("pendingRequests", 0),
                    queue_capacity=queue.get("remainingCapacity", 0),
                )
            )
        return sorted(out, key=lambda s: s.version)

    def versions(self) -> list[str]:
        """Registered versions."""
        return [s.version for s in self.status()]

    def register(self, version: str, workers: int | None = None, timeout: float = 180.0) -> str:
        """Register ``<model>_<version>.mar`` from the model store beside the running versions.

        The default does not change. Workers are up when this returns; if the version cannot
        load, or (with a :class:`Verification`) answers its archive's golden set differently from
        the probabilities recorded at packaging time, it is unregistered again and the error is
        raised.

        Raises:
            RolloutError: bad name or already registered.
            TorchServeError: TorchServe refused or failed to load the archive.
            GoldenMismatch: the served answers differ from the golden set (rows named).
        """
        url = archive_name(self.model, version)
        try:
            registered = self.versions()
        except NotFound:
            registered = []
        if version in registered:
            raise RolloutError(f"{self.model} {version} is already registered; nothing changed")
        try:
            result = self.client.register(url, initial_workers=workers or 1, timeout=timeout)
        except TorchServeError as exc:
            self._discard_failed(version)
            raise exc.reworded(f"{exc}{_register_hint(exc)}") from exc
        if workers:
            self.client.scale(self.model, workers, version=version, timeout=timeout)
        if not any(s.version == version and s.workers_ready > 0 for s in self.status()):
            self._discard_failed(version)
            raise TorchServeError(f"{self.model} {version} registered but no worker became ready")
        if self.verification is not None:
            try:
                check_golden(
                    self.client,
                    self.model,
                    version,
                    self.verification.meta(self.model, version),
                    self.verification.config,
                )
            except (ArchiveError, GateError, TorchServeError) as exc:
                self._discard_failed(version)
                raise exc.reworded(
                    f"{exc}; {self.model} {version} was unregistered again, the default is unchanged"
                ) from exc
        return result.get("status", "")

    def _discard_failed(self, version: str) -> None:
        try:
            if version in self.versions() and version != self.default_version():
                self.client.unregister(self.model, version)
        except TorchServeError as exc:
            logger.warning("could not clean up failed version %s: %s", version, exc)

    def promote(
        self,
        version: str,
        force_reason: str | None = None,
        requests_file: str | Path | None = None,
        forced_by: str | None = None,
    ) -> str:
        """Make ``version`` the default and record the previous default; returns the previous one.

        With a :class:`Verification`, the gate runs first (:meth:`gate`) and its decision is
        recorded; a refused candidate is promoted only with ``force_reason``.

        Raises:
            RolloutError: the version is not registered, has no ready worker, or is already default.
            GateRefused: the gate refused it and no ``force_reason`` was given.
        """
        status = {s.version: s for s in self.status()}
        current = next(v for v, s in status.items() if s.default)
        if version not in status:
            raise RolloutError(
                f"{self.model} {version} is not registered (registered: {', '.join(sorted(status))}); "
                "run `make register` first; nothing changed"
            )
        if version == current:
            raise RolloutError(f"{self.model} {version} is already the default; nothing changed")
        if status[version].workers_ready == 0:
            raise RolloutError(f"{self.model} {version} has no ready worker; nothing changed")
        if force_reason is not None and not force_reason.strip():
            raise RolloutError('a forced promotion needs a reason (REASON="..."); nothing changed')
        if self.verification is not None:
            report = self.gate(current, version, requests_file)
            self._live_evidence(report)
            report.outcome = "promoted" if report.passed else ("forced" if force_reason else "refused")
            if force_reason:
                report.forced_by = forced_by or who_runs()
                report.reason = force_reason
            self._record(report)
            if not report.passed and not force_reason:
                raise GateRefused(report)
            logger.info("%s", report.text())
        self.client.set_default(self.model, version)
        self.history.append({"action": "promote", "model": self.model, "from": current, "to": version})
        if self.verification is not None and self.verification.run_dir is not None:
            dropped = drop_version(RunDir(self.verification.run_dir).live_routes, version)
            if dropped:
                logger.info(
                    "%s %s is the default now: its %s route turned off", self.model, version, " and ".join(dropped)
                )
        return current

    def _live_evidence(self, report: GateReport) -> None:
        """Add the shadow report's figures and failures to ``report`` (``live.promote.require_shadow``).

        Each failure names the live figure.
        """
        live = self.verification.config.live
        if not live.require_shadow:
            return
        run_dir = self.verification.run_dir
        shadow = None
        if run_dir is not None:
            meta = self.verification.meta(self.model, report.candidate)
            files = RunDir(run_dir)
            shadow = shadow_report_from_files(
                self.model,
                files.live_log,
                files.records,
                report.candidate,
                report.default,
                meta.labels,
                Compare.of(meta.output, meta.output_golden, self.verification.config.kinds),
            )
        report.live, failures = promote_evidence(live.shadow, shadow)
        report.failures += failures
        report.passed = not report.failures

    def gate(self, default: str, candidate: str, requests_file: str | Path | None = None) -> GateReport:
        """Measure both versions on the same rows and bursts and decide (changes nothing).

        Their answers are compared per the output kind (:mod:`rtserve.promotion.kinds`).

        Raises:
            GateError: the versions' outputs differ (kind or width), before anything is measured.
        """
        if self.verification is None:
            raise RolloutError("the gate needs the model store (a Verification)")
        metas = [self.verification.meta(self.model, v) for v in (default, candidate)]
        config = self.verification.config
        requests = read_requests(requests_file, metas[1].n_features, config.max_rows) if requests_file else []
        rows = gate_rows(metas[0], metas[1], requests)
        features = [r.features for r in rows]
        burst = latency_burst(self.client, self.model, (default, candidate), features[0], config)
        for _ in range(config.latency_attempts - 1):  # a noisy burst is measured again
            if p99_ratio(burst[candidate], burst[default]) <= config.max_latency_ratio:
                break
            again = latency_burst(self.client, self.model, (default, candidate), features[0], config)
            if p99_ratio(again[candidate], again[default]) < p99_ratio(burst[candidate], burst[default]):
                burst = again
        kind = metas[0].kind
        measured = [
            Measured(v, answer_values(self.client, self.model, v, kind, features, config.concurrency), burst[v])
            for v in (default, candidate)
        ]
        return decide(config, self.model, rows, *measured, comparison(metas[0], config))

    def _record(self, report: GateReport) -> None:
        """One event in the rollout history and one line in the audit log."""
        event = {**report.event(), "at": datetime.now(UTC).isoformat()}
        self.history.append(event)
        if self.verification is not None and self.verification.audit_log is not None:
            append_event(self.verification.audit_log, event, audit_cap(self.verification.run_dir))

    def rollback(self) -> tuple[str, str]:
        """Return the default to the version before the last promote; returns (from, to).

        Raises:
            RolloutError: no previous version is recorded, or it is no longer registered.
        """
        target = self.history.previous_default(self.model)
        if target is None:
            raise RolloutError(f"no previous default recorded for {self.model}; nothing changed")
        status = {s.version: s for s in self.status()}
        current = next(v for v, s in status.items() if s.default)
        if target not in status:
            raise RolloutError(
                f"previous default {self.model} {target} is no longer registered "
                f"(register it again first); nothing changed"
            )
        self.client.set_default(self.model, target)
        self.history.append({"action": "rollback", "model": self.model, "from": current, "to": target})
        return current, target

    def retire(self, version: str, timeout: float = 120.0) -> None:
        """Unregister a version that is not the default.

        Raises:
            RolloutError: the version is the default or not registered.
        """
        status = {s.version: s for s in self.status()}
        if version not in status:
            raise RolloutError(f"{self.model} {version} is not registered; nothing changed")
        if status[version].default:
            raise RolloutError(
                f"{self.model} {version} is the default: promote another version before retiring it; nothing changed"
            )
        self.client.unregister(self.model, version, timeout=timeout)

    def scale(self, workers: int, version: str | None = None, timeout: float = 180.0) -> None:
        """Set the worker count of ``version`` (default: the default version); waits for workers.

        Raises:
            RolloutError: ``workers`` is out of range or the version is not registered.
        """
        if not 1 <= workers <= 64:
            raise RolloutError(f"workers must be in [1, 64], got {workers}; nothing changed")
        version = version or self.default_version()
        if version not in self.versions():
            raise RolloutError(f"{self.model} {version} is not registered; nothing changed")
        self.client.scale(self.model, workers, version=version, timeout=timeout)


def who_runs() -> str:
    """Who runs this (for a forced promotion's record)."""
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def _register_hint(exc: TorchServeError) -> str:
    """What a failed registration most likely means, for the error message."""
    if exc.status == 400 and "Model name is not defined" in str(exc):
        return " (the file is not a valid model archive: no readable MAR-INF/MANIFEST.json)"
    if exc.status == 500 and "Failed to start workers" in str(exc):
        return " (the archive's handler failed to load: see model_log.log in the server's logs)"
    if exc.status == 404:
        return " (build it with `make archive MODEL_VERSION=...` into the server's model store)"
    return ""
