"""Deterministic training of the demo classifier, packaged through ``rtserve.model.package.export``.

``python -m rtserve model train --version 1.0 --out artifacts/1.0`` trains, prints each epoch and the
held-out accuracy, and writes ``model.pt2`` and ``meta.json`` like any user's model (the
normalization is the exported module's first layer).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from rtserve.model.data import FEATURE_NAMES, LABELS, make_dataset
from rtserve.model.package import Standardize, export

logger = logging.getLogger(__name__)


class RealTimeClassifier(nn.Module):
    """The demo's classifier on raw features: Standardize -> Linear -> ReLU -> Linear."""

    model_name = "realtime-classifier"

    def __init__(self, norm: Standardize, hidden: int = 64, n_classes: int = 3) -> None:
        super().__init__()
        self.norm = norm
        self.net = nn.Sequential(
            nn.Linear(len(norm.mean), hidden),
            nn.ReLU(),
            nn.Linear(hidden, n_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, n_classes]`` for raw features ``[batch, n_features]``."""
        return self.net(self.norm(x))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows of ``x`` (raw features) classified as ``y``."""
    with torch.inference_mode():
        return float((model(x).argmax(dim=1) == y).float().mean())


def train(
    version: str, epochs: int, hidden: int, seed: int = 0, lr: float = 1e-3, batch_size: int = 64
) -> RealTimeClassifier:
    """Train the demo model (returned in eval mode).

    Same arguments, same weights: single-threaded, seeded, deterministic ops.
    """
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = make_dataset(seed=seed)
    model = RealTimeClassifier(Standardize.fit(data.x_train), hidden, len(LABELS))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed + 1)
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(data.x_train), generator=g)
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(data.x_train[idx]), data.y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        model.eval()
        logger.info(
            "epoch %d/%d  loss %.4f  held-out accuracy %.4f",
            epoch,
            epochs,
            total / len(order),
            accuracy(model, data.x_test, data.y_test),
        )
    return model.eval()


def package(model: RealTimeClassifier, version: str, out: Path, seed: int = 0, model_config: Path | None = None):
    """Export the trained demo model with its training rows and held-out set."""
    data = make_dataset(seed=seed)
    return export(
        model,
        data.x_train,
        feature_names=FEATURE_NAMES,
        labels=LABELS,
        version=version,
        out_dir=out,
        holdout=(data.x_test, data.y_test),
        model_config=model_config,
    )


def train_and_package(
    version: str,
    out: Path,
    epochs: int = 1,
    hidden: int = 64,
    seed: int = 0,
    lr: float = 1e-3,
    model_config: Path | None = None,
) -> float:
    """Train the demo model, write its artifact directory; returns its held-out accuracy."""
    model = train(version, epochs, hidden, seed, lr)
    data = make_dataset(seed=seed)
    held_out = accuracy(model, data.x_test, data.y_test)
    package(model, version, out, seed, model_config)
    logger.info("model %s: hidden=%d epochs=%d held-out accuracy %.4f -> %s", version, hidden, epochs, held_out, out)
    return held_out
