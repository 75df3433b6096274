"""An image classifier on real data: handwritten digits as 8x8 grayscale images, sent as arrays or PNG.

The digits data set (1,797 images of 8x8 pixels, each 0-16, ten classes) ships inside scikit-learn's
wheel: ``load_digits`` reads it from the installed package, nothing is downloaded. A small CNN takes
one named input ``image`` of shape ``[1, 8, 8]``; its image encoding maps a PNG's 8-bit pixel ``p`` to
``p * 16 / 255``, the data set's own scale, so a request may carry the array or the picture.

    python -m rtserve model export examples.digits:packaging --version 1.0 \\
        --out artifacts/digits/1.0            # what `make example EXAMPLE_NAME=digits` runs
    python examples/digits.py --out artifacts/digits/1.0   # the same, as a script
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import torch
from torch import nn

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.script import fit, run, shuffled  # noqa: E402

#: The input's and the output's names in ``meta.json`` and in requests and answers.
INPUT, OUTPUT = "image", "digit"
#: The data set's largest pixel value: a PNG's 255 maps to it.
PIXEL_MAX = 16.0
#: The seed the weights start from, whatever the training seed.
INIT_SEED = 0


class DigitsNet(nn.Module):
    """Scale to [0, 1] -> two 3x3 convolutions -> 2x2 max pool -> linear (10 logits)."""

    model_name = "digits"

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.classify = nn.Linear(2 * channels * 16, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        """Logits ``[N, 10]`` for images ``[N, 1, 8, 8]`` of pixels 0-16."""
        return self.classify(self.features(image / PIXEL_MAX))


def load_data(seed: int = 0, holdout_share: float = 0.2):
    """(x_train, y_train, x_test, y_test): a seeded stratified split, images ``[N, 1, 8, 8]`` float32."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.images, data.target, test_size=holdout_share, random_state=seed, stratify=data.target
    )
    as_x = lambda a: torch.tensor(a, dtype=torch.float32).unsqueeze(1)  # noqa: E731
    return as_x(x_train), torch.tensor(y_train), as_x(x_test), torch.tensor(y_test)


def train(x: torch.Tensor, y: torch.Tensor, epochs: int = 12, seed: int = 0) -> DigitsNet:
    """Adam on cross-entropy, mini-batches of 32; deterministic; eval mode.

    The weights always start from :data:`INIT_SEED`; ``seed`` orders the rows each epoch, so two seeds
    are two retrains of one recipe.
    """
    torch.manual_seed(INIT_SEED)
    torch.set_num_threads(1)
    model = DigitsNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    return fit(model, {"image": x}, y, optimizer, epochs, 32, seed)


def packaging(seed: int = 0, shuffle_labels: bool = False) -> dict:
    """What ``python -m rtserve model export examples.digits:packaging`` packages.

    Args:
        seed: the rows' order in training (another seed: a retrained candidate of the same quality).
        shuffle_labels: train on labels shuffled across rows (a broken candidate the gate refuses).
    """
    x_train, y_train, x_test, y_test = load_data()
    if shuffle_labels:
        y_train = shuffled(y_train, seed)
    return {
        "model": train(x_train, y_train, seed=seed),
        "inputs": {INPUT: {"rows": x_train, "image": {"scale": PIXEL_MAX / 255}}},
        "outputs": {OUTPUT: {"kind": "classification", "labels": [str(d) for d in range(10)]}},
        "holdout": ({INPUT: x_test}, y_test),
    }


def to_png(image: torch.Tensor) -> bytes:
    """One image ``[1, 8, 8]`` of pixels 0-16 as an 8-bit grayscale PNG (pixel ``round(v * 255 / 16)``)."""
    from PIL import Image

    pixels = (image[0] * (255 / PIXEL_MAX)).round().clamp(0, 255).to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def holdout_accuracy(model: nn.Module) -> float:
    """The model's accuracy on the held-out images."""
    _, _, x_test, y_test = load_data()
    with torch.inference_mode():
        return float((model(x_test).argmax(dim=1) == y_test).float().mean())


def main(argv: list[str] | None = None) -> int:
    """Train and export into ``--out`` (:func:`examples.script.run`)."""
    return run(argv, __doc__, "digits", packaging, holdout_accuracy, "held-out accuracy")


if __name__ == "__main__":
    sys.exit(main())
