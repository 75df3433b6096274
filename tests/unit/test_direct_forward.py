"""The direct forward pass (handler.direct_forward): the exported program's own answers, to 1e-6."""

from __future__ import annotations

import logging
import operator

import pytest
import torch

from handler.model import DirectForward, direct_forward, load_program
from handler.rtserve_handler import RealTimeHandler
from tests.helpers import MODEL_YAML, make_context
from tests.unit.test_package import exported

pytestmark = pytest.mark.unit


def rows(n: int, n_features: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, n_features, generator=g) * 50


def assert_same_answers(path, n_features: int) -> None:
    module = load_program(path)  # the exported module's forward, as before
    direct = load_program(path, direct=True)
    assert isinstance(direct, DirectForward), direct.forward_path
    with torch.inference_mode():
        for n, seed in ((1, 0), (7, 1), (32, 2), (2048, 3)):
            x = rows(n, n_features, seed)
            expected, got = module(x), direct(x)
            assert got.shape == expected.shape and got.dtype == expected.dtype
            assert torch.allclose(got, expected, rtol=0, atol=1e-6), (n, (got - expected).abs().max())
            assert torch.allclose(torch.softmax(got, 1), torch.softmax(expected, 1), rtol=0, atol=1e-6)


def test_direct_forward_answers_as_the_demo_models_exported_program(trained_dir):
    """The demo model as `make archive` packs it (trained, then exported by the same API)."""
    assert_same_answers(trained_dir / "model.pt2", 32)


def test_direct_forward_answers_as_a_program_the_project_never_defined(tmp_path):
    """Other operators (tanh, gelu, layer norm) of a model packaged with rtserve.model.package."""
    assert_same_answers(exported(tmp_path) / "model.pt2", 7)


def test_direct_forward_keeps_autograd_for_explanations(trained_dir):
    module, direct = load_program(trained_dir / "model.pt2"), load_program(trained_dir / "model.pt2", direct=True)
    grads = []
    for forward in (module, direct):
        x = rows(3, 32, 5).requires_grad_()
        forward(x)[:, 1].sum().backward()
        grads.append(x.grad)
    assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-6)


class _Program:
    """An exported program whose graph calls something that is not an ATen operator."""

    def __init__(self, real):
        self.graph_signature, self.state_dict, self.constants = (real.graph_signature, real.state_dict, real.constants)
        self.graph = torch.fx.Graph()
        x = self.graph.placeholder(real.graph_signature.user_inputs[0])
        for spec in real.graph_signature.input_specs[:-1]:
            self.graph.placeholder(spec.arg.name)
        y = self.graph.call_function(operator.neg, (x,))
        self.graph.output((y,))


def test_a_graph_it_does_not_take_falls_back_to_the_module_and_says_why(trained_dir, caplog, server_env):
    real = torch.export.load(str(trained_dir / "model.pt2"))
    forward, why = direct_forward(_Program(real))
    assert forward is None and "a call of <built-in function neg>" in why


@pytest.mark.parametrize(
    "setting,path", [(True, "direct forward (5 operators)"), (False, "exported module (handler.direct_forward off)")]
)
def test_the_worker_log_says_which_forward_runs(trained_dir, server_env, caplog, setting, path):
    cfg = {**MODEL_YAML, "handler": {**MODEL_YAML["handler"], "direct_forward": setting}}
    handler = RealTimeHandler()
    with caplog.at_level(logging.INFO, logger="handler.rtserve_handler"):
        handler.initialize(make_context(trained_dir, cfg))
    try:
        assert f"forward pass: {path}" in caplog.text
        assert isinstance(handler.model, DirectForward) is setting
    finally:
        handler.telemetry.close()
