"""A sequence model on real data: which language a surname comes from, read character by character.

The surnames are the lists the Faker package ships for five locales (German, French, Italian, Spanish,
Dutch; about 4,100 names inside its wheel, nothing downloaded). A name becomes a sequence of character
ids (``encode``: lower case, 1 for a character the training names never used, 0 the padding); a small
convolutional network over the characters, with the padding masked, answers the language. The one
named input ``chars`` is a sequence of at most :data:`MAX_LENGTH` ids, so requests of any length up to
that share a batch, which the server cuts after its longest name.

    python -m rtserve model export examples.names:packaging --version 1.0 \\
        --out artifacts/names/1.0             # what `make example EXAMPLE_NAME=names` runs
    python examples/names.py --out artifacts/names/1.0     # the same, as a script
"""

from __future__ import annotations

import importlib
import sys
import unicodedata
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.script import fit, run, shuffled  # noqa: E402

#: The input's and the output's names in ``meta.json`` and in requests and answers.
INPUT, OUTPUT = "chars", "language"
#: Faker's locale per language (its ``person`` provider's ``last_names``).
LOCALES = {"german": "de_DE", "french": "fr_FR", "italian": "it_IT", "spanish": "es_ES", "dutch": "nl_NL"}
#: The longest name the model takes (the longest in the lists is shorter).
MAX_LENGTH = 24
PAD, UNKNOWN = 0, 1
#: The seed the weights start from, whatever the training seed.
INIT_SEED = 0


def surnames() -> list[tuple[str, int]]:
    """(name, language index) for every distinct surname of each locale, in a fixed order."""
    out = []
    for index, locale in enumerate(LOCALES.values()):
        names = importlib.import_module(f"faker.providers.person.{locale}").Provider.last_names
        out += [(name, index) for name in sorted(set(names))]
    return out


def characters(names: list[str]) -> list[str]:
    """The alphabet of ``names`` (lower case, NFC), sorted: character ``i`` has id ``i + 2``."""
    return sorted({c for name in names for c in _normal(name)})


def _normal(name: str) -> str:
    return unicodedata.normalize("NFC", name.strip().lower())


def encode(name: str, alphabet: list[str]) -> list[int]:
    """A name as the model's ids: one per character (at most :data:`MAX_LENGTH`), unknown ones 1."""
    ids = {c: i + 2 for i, c in enumerate(alphabet)}
    return [ids.get(c, UNKNOWN) for c in _normal(name)[:MAX_LENGTH]]


class NamesNet(nn.Module):
    """Character embedding -> two 3-wide convolutions, padding masked -> max over positions -> 5 logits."""

    model_name = "names"

    def __init__(self, vocabulary: int, width: int = 96) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, 24, padding_idx=PAD)
        self.conv1 = nn.Conv1d(24, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, padding=1)
        self.classify = nn.Linear(width, len(LOCALES))

    def forward(self, chars: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, 5]`` for ids ``[N, length]`` (padded with 0 after each name)."""
        keep = (chars != PAD).unsqueeze(1)  # [N, 1, length]: what the padding must not change
        h = torch.relu(self.conv1(self.embed(chars).transpose(1, 2))) * keep
        h = torch.relu(self.conv2(h)).masked_fill(~keep, 0.0)
        return self.classify(h.amax(dim=2))


def load_data(seed: int = 0, holdout_share: float = 0.2):
    """(x_train, y_train, x_test, y_test, alphabet): a seeded stratified split, ids padded to the longest name."""
    from sklearn.model_selection import train_test_split

    pairs = surnames()
    names, languages = [n for n, _ in pairs], [y for _, y in pairs]
    n_train, n_test, y_train, y_test = train_test_split(
        names, languages, test_size=holdout_share, random_state=seed, stratify=languages
    )
    alphabet = characters(n_train)
    return _pad(n_train, alphabet), torch.tensor(y_train), _pad(n_test, alphabet), torch.tensor(y_test), alphabet


def _pad(names: list[str], alphabet: list[str]) -> torch.Tensor:
    encoded = [encode(name, alphabet) for name in names]
    out = torch.full((len(encoded), max(map(len, encoded))), PAD, dtype=torch.long)
    for i, ids in enumerate(encoded):
        out[i, : len(ids)] = torch.tensor(ids)
    return out


def train(x: torch.Tensor, y: torch.Tensor, vocabulary: int, epochs: int = 40, seed: int = 0) -> NamesNet:
    """Adam on cross-entropy, mini-batches of 64, a one-cycle learning rate; deterministic; eval mode.

    The weights always start from :data:`INIT_SEED`; ``seed`` orders the rows each epoch. The schedule
    and weight decay make two seeds agree on about 93% of the held-out names (the gate's bar is 90%).
    """
    torch.manual_seed(INIT_SEED)
    torch.set_num_threads(1)
    model = NamesNet(vocabulary)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-3)
    steps = epochs * ((len(x) + 63) // 64)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    return fit(model, {"chars": x}, y, optimizer, epochs, 64, seed, schedule)


def packaging(seed: int = 0, shuffle_labels: bool = False) -> dict:
    """What ``python -m rtserve model export examples.names:packaging`` packages.

    Args:
        seed: the rows' order in training (another seed: a retrained candidate of the same quality).
        shuffle_labels: train on labels shuffled across rows (a broken candidate the gate refuses).
    """
    x_train, y_train, x_test, y_test, alphabet = load_data()
    if shuffle_labels:
        y_train = shuffled(y_train, seed)
    vocabulary = len(alphabet) + 2
    chars = {"rows": x_train, "padding": PAD, "max_length": MAX_LENGTH, "vocabulary": vocabulary}
    return {
        "model": train(x_train, y_train, vocabulary, seed=seed),
        "inputs": {INPUT: chars},
        "outputs": {OUTPUT: {"kind": "classification", "labels": list(LOCALES)}},
        "holdout": ({INPUT: x_test}, y_test),
    }


def holdout_accuracy(model: nn.Module) -> float:
    """The model's accuracy on the held-out names."""
    _, _, x_test, y_test, _ = load_data()
    with torch.inference_mode():
        return float((model(x_test).argmax(dim=1) == y_test).float().mean())


def main(argv: list[str] | None = None) -> int:
    """Train and export into ``--out`` (:func:`examples.script.run`)."""
    return run(argv, __doc__, "names", packaging, holdout_accuracy, "held-out accuracy")


if __name__ == "__main__":
    sys.exit(main())
