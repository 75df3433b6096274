"""A second model on real data, packaged with the same API as the demo.

The Wisconsin breast cancer data set (569 tumours, 30 measurements each, malignant or benign)
ships inside scikit-learn's wheel: ``load_breast_cancer`` reads it from the installed package,
nothing is downloaded. The network is shaped unlike the demo's: standardization, two hidden
layers with batch norm and dropout.

    python -m rtserve model export examples.breast_cancer:packaging --version 1.0 \\
        --out artifacts/breast-cancer/1.0          # what `make example` runs
    python examples/breast_cancer.py --out artifacts/breast-cancer/1.0   # the same, as a script
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rtserve.model.package import Standardize, export  # noqa: E402

logger = logging.getLogger(__name__)


class BreastCancerNet(nn.Module):
    """Standardize -> [Linear -> BatchNorm -> ReLU -> Dropout] x 2 -> Linear (2 logits)."""

    model_name = "breast-cancer"

    def __init__(
        self, norm: Standardize, hidden: tuple[int, int] = (32, 16), dropout: float = 0.2, n_classes: int = 2
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [norm]
        width = len(norm.mean)
        for size in hidden:
            layers += [nn.Linear(width, size), nn.BatchNorm1d(size), nn.ReLU(), nn.Dropout(dropout)]
            width = size
        layers.append(nn.Linear(width, n_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, 2]`` for raw measurements ``[N, 30]``."""
        return self.layers(x)


def load_data(seed: int = 0, holdout_share: float = 0.2):
    """(x_train, y_train, x_test, y_test, feature_names, labels): a seeded stratified split."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split

    data = load_breast_cancer()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=holdout_share, random_state=seed, stratify=data.target
    )
    as_x = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.long)  # noqa: E731
    return (
        as_x(x_train),
        as_y(y_train),
        as_x(x_test),
        as_y(y_test),
        [str(n) for n in data.feature_names],
        [str(n) for n in data.target_names],
    )


def train(x: torch.Tensor, y: torch.Tensor, epochs: int = 60, seed: int = 0) -> BreastCancerNet:
    """Full-batch-style Adam training in mini-batches of 64; deterministic; returns eval mode."""
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = BreastCancerNet(Standardize.fit(x))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for start in range(0, len(order) - 1, 64):  # never a batch of 1 (batch norm)
            idx = order[start : start + 64]
            optimizer.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
    return model.eval()


def packaging(seed: int = 0) -> dict:
    """What ``python -m rtserve model export examples.breast_cancer:packaging`` packages."""
    x_train, y_train, x_test, y_test, feature_names, labels = load_data(seed)
    return {
        "model": train(x_train, y_train, seed=seed),
        "train_features": x_train,
        "feature_names": feature_names,
        "labels": labels,
        "holdout": (x_test, y_test),
    }


def main(argv: list[str] | None = None) -> int:
    """Train and export into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("artifacts/breast-cancer/1.0"))
    parser.add_argument("--version", default="1.0")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    meta = export(version=args.version, out_dir=args.out, **packaging())
    logger.info("held-out accuracy %.4f on %d rows", meta.accuracy, len(meta.golden["labels"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
