"""The examples' command line: train with ``packaging()``, export into ``--out``, print a held-out score."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from rtserve.model.package import export

logger = logging.getLogger(__name__)


def run(argv: list[str] | None, doc: str, name: str, packaging: Callable[[], dict], score: Callable, what: str) -> int:
    """``python examples/<name>.py [--out DIR] [--version V]``: what ``make example`` does, as a script.

    Args:
        argv: the arguments (None: the command line's).
        doc: the example's docstring (the help text).
        name: the example's name (the default ``--out`` is ``artifacts/<name>/1.0``).
        packaging: returns what :func:`rtserve.model.package.export` takes.
        score: the trained model's held-out figure, logged as ``what`` (``held-out accuracy``).
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(f"artifacts/{name}/1.0"))
    parser.add_argument("--version", default="1.0")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    spec = packaging()
    export(version=args.version, out_dir=args.out, **spec)
    logger.info("%s %.4f", what, score(spec["model"]))
    return 0


def fit(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    y: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    batch: int,
    seed: int,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> torch.nn.Module:
    """Cross-entropy on mini-batches of ``batch`` rows, ``model(**inputs)``; eval mode at the end.

    ``seed`` orders the rows each epoch (the weights' seed is the caller's): two seeds are two
    retrains of one recipe. ``schedule`` steps after each batch.
    """
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=g)
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(**{k: v[idx] for k, v in inputs.items()}), y[idx]).backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
    return model.eval()


def shuffled(y: torch.Tensor, seed: int) -> torch.Tensor:
    """``y`` shuffled across rows: the truth of a broken candidate the gate must refuse."""
    return y[torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 7))]
