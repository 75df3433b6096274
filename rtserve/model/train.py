"""Deterministic training of the demo classifier, packaged through ``rtserve.package.export``.

``python -m rtserve.train --version 1.0 --out artifacts/1.0`` trains, prints each epoch and the
held-out accuracy, and writes the artifact directory (``model.pt2`` + ``meta.json``) like any
user's model: the normalization is the first layer of the exported module.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from torch import nn

from rtserve.data import FEATURE_NAMES, LABELS, make_dataset
from rtserve.package import Standardize, export

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
    """Train the demo model (eval mode); same arguments, same weights (single-threaded,
    seeded, deterministic ops)."""
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
            idx = order[start:start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(data.x_train[idx]), data.y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        model.eval()
        logger.info("epoch %d/%d  loss %.4f  held-out accuracy %.4f", epoch, epochs,
                    total / len(order), accuracy(model, data.x_test, data.y_test))
    return model.eval()


def package(model: RealTimeClassifier, version: str, out: Path, seed: int = 0):
    """Export the trained demo model with its training rows and held-out set."""
    data = make_dataset(seed=seed)
    return export(model, data.x_train, feature_names=FEATURE_NAMES, labels=LABELS,
                  version=version, out_dir=out, holdout=(data.x_test, data.y_test))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: train and write the artifact directory."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", required=True, help="model version recorded in meta.json")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    model = train(args.version, args.epochs, args.hidden, args.seed, args.lr)
    data = make_dataset(seed=args.seed)
    held_out = accuracy(model, data.x_test, data.y_test)
    package(model, args.version, args.out, args.seed)
    logger.info("model %s: hidden=%d epochs=%d held-out accuracy %.4f -> %s",
                args.version, args.hidden, args.epochs, held_out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
