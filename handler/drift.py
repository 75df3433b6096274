"""Input and prediction drift against the training distribution (no TorchServe import).

Training stores per-feature decile edges and bin shares, and the class shares; :class:`DriftMonitor`
keeps a sliding window's bin counts in a ring buffer and scores them with the population stability
index ``sum((a - e) * ln(a / e))``: < 0.1 stable, 0.1-0.2 moderate shift, > 0.2 significant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Share floor for empty bins, so PSI stays finite.
EPSILON = 1e-4


def fit_reference(x: torch.Tensor, classes: torch.Tensor | None, n_classes: int, bins: int = 10) -> dict:
    """The training reference for ``meta.json``: decile edges and shares per feature, class shares.

    Args:
        x: ``[rows, features]`` inputs as the model sees them (normalized).
        classes: ``[rows]`` predicted class per row; None for a model that is not a classifier
            (its reference has no ``class_expected``: its prediction drift is not measured yet).
        n_classes: number of classes.
        bins: bins per feature (quantile bins, so each holds about ``1/bins`` of training rows).
    """
    qs = torch.linspace(0, 1, bins + 1)[1:-1]
    edges = torch.quantile(x.T.contiguous(), qs, dim=1).T.contiguous()  # [features, bins-1]
    idx = torch.searchsorted(edges, x.T.contiguous())  # [features, rows]
    counts = torch.zeros(x.shape[1], bins).scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float))
    reference = {"edges": edges.tolist(), "expected": (counts / len(x)).tolist()}
    if classes is not None:
        class_counts = torch.bincount(classes, minlength=n_classes).float()
        reference["class_expected"] = (class_counts / len(classes)).tolist()
    return reference


def psi(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """PSI of each row of ``actual`` shares against ``expected`` shares (same shape)."""
    a = actual.clamp_min(EPSILON)
    e = expected.clamp_min(EPSILON)
    return ((a - e) * torch.log(a / e)).sum(dim=-1)


@dataclass
class DriftScores:
    """Current drift scores over the window."""

    features: list[float]
    prediction: float
    rows: int


class DriftMonitor:
    """Sliding-window PSI per feature and for the predicted class."""

    def __init__(self, reference: dict, window: int = 2000) -> None:
        self.edges = torch.tensor(reference["edges"], dtype=torch.float32)
        self.expected = torch.tensor(reference["expected"], dtype=torch.float32)
        # no class shares (a model that is not a classifier): the prediction's PSI stays 0
        self.class_expected = torch.tensor(reference.get("class_expected", []), dtype=torch.float32)
        self.has_classes = len(self.class_expected) > 0
        n_features, n_bins = self.expected.shape
        if self.edges.shape != (n_features, n_bins - 1):
            raise ValueError("drift reference: edges and expected shares do not match")
        self.window = window
        self.n_bins = n_bins
        self.offsets = (torch.arange(n_features) * n_bins).unsqueeze(0)  # [1, features]
        self.bins = torch.zeros(window, n_features, dtype=torch.long)
        self.classes = torch.zeros(window, dtype=torch.long)
        self.counts = torch.zeros(n_features * n_bins)
        self.class_counts = torch.zeros(len(self.class_expected))
        self.pos = 0
        self.rows = 0

    def update(self, x: torch.Tensor, classes: torch.Tensor) -> None:
        """Add a batch: ``x`` is ``[rows, features]`` (normalized), ``classes`` is ``[rows]``.

        ``classes`` is ignored when the reference has no class shares (a model that is not a classifier).
        """
        if len(x) == 0:
            return
        x, classes = x[-self.window :], classes[-self.window :]
        n = len(x)
        bins = torch.searchsorted(self.edges, x.T.contiguous()).T + self.offsets  # [n, features]
        slots = (self.pos + torch.arange(n)) % self.window
        if self.rows + n > self.window:  # evict the rows being overwritten
            full = min(self.rows, self.window)
            old = slots[(slots < full)] if full < self.window else slots
            self.counts.index_add_(0, self.bins[old].flatten(), torch.full((old.numel() * bins.shape[1],), -1.0))
            if self.has_classes:
                self.class_counts.index_add_(0, self.classes[old], torch.full((old.numel(),), -1.0))
        self.bins[slots] = bins
        self.counts.index_add_(0, bins.flatten(), torch.ones(bins.numel()))
        if self.has_classes:
            self.classes[slots] = classes
            self.class_counts.index_add_(0, classes, torch.ones(n))
        self.pos = int((self.pos + n) % self.window)
        self.rows = min(self.rows + n, self.window)

    def scores(self) -> DriftScores:
        """PSI per feature and for predictions over the rows in the window."""
        if self.rows == 0:
            return DriftScores([0.0] * len(self.expected), 0.0, 0)
        shares = self.counts.view(len(self.expected), self.n_bins) / self.rows
        return DriftScores(
            features=psi(shares, self.expected).tolist(),
            prediction=(float(psi(self.class_counts / self.rows, self.class_expected)) if self.has_classes else 0.0),
            rows=self.rows,
        )
