"""Per-batch telemetry: handler metrics, drift, and the audit trail (no TorchServe import).

One :meth:`Telemetry.record` call per batch updates every metric declared in
``config/metrics.yaml`` (aggregated per batch, so the cost does not grow with one metric line per
request), feeds the drift monitor, exports drift gauges every ``drift_every`` seconds, and writes
one JSON audit line per answered or rejected request to the ``rtserve.audit`` logger, which
TorchServe forwards into ``model_log.log``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from typing import Any, Callable, Sequence

import torch

from handler.drift import DriftMonitor
from handler.errors import HandlerError

logger = logging.getLogger(__name__)
audit_logger = logging.getLogger("rtserve.audit")

STAGES = ("preprocess", "inference", "postprocess")
#: Drift gauges are exported only once the window holds this many rows (or is full): PSI over a
#: handful of rows is noise, not drift.
DRIFT_MIN_ROWS = 200

#: SchemaViolations reasons, from the first matching phrase of an InvalidInput's message.
REASONS = (
    ("not valid JSON", "not_json"),
    ("not valid UTF-8", "not_json"),
    ("request body is empty", "empty_body"),
    ("must be a JSON object", "not_an_object"),
    ("missing required field", "missing_field"),
    ("must be a list", "not_a_list"),
    ("must have exactly", "wrong_length"),
    ("must be a number", "not_a_number"),
    ("must be a finite number", "non_finite"),
    ("must be in range", "out_of_range"),
)


def violation_reason(error: HandlerError) -> str:
    """A short label for why a request was rejected (the ``Reason`` metric dimension)."""
    if error.field == "target":
        return "bad_target"
    for phrase, reason in REASONS:
        if phrase in error.message:
            return reason
    return "invalid"


class Telemetry:
    """Metrics, drift and audit for one model version in one worker.

    Args:
        metric: ``metric(name, kind)`` returns TorchServe's metric object (``add_or_update``).
        model: model name; version: model version (metric dimensions and audit fields).
        labels: class labels; feature_names: input feature names (drift dimension).
        batch_size: the model's configured batch size (for BatchFill).
        drift_reference: ``meta.json``'s training reference; empty disables drift.
        drift_window: rows in the drift window; drift_every: seconds between drift exports.
        audit: write the audit trail.
    """

    def __init__(
        self, metric: Callable[[str, str], Any], model: str, version: str, labels: Sequence[str],
        feature_names: Sequence[str], batch_size: int, drift_reference: dict,
        drift_window: int = 2000, drift_every: float = 5.0, audit: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model, self.version = model, version
        self.labels, self.features = list(labels), list(feature_names)
        self.batch_size = max(1, batch_size)
        self.stage = metric("HandlerStageTime", "HISTOGRAM")
        self.fill = metric("BatchFill", "HISTOGRAM")
        self.requests = metric("HandlerRequests", "COUNTER")
        self.batches = metric("HandlerBatches", "COUNTER")
        self.violations = metric("SchemaViolations", "COUNTER")
        self.predictions = metric("Predictions", "COUNTER")
        self.feature_drift = metric("FeatureDrift", "GAUGE")
        self.prediction_drift = metric("PredictionDrift", "GAUGE")
        self.drift = DriftMonitor(drift_reference, drift_window) if drift_reference else None
        self.drift_every = drift_every
        self.audit = audit
        self.clock = clock
        self._last_export = clock()

    def record(self, batch: Any, probabilities: torch.Tensor | None, stage_seconds: Sequence[float],
               request_ids: Sequence[str]) -> None:
        """Account for one handled batch (``batch`` is a ``handler.schema.ParsedBatch``)."""
        dims = [self.model, self.version]
        for stage, seconds in zip(STAGES, stage_seconds):
            self.stage.add_or_update(seconds * 1000.0, dims + [stage])
        self.fill.add_or_update(batch.size / self.batch_size, dims)
        self.batches.add_or_update(1, dims)
        self.requests.add_or_update(batch.size, dims)
        rejected = {idx: err for idx, err in batch.errors.items() if err.status == 400}
        for reason, n in Counter(violation_reason(e) for e in rejected.values()).items():
            self.violations.add_or_update(n, dims + [reason])
        classes: list[int] = []
        if probabilities is not None:
            classes = probabilities.argmax(dim=1).tolist()
            answered = [cls for idx, cls in zip(batch.rows, classes)
                        if idx not in batch.errors and idx not in batch.explanations]
            for cls, n in Counter(answered).items():
                self.predictions.add_or_update(n, dims + [self.labels[cls]])
            if self.drift is not None:
                self.drift.update(batch.inputs, probabilities.argmax(dim=1))
        if self.drift is not None and self.clock() - self._last_export >= self.drift_every:
            self.export_drift()
        if self.audit:
            self._audit(batch, classes, rejected, sum(stage_seconds), request_ids)

    def export_drift(self) -> None:
        """Set the drift gauges from the current window."""
        self._last_export = self.clock()
        scores = self.drift.scores()
        if scores.rows < min(DRIFT_MIN_ROWS, self.drift.window):
            return
        dims = [self.model, self.version]
        for name, value in zip(self.features, scores.features):
            self.feature_drift.add_or_update(round(value, 6), dims + [name])
        self.prediction_drift.add_or_update(round(scores.prediction, 6), dims)

    def _audit(self, batch: Any, classes: list[int], rejected: dict, seconds: float,
               request_ids: Sequence[str]) -> None:
        """One JSON line per answered prediction or rejected request, in one log call."""
        ms = round(seconds * 1000.0, 3)
        row_classes: dict[int, list[int]] = {}  # a KServe v1 request may hold several rows
        for idx, cls in zip(batch.rows, classes):
            row_classes.setdefault(idx, []).append(cls)
        lines = []
        for idx in range(batch.size):
            base = {"request_id": request_ids[idx] if idx < len(request_ids) else None,
                    "model": self.model, "model_version": self.version,
                    "batch_size": batch.size, "handler_ms": ms}
            if idx in rejected:
                lines.append({"event": "rejected", **base, "status": 400,
                              "reason": violation_reason(rejected[idx])})
            elif idx in row_classes and idx not in batch.errors:
                found = row_classes[idx]
                event = "explanation" if idx in batch.explanations else "prediction"
                if len(found) == 1:
                    lines.append({"event": event, **base, "class": found[0],
                                  "label": self.labels[found[0]]})
                else:
                    lines.append({"event": event, **base, "classes": found,
                                  "labels": [self.labels[c] for c in found]})
        if lines:
            audit_logger.info("\n".join(json.dumps(line, separators=(",", ":")) for line in lines))
