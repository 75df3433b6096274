"""Python gRPC stubs for TorchServe's APIs, generated from the ``.proto`` files in the installed frontend jar.

So the client speaks exactly what the installed server speaks, and no protocol file is copied here. They are compiled
once per jar (its SHA-256) and grpcio-tools version into ``<cache_dir>/<key>/``; later calls only import. Needs
``grpcio`` and ``grpcio-tools`` (requirements-dev.txt; the image has neither); nothing is generated at import time.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.resources
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from types import SimpleNamespace

from rtserve.errors import StubError
from rtserve.settings import Settings

#: The jar entries compiled: TorchServe's three APIs and the googleapis file they import.
PROTOS = ("inference.proto", "management.proto", "open_inference_grpc.proto", "google/rpc/status.proto")
#: The modules :func:`generate` returns.
MODULES = (
    "inference_pb2",
    "inference_pb2_grpc",
    "management_pb2",
    "management_pb2_grpc",
    "open_inference_grpc_pb2",
    "open_inference_grpc_pb2_grpc",
)
_DONE = ".complete"


def default_cache_dir() -> Path:
    """Where the stubs are generated unless the caller names another directory: ``build/grpc`` of the checkout.

    Git-ignored.
    """
    return Settings().build_dir / "grpc"


def frontend_jar() -> Path:
    """The installed TorchServe frontend jar, found through the installed ``ts`` package.

    Raises:
        StubError: TorchServe is not installed, or its package has no frontend jar.
    """
    try:
        jar = Path(str(importlib.resources.files("ts") / "frontend" / "model-server.jar"))
    except ModuleNotFoundError as exc:
        raise StubError("TorchServe (the ts package) is not installed") from exc
    if not jar.is_file():
        raise StubError(f"TorchServe's frontend jar is missing: {jar}")
    return jar


def jar_protos(jar: Path) -> list[str]:
    """Every ``.proto`` entry in ``jar``, sorted."""
    with zipfile.ZipFile(jar) as archive:
        return sorted(name for name in archive.namelist() if name.endswith(".proto"))


def cache_key(jar: Path) -> str:
    """The jar's SHA-256 (16 hex digits) and the compiler's version: what the stubs depend on."""
    digest = hashlib.sha256()
    with jar.open("rb") as data:
        for block in iter(lambda: data.read(1 << 20), b""):
            digest.update(block)
    return f"{digest.hexdigest()[:16]}-grpcio-tools-{importlib.metadata.version('grpcio-tools')}"


def extract(jar: Path, dest: Path) -> list[Path]:
    """Copy :data:`PROTOS` out of ``jar`` into ``dest``, keeping their paths.

    Raises:
        StubError: the jar lacks one of them.
    """
    with zipfile.ZipFile(jar) as archive:
        missing = sorted(set(PROTOS) - set(archive.namelist()))
        if missing:
            raise StubError(f"{jar} has no {', '.join(missing)}")
        paths = []
        for name in PROTOS:
            path = dest / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(archive.read(name))
            paths.append(path)
    return paths


def compile_protos(jar: Path, out: Path) -> None:
    """Extract the jar's protos into ``out/proto`` and compile them into ``out``.

    Raises:
        StubError: as :func:`extract`, or ``protoc`` reported an error.
    """
    from grpc_tools import protoc

    sources = out / "proto"
    paths = extract(jar, sources)
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    rc = protoc.main(
        [
            "protoc",
            f"-I{sources}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            *(str(p) for p in paths),
        ]
    )
    if rc != 0:
        raise StubError(f"protoc exited {rc} compiling the protos of {jar}")


def stub_dir(cache_dir: str | Path | None = None, jar: Path | None = None) -> Path:
    """The directory holding the stubs for ``jar`` (default: the installed one).

    Generated there first unless a previous call did.

    Raises:
        StubError: as :func:`frontend_jar` and :func:`compile_protos`.
    """
    jar = jar or frontend_jar()
    root = Path(cache_dir or default_cache_dir()).resolve()
    out = root / cache_key(jar)
    if (out / _DONE).is_file():
        return out
    root.mkdir(parents=True, exist_ok=True)
    # Generated beside the final place, then renamed into it: a concurrent caller (another test
    # process) either finds the complete directory or loses the rename and uses the winner's.
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=root))
    try:
        compile_protos(jar, work)
        (work / _DONE).write_text(f"{jar}\n")
        try:
            os.rename(work, out)
        except OSError:
            if not (out / _DONE).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def generate(cache_dir: str | Path | None = None) -> SimpleNamespace:
    """Stubs for the installed server's gRPC APIs, imported (generated first if not cached).

    Args:
        cache_dir: where the generated directories live (default :func:`default_cache_dir`).

    Returns:
        A namespace with ``inference_pb2``, ``inference_pb2_grpc``, ``management_pb2``,
        ``management_pb2_grpc``, ``open_inference_grpc_pb2`` and ``open_inference_grpc_pb2_grpc``.

    Raises:
        StubError: the jar is missing or incomplete, or ``protoc`` reported an error.
    """
    out = str(stub_dir(cache_dir))
    if out not in sys.path:
        sys.path.insert(0, out)
    return SimpleNamespace(**{name: importlib.import_module(name) for name in MODULES})
