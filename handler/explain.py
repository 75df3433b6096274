"""Per-feature explanations with Captum's Integrated Gradients (pure: no TorchServe import).

It explains one target class's softmax probability along the straight path from a baseline to the raw
input: each attribution is a feature's share of ``p(input) - p(baseline)``, up to ``convergence_delta``.
Raw-space and standardized-space attributions are equal (IG is invariant to a per-feature affine map).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from handler.errors import ExplanationUnsupported

#: Name of the attribution method, echoed in every explanation.
METHOD = "integrated_gradients"


@dataclass(frozen=True)
class Explanation:
    """One request's explanation (plain Python numbers, ready for JSON)."""

    target: int
    attributions: list[float]
    target_probability: float
    baseline_probability: float
    convergence_delta: float


class Explainer:
    """Integrated Gradients over ``softmax(model(z))``, built once per worker.

    Args:
        model: the classifier; takes raw ``[batch, n_features]`` inputs, returns logits.
        mean: training mean per feature (raw units).
        feature_names: one name per feature, the keys of the attributions.
        labels: class labels, indexed by class.
        baseline: ``"mean"`` (the training mean: all zeros after normalization) or ``"zero"``
            (all raw features 0).
        n_steps: integration steps per explanation.
        internal_batch_size: most interpolated rows per forward/backward pass.
        device: where ``model`` runs; inputs are copied there, results come back as Python
            numbers.
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
    ) -> None:
        # Imported here, at worker initialize: captum.attr takes ~0.4 s and pulls in matplotlib.
        from captum.attr import IntegratedGradients

        if baseline not in ("mean", "zero"):
            raise ValueError(f"unknown baseline {baseline!r}")
        self.model = model
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
            self._baseline_probabilities = self.probabilities(self.baseline)[0].tolist()
        self._ig = IntegratedGradients(self.probabilities)

    def probabilities(self, z: torch.Tensor) -> torch.Tensor:
        """The explained function: class probabilities for raw inputs ``z``."""
        return torch.softmax(self.model(z), dim=1)

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
            probs = self.probabilities(inputs).cpu()
        attributions, delta = attributions.cpu(), delta.cpu()
        out = []
        for row, target in enumerate(targets):
            out.append(
                Explanation(
                    target=int(target),
                    attributions=attributions[row].tolist(),
                    target_probability=float(probs[row, target]),
                    baseline_probability=float(self._baseline_probabilities[target]),
                    convergence_delta=float(delta[row]),
                )
            )
        return out

    def document(self, explanation: Explanation) -> dict:
        """The JSON document of one explanation: attributions and baseline keyed by feature."""
        names = self.feature_names
        return {
            "target": explanation.target,
            "label": self.labels[explanation.target],
            "attributions": dict(zip(names, explanation.attributions)),
            "baseline": dict(zip(names, self.baseline_raw)),
            "target_probability": explanation.target_probability,
            "baseline_probability": explanation.baseline_probability,
            "convergence_delta": explanation.convergence_delta,
            "method": METHOD,
            "n_steps": self.n_steps,
        }


def unsupported(kind: str) -> ExplanationUnsupported:
    """The 501 an explain request gets from a model whose output is not a classification.

    Integrated Gradients here explain one class's softmax probability; other kinds wait for issue 37.
    """
    return ExplanationUnsupported(
        f"explanations are not available for a {kind} model yet: this server explains "
        "classifiers only (Integrated Gradients over one class's probability); ask /predictions instead"
    )
