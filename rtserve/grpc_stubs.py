"""Python gRPC stubs for TorchServe's APIs, generated at run time from the ``.proto`` files in
``proto/`` (TorchServe 0.12.0's own, see proto/README.md).

Needs ``grpcio`` and ``grpcio-tools`` (test tools, in requirements-dev.txt). Nothing is generated
at import time; :func:`generate` writes the modules into a directory of the caller's choice.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parent.parent
PROTO_DIR = REPO / "proto"
PROTOS = ("inference.proto", "management.proto", "open_inference_grpc.proto",
          "google/rpc/status.proto")


class StubError(RuntimeError):
    """``protoc`` failed to compile the proto files."""


def generate(out_dir: str | Path) -> SimpleNamespace:
    """Compile ``proto/*.proto`` into ``out_dir`` and import the generated modules.

    Returns:
        A namespace with ``inference_pb2``, ``inference_pb2_grpc``, ``management_pb2``,
        ``management_pb2_grpc``, ``open_inference_grpc_pb2`` and ``open_inference_grpc_pb2_grpc``.

    Raises:
        StubError: ``protoc`` reported an error.
    """
    import importlib.resources

    from grpc_tools import protoc

    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{well_known}", f"--python_out={out}",
                      f"--grpc_python_out={out}", *(str(PROTO_DIR / p) for p in PROTOS)])
    if rc != 0:
        raise StubError(f"protoc exited {rc} compiling {PROTO_DIR}")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    names = ("inference_pb2", "inference_pb2_grpc", "management_pb2", "management_pb2_grpc",
             "open_inference_grpc_pb2", "open_inference_grpc_pb2_grpc")
    return SimpleNamespace(**{name: importlib.import_module(name) for name in names})
