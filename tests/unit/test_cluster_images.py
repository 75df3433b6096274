"""rtserve.cluster.images: when an image is skipped, tagged or imported, how a node's image ID is
read through a manifest or an index, and the errors for a missing cluster, node or image.

No podman or containerd runs in the unit tier, so the engine and ``ctr`` of the streamed import
are small stand-in scripts (an engine whose ``save`` writes bytes or fails, a ``ctr`` that reads
its input to the end or fails); the real load into a node's containerd is tests/cluster/test_images.py.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from rtserve.cluster import images
from rtserve.cluster.containerd import Ctr
from rtserve.cluster.images import Loaded, Local, config_digest, plan
from rtserve.errors import ClusterError, CommandError, ImageNotFound

pytestmark = pytest.mark.unit

ID = "sha256:" + "6c99a55ac8b2" + "0" * 52
OTHER = "sha256:" + "b84c32b43474" + "0" * 52
IMAGE = Local("registry.example.com/ml/rtserve:1.0", ID, 4_640_000_000)
MANIFEST = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": ID},
    "layers": [],
}


def blobs(**docs: dict):
    """A content store: digest -> its JSON document."""
    return lambda digest: docs[digest.removeprefix("sha256:")]


def test_the_image_id_is_the_config_of_the_manifest_a_name_points_to():
    assert config_digest("sha256:m1", blobs(m1=MANIFEST)) == ID


def test_an_index_is_followed_to_this_platforms_manifest_or_gives_none():
    index = {
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"digest": "sha256:arm", "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": "sha256:amd", "platform": {"os": "linux", "architecture": "amd64"}},
        ],
    }
    other = {**MANIFEST, "config": {"digest": OTHER}}
    fetch = blobs(idx=index, amd=MANIFEST, arm=other)
    assert config_digest("sha256:idx", fetch, ("linux", "amd64")) == ID
    assert config_digest("sha256:idx", fetch, ("linux", "arm64")) == OTHER
    assert config_digest("sha256:idx", fetch, ("linux", "s390x")) is None


def test_present_when_the_name_points_to_the_same_image():
    refs = {IMAGE.name: "sha256:m1", ID: "sha256:m1"}
    assert plan(IMAGE, refs, {"sha256:m1": ID}.get) == "present"


def test_tagged_when_the_node_holds_the_id_under_another_name_only():
    """CRI names every image it holds sha256:<ID>: the name is added without an import."""
    refs = {"registry.example.com/ml/rtserve:pytest-1.0": "sha256:m1", ID: "sha256:m1"}
    assert plan(IMAGE, refs, {"sha256:m1": ID}.get) == "tag"


def test_imported_when_the_name_points_to_another_build_or_nothing():
    rebuilt = {IMAGE.name: "sha256:old", OTHER: "sha256:old"}
    assert plan(IMAGE, rebuilt, {"sha256:old": OTHER}.get) == "import"
    assert plan(IMAGE, {}, {}.get) == "import"
    # a name whose manifest is gone from the content store (config_of: None) is no match
    assert plan(IMAGE, {IMAGE.name: "sha256:gone"}, {}.get) == "import"


def test_each_outcome_says_what_happened_in_one_line():
    assert (
        Loaded(IMAGE, "imported", 116.74).line()
        == ">> loaded registry.example.com/ml/rtserve:1.0 (4.64 GB, image 6c99a55ac8b2) in 116.7 s"
    )
    assert (
        Loaded(IMAGE, "present").line()
        == ">> registry.example.com/ml/rtserve:1.0 is on the node already (image 6c99a55ac8b2): skipped"
    )
    assert (
        Loaded(IMAGE, "tagged").line()
        == ">> tagged registry.example.com/ml/rtserve:1.0 on the node: it held image 6c99a55ac8b2 already"
    )


def state(run_dir: Path, **values: str) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "state.json").write_text(json.dumps({"api_url": "https://127.0.0.1:6443", **values}))
    return run_dir


def test_no_cluster_no_node_or_a_stopped_one_is_a_clear_error(tmp_path):
    with pytest.raises(ClusterError, match=r"no cluster was started from .*nowhere \(make cluster\)"):
        images.node_ctr(tmp_path / "nowhere")
    with pytest.raises(ClusterError, match="has no node: its state file records no containerd_address"):
        images.node_ctr(state(tmp_path / "control-plane-only"))
    gone = tmp_path / "stopped" / "containerd.sock"
    with pytest.raises(ClusterError, match=f"the node's containerd does not run: no socket at {gone}"):
        images.node_ctr(state(tmp_path / "stopped", containerd_address=str(gone)))


def test_a_running_nodes_socket_gives_its_ctr(tmp_path):
    path = tmp_path / "c.sock"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        ctr = images.node_ctr(state(tmp_path / "run", containerd_address=str(path)))
    assert ctr.argv("images", "ls") == ["ctr", "--address", str(path), "-n", "k8s.io", "images", "ls"]


def stand_in(path: Path, body: str) -> str:
    path.write_text(f"#!{sys.executable}\nimport json, sys\nargs = sys.argv[1:]\n{body}")
    path.chmod(0o755)
    return str(path)


ENGINE = """
if args[:2] == ["image", "inspect"]:
    known = {"localhost/gw:1": "c66dafbde504" + "0" * 52}
    if args[2] not in known:
        sys.stderr.write(f"Error: {args[2]}: image not known\\n"); sys.exit(125)
    print(json.dumps([{"Id": known[args[2]], "RepoTags": ["localhost/gw:1"], "Size": 272000000}]))
elif args[0] == "save":
    if "FAIL" in args[-1]:
        sys.stderr.write("Error: layer is gone\\n"); sys.exit(125)
    sys.stdout.buffer.write(b"x" * 1_000_000)
"""


def test_an_image_the_engine_lacks_or_names_otherwise_is_refused(tmp_path):
    engine = stand_in(tmp_path / "podman", ENGINE)
    found = images.local_image("localhost/gw:1", engine)
    assert found == Local("localhost/gw:1", "sha256:c66dafbde504" + "0" * 52, 272000000)
    with pytest.raises(
        ImageNotFound,
        match=r"has no image localhost/rtserve:9.9: build it first \(make "
        r"image MODEL_VERSION=\.\.\. DOCKER=.*: image not known",
    ):
        images.local_image("localhost/rtserve:9.9", engine)


def test_the_streamed_import_reports_the_failing_side(tmp_path):
    """The engine's failure is the cause when its stream was cut; ctr's when it stopped reading."""
    engine = stand_in(tmp_path / "podman", ENGINE)
    reads = stand_in(tmp_path / "ctr-ok", "n = len(sys.stdin.buffer.read()); print(f'unpacking ({n} bytes)...done')")
    refuses = stand_in(tmp_path / "ctr-bad", "sys.stderr.write('ctr: unrecognized image format\\n'); sys.exit(1)")
    node = images.NodeImages(Ctr(tmp_path / "c.sock", reads))
    assert node.import_from(engine, Local("localhost/gw:1", ID, 1)) > 0
    with pytest.raises(
        CommandError,
        match=r"/podman save --format docker-archive localhost/FAIL exited "
        r"with 125:\nError: layer is gone",
    ):
        node.import_from(engine, Local("localhost/FAIL", ID, 1))
    node = images.NodeImages(Ctr(tmp_path / "c.sock", refuses))
    with pytest.raises(ClusterError, match="images import - exited 1: ctr: unrecognized image format"):
        node.import_from(engine, Local("localhost/gw:1", ID, 1))
    with pytest.raises(
        ClusterError,
        match=r"(?s)images import - exited 1: ctr: unrecognized image format\n"
        r"and .*/podman save --format docker-archive localhost/FAIL exited "
        r"with 125:\nError: layer is gone",
    ):
        node.import_from(engine, Local("localhost/FAIL", ID, 1))


def test_the_oci_archive_of_new_layers_names_the_image_and_leaves_out_what_the_node_holds(tmp_path):
    import hashlib
    import io
    import json
    import tarfile

    from rtserve.cluster.images import oci_archive

    config, new = tmp_path / "config", tmp_path / "layer"
    config.write_bytes(b'{"rootfs": {}}')
    new.write_bytes(b"new layer")
    manifest = json.dumps(
        {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"digest": "sha256:c"},
            "layers": [{"digest": "sha256:old"}, {"digest": "sha256:new"}],
        }
    ).encode()
    out = io.BytesIO()
    oci_archive("registry.example.com/ml/rtserve:2.0", manifest, {"sha256:c": config, "sha256:new": new})(out)
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        names = tar.getnames()
        index = json.load(tar.extractfile("index.json"))
    digest = hashlib.sha256(manifest).hexdigest()
    assert names == ["oci-layout", "index.json", f"blobs/sha256/{digest}", "blobs/sha256/c", "blobs/sha256/new"]
    entry = index["manifests"][0]
    assert entry["digest"] == f"sha256:{digest}" and entry["size"] == len(manifest)
    assert entry["annotations"]["io.containerd.image.name"] == "registry.example.com/ml/rtserve:2.0"


class NodeCtr:
    """A node's ``ctr`` holding IMAGE under its name, unpacked or not (``images check``)."""

    def __init__(self, unpacked: bool) -> None:
        self.unpacked, self.calls = unpacked, []

    def images(self) -> dict[str, str]:
        return {IMAGE.name: "sha256:" + "a" * 64}

    def __call__(self, *args: str, stdin=None, timeout: float = 120) -> str:
        self.calls.append(args)
        if args[:2] == ("content", "get"):
            return json.dumps(MANIFEST)
        if args[:2] == ("images", "check"):
            return (
                f"REF TYPE DIGEST STATUS SIZE UNPACKED\n{IMAGE.name} application/vnd.oci.image.manifest.v1+json "
                f"sha256:{'a' * 64} complete (12/12) 4.3 GiB/4.3 GiB {str(self.unpacked).lower()}\n"
            )
        raise AssertionError(f"unexpected ctr {args}")


@pytest.mark.parametrize("unpacked", [True, False])
def test_a_name_on_the_node_is_skipped_only_when_its_layers_are_unpacked(monkeypatch, unpacked):
    """A fresh clone's first deploy met a name whose import had failed mid-unpack: ctr names the
    image before it unpacks it, so the name alone says nothing about a container's start."""
    imported, said = [], []
    monkeypatch.setattr(images, "local_image", lambda name, engine: IMAGE)
    monkeypatch.setattr(
        images.NodeImages, "import_new_layers", lambda node, engine, image, **kw: imported.append(image) or 1.0
    )
    ctr = NodeCtr(unpacked)
    (loaded,) = images.load(ctr, [IMAGE.name], "podman", said.append)
    assert ("images", "check", f"name=={IMAGE.name}") in ctr.calls
    if unpacked:
        assert loaded.action == "present" and imported == []
    else:
        assert loaded.action == "imported" and imported == [IMAGE]
        assert "not unpacked (an import cut short): importing it again" in said[0]


def test_a_failed_import_is_tried_once_more_and_a_second_failure_is_raised():
    said, calls = [], []

    def flaky(failures: int):
        def into(engine: str, image: Local) -> float:
            calls.append(image)
            if len(calls) <= failures:
                raise ClusterError("ctr images import exited 1\nctr: parent snapshot sha256:ebd5 does not exist")
            return 1.0

        return into

    assert images.import_twice(flaky(1), "podman", IMAGE, said.append) >= 0
    assert len(calls) == 2 and "does not exist): once more" in said[0]
    calls.clear()
    with pytest.raises(ClusterError, match="does not exist"):
        images.import_twice(flaky(2), "podman", IMAGE, said.append)
    assert len(calls) == 2
