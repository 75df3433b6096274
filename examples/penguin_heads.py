"""Several outputs on real data: a penguin's species, its body mass and an embedding, from one network.

The Palmer penguins (``palmerpenguins``' wheel, as in examples/penguins.py; 333 without a missing
value). Two named inputs: ``measurements`` float32 ``[3]`` (bill length and depth, flipper length in mm)
and ``category`` int64 ``[2]`` (island id, sex id; vocabularies 3 and 2). One shared body, three heads,
three outputs in this order:

- ``species``: ``classification`` over Adelie, Chinstrap, Gentoo (the first output: the holdout's
  truth, the gate's comparison and the predictions' drift follow it);
- ``body_mass``: ``regression``, one target ``body_mass_g``, in grams;
- ``embedding``: ``embedding``, the body's 8 numbers (a penguin's representation, for search).

Trained on cross-entropy plus the standardized mass's squared error.

    python -m rtserve model export examples.penguin_heads:packaging --version 1.0 \\
        --out artifacts/penguin-heads/1.0     # what `make example EXAMPLE_NAME=penguin-heads` runs
    python examples/penguin_heads.py --out artifacts/penguin-heads/1.0   # the same, as a script
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.penguins import CATEGORY, DENSE, ISLANDS, SEXES, SPECIES, VOCABULARY, column_ids, load_frame  # noqa: E402
from examples.script import fit, run, shuffled  # noqa: E402
from rtserve.model.package import Standardize  # noqa: E402

#: The data set's columns behind ``measurements``, in order (body mass is an output here).
MEASUREMENTS = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm")
#: The outputs' names, in the order of ``outputs=`` (and of the model's tuple).
SPECIES_OUT, MASS, EMBEDDING = "species", "body_mass", "embedding"
#: The regression's one target.
MASS_COLUMN = "body_mass_g"
#: The embedding's width.
WIDTH = 8
#: The seed the weights start from, whatever the training seed.
INIT_SEED = 0
#: ``packaging()``'s outputs, in column order.
OUTPUTS = {
    SPECIES_OUT: {"kind": "classification", "labels": list(SPECIES)},
    MASS: {"kind": "regression", "targets": [MASS_COLUMN]},
    EMBEDDING: {"kind": "embedding"},
}


class PenguinHeads(nn.Module):
    """Standardized measurements beside the summed island and sex embeddings -> body (8) -> three heads.

    Returns ``(species logits [N, 3], body mass in grams [N, 1], embedding [N, 8])``.
    """

    model_name = "penguin-heads"

    def __init__(self, norm: Standardize, mass_mean: float, mass_std: float, embedding_dim: int = 4) -> None:
        super().__init__()
        self.norm = norm
        self.register_buffer("offsets", torch.tensor([sum(VOCABULARY[:c]) for c in range(len(VOCABULARY))]))
        self.register_buffer("mass", torch.tensor([mass_mean, mass_std]))
        self.embed = nn.EmbeddingBag(sum(VOCABULARY), embedding_dim, mode="sum")
        self.body = nn.Sequential(nn.Linear(len(MEASUREMENTS) + embedding_dim, 16), nn.ReLU(), nn.Linear(16, WIDTH))
        self.species = nn.Linear(WIDTH, len(SPECIES))
        self.body_mass = nn.Linear(WIDTH, 1)

    def forward(self, measurements: torch.Tensor, category: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The three outputs for raw measurements ``[N, 3]`` and ids ``[N, 2]`` (island, sex)."""
        h = self.body(torch.cat([self.norm(measurements), self.embed(category + self.offsets)], dim=1))
        hidden = torch.relu(h)
        return self.species(hidden), self.body_mass(hidden) * self.mass[1] + self.mass[0], h


def load_data(seed: int = 0, holdout_share: float = 0.2):
    """(x_train, y_train, x_test, y_test): a seeded stratified split by species.

    Each ``x`` is ``{"measurements": float32 [N, 3], "category": int64 [N, 2]}``; each ``y``
    ``{"species": class indices [N], "body_mass": grams [N, 1]}``.
    """
    from sklearn.model_selection import train_test_split

    frame = load_frame()
    dense = torch.tensor(frame[list(MEASUREMENTS)].to_numpy(dtype="float64"), dtype=torch.float32)
    category = torch.tensor([column_ids(frame["island"], ISLANDS), column_ids(frame["sex"], SEXES)]).T.contiguous()
    species = torch.tensor(column_ids(frame["species"], SPECIES))
    mass = torch.tensor(frame[MASS_COLUMN].to_numpy(dtype="float64"), dtype=torch.float32).unsqueeze(1)
    train, test = train_test_split(
        torch.arange(len(species)).numpy(), test_size=holdout_share, random_state=seed, stratify=species.numpy()
    )
    train, test = torch.from_numpy(train), torch.from_numpy(test)
    as_x = lambda rows: {DENSE: dense[rows], CATEGORY: category[rows]}  # noqa: E731
    as_y = lambda rows: {SPECIES_OUT: species[rows], MASS: mass[rows]}  # noqa: E731
    return as_x(train), as_y(train), as_x(test), as_y(test)


def train(x: dict, y: dict, epochs: int = 80, seed: int = 0) -> PenguinHeads:
    """Adam on cross-entropy plus the standardized mass's squared error, batches of 32; deterministic.

    The weights always start from :data:`INIT_SEED`; ``seed`` orders the rows each epoch.
    """
    torch.manual_seed(INIT_SEED)
    torch.set_num_threads(1)
    mean, std = float(y[MASS].mean()), float(y[MASS].std())
    model = PenguinHeads(Standardize.fit(x[DENSE]), mean, std)

    def loss(out: tuple, truth: dict) -> torch.Tensor:
        logits, grams, _ = out
        return nn.functional.cross_entropy(logits, truth[SPECIES_OUT]) + nn.functional.mse_loss(
            (grams - truth[MASS]) / std, torch.zeros_like(grams)
        )

    return fit(model, x, y, torch.optim.Adam(model.parameters(), lr=1e-2), epochs, 32, seed, loss=loss)


def packaging(seed: int = 0, shuffle_labels: bool = False) -> dict:
    """What ``python -m rtserve model export examples.penguin_heads:packaging`` packages.

    Args:
        seed: the rows' order in training (another seed: a retrained candidate of the same quality).
        shuffle_labels: train on species and masses shuffled across rows (a broken candidate).
    """
    x_train, y_train, x_test, y_test = load_data()
    if shuffle_labels:
        y_train = {name: shuffled(truth, seed) for name, truth in y_train.items()}
    return {
        "model": train(x_train, y_train, seed=seed),
        "inputs": {DENSE: x_train[DENSE], CATEGORY: {"rows": x_train[CATEGORY], "vocabulary": VOCABULARY}},
        "outputs": OUTPUTS,
        "holdout": (x_test, y_test[SPECIES_OUT]),  # the first output's truth
    }


def holdout_scores(model: nn.Module) -> tuple[float, float]:
    """The model's held-out species accuracy and body mass mean absolute error (grams)."""
    _, _, x_test, y_test = load_data()
    with torch.inference_mode():
        logits, grams, _ = model(**x_test)
    return float((logits.argmax(dim=1) == y_test[SPECIES_OUT]).float().mean()), float(
        (grams - y_test[MASS]).abs().mean()
    )


def main(argv: list[str] | None = None) -> int:
    """Train and export into ``--out`` (:func:`examples.script.run`)."""
    return run(argv, __doc__, "penguin-heads", packaging, holdout_scores, "held-out accuracy, mass MAE (g)")


if __name__ == "__main__":
    sys.exit(main())
