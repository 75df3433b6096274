"""Where the handler runs its model: the GPU TorchServe assigns the worker, or the CPU.

No GPU exists on this machine or on CI, so the placement is tested without one: the choice of
device with ``torch.cuda.is_available`` patched (the tests assert the device it names and never
put a tensor on it), the non-CPU loading path on PyTorch's ``meta`` device (no memory, no
kernels: it proves every weight and constant of the program moves, since a program with
anything left on the CPU refuses meta inputs), and the handler on a context that names a GPU
where CUDA is unavailable. ``test_handler_on_a_real_gpu`` runs only where CUDA is available
(it is skipped here and on CI).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from handler.config import HandlerConfig
from handler.device import CPU, choose_device, on_device
from handler.errors import ConfigError
from handler.model import load_program
from handler.rtserve_handler import RealTimeHandler
from tests.helpers import MODEL_YAML, features, json_row, make_context, start_batch

pytestmark = pytest.mark.unit


@pytest.fixture()
def cuda(monkeypatch):
    """Make ``torch.cuda.is_available()`` answer what a test says (no device is touched)."""

    def set_available(available: bool) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)

    return set_available


def test_no_gpu_id_means_the_cpu(cuda):
    cuda(True)
    assert choose_device("auto", None) == CPU


def test_a_gpu_id_without_cuda_means_the_cpu_without_an_error(cuda):
    cuda(False)
    assert choose_device("auto", 0) == CPU
    assert choose_device("auto", 3) == CPU


@pytest.mark.parametrize("gpu_id,expected", [(0, "cuda:0"), (3, "cuda:3"), ("1", "cuda:1")])
def test_the_assigned_gpu_when_cuda_is_available(cuda, gpu_id, expected):
    cuda(True)
    assert str(choose_device("auto", gpu_id)) == expected


def test_cpu_setting_and_negative_ids_keep_the_cpu(cuda):
    cuda(True)
    assert choose_device("cpu", 0) == CPU
    assert choose_device("auto", -1) == CPU
    with pytest.raises(ValueError, match="unknown device setting 'gpu'"):
        choose_device("gpu", 0)


def test_on_the_cpu_the_forward_function_is_not_wrapped():
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x

    assert on_device(forward, CPU) is forward


def test_on_another_device_inputs_go_there_and_results_come_back():
    seen = []

    class Result:  # what a GPU forward returns: a tensor that must be copied back
        def cpu(self) -> str:
            seen.append("copied back")
            return "on the cpu"

    def forward(x: torch.Tensor) -> Result:
        seen.append(x.device)
        return Result()

    wrapped = on_device(forward, torch.device("meta"))  # meta stands in for a GPU: no memory
    assert wrapped(torch.ones(2, 3)) == "on the cpu"
    assert seen == [torch.device("meta"), "copied back"]


def test_on_cuda_tf32_is_turned_off():
    """A float32 model answers in float32 on the GPU: cuDNN's convolutions and matmuls without TF32."""
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        on_device(lambda x: x, torch.device("cuda:0"))  # wrapping only: no GPU is needed
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


def test_the_program_moves_whole_to_another_device(trained_dir):
    forward = load_program(trained_dir / "model.pt2", "meta")
    out = forward(torch.zeros(4, 32, device="meta"))
    assert out.shape == (4, 3) and out.device.type == "meta"
    with pytest.raises(RuntimeError, match="meta"):
        forward(torch.zeros(4, 32))  # nothing of it stayed on the CPU


@pytest.mark.parametrize(
    "value,message",
    [
        ("gpu", "handler.device must be one of: auto, cpu"),
        (1, "handler.device must be str, got 1"),
    ],
)
def test_device_setting_is_validated(value, message):
    with pytest.raises(ConfigError, match=message):
        HandlerConfig.from_model_yaml({"handler": {"device": value}})
    assert HandlerConfig.from_model_yaml({"handler": {"device": "cpu"}}).device == "cpu"
    assert HandlerConfig.from_model_yaml({}).device == "auto"


def answers(handler, ctx, rows):
    start_batch(ctx, len(rows))
    return [json.loads(o) for o in handler.handle([json_row({"features": r}) for r in rows], ctx)]


def test_handler_with_a_gpu_id_and_no_cuda_serves_on_the_cpu(trained_dir, cuda, caplog):
    cuda(False)
    ctx = make_context(trained_dir, MODEL_YAML, gpu=0)
    assert ctx.system_properties["gpu_id"] == 0
    handler = RealTimeHandler()
    with caplog.at_level(logging.INFO, logger="handler.rtserve_handler"):
        handler.initialize(ctx)
    assert handler.device == CPU
    assert any("version 1.0 on cpu (" in r.getMessage() for r in caplog.records), caplog.text
    plain = RealTimeHandler()
    plain_ctx = make_context(trained_dir, MODEL_YAML)
    plain.initialize(plain_ctx)
    rows = [features(value=v) for v in (-20.0, 0.0, 7.5)]
    assert answers(handler, ctx, rows) == answers(plain, plain_ctx, rows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here or on CI)")
def test_handler_on_a_real_gpu(trained_dir):
    """Where a GPU exists: predictions and explanations on ``cuda:0`` equal the CPU's."""
    on_gpu, cpu = RealTimeHandler(), RealTimeHandler()
    gpu_ctx = make_context(trained_dir, MODEL_YAML, gpu=0)
    cpu_ctx = make_context(trained_dir, {**MODEL_YAML, "handler": {**MODEL_YAML["handler"], "device": "cpu"}}, gpu=0)
    on_gpu.initialize(gpu_ctx)
    cpu.initialize(cpu_ctx)
    assert str(on_gpu.device) == "cuda:0" and cpu.device == CPU
    rows = [features(value=v) for v in (-20.0, 0.0, 7.5)]
    got, want = answers(on_gpu, gpu_ctx, rows), answers(cpu, cpu_ctx, rows)
    for g, w in zip(got, want):
        assert g["prediction"] == w["prediction"]
        assert g["probabilities"] == pytest.approx(w["probabilities"], abs=1e-5)
    x = torch.tensor(rows)
    for g, w in zip(on_gpu.explainer.explain(x, [0, 1, 2]), cpu.explainer.explain(x, [0, 1, 2])):
        assert g.attributions == pytest.approx(w.attributions, abs=1e-4)
