"""A regression model on real data: disease progression a year after baseline, in its own units.

The diabetes data set (442 patients, 10 baseline measurements, a progression score of 25-346)
ships inside scikit-learn's wheel: ``load_diabetes`` reads it from the installed package, nothing
is downloaded. The network standardizes its inputs and predicts the standardized score, then maps
it back to the score's units inside the model, so the server answers in those units.

    python -m rtserve model export examples.diabetes:packaging --version 1.0 \\
        --out artifacts/diabetes/1.0          # what `make example EXAMPLE_NAME=diabetes` runs
    python examples/diabetes.py --out artifacts/diabetes/1.0   # the same, as a script
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

#: The output's name and its one target's name in ``meta.json`` and in the answers.
OUTPUT, TARGET = "progression", "progression"
#: The seed the weights start from, whatever the training seed.
INIT_SEED = 0


class Rescale(nn.Module):
    """``y * std + mean``: a standardized prediction back in the target's units."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean))
        self.register_buffer("std", torch.tensor(std))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """The rescaled prediction."""
        return y * self.std + self.mean


class DiabetesNet(nn.Module):
    """Standardize -> Linear -> ReLU -> Linear (1 value) -> Rescale."""

    model_name = "diabetes"

    def __init__(self, norm: Standardize, target_mean: float, target_std: float, hidden: int = 16) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            norm, nn.Linear(len(norm.mean), hidden), nn.ReLU(), nn.Linear(hidden, 1), Rescale(target_mean, target_std)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The progression score ``[N, 1]`` for raw measurements ``[N, 10]``."""
        return self.layers(x)


def load_data(seed: int = 0, holdout_share: float = 0.2):
    """(x_train, y_train, x_test, y_test, feature_names): a seeded split, targets as float32."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split

    data = load_diabetes()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data, data.target, test_size=holdout_share, random_state=seed
    )
    as_t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return as_t(x_train), as_t(y_train), as_t(x_test), as_t(y_test), [str(n) for n in data.feature_names]


def train(x: torch.Tensor, y: torch.Tensor, epochs: int = 80, seed: int = 0) -> DiabetesNet:
    """Adam on the standardized target's squared error, mini-batches of 32; deterministic; eval mode.

    The weights always start from :data:`INIT_SEED`; ``seed`` orders the rows each epoch, so two seeds
    are two retrains of one recipe (they agree within a quarter of the target's spread on 92-100% of
    the held-out rows).
    """
    torch.manual_seed(INIT_SEED)
    torch.set_num_threads(1)
    mean, std = float(y.mean()), float(y.std())
    model = DiabetesNet(Standardize.fit(x), mean, std)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-2)
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=g)
        for start in range(0, len(order), 32):
            idx = order[start : start + 32]
            optimizer.zero_grad()
            loss = nn.functional.mse_loss((model(x[idx]).squeeze(1) - mean) / std, (y[idx] - mean) / std)
            loss.backward()
            optimizer.step()
    return model.eval()


def packaging(seed: int = 0, shuffle_targets: bool = False) -> dict:
    """What ``python -m rtserve model export examples.diabetes:packaging`` packages.

    Args:
        seed: the rows' order in training (another seed: a retrained candidate of the same quality).
        shuffle_targets: train on targets shuffled across rows (a broken candidate the gate refuses).
    """
    x_train, y_train, x_test, y_test, feature_names = load_data()
    if shuffle_targets:
        y_train = y_train[torch.randperm(len(y_train), generator=torch.Generator().manual_seed(seed + 7))]
    return {
        "model": train(x_train, y_train, seed=seed),
        "train_features": x_train,
        "feature_names": feature_names,
        "outputs": {OUTPUT: {"kind": "regression", "targets": [TARGET]}},
        "holdout": (x_test, y_test),
    }


def holdout_mae(model: nn.Module) -> float:
    """The model's mean absolute error on the held-out rows, in the target's units."""
    _, _, x_test, y_test, _ = load_data()
    with torch.inference_mode():
        return float((model(x_test).squeeze(1) - y_test).abs().mean())


def main(argv: list[str] | None = None) -> int:
    """Train and export into ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("artifacts/diabetes/1.0"))
    parser.add_argument("--version", default="1.0")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    spec = packaging()
    export(version=args.version, out_dir=args.out, **spec)
    logger.info("held-out mean absolute error %.2f", holdout_mae(spec["model"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
