"""`make cluster-load` into the real node's containerd (``make cluster``): an image built with
podman is imported under its name, with podman's image ID as its config digest; a second load
skips it; another name of the same image is tagged without an import; a missing image is refused.

The image is a tiny one of this test's own (one file, a label unique to the run), so that the
node, whose containerd root outlives a cluster (CLUSTER_CONTAINERD_ROOT), never holds it yet;
the rtserve and gateway images go the same way in `make k8s-deploy OVERLAY=local`.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest

from bench.pod_report import podman
from rtserve.cluster import images
from tests.cluster.conftest import make

pytestmark = pytest.mark.cluster


@pytest.fixture
def tiny_image(tmp_path) -> tuple[str, str]:
    """(name, image ID) of a one-file image no node has seen; removed from podman and the node after."""
    run = uuid.uuid4().hex[:12]
    (tmp_path / "stamp").write_text(run)
    (tmp_path / "Containerfile").write_text("FROM scratch\nCOPY stamp /stamp\n")
    name = f"localhost/rtserve-load-check:{run}"
    image_id = podman("build", "-q", "--label", f"rtserve.load-check={run}", "-t", name, ".", cwd=tmp_path)
    yield name, f"sha256:{image_id}"
    podman("rmi", "--force", image_id)


def load(cluster, *names: str) -> subprocess.CompletedProcess:
    return make("cluster-load", f"CLUSTER_RUN_DIR={cluster.run_dir}", f"IMAGES={' '.join(names)}")


def test_an_image_is_imported_once_and_tagged_under_a_second_name(cluster, tiny_image):
    name, image_id = tiny_image
    short = image_id.removeprefix("sha256:")[:12]
    ctr = images.node_ctr(cluster.run_dir)
    second = name.replace("load-check:", "load-check:again-")
    try:
        first = load(cluster, name)
        assert first.returncode == 0, first.stdout
        assert re.search(
            rf"^>> loaded {re.escape(name)} \(0\.00 GB, image {short}\) in [\d.]+ s$", first.stdout, re.M
        ), first.stdout
        refs = ctr.images()
        assert images.NodeImages(ctr).config_of(refs[name]) == image_id  # podman's ID on the node
        assert not [r for r in refs if r.startswith("import-")], "no import-<date>@ names (--digests)"

        again = load(cluster, name)
        assert f">> {name} is on the node already (image {short}): skipped\n" in again.stdout, again.stdout
        assert ">> 1 image(s) on the node, 0 imported" in again.stdout

        podman("tag", name, second)
        tagged = load(cluster, second)
        assert f">> tagged {second} on the node: it held image {short} already\n" in tagged.stdout, tagged.stdout
        assert images.NodeImages(ctr).config_of(ctr.images()[second]) == image_id
    finally:
        held = ctr.images()
        left = [ref for ref in (name, second, image_id) if ref in held]
        if left:
            ctr("images", "rm", *left)


def test_a_second_version_copies_only_its_new_layer_and_the_cache_keeps_one_image(cluster, tmp_path):
    """Version images share every layer but their last: the load's layer cache (skopeo's OCI
    layout) copies the shared ones once, keeps one image per repository, and the node runs it."""
    run = uuid.uuid4().hex[:12]
    (tmp_path / "shared").write_bytes(run.encode() * 100_000)
    (tmp_path / "version").write_text(run)
    (tmp_path / "Base").write_text("FROM scratch\nCOPY shared /shared\n")
    name = f"localhost/rtserve-layer-check:{run}"
    base = podman("build", "-q", "-f", "Base", "-t", f"{name}-1", ".", cwd=tmp_path)
    (tmp_path / "Next").write_text(f"FROM {base}\nCOPY version /version\n")
    nxt = podman("build", "-q", "-f", "Next", "-t", f"{name}-2", ".", cwd=tmp_path)
    layers, ctr = tmp_path / "layers", images.node_ctr(cluster.run_dir)
    layout = layers / "localhost_rtserve-layer-check"
    blobs = layout / "blobs" / "sha256"

    def cache_load(tag: str) -> subprocess.CompletedProcess:
        done = make("cluster-load", f"CLUSTER_RUN_DIR={cluster.run_dir}", f"CLUSTER_LAYERS={layers}", f"IMAGES={tag}")
        assert done.returncode == 0, done.stdout
        return done

    try:
        cache_load(f"{name}-1")
        (shared,) = json.loads(podman("image", "inspect", "--format", "{{json .RootFS.Layers}}", base))
        shared_blob = blobs / shared.removeprefix("sha256:")
        first = shared_blob.stat()
        assert first.st_size > 1_000_000, "the shared layer, uncompressed, in the cache"
        cache_load(f"{name}-2")
        again = shared_blob.stat()
        assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns), "the shared layer copied again"
        index = json.loads((layout / "index.json").read_text())
        assert len(index["manifests"]) == 1, index
        manifest = json.loads((blobs / index["manifests"][0]["digest"].removeprefix("sha256:")).read_bytes())
        assert manifest["config"]["digest"] == f"sha256:{nxt}"
        named = {
            manifest["config"]["digest"],
            index["manifests"][0]["digest"],
            *(x["digest"] for x in manifest["layers"]),
        }
        assert {f"sha256:{p.name}" for p in blobs.iterdir()} == named, "the first version's config left in the cache"
        node = images.NodeImages(ctr)
        assert node.config_of(ctr.images()[f"{name}-2"]) == f"sha256:{nxt}" and node.unpacked(f"{name}-2")
    finally:
        held = ctr.images()
        left = [ref for ref in (f"{name}-1", f"{name}-2") if ref in held]
        if left:
            ctr("images", "rm", *left)
        podman("rmi", "--force", nxt, base)


def test_a_missing_image_or_a_stopped_cluster_is_refused_by_name(cluster, tmp_path):
    missing = load(cluster, "localhost/rtserve-load-check:never-built")
    assert missing.returncode != 0
    assert "error: podman has no image localhost/rtserve-load-check:never-built: build it first" in missing.stdout
    nowhere = make("cluster-load", f"CLUSTER_RUN_DIR={tmp_path}", "IMAGES=localhost/x:1")
    assert nowhere.returncode != 0
    assert f"error: no cluster was started from {tmp_path} (make cluster)" in nowhere.stdout
