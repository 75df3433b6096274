"""Input and prediction drift against the training distribution (no TorchServe import).

Training stores per-feature decile edges and bin shares, and a reference for the model's predictions
(:func:`fit_prediction`: class shares of a classifier; per kind for the others). Named inputs add what
their kind is watched by (:func:`input_views`): an image's mean intensity per channel and a sequence's
length, in deciles like a feature, and an id sequence's token shares. :class:`DriftMonitor` keeps
a sliding window's bin counts in a ring buffer and scores them with the population stability index
``sum((a - e) * ln(a / e))``: < 0.1 stable, 0.1-0.2 moderate shift, > 0.2 significant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from handler.errors import ConfigError
from handler.signature import CLASSIFICATION, EMBEDDING, MULTI_LABEL

#: Share floor for empty bins, so PSI stays finite.
EPSILON = 1e-4


def input_views(specs: Sequence[Any]) -> tuple[list[dict], dict | None]:
    """What named inputs are watched by beyond their numbers: derived columns, and token shares.

    Returns ``(derived, tokens)``: one ``{"name", "op", "start", "stop", ...}`` per derived column
    (``mean``: an image channel's mean intensity, ``image.intensity[c]``; ``length``: a sequence's
    positions up to its last one that is not all padding, ``chars.length``), and for an int64 sequence
    ``{"name": "chars.tokens", "start", "stop", "padding", "vocabulary"}`` (None otherwise).

    Args:
        specs: the model's :class:`handler.inputs.InputSpec`, in row order.
    """
    derived, tokens, start = [], None, 0
    for spec in specs:
        if spec.image is not None:
            plane = spec.shape[1] * spec.shape[2]
            for c in range(spec.shape[0]):
                first = start + c * plane
                derived.append(
                    {"name": f"{spec.name}.intensity[{c}]", "op": "mean", "start": first, "stop": first + plane}
                )
        if spec.sequence:
            derived.append(
                {
                    "name": f"{spec.name}.length",
                    "op": "length",
                    "start": start,
                    "stop": start + spec.width,
                    "inner": spec.inner,
                    "padding": spec.padding,
                }
            )
            if spec.dtype == "int64" and spec.inner == 1:
                tokens = {
                    "name": f"{spec.name}.tokens",
                    "start": start,
                    "stop": start + spec.width,
                    "padding": spec.padding,
                    "vocabulary": spec.vocabulary,
                }
        start += spec.width
    return derived, tokens


def derived_columns(x: torch.Tensor, derived: Sequence[dict]) -> torch.Tensor:
    """``x`` ``[rows, features]`` with one column appended per entry of ``derived`` (:func:`input_views`)."""
    if not derived:
        return x
    columns = [x]
    for view in derived:
        part = x[:, view["start"] : view["stop"]]
        if view["op"] == "mean":
            columns.append(part.mean(dim=1, keepdim=True))
        else:
            used = (part != view["padding"]).unflatten(1, (-1, view["inner"])).any(dim=2)
            positions = torch.arange(1, used.shape[1] + 1, dtype=x.dtype)
            columns.append((used * positions).amax(dim=1, keepdim=True))
    return torch.cat(columns, dim=1)


def token_counts(x: torch.Tensor, tokens: dict) -> torch.Tensor:
    """``[rows, vocabulary]``: how often each id appears in each row's sequence, padding left out."""
    ids = x[:, tokens["start"] : tokens["stop"]].long()
    counts = torch.zeros(len(x), tokens["vocabulary"]).scatter_add_(1, ids, torch.ones(ids.shape))
    counts[:, int(tokens["padding"])] = 0
    return counts


def drift_names(reference: dict) -> list[str]:
    """The names of the scores :class:`DriftMonitor` gives after the features': derived columns, token shares."""
    names = [view["name"] for view in reference.get("derived", [])]
    return names + ([reference["tokens"]["name"]] if reference.get("tokens") else [])


def fit_reference(
    x: torch.Tensor,
    classes: torch.Tensor | None,
    n_classes: int,
    bins: int = 10,
    *,
    output: dict | None = None,
    values: torch.Tensor | None = None,
    specs: Sequence[Any] = (),
) -> dict:
    """The training reference for ``meta.json``: decile edges and shares per feature, and the predictions'.

    Args:
        x: ``[rows, features]`` inputs as the model takes them (raw units).
        classes: ``[rows]`` predicted class per row of a classifier (its ``class_expected``); None
            for other kinds.
        n_classes: number of classes.
        bins: bins per feature (quantile bins, so each holds about ``1/bins`` of training rows).
        output: the output's signature, for a model that is not a classifier: with ``values``, its
            ``prediction`` reference (:func:`fit_prediction`).
        values: ``[rows, width]``: what the answers carry for ``x`` (sigmoid probabilities,
            regression values, embeddings).
        specs: named inputs (:func:`input_views`): their derived columns are binned like features
            (``derived``), an id sequence's token shares kept (``tokens``).
    """
    derived, tokens = input_views(specs)
    x = derived_columns(x, derived)
    qs = torch.linspace(0, 1, bins + 1)[1:-1]
    edges = torch.quantile(x.T.contiguous(), qs, dim=1).T.contiguous()  # [features, bins-1]
    idx = torch.searchsorted(edges, x.T.contiguous())  # [features, rows]
    counts = torch.zeros(x.shape[1], bins).scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float))
    reference = {"edges": edges.tolist(), "expected": (counts / len(x)).tolist()}
    if derived:
        reference["derived"] = derived
    if tokens is not None:
        total = token_counts(x, tokens).sum(dim=0)
        reference["tokens"] = {**tokens, "expected": (total / total.sum().clamp_min(1)).tolist()}
    if classes is not None:
        class_counts = torch.bincount(classes, minlength=n_classes).float()
        reference["class_expected"] = (class_counts / len(classes)).tolist()
    if output is not None and values is not None and output["kind"] != CLASSIFICATION:
        reference["prediction"] = fit_prediction(output, values, bins)
    return reference


def fit_prediction(output: dict, values: torch.Tensor, bins: int = 10) -> dict:
    """The reference of a non-classifier's predictions: what is binned per row, with edges and training shares.

    - regression: each target's value in deciles (one column per target);
    - multi-label: each label's sigmoid probability in two bins split at the threshold, so a bin's
      share is the label's positive share (``p >= threshold``, as the answer's ``labels``);
    - embedding: the distance of the embedding to the training mean embedding (``center``), in
      deciles. One number per row that any movement of the embeddings away from where training put
      them raises, whatever its direction (the cosine to the mean misses moves orthogonal to it, the
      norm misses rotations), for a subtraction and a norm per row.

    Args:
        output: the output's signature (``kind``, ``threshold`` of a multi-label output).
        values: ``[rows, width]`` answers on the training rows.
        bins: deciles by default (multi-label: always 2).
    """
    kind = output["kind"]
    center = values.mean(dim=0) if kind == EMBEDDING else None
    columns = prediction_columns(values, center)
    if kind == MULTI_LABEL:
        edges = torch.full((columns.shape[1], 1), float(output["threshold"]))
    else:
        qs = torch.linspace(0, 1, bins + 1)[1:-1]
        edges = torch.quantile(columns.T.contiguous(), qs, dim=1).T.contiguous()  # [columns, bins-1]
    idx = output_bins(edges, columns)  # [rows, columns]
    counts = torch.zeros(columns.shape[1], edges.shape[1] + 1).scatter_add_(
        1, idx.T.contiguous(), torch.ones(idx.shape[1], idx.shape[0])
    )
    reference = {"kind": kind, "edges": edges.tolist(), "expected": (counts / len(columns)).tolist()}
    if center is not None:
        reference["center"] = center.tolist()
    return reference


def prediction_columns(values: torch.Tensor, center: torch.Tensor | None) -> torch.Tensor:
    """``[rows, columns]``: what is binned of each answer row (``values``, or its distance to ``center``)."""
    if center is None:
        return values
    return torch.linalg.vector_norm(values - center, dim=1, keepdim=True)


def output_bins(edges: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``[rows, columns]`` bin of each value: how many of its column's ``edges`` are at or below it."""
    return torch.searchsorted(edges, columns.T.contiguous(), right=True).T


def psi(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """PSI of each row of ``actual`` shares against ``expected`` shares (same shape)."""
    a = actual.clamp_min(EPSILON)
    e = expected.clamp_min(EPSILON)
    return ((a - e) * torch.log(a / e)).sum(dim=-1)


@dataclass
class DriftScores:
    """Current drift scores over the window.

    Attributes:
        features: PSI per input feature, then per derived column and of the token shares
            (:func:`drift_names`).
        prediction: PSI of the predictions: of the class mix (classifier), else the mean of
            :attr:`outputs`; None when the reference has nothing to score them against.
        rows: rows in the window.
        outputs: PSI per output column of a model that is not a classifier (per target, per
            label; one for an embedding); empty otherwise.
    """

    features: list[float]
    prediction: float | None
    rows: int
    outputs: list[float] = field(default_factory=list)


class DriftMonitor:
    """Sliding-window PSI per feature and of the predictions (see :func:`fit_prediction`)."""

    def __init__(self, reference: dict, window: int = 2000) -> None:
        self.derived = reference.get("derived", [])
        self.tokens = reference.get("tokens")
        if self.tokens is not None:
            self.tokens_expected = torch.tensor(self.tokens["expected"], dtype=torch.float32)
            self.token_counts = torch.zeros(len(self.tokens_expected))
            self.token_rows = torch.zeros(window, len(self.tokens_expected))
        self.edges = torch.tensor(reference["edges"], dtype=torch.float32)
        self.expected = torch.tensor(reference["expected"], dtype=torch.float32)
        # class shares of a classifier; another kind's reference is its "prediction"
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
        prediction = reference.get("prediction")
        #: The kind whose predictions are scored per output column; None: a classifier, or no reference.
        self.output_kind = prediction["kind"] if prediction and not self.has_classes else None
        if self.output_kind is not None:
            self.out_edges = torch.tensor(prediction["edges"], dtype=torch.float32)
            self.out_expected = torch.tensor(prediction["expected"], dtype=torch.float32)
            center = prediction.get("center")
            self.center = None if center is None else torch.tensor(center, dtype=torch.float32)
            n_columns, self.out_n_bins = self.out_expected.shape
            self.out_offsets = (torch.arange(n_columns) * self.out_n_bins).unsqueeze(0)
            self.out_bins = torch.zeros(window, n_columns, dtype=torch.long)
            self.out_counts = torch.zeros(n_columns * self.out_n_bins)
        self.pos = 0
        self.rows = 0

    def update(self, x: torch.Tensor, predictions: torch.Tensor) -> None:
        """Add a batch: ``x`` is ``[rows, features]`` (raw), ``predictions`` the rows' predictions.

        A classifier's are ``[rows]`` class indices; another kind's ``[rows, width]`` answer values
        (sigmoid probabilities, regression values, embeddings). Ignored when the reference has
        nothing to score them against.
        """
        if len(x) == 0:
            return
        x, predictions = x[-self.window :], predictions[-self.window :]
        tokens = token_counts(x, self.tokens) if self.tokens is not None else None
        x = derived_columns(x, self.derived)
        n = len(x)
        bins = torch.searchsorted(self.edges, x.T.contiguous()).T + self.offsets  # [n, features]
        out = None
        if self.output_kind is not None:
            out = output_bins(self.out_edges, prediction_columns(predictions, self.center)) + self.out_offsets
        slots = (self.pos + torch.arange(n)) % self.window
        if self.rows + n > self.window:  # evict the rows being overwritten
            full = min(self.rows, self.window)
            old = slots[(slots < full)] if full < self.window else slots
            self.counts.index_add_(0, self.bins[old].flatten(), torch.full((old.numel() * bins.shape[1],), -1.0))
            if self.has_classes:
                self.class_counts.index_add_(0, self.classes[old], torch.full((old.numel(),), -1.0))
            if out is not None:
                evicted = self.out_bins[old].flatten()
                self.out_counts.index_add_(0, evicted, torch.full((evicted.numel(),), -1.0))
            if tokens is not None:
                self.token_counts -= self.token_rows[old].sum(dim=0)
        if tokens is not None:
            self.token_rows[slots] = tokens
            self.token_counts += tokens.sum(dim=0)
        self.bins[slots] = bins
        self.counts.index_add_(0, bins.flatten(), torch.ones(bins.numel()))
        if self.has_classes:
            self.classes[slots] = predictions
            self.class_counts.index_add_(0, predictions, torch.ones(n))
        if out is not None:
            self.out_bins[slots] = out
            self.out_counts.index_add_(0, out.flatten(), torch.ones(out.numel()))
        self.pos = int((self.pos + n) % self.window)
        self.rows = min(self.rows + n, self.window)

    def scores(self) -> DriftScores:
        """PSI per feature and of the predictions over the rows in the window."""
        scored = self.has_classes or self.output_kind is not None
        if self.rows == 0:
            return DriftScores([0.0] * (len(self.expected) + (self.tokens is not None)), 0.0 if scored else None, 0)
        shares = self.counts.view(len(self.expected), self.n_bins) / self.rows
        features = psi(shares, self.expected).tolist()
        if self.tokens is not None:
            token_shares = self.token_counts / self.token_counts.sum().clamp_min(1)
            features.append(float(psi(token_shares, self.tokens_expected)))
        if self.has_classes:
            return DriftScores(features, float(psi(self.class_counts / self.rows, self.class_expected)), self.rows)
        if self.output_kind is None:
            return DriftScores(features, None, self.rows)
        per_column = psi(self.out_counts.view(len(self.out_expected), self.out_n_bins) / self.rows, self.out_expected)
        return DriftScores(features, float(per_column.mean()), self.rows, per_column.tolist())


def check_reference(reference: Any, n_features: int, output: dict) -> None:
    """Check ``meta.json``'s ``drift_reference`` against the model's features and output signature.

    Empty: drift is not scored. Without ``class_expected`` (classifier) or ``prediction`` (other kinds,
    :func:`fit_prediction`), as in archives exported before it: the predictions' drift is not scored.

    Raises:
        ConfigError: naming the field at fault.
    """
    where = "meta.json: drift_reference"
    if not isinstance(reference, dict):
        raise ConfigError(f"{where} must be an object")
    if not reference:
        return
    derived, tokens = reference.get("derived", []), reference.get("tokens")
    if not isinstance(derived, list) or not all(
        isinstance(v, dict)
        and v.get("op") in ("mean", "length")
        and isinstance(v.get("name"), str)
        and isinstance(v.get("start"), int)
        and isinstance(v.get("stop"), int)
        and 0 <= v["start"] < v["stop"] <= n_features
        for v in derived
    ):
        raise ConfigError(f"{where}.derived must be a list of views (name, op mean or length, columns in the row)")
    if tokens is not None and (
        not isinstance(tokens, dict)
        or not isinstance(tokens.get("vocabulary"), int)
        or not _numbers(tokens.get("expected"), tokens["vocabulary"])
        or not 0 <= tokens.get("start", -1) < tokens.get("stop", -1) <= n_features
    ):
        raise ConfigError(f"{where}.tokens must hold one share per id of the vocabulary and the sequence's columns")
    _check_bins(reference, where, n_features + len(derived), "feature")
    kind, width = output["kind"], output["width"]
    if "class_expected" in reference and (kind != CLASSIFICATION or not _numbers(reference["class_expected"], width)):
        raise ConfigError(f"{where}.class_expected must hold one share per class ({width}), for a classifier only")
    prediction = reference.get("prediction")
    if prediction is None:
        return
    where += ".prediction"
    if kind == CLASSIFICATION or not isinstance(prediction, dict):
        raise ConfigError(
            f"{where} must be an object, for an output that is not a classification (a classifier's is class_expected)"
        )
    if prediction.get("kind") != kind:
        raise ConfigError(f"{where}.kind must be {kind!r} (the output's kind), got {prediction.get('kind')!r}")
    if kind == EMBEDDING:
        if not _numbers(prediction.get("center"), width):
            raise ConfigError(f"{where}.center must hold {width} finite numbers (the training mean embedding)")
        _check_bins(prediction, where, 1, "distance to the center")
    elif kind == MULTI_LABEL:
        _check_bins(prediction, where, width, "label", bins=2)
    else:
        _check_bins(prediction, where, width, "target")


def _check_bins(reference: dict, where: str, rows: int, what: str, bins: int | None = None) -> None:
    """``reference``'s ``edges`` (``rows`` sorted lists) and ``expected`` shares (one more per row than edges)."""
    edges, expected = reference.get("edges"), reference.get("expected")
    n = len(edges[0]) if isinstance(edges, list) and edges and isinstance(edges[0], list) else 0
    if (
        not isinstance(edges, list)
        or len(edges) != rows
        or n < 1
        or (bins is not None and n != bins - 1)
        or not all(_numbers(e, n) and e == sorted(e) for e in edges)
    ):
        size = f"{bins - 1}" if bins is not None else "equally many"
        raise ConfigError(f"{where}.edges must hold {rows} lists (one per {what}) of {size} sorted finite numbers")
    if (
        not isinstance(expected, list)
        or len(expected) != rows
        or not all(_numbers(e, n + 1) and all(0 <= v <= 1 for v in e) for e in expected)
    ):
        raise ConfigError(f"{where}.expected must hold {rows} lists (one per {what}) of {n + 1} shares in [0, 1]")


def _numbers(values: Any, n: int) -> bool:
    """Whether ``values`` is a list of ``n`` finite numbers."""
    return (
        isinstance(values, list)
        and len(values) == n
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    )
