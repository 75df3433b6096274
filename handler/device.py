"""Where a worker runs its model: the GPU TorchServe assigned it, or the CPU (no TorchServe import).

``handler.device: auto`` uses ``cuda:<gpu_id>`` when the worker has one and torch reaches CUDA, else
the CPU path unchanged (no copies); ``cpu`` always stays on the CPU. Rows and logits stay CPU tensors
around the forward pass (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def on_device(
    forward: Callable[[torch.Tensor], torch.Tensor], device: torch.device
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``forward`` for CPU inputs and outputs.

    On the CPU ``forward`` itself (no extra call), elsewhere a wrapper that copies the inputs to
    ``device`` and the result back. On CUDA, TF32 is turned off for the process (cuDNN's
    convolutions use it by default): a float32 model answers in float32 there as on the CPU, not
    with 10-bit mantissas (an H200 put a CNN's logits 3e-3 off the CPU's with it on).
    """
    if device.type == "cpu":
        return forward
    if device.type == "cuda":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False

    def forward_on_device(x: torch.Tensor) -> torch.Tensor:
        return forward(x.to(device)).cpu()

    return forward_on_device
