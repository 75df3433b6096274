"""gRPC stubs generated from the installed TorchServe frontend jar (rtserve.client.grpc_stubs): the
jar's protos are the ones compiled, the stubs are cached by the jar, and the generated services
are the ones the installed server's compiled Java classes serve."""

from __future__ import annotations

import re
import struct
import zipfile
from pathlib import Path

import pytest

from rtserve.client import grpc_stubs as grpc_stubs
from rtserve.client.grpc_stubs import PROTOS, StubError, frontend_jar, generate, jar_protos, stub_dir

pytestmark = pytest.mark.unit

#: TorchServe's own APIs: every .proto in the jar that is not googleapis' or protobuf's.
TORCHSERVE_PROTOS = {"inference.proto", "management.proto", "open_inference_grpc.proto"}


@pytest.fixture(scope="module")
def jar() -> Path:
    return frontend_jar()


def test_the_jar_is_the_installed_torchserves(jar):
    import ts

    assert jar == Path(ts.__file__).parent / "frontend" / "model-server.jar"
    protos = jar_protos(jar)
    own = {p for p in protos if not p.startswith("google/")}
    # Each API at the root and the same file again under proto/; nothing else of TorchServe's.
    assert own == TORCHSERVE_PROTOS | {f"proto/{p}" for p in TORCHSERVE_PROTOS}
    with zipfile.ZipFile(jar) as archive:
        for name in TORCHSERVE_PROTOS:
            assert archive.read(name) == archive.read(f"proto/{name}")
    assert "google/rpc/status.proto" in protos


def test_exactly_the_servers_apis_are_extracted_and_compiled(tmp_path):
    out = stub_dir(tmp_path)
    assert out.parent == tmp_path.resolve()
    extracted = sorted(str(p.relative_to(out / "proto")) for p in (out / "proto").rglob("*.proto"))
    assert extracted == sorted(PROTOS)
    assert sorted(PROTOS) == sorted(TORCHSERVE_PROTOS | {"google/rpc/status.proto"})
    generated = sorted(str(p.relative_to(out)) for p in out.rglob("*.py"))
    assert generated == sorted(
        f"{name.removesuffix('.proto')}_pb2{kind}.py" for name in PROTOS for kind in ("", "_grpc")
    )


def test_stubs_are_generated_once_per_jar(tmp_path, monkeypatch):
    first = stub_dir(tmp_path)
    stamp = (first / "inference_pb2.py").stat().st_mtime_ns

    def no_second_compile(*args):
        raise AssertionError("compiled again although the stubs of this jar are cached")

    monkeypatch.setattr(grpc_stubs, "compile_protos", no_second_compile)
    assert stub_dir(tmp_path) == first
    assert (first / "inference_pb2.py").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name], "a work directory was left"


def test_a_jar_without_the_protos_is_refused(tmp_path):
    jar = tmp_path / "model-server.jar"
    with zipfile.ZipFile(jar, "w") as archive:
        archive.writestr("inference.proto", 'syntax = "proto3";\n')
    with pytest.raises(StubError, match="has no google/rpc/status.proto, management.proto, open_inference_grpc.proto"):
        stub_dir(tmp_path / "cache", jar=jar)
    assert not any((tmp_path / "cache").rglob("*.py")), "stubs from an incomplete jar"


def class_strings(data: bytes) -> set[str]:
    """The UTF-8 constants of a Java class file's constant pool (JVM spec 4.4)."""
    assert data[:4] == b"\xca\xfe\xba\xbe"
    (count,) = struct.unpack_from(">H", data, 8)
    sizes = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}
    strings, pos, index = set(), 10, 1
    while index < count:
        tag = data[pos]
        if tag == 1:
            (length,) = struct.unpack_from(">H", data, pos + 1)
            strings.add(data[pos + 3 : pos + 3 + length].decode("utf-8", "replace"))
            pos += 3 + length
        else:
            pos += 1 + sizes[tag]
        index += 2 if tag in (5, 6) else 1
    return strings


def test_generated_services_are_the_ones_the_installed_server_serves(jar):
    """Every service in the generated stubs against the server's own compiled ``*Grpc`` class
    (grpc-java's generated code): the same full service name and the same methods."""
    stubs = generate()
    services = {}
    for module in (stubs.inference_pb2, stubs.management_pb2, stubs.open_inference_grpc_pb2):
        # grpc-java's package: java_package if the file sets it, else the proto package.
        java_package = module.DESCRIPTOR.GetOptions().java_package or module.DESCRIPTOR.package
        for service in module.DESCRIPTOR.services_by_name.values():
            services[service.full_name] = (java_package, service)
    assert set(services) == {
        "org.pytorch.serve.grpc.inference.InferenceAPIsService",
        "org.pytorch.serve.grpc.management.ManagementAPIsService",
        "org.pytorch.serve.grpc.openinference.GRPCInferenceService",
    }
    with zipfile.ZipFile(jar) as archive:
        for full_name, (java_package, service) in services.items():
            path = f"{java_package.replace('.', '/')}/{service.name}Grpc.class"
            strings = class_strings(archive.read(path))
            assert full_name in strings
            served = {m.group(1) for s in strings if (m := re.fullmatch(r"get(\w+)Method", s))}
            assert served == set(service.methods_by_name), full_name
            # and the Python stub class offers each of them
            module = getattr(stubs, f"{service.file.name.removesuffix('.proto')}_pb2_grpc")
            stub_class = getattr(module, f"{service.name}Stub")
            for method in served:
                assert f"/{full_name}/{method}" in stub_class.__init__.__code__.co_consts
    inference = services["org.pytorch.serve.grpc.inference.InferenceAPIsService"][1]
    assert set(inference.methods_by_name) == {"Ping", "Predictions", "StreamPredictions", "StreamPredictions2"}
