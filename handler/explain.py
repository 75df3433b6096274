"""Per-feature explanations with Captum's Integrated Gradients (pure: no TorchServe import).

It explains one scalar of the model's answer along the straight path from a baseline to the raw input: a
classifier's class's softmax probability, a multi-label model's label's sigmoid probability, a regression's
target value. Each attribution is a feature's share of ``f(input) - f(baseline)``, up to
``convergence_delta``. Raw-space and standardized-space attributions are equal (IG is invariant to a
per-feature affine map). An embedding has no single scalar to attribute: :func:`unsupported`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from handler.errors import ExplanationUnsupported
from handler.signature import CLASSIFICATION, EMBEDDING, MULTI_LABEL, REGRESSION

#: Name of the attribution method, echoed in every explanation.
METHOD = "integrated_gradients"
#: The kinds explained, and what of the model's raw output ``[N, width]`` is explained per column.
EXPLAINED = {
    CLASSIFICATION: lambda raw: torch.softmax(raw, dim=1),
    MULTI_LABEL: torch.sigmoid,
    REGRESSION: lambda raw: raw,
}


@dataclass(frozen=True)
class Explanation:
    """One request's explanation (plain Python numbers, ready for JSON)."""

    target: int
    attributions: list[float]
    target_value: float
    baseline_value: float
    convergence_delta: float


class Explainer:
    """Integrated Gradients over one column of the model's answer (:data:`EXPLAINED`), built once per worker.

    Args:
        model: takes raw ``[batch, n_features]`` inputs, returns the raw output (logits, values).
        mean: training mean per feature (raw units).
        feature_names: one name per feature, the keys of the attributions.
        labels: the output columns' names, indexed by column (classes, labels or regression
            targets: :func:`handler.signature.target_names`).
        baseline: ``"mean"`` (the training mean: all zeros after normalization) or ``"zero"``
            (all raw features 0).
        n_steps: integration steps per explanation.
        internal_batch_size: most interpolated rows per forward/backward pass.
        device: where ``model`` runs; inputs are copied there, results come back as Python
            numbers.
        kind: the output's kind, a key of :data:`EXPLAINED`: a document names the explained
            value ``target_probability`` (classification, multi-label) or ``target_value``
            (regression), its baseline's likewise.
    """

    def __init__(
        self,
        model: Callable[[torch.Tensor], torch.Tensor],
        mean: Sequence[float],
        feature_names: Sequence[str],
        labels: Sequence[str],
        baseline: str = "mean",
        n_steps: int = 50,
        internal_batch_size: int = 512,
        device: torch.device | str = "cpu",
        kind: str = CLASSIFICATION,
    ) -> None:
        # Imported here, at worker initialize: captum.attr takes ~0.4 s and pulls in matplotlib.
        from captum.attr import IntegratedGradients

        if baseline not in ("mean", "zero"):
            raise ValueError(f"unknown baseline {baseline!r}")
        if kind not in EXPLAINED:
            raise unsupported(kind)
        self.model = model
        self._activation = EXPLAINED[kind]
        self._value_key = "value" if kind == REGRESSION else "probability"
        self.feature_names = list(feature_names)
        self.labels = list(labels)
        self.baseline_kind = baseline
        self.n_steps = n_steps
        self.internal_batch_size = internal_batch_size
        self.device = torch.device(device)
        mean_t = torch.tensor(mean, dtype=torch.float32)
        raw = mean_t if baseline == "mean" else torch.zeros_like(mean_t)
        self.baseline_raw: list[float] = raw.tolist()
        #: The baseline, shape ``[1, n_features]`` (raw units), on the model's device.
        self.baseline = raw.unsqueeze(0).to(self.device)
        with torch.inference_mode():
            self._baseline_values = self.explained(self.baseline)[0].tolist()
        self._ig = IntegratedGradients(self.explained)

    def explained(self, z: torch.Tensor) -> torch.Tensor:
        """The explained function for raw inputs ``z``: the answer's values, one column per target."""
        return self._activation(self.model(z))

    def explain(self, inputs: torch.Tensor, targets: Sequence[int]) -> list[Explanation]:
        """Explain each row of ``inputs`` (raw, ``[k, n_features]``) for its own target.

        All rows go through one Captum call: ``k * n_steps`` interpolated rows, in chunks of
        at most ``internal_batch_size``.
        """
        # never an inference-mode tensor (IG needs autograd), and on the model's device
        inputs = inputs.detach().to(self.device, copy=True)
        with torch.enable_grad():
            attributions, delta = self._ig.attribute(
                inputs,
                baselines=self.baseline,
                target=list(targets),
                n_steps=self.n_steps,
                internal_batch_size=max(self.internal_batch_size, len(inputs)),
                return_convergence_delta=True,
            )
        with torch.inference_mode():
            values = self.explained(inputs).cpu()
        attributions, delta = attributions.cpu(), delta.cpu()
        out = []
        for row, target in enumerate(targets):
            out.append(
                Explanation(
                    target=int(target),
                    attributions=attributions[row].tolist(),
                    target_value=float(values[row, target]),
                    baseline_value=float(self._baseline_values[target]),
                    convergence_delta=float(delta[row]),
                )
            )
        return out

    def document(self, explanation: Explanation) -> dict:
        """The JSON document of one explanation: the target named, attributions and baseline keyed by feature."""
        names, key = self.feature_names, self._value_key
        return {
            "target": explanation.target,
            "label": self.labels[explanation.target],
            "attributions": dict(zip(names, explanation.attributions)),
            "baseline": dict(zip(names, self.baseline_raw)),
            f"target_{key}": explanation.target_value,
            f"baseline_{key}": explanation.baseline_value,
            "convergence_delta": explanation.convergence_delta,
            "method": METHOD,
            "n_steps": self.n_steps,
        }


def unsupported_inputs(dtypes: dict[str, str]) -> ExplanationUnsupported:
    """The 501 an explain request gets from a model with id or boolean inputs (``{name: dtype}``).

    Integrated Gradients move every input along a straight line from the baseline; ids and
    booleans have no values in between, and attributions over an embedding layer's output are
    not offered yet.
    """
    discrete = ", ".join(f"{name!r} ({dtype})" for name, dtype in dtypes.items() if dtype != "float32")
    return ExplanationUnsupported(
        f"explanations are not available for this model: its input(s) {discrete} are not float32, and "
        "Integrated Gradients need inputs that vary continuously; ask /predictions instead"
    )


def unsupported(kind: str) -> ExplanationUnsupported:
    """The 501 an explain request gets from a model whose output kind has no explanation (an embedding).

    Integrated Gradients attribute one scalar output; an embedding's is a vector whose single numbers
    mean nothing alone.
    """
    if kind == EMBEDDING:
        why = "it has no single scalar output to attribute (an embedding's numbers mean something only together)"
    else:
        why = "Integrated Gradients here explain a class's or label's probability or a regression target's value"
    article = "an" if kind[:1] in "aeiou" else "a"
    return ExplanationUnsupported(
        f"explanations are not available for {article} {kind} model: {why}; ask /predictions instead"
    )


def unsupported_outputs(names: Sequence[str]) -> ExplanationUnsupported:
    """The 501 an explain request gets from a model with several outputs (``names``, in order).

    An explanation attributes one scalar of one output; naming the output in ``target`` is not
    offered yet.
    """
    listed = ", ".join(map(repr, names))
    return ExplanationUnsupported(
        f"explanations are not available for a model with several outputs ({listed}) yet: an explanation "
        "attributes one number of one output, and a target cannot name the output; ask /predictions instead"
    )
