"""How two versions' answers of each output kind compare: one table for the gate and the live evidence.

Per kind (``handler.signature.KINDS``), what an answer carries (:func:`answer_value`), when two answers
agree and how far apart they are (:class:`Compare`), and the metric on labelled rows:

============== ============================= ================================================ ==================
kind           value compared                agreement of a pair                              labelled metric
============== ============================= ================================================ ==================
classification the class label               1 when the labels are equal                      accuracy
regression     the values (one per target)   1 when each is within ``agreement_tolerance``    mean absolute error
                                             target standard deviations of the default's
multi_label    the labels on                 the share of label decisions equal (Hamming)     macro F1
embedding      the vector                    1 when the cosine similarity is ``min_cosine``+  none
============== ============================= ================================================ ==================

A regression's tolerance and error are in units of the target's spread (:func:`regression_scale`), so one
``config/gate.yaml`` serves a target in dollars and one in probabilities alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from handler.signature import (
    CLASSIFICATION,
    EMBEDDING,
    MULTI_LABEL,
    REGRESSION,
    first_answer,
    golden_values,
    output_values,
)


@dataclass(frozen=True)
class KindThresholds:
    """The per-kind thresholds of ``config/gate.yaml``.

    Its optional ``regression:``, ``multi_label:`` and ``embedding:`` sections; a missing key takes
    the default here.

    Attributes:
        max_mae_increase: a regression candidate's mean absolute error on the labelled rows may
            exceed the default's by at most this many target standard deviations.
        agreement_tolerance: two regression answers agree when every value is within this many
            target standard deviations of the other's.
        max_f1_drop: a multi-label candidate's macro F1 on the labelled rows may be at most this
            much below the default's.
        min_cosine: two embeddings agree when their cosine similarity is at least this.
    """

    max_mae_increase: float = 0.05
    agreement_tolerance: float = 0.25
    max_f1_drop: float = 0.02
    min_cosine: float = 0.95


#: ``config/gate.yaml``'s per-kind sections: section -> key -> (what it accepts, the check).
KIND_KEYS = {
    REGRESSION: {
        "max_mae_increase": ("a finite number of at least 0", lambda v: math.isfinite(v) and v >= 0),
        "agreement_tolerance": ("a finite number of at least 0", lambda v: math.isfinite(v) and v >= 0),
    },
    MULTI_LABEL: {"max_f1_drop": ("a number in [0, 1]", lambda v: 0 <= v <= 1)},
    EMBEDDING: {"min_cosine": ("a number in [-1, 1]", lambda v: -1 <= v <= 1)},
}


def answer_value(kind: str, answer: dict) -> Any:
    """The value an answer of ``kind`` is compared by (the answer body as the handler sends it).

    The class label (a string), the regression's values and the embedding (tuples of floats, through
    :func:`handler.signature.output_values`), the multi-label's labels on (a frozenset of strings).
    A model with several outputs is compared by its first (:func:`handler.signature.first_answer`).

    Raises:
        KeyError, TypeError, ValueError: ``answer`` is not an answer of that kind.
    """
    answer = first_answer(answer)
    if kind == CLASSIFICATION:
        label = answer["label"]
        if not isinstance(label, str):
            raise TypeError(f"label must be a string, got {type(label).__name__}")
        return label
    if kind == MULTI_LABEL:
        labels = answer["labels"]
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise TypeError("labels must be a list of strings")
        return frozenset(labels)
    values = output_values({"kind": kind}, answer)
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise TypeError(f"a {kind} answer carries numbers")
    return tuple(float(v) for v in values)


def regression_scale(golden: dict) -> tuple[float, ...]:
    """Per target, the spread that a regression's tolerance and error are measured in.

    The standard deviation of the golden set's targets (``labels``, kept from the holdout), else of
    the model's own golden outputs; a constant column counts its absolute mean, else 1.
    """
    labels = golden.get("labels")
    rows = [v if isinstance(v, list) else [v] for v in (labels if labels is not None else golden_values(golden))]
    scale = []
    for column in zip(*rows):
        mean = sum(column) / len(column)
        std = math.sqrt(sum((v - mean) ** 2 for v in column) / len(column))
        scale.append(std if std > 0 else (abs(mean) or 1.0))
    return tuple(scale)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The cosine similarity of two vectors (1 for two zero vectors, 0 for one; -1 for other lengths)."""
    if len(a) != len(b):
        return -1.0
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norm == 0:
        return 1.0 if not any(a) and not any(b) else 0.0
    return max(-1.0, min(1.0, sum(x * y for x, y in zip(a, b)) / norm))


@dataclass(frozen=True)
class Compare:
    """How two versions' answers of one output kind compare (the default classification).

    Attributes:
        kind: the output kind.
        labels: a multi-label output's labels (a pair's Hamming agreement is over them).
        scale: a regression's target spread per column (:func:`regression_scale`).
        thresholds: the per-kind thresholds.
    """

    kind: str = CLASSIFICATION
    labels: tuple[str, ...] = ()
    scale: tuple[float, ...] = ()
    thresholds: KindThresholds = field(default_factory=KindThresholds)

    @classmethod
    def of(cls, output: dict | None, golden: dict, thresholds: KindThresholds | None = None) -> Compare:
        """The comparison for an archive's output signature (None: ``rtserve-model/1``, a classifier).

        ``golden`` (the archive's golden set) gives a regression's scale.
        """
        kind = output["kind"] if output else CLASSIFICATION
        return cls(
            kind,
            tuple(output.get("labels") or ()) if kind == MULTI_LABEL else (),
            regression_scale(golden) if kind == REGRESSION else (),
            thresholds or KindThresholds(),
        )

    def value(self, answer: dict) -> Any:
        """:func:`answer_value` of this kind."""
        return answer_value(self.kind, answer)

    def truth(self, label: Any) -> Any:
        """A golden label (:meth:`rtserve.promotion.gate.ArchiveMeta.golden_labels`) as a value of this kind."""
        if self.kind == REGRESSION:
            return tuple(label) if isinstance(label, list | tuple) else (float(label),)
        return label

    def tolerance(self) -> tuple[float, ...]:
        """A regression's tolerance per column, in target units."""
        return tuple(self.thresholds.agreement_tolerance * s for s in self.scale)

    def _scale(self, n: int) -> Sequence[float]:
        return self.scale if len(self.scale) == n else (1.0,) * n

    def agreement(self, default: Any, candidate: Any) -> float:
        """How much two answers' values agree, in [0, 1] (the share of label decisions for multi-label)."""
        if self.kind == REGRESSION:
            if len(default) != len(candidate):
                return 0.0
            tol = self.thresholds.agreement_tolerance
            scale = self._scale(len(default))
            return float(all(abs(a - b) <= tol * s for a, b, s in zip(default, candidate, scale)))
        if self.kind == MULTI_LABEL:
            n = len(self.labels) or max(len(default | candidate), 1)
            return 1.0 - len(default ^ candidate) / n
        if self.kind == EMBEDDING:
            return float(cosine(default, candidate) >= self.thresholds.min_cosine)
        return float(default == candidate)

    def distance(self, default: Any, candidate: Any) -> float:
        """How far apart two answers are, to rank disagreements (larger: further).

        The largest absolute difference in target standard deviations (regression), the number of
        labels decided differently (multi-label), one minus the cosine similarity (embedding), 1
        for two classes (a classifier's disagreements are ranked by probability gaps instead).
        """
        if self.kind == REGRESSION:
            if len(default) != len(candidate):
                return math.inf
            scale = self._scale(len(default))
            return max(abs(a - b) / s for a, b, s in zip(default, candidate, scale))
        if self.kind == MULTI_LABEL:
            return float(len(default ^ candidate))
        if self.kind == EMBEDDING:
            return 1.0 - cosine(default, candidate)
        return float(default != candidate)

    def agreeing(self) -> str:
        """What agreeing is, as the object of "the candidate gave ... on 0.95 of the rows"."""
        if self.kind == REGRESSION:
            return f"the default's value to within {self.thresholds.agreement_tolerance:g} target standard deviations"
        if self.kind == MULTI_LABEL:
            return "the default's decision per label"
        if self.kind == EMBEDDING:
            return f"a vector at cosine {self.thresholds.min_cosine:g} or more to the default's"
        return "the default's class"

    def show(self, value: Any) -> Any:
        """A value as a report shows it (JSON): a label, a number or list of numbers, sorted labels.

        An embedding is not shown (None): its cosine is.
        """
        if self.kind == REGRESSION:
            return round(value[0], 6) if len(value) == 1 else [round(v, 6) for v in value]
        if self.kind == MULTI_LABEL:
            return sorted(value)
        if self.kind == EMBEDDING:
            return None
        return value


# -- metrics on labelled rows --------------------------------------------------------------------------
def accuracy(predicted: Sequence[str], truths: Sequence[str]) -> float | None:
    """The share of labels equal to the truth (None without rows)."""
    return sum(p == y for p, y in zip(predicted, truths)) / len(truths) if truths else None


def mean_absolute_error(
    predicted: Sequence[Sequence[float]], truths: Sequence[Sequence[float]], scale: Sequence[float]
) -> tuple[float | None, list[float]]:
    """The mean absolute error in target standard deviations (over rows and targets), and per target in its units.

    (None, []) without rows.
    """
    if not truths:
        return None, []
    width = len(truths[0])
    scale = scale if len(scale) == width else (1.0,) * width
    per = [sum(abs(p[j] - y[j]) for p, y in zip(predicted, truths)) / len(truths) for j in range(width)]
    return sum(e / s for e, s in zip(per, scale)) / width, per


def f1_per_label(
    predicted: Sequence[frozenset], truths: Sequence[frozenset], labels: Sequence[str]
) -> tuple[float | None, dict[str, float]]:
    """The macro F1 over ``labels`` and each label's F1 (None, {} without rows).

    A label neither true nor predicted on any row has F1 1 (nothing to find, nothing wrongly found).
    """
    if not truths:
        return None, {}
    per = {}
    for label in labels:
        tp = sum(label in p and label in y for p, y in zip(predicted, truths))
        fp = sum(label in p and label not in y for p, y in zip(predicted, truths))
        fn = sum(label not in p and label in y for p, y in zip(predicted, truths))
        per[label] = 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
    return (sum(per.values()) / len(per) if per else None), per
