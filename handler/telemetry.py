"""Per-batch telemetry: handler metrics and drift (no TorchServe import).

Nothing goes through the worker's stdout, which the frontend parses per line: metrics are ``prometheus_client``
multiprocess files (served by :mod:`rtserve.observability.exporter`); drift rows are scored in bulk
(:class:`DriftBuffer`) and exported by a daemon thread (:class:`DriftExporter`), never in the request's wait.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import Counter as Tally
from collections.abc import Callable, Sequence
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from handler.drift import DriftMonitor, drift_names
from handler.errors import ConfigError, HandlerError

logger = logging.getLogger(__name__)

#: The environment variable prometheus_client's multiprocess mode reads (set by rtserve.server).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The server's log directory (rtserve.server sets it for TorchServe, whose workers inherit it).
LOG_DIR_ENV = "LOG_LOCATION"

#: What TorchServe's worker prints to its stdout for every batch, for the frontend to read back:
#: its "Backend received inference at" log line (the frontend's log config drops it anyway) and
#: its PredictionTime metric line (rtserve_handler_stage_seconds has the handler's stages).
TORCHSERVE_BATCH_LINE = "Backend received inference at"
TORCHSERVE_METRICS_LOGGER = "ts.metrics.caching_metric"

STAGES = ("preprocess", "inference", "postprocess")
#: Drift gauges are exported only once the window holds this many rows (or is full): PSI over a
#: handful of rows is noise, not drift.
DRIFT_MIN_ROWS = 200
#: Handler stage buckets, seconds: 10 us .. 1 s (a stage of this model takes 20 us .. 2 ms; an
#: explanation tens of ms).
STAGE_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
#: Batch size buckets: powers of two up to the largest batch TorchServe forms here.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
LABELS = ("model_name", "model_version")


def violation_reason(error: HandlerError) -> str:
    """The ``reason`` metric label of a rejected request: an :class:`~handler.errors.InvalidInput`'s own."""
    return getattr(error, "reason", "invalid")


class HandlerMetrics:
    """The handler's Prometheus metrics for one model version (children bound once).

    Args:
        model, version: the ``model_name`` / ``model_version`` labels.
        labels: class labels; feature_names: input feature names (drift label).
        registry: where the metrics are registered (a private one by default: in multiprocess
            mode the values live in the shared files whatever the registry).
    """

    def __init__(
        self,
        model: str,
        version: str,
        labels: Sequence[str],
        feature_names: Sequence[str],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg = {"registry": self.registry}
        ids = (model, version)
        self.requests = Counter(
            "rtserve_handler_requests", "Requests the handler answered or rejected", LABELS, **reg
        ).labels(*ids)
        self.batches = Counter("rtserve_handler_batches", "Batches the handler ran", LABELS, **reg).labels(*ids)
        violations = Counter(
            "rtserve_schema_violations", "Requests rejected with 400, by reason", LABELS + ("reason",), **reg
        )
        self.violations = lambda reason: violations.labels(model, version, reason)
        predictions = Counter(
            "rtserve_predictions", "Answered predictions by predicted class", LABELS + ("class",), **reg
        )
        self.predictions = [predictions.labels(model, version, label) for label in labels]
        stage = Histogram(
            "rtserve_handler_stage_seconds",
            "Seconds per batch in each handler stage",
            LABELS + ("stage",),
            buckets=STAGE_BUCKETS,
            **reg,
        )
        self.stages = [stage.labels(model, version, name) for name in STAGES]
        self.batch_size = Histogram(
            "rtserve_batch_size", "Requests per batch the handler ran", LABELS, buckets=BATCH_BUCKETS, **reg
        ).labels(*ids)
        self.records_written = Counter(
            "rtserve_records_written", "Records the handler wrote to its spool", LABELS, **reg
        ).labels(*ids)
        self.records_dropped = Counter(
            "rtserve_records_dropped",
            "Records the handler could not keep: the spool was full (the store away too long)",
            LABELS,
            **reg,
        ).labels(*ids)
        # Drift gauges get their children at the first export: no series until there is a score.
        self.ids = ids
        self.feature_names = list(feature_names)
        self.feature_drift = Gauge(
            "rtserve_feature_drift_psi",
            "Population stability index of each input feature over the recent window",
            LABELS + ("feature",),
            multiprocess_mode="mostrecent",
            **reg,
        )
        self.prediction_drift = Gauge(
            "rtserve_prediction_drift_psi",
            "Population stability index of the predictions over the recent window (classes, or the mean over "
            "regression targets, labels' positive shares, an embedding's distance to its training mean)",
            LABELS,
            multiprocess_mode="mostrecent",
            **reg,
        )

    def set_drift(self, features: Sequence[float], prediction: float | None) -> None:
        """Set the drift gauges (PSI per feature, and of the predictions unless None: not scored)."""
        for name, value in zip(self.feature_names, features):
            self.feature_drift.labels(*self.ids, name).set(round(value, 6))
        if prediction is not None:
            self.prediction_drift.labels(*self.ids).set(round(prediction, 6))


class DriftExporter:
    """A daemon thread that calls ``export`` every ``every`` seconds until :meth:`stop`.

    The worker's request loop is a single thread; this is the only other thread touching the
    drift state, and :class:`Telemetry` guards that state with a lock. An exception in
    ``export`` is logged and the thread keeps going (a gauge left stale is better than a
    worker without metrics).
    """

    def __init__(self, export: Callable[[], object], every: float) -> None:
        self._export = export
        self.every = every
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="rtserve-drift-export", daemon=True)
        self.thread.start()
        # Stopped before the interpreter finalizes: a daemon thread still inside torch then
        # aborts the process ("terminate called without an active exception").
        atexit.register(self.stop)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self._export()
            except Exception:  # noqa: BLE001 - keep exporting; the log says why once per failure
                logger.exception("drift export failed")

    def stop(self) -> None:
        """Stop the thread (waits for an export in progress)."""
        self._stop.set()
        self.thread.join()


class DriftBuffer:
    """Feeds a :class:`DriftMonitor` in bulk: rows are kept until ``flush_rows`` arrived, then scored.

    Exact: every row is counted, at most ``flush_rows`` rows late. Rows are kept by reference, a
    classifier's predicted classes as plain ints that become one tensor per flush, another kind's
    answer values (:meth:`add_outputs`) as the batch's tensor.
    """

    def __init__(self, monitor: DriftMonitor, flush_rows: int = 256) -> None:
        self.monitor = monitor
        self.flush_rows = flush_rows
        self._inputs: list[torch.Tensor] = []
        self._classes: list[int] = []
        self._outputs: list[torch.Tensor] = []
        self._output_rows = 0

    @property
    def _rows(self) -> int:
        return len(self._classes) + self._output_rows

    def add(self, inputs: torch.Tensor, classes: Sequence[int] | torch.Tensor) -> None:
        """Keep one batch's valid rows (``[rows, features]``) and predicted classes."""
        self._inputs.append(inputs)
        self._classes += classes.tolist() if isinstance(classes, torch.Tensor) else classes
        if len(self._classes) >= self.flush_rows:
            self.flush()

    def add_outputs(self, inputs: torch.Tensor, outputs: torch.Tensor) -> None:
        """Keep one batch's valid rows (``[rows, features]``) and what their answers carry (``[rows, width]``)."""
        self._inputs.append(inputs)
        self._outputs.append(outputs)
        self._output_rows += len(outputs)
        if self._output_rows >= self.flush_rows:
            self.flush()

    def flush(self) -> None:
        """Score what is buffered."""
        if self._classes:
            self.monitor.update(torch.cat(self._inputs), torch.tensor(self._classes))
            self._inputs, self._classes = [], []
        elif self._outputs:
            self.monitor.update(torch.cat(self._inputs), torch.cat(self._outputs))
            self._inputs, self._outputs, self._output_rows = [], [], 0


class _DropLine(logging.Filter):
    """Drops records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.prefix))


def quiet_torchserve_batch_lines() -> None:
    """Stop the two lines TorchServe's worker writes to its stdout per batch.

    See :data:`TORCHSERVE_BATCH_LINE`: each costs the worker a write and the frontend a read, a parse
    and a log call, on every batch. Warnings and errors still go through.
    """
    root = logging.getLogger()
    if not any(isinstance(f, _DropLine) for f in root.filters):
        root.addFilter(_DropLine(TORCHSERVE_BATCH_LINE))
    logging.getLogger(TORCHSERVE_METRICS_LOGGER).setLevel(logging.WARNING)


def require_multiprocess_dir() -> str:
    """The metrics directory the server gave the workers.

    Raises:
        ConfigError: it is not set, so the handler's metrics would be exported nowhere.
    """
    path = os.environ.get(MULTIPROC_ENV)
    if not path or not os.path.isdir(path):
        raise ConfigError(
            f"handler.metrics is on but {MULTIPROC_ENV} is not an existing directory "
            "(rtserve.server sets it): start the server with rtserve.server, or set "
            "handler.metrics: false"
        )
    return path


class Telemetry:
    """Metrics and drift for one model version in one worker.

    Args:
        model: model name; version: model version (metric labels).
        labels: class labels; feature_names: input feature names (drift label).
        drift_reference: ``meta.json``'s training reference; empty disables drift.
        drift_window: rows in the drift window; drift_every: seconds between drift exports
            (a :class:`DriftExporter` thread; None: no thread, :meth:`export_drift` is called
            by the owner).
        drift_flush_rows: rows buffered before the drift window is updated.
        registry: the metrics' registry (tests read values from it).
    """

    def __init__(
        self,
        model: str,
        version: str,
        labels: Sequence[str],
        feature_names: Sequence[str],
        drift_reference: dict,
        drift_window: int = 2000,
        drift_every: float | None = 5.0,
        drift_flush_rows: int = 256,
        registry: CollectorRegistry | None = None,
    ) -> None:
        names = list(feature_names) + drift_names(drift_reference or {})  # derived views, token shares
        self.metrics = HandlerMetrics(model, version, labels, names, registry)
        self.drift = DriftMonitor(drift_reference, drift_window) if drift_reference else None
        self.buffer = DriftBuffer(self.drift, min(drift_flush_rows, drift_window)) if self.drift else None
        #: Guards the drift buffer and window between the request loop and the exporter.
        self._drift_lock = threading.Lock()
        self._drift_rows = 0  # rows handed over since the last export
        self.exporter = (
            DriftExporter(self.export_drift, drift_every)
            if self.drift is not None and drift_every is not None
            else None
        )

    def record(self, batch: Any, classes: Sequence[int] | None, stage_seconds: Sequence[float]) -> None:
        """Account for one handled batch.

        ``batch`` is a ``handler.schema.ParsedBatch``; ``classes`` the predicted class of each of its
        rows, None when it had no valid row or the model is not a classifier (then its drift takes
        ``batch.outputs``, what the rows' answers carry).
        """
        m = self.metrics
        for stage, seconds in zip(m.stages, stage_seconds):
            stage.observe(seconds)
        m.batch_size.observe(batch.size)
        m.batches.inc()
        m.requests.inc(batch.size)
        errors = batch.errors
        rejected = {idx: err for idx, err in errors.items() if err.status == 400} if errors else {}
        if rejected:
            for reason, n in Tally(violation_reason(e) for e in rejected.values()).items():
                m.violations(reason).inc(n)
        if classes:
            skip = errors or batch.explanations
            answered = (
                classes
                if not skip
                else [
                    cls for idx, cls in zip(batch.rows, classes) if idx not in errors and idx not in batch.explanations
                ]
            )
            if len(answered) == 1:
                m.predictions[answered[0]].inc()
            else:
                for cls, n in Tally(answered).items():
                    m.predictions[cls].inc(n)
            if self.buffer is not None:
                with self._drift_lock:
                    self.buffer.add(batch.inputs, classes)
                    self._drift_rows += len(classes)
        elif batch.outputs is not None and self.buffer is not None:
            with self._drift_lock:
                self.buffer.add_outputs(batch.inputs, batch.outputs)
                self._drift_rows += len(batch.outputs)

    def export_drift(self) -> bool:
        """Score the buffered rows and set the drift gauges, if rows arrived since the last export.

        The :class:`DriftExporter` thread calls this.

        Returns:
            Whether the gauges were set (the window holds enough rows to score).
        """
        with self._drift_lock:
            if not self._drift_rows:
                return False
            self._drift_rows = 0
            self.buffer.flush()
            scores = self.drift.scores()
        if scores.rows < min(DRIFT_MIN_ROWS, self.drift.window):
            return False
        self.metrics.set_drift(scores.features, scores.prediction)
        return True

    def close(self) -> None:
        """Stop the drift exporter (a worker's process exit ends it too)."""
        if self.exporter is not None:
            self.exporter.stop()
