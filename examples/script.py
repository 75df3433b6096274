"""The examples' command line: train with ``packaging()``, export into ``--out``, print a held-out score."""

from __future__ import annotations

import argparse
import hashlib
import inspect
import io
import logging
import os
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
        score: the trained model's held-out figure (or figures, a tuple), logged as ``what``.
    """
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(f"artifacts/{name}/1.0"))
    parser.add_argument("--version", default="1.0")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    spec = packaging()
    export(version=args.version, out_dir=args.out, **spec)
    scores = score(spec["model"])
    logger.info("%s %s", what, ", ".join(f"{v:.4f}" for v in (scores if isinstance(scores, tuple) else (scores,))))
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
    loss: Callable = torch.nn.functional.cross_entropy,
) -> torch.nn.Module:
    """``loss(model(**inputs), y)`` (cross-entropy) on mini-batches of ``batch`` rows; eval mode at the end.

    ``seed`` orders the rows each epoch (the weights' seed is the caller's): two seeds are two
    retrains of one recipe. ``schedule`` steps after each batch. ``y`` is a tensor, or a dict of
    tensors (one per output) that ``loss`` takes as such.
    """
    cached = _cache_path(model, inputs, y, optimizer, epochs, batch, seed, schedule, loss)
    if cached is not None and cached.is_file():
        model.load_state_dict(torch.load(cached, weights_only=True))
        logger.info("weights from the training cache (%s): trained before on the same inputs", cached.name)
        return model.eval()
    g = torch.Generator().manual_seed(seed + 1)
    rows = len(next(iter(y.values()))) if isinstance(y, dict) else len(y)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(rows, generator=g)
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            optimizer.zero_grad()
            truth = {k: v[idx] for k, v in y.items()} if isinstance(y, dict) else y[idx]
            loss(model(**{k: v[idx] for k, v in inputs.items()}), truth).backward()
            optimizer.step()
            if schedule is not None:
                schedule.step()
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.part")
        torch.save(model.state_dict(), partial)
        partial.replace(cached)
    return model.eval()


#: A directory that keeps :func:`fit`'s results (unset: every call trains). The tests set it, under
#: ~/.cache/rtserve, so that each example trains once per change of anything its training reads.
CACHE_ENV = "RTSERVE_TRAIN_CACHE"


def _cache_path(model, inputs, y, optimizer, epochs, batch, seed, schedule, loss) -> Path | None:
    """Where :func:`fit` keeps its result for exactly these arguments, or None when no cache is set.

    The key hashes everything the training reads: the starting weights, the rows and the truth, the
    optimizer's and the schedule's class and settings, epochs, batch, seed, the loss, the source of
    this module and of the model's, and torch's version.
    """
    root = os.environ.get(CACHE_ENV)
    if not root:
        return None
    h = hashlib.sha256(f"{torch.__version__}|{epochs}|{batch}|{seed}|{loss.__module__}.{loss.__qualname__}".encode())
    for source in (inspect.getsource(sys.modules[__name__]), inspect.getsource(sys.modules[type(model).__module__])):
        h.update(source.encode())
    state = io.BytesIO()
    torch.save(
        {
            "model": model.state_dict(),
            "inputs": inputs,
            "y": y,
            "optimizer": (type(optimizer).__qualname__, optimizer.state_dict()),
            "schedule": (type(schedule).__qualname__, schedule.state_dict()) if schedule is not None else None,
        },
        state,
    )
    h.update(state.getvalue())
    return Path(root) / f"{h.hexdigest()[:32]}.pt"


def shuffled(y: torch.Tensor, seed: int) -> torch.Tensor:
    """``y`` shuffled across rows: the truth of a broken candidate the gate must refuse."""
    return y[torch.randperm(len(y), generator=torch.Generator().manual_seed(seed + 7))]
