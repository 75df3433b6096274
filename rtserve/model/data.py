"""A synthetic, deterministic tabular data set for the default model.

A fixed random "teacher" network labels standard-normal latent vectors; the observed features
are those vectors scaled and shifted per feature (so normalization matters), and a few labels
are flipped (so accuracy has a ceiling below 100%). Same seed, same data, on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

N_FEATURES = 32
LABELS = ["low", "medium", "high"]
FEATURE_NAMES = [f"f{i:02d}" for i in range(N_FEATURES)]


@dataclass
class Dataset:
    """Train and held-out splits (features are raw, not normalized)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def make_dataset(n_train: int = 20_000, n_test: int = 5_000, seed: int = 0, label_noise: float = 0.03) -> Dataset:
    """Generate the data set; every draw comes from one seeded generator."""
    g = torch.Generator().manual_seed(seed)
    n = n_train + n_test
    w1 = torch.randn(N_FEATURES, 12, generator=g) / N_FEATURES**0.5
    w2 = torch.randn(12, len(LABELS), generator=g)
    z = torch.randn(n, N_FEATURES, generator=g)
    logits = torch.tanh(1.0 * z @ w1) @ w2
    logits = logits - logits.mean(dim=0)  # roughly balanced classes
    y = logits.argmax(dim=1)
    flip = torch.rand(n, generator=g) < label_noise
    y[flip] = torch.randint(0, len(LABELS), (int(flip.sum()),), generator=g)
    scale = torch.exp(torch.empty(N_FEATURES).uniform_(-1.0, 3.5, generator=g))
    offset = torch.empty(N_FEATURES).uniform_(-100.0, 100.0, generator=g)
    x = z * scale + offset
    return Dataset(x[:n_train], y[:n_train], x[n_train:], y[n_train:])
