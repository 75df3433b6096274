"""The examples' training cache (examples/script.py ``fit``): the same arguments load the weights
trained before; any change of what the training reads trains again; no cache set, no files."""

from __future__ import annotations

import torch
from torch import nn

from examples import script


def trained(seed: int, epochs: int = 3, lr: float = 0.1) -> tuple[nn.Module, int]:
    """A small model fitted on fixed rows, and how many optimizer steps ran while fitting it."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, 4, generator=g), torch.randint(0, 3, (40,), generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps = []
    optimizer.register_step_post_hook(lambda *_: steps.append(1))
    return script.fit(model, {"input": x}, y, optimizer, epochs, 8, seed), len(steps)


def test_the_same_training_is_loaded_and_another_trains(tmp_path, monkeypatch):
    monkeypatch.setenv(script.CACHE_ENV, str(tmp_path))
    first, steps = trained(seed=0)
    assert steps == 15 and len(list(tmp_path.glob("*.pt"))) == 1
    again, steps = trained(seed=0)
    assert steps == 0, "the same training ran again"
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert not again.training
    for changed in ({"seed": 1}, {"seed": 0, "epochs": 4}, {"seed": 0, "lr": 0.2}):
        _, steps = trained(**changed)
        assert steps > 0, f"{changed} was loaded from another training"
    assert len(list(tmp_path.glob("*.pt"))) == 4
    assert not list(tmp_path.glob("*.part"))


def test_without_a_cache_every_call_trains(tmp_path, monkeypatch):
    monkeypatch.delenv(script.CACHE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        _, steps = trained(seed=0)
        assert steps == 15
    assert not list(tmp_path.iterdir())
