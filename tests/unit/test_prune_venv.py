"""deploy/podman/prune_venv.py on a small virtualenv tree made here (the image's builder stage runs
it on the real one; the pod tier then imports torch and answers predictions in that image)."""

from pathlib import Path

import pytest

from deploy.podman import prune_venv

pytestmark = pytest.mark.unit


def _venv(tmp_path: Path) -> Path:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    files = [
        "triton/__init__.py",
        "triton/backends/nvidia/lib/libcuda_stub.so",
        "triton-3.7.0.dist-info/METADATA",
        "torch/__init__.py",
        "torch/bin/torch_shm_manager",
        "torch/bin/protoc",
        "torch/test/data.bin",
        "numpy/tests/test_x.py",
        "nvidia/cu13/lib/libcudart.so.13",
        "rtmod/__init__.py",
    ]
    for name in files:
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"x" * 100)
    return site


def test_removes_triton_tests_and_torch_binaries_keeps_cuda_libraries(tmp_path, capsys):
    site = _venv(tmp_path)
    modules = tmp_path / "modules.txt"
    modules.write_text("torch\nnumpy\n")
    assert prune_venv.main(str(tmp_path / "venv"), str(modules)) == 0
    assert not (site / "triton").exists() and not (site / "triton-3.7.0.dist-info").exists()
    assert not (site / "numpy" / "tests").exists() and not (site / "torch" / "test").exists()
    assert sorted(p.name for p in (site / "torch" / "bin").iterdir()) == ["torch_shm_manager"]
    assert (site / "nvidia" / "cu13" / "lib" / "libcudart.so.13").exists()
    assert "pruned 0 MB: packages never imported (triton)" in capsys.readouterr().out


def test_refuses_to_remove_a_package_the_runtime_imports(tmp_path):
    site = _venv(tmp_path)
    modules = tmp_path / "modules.txt"
    modules.write_text("torch\ntriton.language\n")
    with pytest.raises(SystemExit, match="triton is imported by rtserve's runtime modules"):
        prune_venv.main(str(tmp_path / "venv"), str(modules))
    assert (site / "triton" / "__init__.py").exists()
