"""The routes file: which share of a model's requests the agent mirrors to (or sends to) a candidate.

The agent (agent/src/rtserve/agent/Routes.java) re-reads the file whenever it changes; it is written here,
atomically and under a lock. :func:`sticky_bucket` is the agent's canary policy in Python (a unit test
compares it with the agent's own).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rtserve.errors import LiveError

#: The header whose value makes the canary share sticky (one client key, one version).
KEY_HEADER = "x-rtserve-key"


def sticky_bucket(key: str) -> float:
    """The agent's place in [0, 100) of a sticky key (agent/src/rtserve/agent/Routes.java).

    A request whose key's bucket is below the canary's percent goes to the candidate.
    """
    return (int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 11) / 2**53 * 100


@dataclass(frozen=True)
class Route:
    """One live route: ``percent`` of the requests go to ``url`` (the candidate ``version``)."""

    version: str
    percent: float
    url: str
    key_header: str | None = None

    def json(self) -> dict:
        out = {"version": self.version, "percent": self.percent, "url": self.url}
        return out if self.key_header is None else {**out, "key_header": self.key_header}


@dataclass(frozen=True)
class Routes:
    """The routes file: the model, its shadow and canary (None: off), the live log's path.

    ``revision`` (0: none, and not written) orders the routes a cluster publishes (epoch ms,
    :mod:`rtserve.promotion.live.cluster`): a pod's :class:`RoutesSync` never replaces newer routes with older
    ones that the kubelet brings late. The agent ignores it.
    """

    model: str
    log: str
    shadow: Route | None = None
    canary: Route | None = None
    token_file: str | None = None
    revision: int = 0

    def json(self) -> dict:
        out = {
            "model": self.model,
            "shadow": self.shadow and self.shadow.json(),
            "canary": self.canary and self.canary.json(),
            "log": self.log,
            "token_file": self.token_file,
        }
        return {**out, "revision": self.revision} if self.revision else out

    @classmethod
    def parse(cls, raw: object, where: str) -> Routes:
        """Routes from the file's JSON.

        Raises:
            LiveError: a key is missing or has the wrong type (``where`` names the file).
        """
        try:
            routes = {}
            for kind in ("shadow", "canary"):
                entry = raw.get(kind)
                routes[kind] = (
                    None
                    if entry is None
                    else Route(
                        str(entry["version"]), _share(entry["percent"]), str(entry["url"]), entry.get("key_header")
                    )
                )
            revision = raw.get("revision", 0)
            if isinstance(revision, bool) or not isinstance(revision, int):
                raise ValueError(f"revision must be an integer, got {revision!r}")
            return cls(
                str(raw["model"]), str(raw["log"]), token_file=raw.get("token_file"), revision=revision, **routes
            )
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise LiveError(
                f"{where}: not a routes file ({type(exc).__name__}: {exc}); move it away to start again"
            ) from exc


def _share(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise ValueError(f"percent must be a number in [0, 100], got {value!r}")
    return float(value)


def read_routes(path: str | Path) -> Routes | None:
    """The routes file at ``path`` (None when there is none).

    Raises:
        LiveError: it is not a routes file.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise LiveError(f"{path}: not JSON ({exc}); move it away to start again") from exc
    return Routes.parse(raw, str(path))


def write_routes(path: str | Path, routes: Routes) -> None:
    """Replace the routes file at once (a temporary file renamed over it): the agent never reads half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(routes.json(), out, indent=2)
            out.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update_routes(path: str | Path, change: Callable[[Routes | None], Routes]) -> Routes:
    """Read, change and write the routes file under a lock; returns what was written.

    ``make shadow`` and the canary watcher may change it at the same moment.
    """
    lock = Path(path).with_name(Path(path).name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        routes = change(read_routes(path))
        write_routes(path, routes)
    return routes


def set_route(path: str | Path, model: str, log: str | Path, kind: str, route: Route | None) -> Routes:
    """Set (or, with None, turn off) the ``shadow`` or ``canary`` route, keeping the other."""

    def change(routes: Routes | None) -> Routes:
        routes = routes or Routes(model, str(log))
        return replace(routes, model=model, log=str(log), **{kind: route})

    return update_routes(path, change)


def drop_version(path: str | Path, version: str) -> list[str]:
    """Turn off the routes to ``version`` (it became the default); returns which ones."""
    if not Path(path).exists():
        return []
    dropped: list[str] = []

    def change(routes: Routes | None) -> Routes:
        for kind in ("shadow", "canary"):
            route = getattr(routes, kind)
            if route is not None and route.version == version:
                dropped.append(kind)
                routes = replace(routes, **{kind: None})
        return routes

    update_routes(path, change)
    return dropped


class RoutesSync:
    """Keeps a server's routes file equal to a mounted one (a pod's ConfigMap: ``$RTSERVE_LIVE_ROUTES``).

    It copies only when the mounted content changes, and never over routes of a higher ``revision``
    (those written straight into the pod stay until the ConfigMap brings newer ones). A mounted file that
    goes away removes the copy; an invalid one is not copied (the agent keeps its routes) and said once.

    Args:
        source: the mounted file.
        target: the routes file the frontend's agent follows (:attr:`RunDir.live_routes`).
    """

    def __init__(self, source: Path, target: Path, log: Callable[[str], None] = print) -> None:
        self.source, self.target, self.log = source, target, log
        self.seen: str | None = None

    def sync(self) -> bool:
        """Copy the mounted file if its content changed since the last look; whether it did."""
        try:
            text = self.source.read_text()
        except (FileNotFoundError, NotADirectoryError):
            text = None
        if text == self.seen:
            return False
        self.seen = text
        if text is None:
            self.target.unlink(missing_ok=True)
            self.log(f"live routes: {self.source} is gone: {self.target} removed (no routes)")
            return True
        try:
            routes = Routes.parse(json.loads(text), str(self.source))
        except (ValueError, LiveError) as exc:
            self.log(f"live routes: {self.source} not copied: {exc}")
            return False
        try:
            current = read_routes(self.target)
        except LiveError:
            current = None
        if current is not None and current.revision > routes.revision:
            self.log(
                f"live routes: {self.source} not copied: revision {routes.revision} is older "
                f"than {self.target}'s {current.revision}"
            )
            return False
        write_routes(self.target, routes)
        self.log(f"live routes: {self.source} copied to {self.target}")
        return True


def canary_route(routes: Routes | None, version: str) -> Route | None:
    """The canary route of ``version`` while its share is above 0."""
    route = routes.canary if routes else None
    return route if route and route.version == version and route.percent > 0 else None


def checked_percent(percent: float) -> float:
    """A shadow's or canary's share as asked (``--percent``).

    Raises:
        LiveError: it is not in (0, 100].
    """
    if not 0 < percent <= 100:
        raise LiveError(f"--percent must be in (0, 100], got {percent:g}; nothing changed")
    return float(percent)
