"""Dense and categorical inputs on real data: a penguin's species from its measurements, island and sex.

The Palmer penguins data (344 penguins of three species on three islands of the Palmer Archipelago,
Antarctica; 333 without a missing value) ships inside the ``palmerpenguins`` wheel: ``load_penguins``
reads its CSV from the installed package, nothing is downloaded. The model takes two named inputs:
``measurements`` float32 ``[4]`` (bill length and depth, flipper length in mm, body mass in g),
standardized inside the model, and ``category`` int64 ``[2]`` (island id, sex id), summed from one
embedding table through per-column offsets (an ``nn.EmbeddingBag``).

Each column declares its own vocabulary (:data:`VOCABULARY`: 3 islands, 2 sexes), so the server refuses
an island id of 3 or a sex id of 2 with a 400 naming the column.

    python -m rtserve model export examples.penguins:packaging --version 1.0 \\
        --out artifacts/penguins/1.0          # what `make example EXAMPLE_NAME=penguins` runs
    python examples/penguins.py --out artifacts/penguins/1.0   # the same, as a script
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.script import fit, run, shuffled  # noqa: E402
from rtserve.model.package import Standardize  # noqa: E402

#: The inputs' and the output's names in ``meta.json`` and in requests and answers.
DENSE, CATEGORY, OUTPUT = "measurements", "category", "species"
#: The data set's columns behind ``measurements``, in order.
MEASUREMENTS = ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g")
#: Each categorical column's values: a value's id is its position.
ISLANDS = ("Biscoe", "Dream", "Torgersen")
SEXES = ("female", "male")
#: The classes, in output column order.
SPECIES = ("Adelie", "Chinstrap", "Gentoo")
#: The ``category`` input's vocabulary per column: island ids in ``[0, 3)``, sex ids in ``[0, 2)``.
VOCABULARY = [len(ISLANDS), len(SEXES)]
#: The seed the weights start from, whatever the training seed.
INIT_SEED = 0


class PenguinsNet(nn.Module):
    """Standardized measurements beside the summed embeddings of island and sex -> MLP (3 logits).

    Column ``c`` of ``category`` indexes rows ``sum(VOCABULARY[:c]) + id`` of one table.
    """

    model_name = "penguins"

    def __init__(self, norm: Standardize, embedding_dim: int = 4, hidden: int = 16) -> None:
        super().__init__()
        self.norm = norm
        columns = 2
        self.register_buffer("offsets", torch.tensor([sum(VOCABULARY[:c]) for c in range(columns)]))
        self.embed = nn.EmbeddingBag(sum(VOCABULARY), embedding_dim, mode="sum")
        self.layers = nn.Sequential(
            nn.Linear(len(MEASUREMENTS) + embedding_dim, hidden), nn.ReLU(), nn.Linear(hidden, len(SPECIES))
        )

    def forward(self, measurements: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, 3]`` for raw measurements ``[N, 4]`` and ids ``[N, 2]`` (island, sex)."""
        embedded = self.embed(category + self.offsets)
        return self.layers(torch.cat([self.norm(measurements), embedded], dim=1))


def load_frame():
    """The penguins without a missing value (333 rows), as ``palmerpenguins.load_penguins`` reads them."""
    from palmerpenguins import load_penguins

    return load_penguins().dropna().reset_index(drop=True)


def column_ids(values, names: tuple[str, ...]) -> list[int]:
    """Each value's position in ``names`` (a value outside them is an error, not a new id)."""
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(values) - set(index))
    if unknown:
        raise ValueError(f"values {unknown} are not among {names}")
    return [index[v] for v in values]


def load_data(seed: int = 0, holdout_share: float = 0.2):
    """(x_train, y_train, x_test, y_test): a seeded stratified split by species.

    Each ``x`` is ``{"measurements": float32 [N, 4], "category": int64 [N, 2]}``; ``y`` class indices.
    """
    from sklearn.model_selection import train_test_split

    frame = load_frame()
    dense = torch.tensor(frame[list(MEASUREMENTS)].to_numpy(dtype="float64"), dtype=torch.float32)
    category = torch.tensor([column_ids(frame["island"], ISLANDS), column_ids(frame["sex"], SEXES)]).T.contiguous()
    y = torch.tensor(column_ids(frame["species"], SPECIES))
    train, test = train_test_split(
        torch.arange(len(y)).numpy(), test_size=holdout_share, random_state=seed, stratify=y.numpy()
    )
    train, test = torch.from_numpy(train), torch.from_numpy(test)
    as_x = lambda rows: {DENSE: dense[rows], CATEGORY: category[rows]}  # noqa: E731
    return as_x(train), y[train], as_x(test), y[test]


def train(x: dict, y: torch.Tensor, epochs: int = 60, seed: int = 0) -> PenguinsNet:
    """Adam on cross-entropy, mini-batches of 32; deterministic; eval mode.

    The weights always start from :data:`INIT_SEED`; ``seed`` orders the rows each epoch, so two seeds
    are two retrains of one recipe.
    """
    torch.manual_seed(INIT_SEED)
    torch.set_num_threads(1)
    model = PenguinsNet(Standardize.fit(x[DENSE]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return fit(model, x, y, optimizer, epochs, 32, seed)


def packaging(seed: int = 0, shuffle_labels: bool = False) -> dict:
    """What ``python -m rtserve model export examples.penguins:packaging`` packages.

    Args:
        seed: the rows' order in training (another seed: a retrained candidate of the same quality).
        shuffle_labels: train on labels shuffled across rows (a broken candidate the gate refuses).
    """
    x_train, y_train, x_test, y_test = load_data()
    if shuffle_labels:
        y_train = shuffled(y_train, seed)
    return {
        "model": train(x_train, y_train, seed=seed),
        "inputs": {DENSE: x_train[DENSE], CATEGORY: {"rows": x_train[CATEGORY], "vocabulary": VOCABULARY}},
        "outputs": {OUTPUT: {"kind": "classification", "labels": list(SPECIES)}},
        "holdout": (x_test, y_test),
    }


def holdout_accuracy(model: nn.Module) -> float:
    """The model's accuracy on the held-out penguins."""
    _, _, x_test, y_test = load_data()
    with torch.inference_mode():
        return float((model(**x_test).argmax(dim=1) == y_test).float().mean())


def main(argv: list[str] | None = None) -> int:
    """Train and export into ``--out`` (:func:`examples.script.run`)."""
    return run(argv, __doc__, "penguins", packaging, holdout_accuracy, "held-out accuracy")


if __name__ == "__main__":
    sys.exit(main())
