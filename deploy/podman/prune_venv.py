"""Trim a built virtualenv to what runs (used by the Dockerfile's builder stage).

    python -m deploy.podman.prune_venv --list > runtime-modules.txt   # `make image`, on the host
    python prune_venv.py VENV runtime-modules.txt                     # in the builder stage

Removes test suites (``tests`` packages, torch's ``test`` data and C++ test binaries) and keeps
compiled bytecode only for the modules rtserve actually imports (the server, the probes, the
worker and the handler with its explanations): the image's root filesystem is read-only, so
those must be precompiled; any other module still has its source and is compiled in memory if it
is ever imported. Prints what it removed.

Which modules rtserve imports is listed on the host (``--list``: the third-party modules that
importing ``RUNTIME_MODULES`` loads, from the same pinned wheels), so the builder stage needs
only that list, not rtserve's code: the pruned virtualenv's layer is rebuilt when the list
changes, not on every change to rtserve.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import shutil
import sys
from pathlib import Path

#: What the server container runs: the handler, the probes, the frontend's worker, rtserve.
RUNTIME_MODULES = ("handler.rtserve_handler", "handler.explain", "rtserve.server", "rtserve.probe",
                   "rtserve.oip", "rtserve.gateway", "ts.model_service_worker", "ts.service",
                   "ts.torch_handler.base_handler", "ts.model_loader", "captum.attr", "psutil",
                   "requests", "yaml", "numpy")
#: Packages rtserve never imports that torch's wheel pulls in: Triton is the GPU kernel compiler of
#: ``torch.compile`` / Inductor (about 0.7 GB); the handler runs exported programs as they are,
#: so neither the CPU nor the CUDA path loads it (``--list`` would name it if it did: main()
#: refuses to remove a package that is on the list). The CUDA libraries torch links against
#: (``nvidia/*``) are all kept: ``import torch`` loads them.
NEVER_IMPORTED = ("triton",)
#: torch/bin: C++ test programs and protoc, none used by torch at run time, but the shared-memory
#: manager that torch.multiprocessing starts.
TORCH_BIN_KEEP = {"torch_shm_manager"}


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def runtime_modules() -> list[str]:
    """Third-party modules (in a site-packages folder) loaded by importing ``RUNTIME_MODULES``."""
    with contextlib.redirect_stdout(io.StringIO()):  # what some imports print is not a module
        for name in RUNTIME_MODULES:
            importlib.import_module(name)
    return sorted(name for name, m in list(sys.modules.items())
                  if "site-packages" in str(getattr(m, "__file__", None) or ""))


def main(venv: str, modules_file: str) -> int:
    site = next(Path(venv).glob("lib/python3*/site-packages"))
    never = f"packages never imported ({', '.join(NEVER_IMPORTED)})"
    removed = {"tests": 0, "torch test data and binaries": 0, "bytecode of modules never imported": 0,
               never: 0}
    listed = {name.split(".")[0] for name in Path(modules_file).read_text().split()}
    for name in NEVER_IMPORTED:
        if name in listed:
            raise SystemExit(f"{name} is imported by rtserve's runtime modules: it cannot be pruned")
        for path in [site / name, *site.glob(f"{name}-*.dist-info")]:
            if path.exists():
                removed[never] += size(path)
                shutil.rmtree(path)
    for tests in [p for p in site.glob("**/tests") if p.is_dir()]:
        if tests.exists():
            removed["tests"] += size(tests)
            shutil.rmtree(tests)
    for path in [site / "torch" / "test", *(p for p in (site / "torch" / "bin").iterdir()
                                             if p.name not in TORCH_BIN_KEEP)]:
        if path.exists():
            removed["torch test data and binaries"] += size(path)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    failed = []
    for name in Path(modules_file).read_text().split():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - its bytecode is simply not kept; said below
            failed.append(name)
    if failed:
        print(f"not importable here, bytecode not kept: {', '.join(failed)}")
    keep = {Path(cached) for m in list(sys.modules.values())
            if isinstance(cached := getattr(m, "__cached__", None), str)}
    for pyc in site.rglob("*.pyc"):
        if pyc not in keep:
            removed["bytecode of modules never imported"] += pyc.stat().st_size
            pyc.unlink()
    for what, n in removed.items():
        print(f"pruned {n / 1e6:.0f} MB: {what}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print("\n".join(runtime_modules()))
        sys.exit(0)
    sys.exit(main(*sys.argv[1:3]))
