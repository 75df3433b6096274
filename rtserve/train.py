"""Deterministic training of the default classifier.

``python -m rtserve.train --version 1.0 --out artifacts/1.0`` writes ``weights.pt`` (a
state_dict) and ``meta.json`` (labels, feature names, normalization statistics, accuracy)
and prints each epoch and the held-out accuracy.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from torch import nn

from handler.drift import fit_reference
from handler.model import ModelMetadata
from rtserve.data import FEATURE_NAMES, LABELS, make_dataset

logger = logging.getLogger(__name__)


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of rows of ``x`` (already normalized) classified as ``y``."""
    with torch.inference_mode():
        return float((model(x).argmax(dim=1) == y).float().mean())


def train(
    version: str, epochs: int, hidden: int, seed: int = 0, lr: float = 1e-3, batch_size: int = 64
) -> tuple[nn.Module, ModelMetadata]:
    """Train a model; same arguments, same weights (single-threaded, seeded, deterministic ops)."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    data = make_dataset(seed=seed)
    mean = data.x_train.mean(dim=0)
    std = data.x_train.std(dim=0)
    x_train = (data.x_train - mean) / std
    x_test = (data.x_test - mean) / std
    meta = ModelMetadata(
        feature_names=list(FEATURE_NAMES),
        labels=list(LABELS),
        mean=mean.tolist(),
        std=std.tolist(),
        hidden=hidden,
        version=version,
        training={"epochs": epochs, "hidden": hidden, "seed": seed, "lr": lr, "batch_size": batch_size},
    )
    model = meta.build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed + 1)
    for epoch in range(1, epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=g)
        total = 0.0
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model(x_train[idx]), data.y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
        model.eval()
        logger.info(
            "epoch %d/%d  loss %.4f  held-out accuracy %.4f",
            epoch, epochs, total / len(order), accuracy(model, x_test, data.y_test),
        )
    meta.accuracy = round(accuracy(model, x_test, data.y_test), 4)
    with torch.inference_mode():
        predicted = model(x_train).argmax(dim=1)
    meta.drift_reference = fit_reference(x_train, predicted, len(LABELS))
    return model, meta


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: train and write the artifacts."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", required=True, help="model version recorded in meta.json")
    parser.add_argument("--out", required=True, type=Path, help="output directory")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    model, meta = train(args.version, args.epochs, args.hidden, args.seed, args.lr)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "weights.pt")
    meta.save(args.out / "meta.json")
    logger.info("model %s: hidden=%d epochs=%d held-out accuracy %.4f -> %s",
                args.version, args.hidden, args.epochs, meta.accuracy, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
