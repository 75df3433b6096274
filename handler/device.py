"""Where a worker runs its model: the GPU TorchServe assigned it, or the CPU (no TorchServe import).

TorchServe gives each worker a ``gpu_id`` (``context.system_properties["gpu_id"]``) when its
frontend found GPUs, and ``None`` otherwise. With ``handler.device: auto`` (the default) a worker
uses ``cuda:<gpu_id>`` when it has one and torch can reach CUDA; in every other case it stays on
the CPU, exactly the CPU path of a machine without a GPU (the model is not moved, inputs and
outputs are not copied). ``handler.device: cpu`` keeps it on the CPU even where a GPU is present.

On a GPU the request path stays the same: rows are parsed into a CPU tensor, copied to the
device for the forward pass, and the logits come back to the CPU before the answers (and the
drift window, metrics and audit trail) are made from them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: The values of ``handler.device``.
DEVICE_SETTINGS = ("auto", "cpu")
CPU = torch.device("cpu")


def choose_device(setting: str, gpu_id: Any) -> torch.device:
    """The device a worker runs its model on.

    Args:
        setting: ``handler.device``: ``auto`` (the assigned GPU when CUDA is available) or
            ``cpu``.
        gpu_id: TorchServe's ``gpu_id`` for this worker (``None`` without GPUs; TorchServe
            passes an int, a numeric string is accepted too).

    Raises:
        ValueError: ``setting`` is not one of :data:`DEVICE_SETTINGS`.
    """
    if setting not in DEVICE_SETTINGS:
        raise ValueError(f"unknown device setting {setting!r}")
    if setting == "cpu" or gpu_id is None or not torch.cuda.is_available():
        return CPU
    index = int(gpu_id)
    return torch.device(f"cuda:{index}") if index >= 0 else CPU


def on_device(forward: Callable[[torch.Tensor], torch.Tensor],
              device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """``forward`` for CPU inputs and outputs: on the CPU ``forward`` itself (no extra call),
    elsewhere a wrapper that copies the inputs to ``device`` and the result back."""
    if device.type == "cpu":
        return forward

    def forward_on_device(x: torch.Tensor) -> torch.Tensor:
        return forward(x.to(device)).cpu()

    return forward_on_device
