"""Load images built on this machine into the local cluster's node (``ctr images import``, no registry).

With podman only the layers the node lacks are sent; with Docker its ``save`` is streamed whole. An image the
node holds is skipped: compared by config digest (the engine's image ID), never manifest digest, which ctr
rewrites. :func:`config_digest` and :func:`plan` are pure; :func:`load` runs the commands.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import io
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rtserve.cluster.containerd import Ctr
from rtserve.cluster.runtime import load_state
from rtserve.cluster.sandbox import architecture
from rtserve.errors import ClusterError, CommandError, ImageNotFound, ProcessError
from rtserve.runtime.process import last_lines, run

#: What ``make cluster`` records in its state file: the node's containerd socket.
ADDRESS_KEY = "containerd_address"
#: Seconds for one image's save and import (4.6 GB: about two minutes here), and for a query.
LOAD_TIMEOUT = 1800.0
QUERY_TIMEOUT = 60.0
INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
#: The exit status of a process killed by SIGPIPE (its reader went away).
SIGPIPE_EXIT = -13
#: The OCI layout's name of a manifest.
ANNOTATION = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class Local:
    """An image in the engine's store: the name asked for, its ID (``sha256:...``), its size."""

    name: str
    id: str
    size: int


@dataclass(frozen=True)
class Loaded:
    """What :func:`load` did with one image.

    ``action``: ``imported`` (in ``seconds``), ``tagged`` (the node held its ID under another name) or ``present``.
    """

    image: Local
    action: str
    seconds: float = 0.0

    def line(self) -> str:
        short = self.image.id.removeprefix("sha256:")[:12]
        if self.action == "imported":
            return (
                f">> loaded {self.image.name} ({self.image.size / 1e9:.2f} GB, image {short}) in {self.seconds:.1f} s"
            )
        if self.action == "tagged":
            return f">> tagged {self.image.name} on the node: it held image {short} already"
        return f">> {self.image.name} is on the node already (image {short}): skipped"


def node_ctr(run_dir: Path, binary: str = "ctr") -> Ctr:
    """``ctr`` for the node of the cluster started from ``run_dir`` (its state file).

    Raises:
        ClusterError: no cluster was started there, it records no containerd, or the socket is
            gone (the cluster is stopped).
    """
    address = load_state(run_dir).get(ADDRESS_KEY)
    if not address:
        raise ClusterError(
            f"the cluster of {run_dir} has no node: its state file records no "
            f"{ADDRESS_KEY} (start it with make cluster)"
        )
    try:
        is_socket = stat.S_ISSOCK(os.stat(address).st_mode)
    except OSError:
        is_socket = False
    if not is_socket:
        raise ClusterError(
            f"the node's containerd does not run: no socket at {address} (start the cluster with make cluster)"
        )
    return Ctr(Path(address), binary)


def local_image(name: str, engine: str = "podman") -> Local:
    """The engine's image ``name``, a name exactly as the engine lists it.

    That is the name the node and the pod spec use.

    Raises:
        ImageNotFound: the engine has no image of that name, or knows it only by another name.
    """
    done = run([engine, "image", "inspect", name], QUERY_TIMEOUT, check=False, apart=True)
    if done.returncode != 0:
        raise ImageNotFound(
            f"{engine} has no image {name}: build it first (make image "
            f"MODEL_VERSION=... DOCKER={engine}, or make image-gateway DOCKER={engine}); "
            f"{engine} said: {done.stderr.strip()}"
        )
    (info,) = json.loads(done.stdout)
    tags = info.get("RepoTags") or []
    if name not in tags:
        raise ImageNotFound(
            f"{engine} knows {name} as {', '.join(tags) or 'no name'}: give the full "
            "name (the one the pod spec uses), e.g. registry.example.com/ml/rtserve:1.0"
        )
    image_id = info["Id"] if info["Id"].startswith("sha256:") else f"sha256:{info['Id']}"
    return Local(name, image_id, int(info.get("Size") or 0))


def config_digest(
    target: str, fetch: Callable[[str], dict], platform: tuple[str, str] = ("linux", "amd64")
) -> str | None:
    """The config digest (the image ID) of the manifest ``target`` names, or None.

    An index is followed to ``platform``'s manifest (None when it has none). ``fetch`` reads a blob as JSON.
    """
    doc = fetch(target)
    if doc.get("mediaType") in INDEX_TYPES or ("manifests" in doc and "config" not in doc):
        for entry in doc.get("manifests", []):
            p = entry.get("platform") or {}
            if (p.get("os"), p.get("architecture")) == platform:
                return config_digest(entry["digest"], fetch, platform)
        return None
    return (doc.get("config") or {}).get("digest")


def plan(image: Local, refs: dict[str, str], config_of: Callable[[str], str | None]) -> str:
    """What to do with ``image`` on a node whose names point as ``refs`` says.

    ``present`` (its name points to the same image), ``tag`` (``sha256:<ID>``, the CRI plugin's name
    for an image it holds, does), else ``import``.
    """
    if image.name in refs and config_of(refs[image.name]) == image.id:
        return "present"
    if image.id in refs and config_of(refs[image.id]) == image.id:
        return "tag"
    return "import"


class NodeImages:
    """The node's images through its ``ctr``: their config digests, a tag, a streamed import."""

    def __init__(self, ctr: Ctr) -> None:
        self.ctr = ctr

    def config_of(self, target: str) -> str | None:
        try:
            return config_digest(target, lambda d: json.loads(self.ctr("content", "get", d)), ("linux", architecture()))
        except (ClusterError, ValueError):
            return None  # a blob not (or no longer) in the content store: not this image

    def tag(self, source: str, name: str) -> None:
        self.ctr("images", "tag", "--force", source, name)

    def unpacked(self, name: str) -> bool:
        """Whether the snapshotter holds ``name``'s layers unpacked (``ctr images check``'s last column).

        An import whose unpack failed leaves the name on the image all the same.
        """
        for line in self.ctr("images", "check", f"name=={name}", timeout=QUERY_TIMEOUT).splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == name:
                return fields[-1] == "true"
        return False

    def import_new_layers(
        self, engine: str, image: Local, timeout: float = LOAD_TIMEOUT, layers: Path | None = None
    ) -> float:
        """Import ``image`` sending only the layers the node lacks; returns the seconds.

        ``skopeo`` copies the image from podman's store into an OCI layout kept under ``layers``
        (one per repository), uncompressed, so blob digests are the layers' diff IDs, which
        containerd holds them under once imported; a layer the layout holds is not copied again,
        so a second version of an image writes its new layers only (without skopeo: ``podman push
        dir:``, every layer each time). The OCI archive streamed into ``ctr images import``
        carries the manifest, the config and the layers the node lacks.
        """
        start = time.monotonic()
        have = set(self.ctr("content", "ls", "-q", timeout=QUERY_TIMEOUT).split())
        with tempfile.TemporaryDirectory(prefix="rtserve-load-", dir=os.environ.get("TMPDIR", "/var/tmp")) as tmp:
            if layers is not None and shutil.which("skopeo"):
                with LayerCache(layers, image.name) as cache:
                    manifest = cache.copy(image, timeout)
                    self._import(image, manifest, cache.blob, have, Path(tmp), timeout)
            else:
                layout = Path(tmp) / "image"
                run([engine, "push", "--quiet", image.name, f"dir:{layout}"], timeout=timeout)
                manifest = (layout / "manifest.json").read_bytes()
                self._import(image, manifest, lambda d: layout / d.removeprefix("sha256:"), have, Path(tmp), timeout)
        return time.monotonic() - start

    def _import(
        self, image: Local, manifest: bytes, blob: Callable[[str], Path], have: set[str], tmp: Path, timeout: float
    ) -> None:
        """Send ctr the manifest, the config and the layers not in ``have`` (``blob``: digest -> its file)."""
        doc = json.loads(manifest)
        wanted = [doc["config"]] + [layer for layer in doc["layers"] if layer["digest"] not in have]
        writer = oci_archive(image.name, manifest, {d["digest"]: blob(d["digest"]) for d in wanted})
        archive = tmp / "import.tar"
        with archive.open("wb") as out:
            writer(out)
        with archive.open("rb") as stream:
            self.ctr("images", "import", "-", stdin=stream, timeout=timeout)

    def import_from(self, engine: str, image: Local, timeout: float = LOAD_TIMEOUT) -> float:
        """Stream ``engine save`` of ``image`` into ``ctr images import``; returns the seconds.

        Only the archive's platform is in it (so no ``--all-platforms``) and its image is named
        (so no ``--digests``, which adds an ``import-<date>@sha256:...`` name per image); ctr
        unpacks it into overlayfs, the CRI plugin's snapshotter, so a container starts at once.

        Raises:
            CommandError: the engine's save failed (its output kept).
            ClusterError: ctr's import failed (its stderr kept, and the save's output when that
                failed too) or ran past ``timeout``.
            ProcessError: the engine cannot be started.
        """
        docker_archive = ["--format", "docker-archive"] if Path(engine).name == "podman" else []  # docker's only
        save = [engine, "save", *docker_archive, image.name]
        start = time.monotonic()
        with tempfile.TemporaryFile() as save_err:
            try:
                saver = subprocess.Popen(save, stdout=subprocess.PIPE, stderr=save_err, stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise ProcessError(f"cannot run {' '.join(save)}: {exc}") from exc
            failed = None
            try:
                self.ctr("images", "import", "-", stdin=saver.stdout, timeout=timeout)
            except ClusterError as exc:
                failed = exc
            finally:
                saver.stdout.close()
            try:
                code = saver.wait(60 if failed else max(60.0, timeout - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                saver.kill()
                code = saver.wait()
            # Either side may be the cause (a cut stream fails ctr; ctr's failure cuts the save
            # off), so a failure of both names both; a save that only lost its reader, ctr's.
            if code not in (0, SIGPIPE_EXIT) or (code and not failed):
                save_err.seek(0)
                save_error = CommandError(save, code, last_lines(save_err.read().decode(errors="replace"), 40))
                if not failed:
                    raise save_error
                raise failed.reworded(f"{failed}\nand {save_error}")
            if failed:
                raise failed
        return time.monotonic() - start


class LayerCache:
    """An OCI layout of one repository's images, kept between loads (locked while in use).

    :meth:`copy` puts an image in it with ``skopeo`` (a layer the layout holds is not copied
    again) and leaves only that image: blobs no longer named are deleted, so the layout holds one
    image's layers, and a later version of it reuses all but its new ones.
    """

    def __init__(self, root: Path, name: str) -> None:
        repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
        self.dir = root / re.sub(r"[^A-Za-z0-9._-]+", "_", repository)
        self._lock: IO[bytes] | None = None

    def __enter__(self) -> LayerCache:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = (self.dir.parent / f"{self.dir.name}.lock").open("wb")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.close()  # releases the lock

    def blob(self, digest: str) -> Path:
        return self.dir / "blobs" / "sha256" / digest.removeprefix("sha256:")

    def copy(self, image: Local, timeout: float) -> bytes:
        """Copy ``image`` (podman's store) into the layout; returns its manifest."""
        tag = "image"
        run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-oci-accept-uncompressed-layers",
                f"containers-storage:{image.name}",
                f"oci:{self.dir}:{tag}",
            ],
            timeout=timeout,
        )
        index = json.loads((self.dir / "index.json").read_text())
        (entry,) = [m for m in index["manifests"] if (m.get("annotations") or {}).get(ANNOTATION) == tag]
        manifest = self.blob(entry["digest"]).read_bytes()
        index["manifests"] = [entry]
        (self.dir / "index.json").write_text(json.dumps(index))
        doc = json.loads(manifest)
        keep = {entry["digest"], doc["config"]["digest"], *(layer["digest"] for layer in doc["layers"])}
        for path in (self.dir / "blobs" / "sha256").iterdir():
            if f"sha256:{path.name}" not in keep:
                path.unlink()
        return manifest


def oci_archive(name: str, manifest: bytes, blobs: dict[str, Path]) -> Callable[[IO[bytes]], None]:
    """A writer of the OCI archive of one image named ``name``: its ``manifest`` and ``blobs`` (digest -> file).

    The manifest may name blobs the node holds already, which the archive then leaves out.
    """
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": json.loads(manifest).get("mediaType", "application/vnd.oci.image.manifest.v1+json"),
                    "digest": digest,
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                    },
                }
            ],
        }
    ).encode()

    def write(out: IO[bytes]) -> None:
        with tarfile.open(fileobj=out, mode="w|") as tar:

            def add(member: str, data: bytes) -> None:
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

            add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            add("index.json", index)
            add(f"blobs/sha256/{digest.removeprefix('sha256:')}", manifest)
            for blob, path in blobs.items():
                tar.add(path, arcname=f"blobs/sha256/{blob.removeprefix('sha256:')}")

    return write


def load(
    ctr: Ctr,
    names: list[str],
    engine: str = "podman",
    say: Callable[[str], None] = print,
    layers: Path | None = None,
) -> list[Loaded]:
    """Load each image of ``names`` from ``engine`` into the node ``ctr`` reaches, unless it holds it already.

    With podman, ``layers`` keeps the images' layers between loads (:class:`LayerCache`).

    One line is said per image.

    Raises:
        ImageNotFound: the engine lacks one of the images (all are checked before any import).
        ClusterError, CommandError, ProcessError: a ctr or engine command failed.
    """
    images = [local_image(name, engine) for name in names]
    node = NodeImages(ctr)
    refs = ctr.images()
    done = []
    if Path(engine).name == "podman":
        into = functools.partial(node.import_new_layers, layers=layers)
    else:
        into = node.import_from
    for image in images:
        action = plan(image, refs, node.config_of)
        if action == "present" and not node.unpacked(image.name):
            say(f">> {image.name} is on the node but not unpacked (an import cut short): importing it again")
            action = "import"
        if action == "import":
            loaded = Loaded(image, "imported", import_twice(into, engine, image, say))
        elif action == "tag":
            node.tag(image.id, image.name)
            loaded = Loaded(image, "tagged")
        else:
            loaded = Loaded(image, "present")
        say(loaded.line())
        done.append(loaded)
    return done


def import_twice(into: Callable[[str, Local], float], engine: str, image: Local, say: Callable[[str], None]) -> float:
    """Run ``into(engine, image)``, once more when ctr's import fails; returns the seconds of both.

    Its unpack can lose a race with containerd's garbage collection ("parent snapshot ... does not
    exist"); the second import finds the layers sent the first time and unpacks again.

    Raises:
        ClusterError: the second import failed too.
    """
    start = time.monotonic()
    try:
        into(engine, image)
    except ClusterError as exc:
        say(f">> importing {image.name} failed ({last_lines(str(exc), 1)}): once more")
        into(engine, image)
    return time.monotonic() - start
